"""The PostgreSQL peers, each through its own API, in a process of its own.

    python -m benchmarks.pg_peers_app PEER ACTION URL [N | CONCURRENCY]

PEER is ``pgqueuer`` or ``procrastinate``; ACTION is ``install``, ``enqueue N``
(one batch) or ``work CONCURRENCY`` (drain the queue, then exit).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


async def pgqueuer(action: str, url: str, arg: int) -> None:
    import psycopg  # noqa: PLC0415 - optional
    from pgqueuer import PsycopgDriver, QueueManager  # noqa: PLC0415 - optional
    from pgqueuer.models import Job  # noqa: PLC0415 - optional
    from pgqueuer.queries import Queries  # noqa: PLC0415 - optional
    from pgqueuer.types import QueueExecutionMode  # noqa: PLC0415 - optional

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    driver = PsycopgDriver(conn)
    if action == "install":
        await Queries(driver).install(create_schema=False)
    elif action == "enqueue":
        await Queries(driver).enqueue(["noop"] * arg, [None] * arg, [0] * arg)
    else:
        qm = QueueManager(Queries(driver))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        await qm.run(mode=QueueExecutionMode.drain)  # its defaults: batches of 10
    await conn.close()


def procrastinate(action: str, url: str, arg: int) -> None:
    from procrastinate import App, PsycopgConnector  # noqa: PLC0415 - optional

    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    def noop() -> None:
        return None

    with app.open():
        if action == "install":
            app.schema_manager.apply_schema()
        elif action == "enqueue":
            for start in range(0, arg, 1000):
                noop.batch_defer(*({} for _ in range(min(1000, arg - start))))
        else:
            app.run_worker(concurrency=arg, wait=False, install_signal_handlers=False)


def main(argv: list[str]) -> int:
    peer, action, url = argv[:3]
    arg = int(argv[3]) if len(argv) > 3 else 0
    runner: Any = pgqueuer if peer == "pgqueuer" else procrastinate
    if peer == "pgqueuer":
        asyncio.run(runner(action, url, arg))
    else:
        runner(action, url, arg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
