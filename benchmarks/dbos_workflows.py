"""DBOS's side of ``benchmarks/workflows.py``'s ``steps``: W workflows of S no-op
``@DBOS.step`` steps, as a DBOS user writes them, run in a process of their own.

    python -m benchmarks.dbos_workflows --url URL --workflows W --steps S
        [--mode queue|direct] [--schema NAME]

``--url`` is DBOS's ``system_database_url`` (``sqlite:///FILE`` or a PostgreSQL URL;
``--schema`` names the schema DBOS keeps its tables in there). ``queue``: the W
workflows enqueued on a queue registered at DBOS's defaults (no limits, polled once
a second) and run by this process's DBOS executor; ``direct``: started at once with
``DBOS.start_workflow``. Timed from the first enqueue or start to the last result
(``handle.get_result()``), after ``DBOS.launch()``; prints one JSON line:
``{"seconds": ..., "steps": W * S}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from dbos import DBOS, DBOSConfig

QUEUE = "bench"


@DBOS.step()
def noop() -> None:
    return None


@DBOS.workflow()
def flow(steps: int) -> int:
    for _ in range(steps):
        noop()
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mode", choices=["queue", "direct"], default="queue")
    parser.add_argument("--schema")
    args = parser.parse_args(argv)
    config: DBOSConfig = {
        "name": "durablesched-bench",
        "system_database_url": args.url,
        "log_level": "WARNING",
    }
    if args.schema:
        config["dbos_system_schema"] = args.schema
    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(config=config)
    DBOS.launch()
    try:
        if args.mode == "queue":
            DBOS.register_queue(QUEUE)
        started = time.perf_counter()
        if args.mode == "queue":
            handles = [
                DBOS.enqueue_workflow(QUEUE, flow, args.steps) for _ in range(args.workflows)
            ]
        else:
            handles = [DBOS.start_workflow(flow, args.steps) for _ in range(args.workflows)]
        results = [handle.get_result() for handle in handles]
        seconds = time.perf_counter() - started
    finally:
        DBOS.destroy()
    assert results == [args.steps] * args.workflows, "a workflow's result is missing or wrong"
    print(json.dumps({"seconds": seconds, "steps": args.workflows * args.steps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
