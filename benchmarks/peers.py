"""The queues people use instead, each through its own API: N no-op tasks through each."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import ROOT, bench_env, fresh


def available() -> dict[str, bool]:
    found = {}
    for module in ("huey", "litequeue", "persistqueue", "pgqueuer", "procrastinate"):
        try:
            __import__(module)
            found[module] = True
        except ImportError:
            found[module] = False
    return found


def huey_consumer(path: Path, n: int, threads: int) -> float:
    """huey's real consumer (SqliteHuey, its default durability: FULL) with ``threads`` threads."""
    return huey_drain(path, n, workers=threads).drain_rate(n)


@dataclass(frozen=True)
class HueyRun:
    """When (``time.perf_counter``) huey's consumer was started, was first seen to have
    taken a task, and was seen to have emptied its queue."""

    started: float
    first: float
    last: float

    def drain_rate(self, n: int) -> float:
        """Tasks/s while it drained ``n``: from the first taken to the last."""
        return (n - 1) / (self.last - self.first)


def huey_drain(
    path: Path,
    n: int,
    *,
    workers: int,
    kind: str = "thread",
    app: str = "benchmarks.huey_app",
    task: str = "noop",
    env: dict[str, str] | None = None,
) -> HueyRun:
    """``n`` of ``app``'s ``task`` enqueued through huey's own API in a fresh SqliteHuey
    file, then drained by its consumer (``workers`` of ``kind``, quiet), then stopped.

    huey deletes a task when it dequeues it and stores no result of None, so its queue
    is seen from outside only through its pending count, polled every 2 ms: "emptied"
    is when the last task was taken, not when it finished.
    """
    fresh(path)
    env = bench_env(BENCH_HUEY_DB=str(path), **(env or {}))
    probe = f"import sys; from {app} import {task}\nfor _ in range(int(sys.argv[1])): {task}()\n"
    subprocess.run([sys.executable, "-c", probe, str(n)], cwd=ROOT, env=env, check=True)  # noqa: S603
    from huey import SqliteHuey  # noqa: PLC0415 - an optional dependency

    queue = SqliteHuey(filename=str(path))
    started = time.perf_counter()
    consumer = subprocess.Popen(  # noqa: S603 - the peer's own consumer command
        [
            sys.executable,
            "-m",
            "huey.bin.huey_consumer",
            f"{app}.huey",
            "-w",
            str(workers),
            "-k",
            kind,
            "-q",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = last = None
        end = time.monotonic() + 600
        while time.monotonic() < end and consumer.poll() is None:
            pending = queue.pending_count()
            now = time.perf_counter()
            if first is None and pending < n:
                first = now
            if pending == 0:
                last = now
                break
            time.sleep(0.002)
    finally:
        consumer.terminate()
        consumer.wait(30)
    assert first is not None and last is not None, f"huey's consumer exited {consumer.returncode}"
    return HueyRun(started, first, last)


def litequeue_loop(path: Path, n: int, synchronous: str) -> float:
    """litequeue: put N, then pop and done each (it has no consumer of its own)."""
    from litequeue import LiteQueue  # noqa: PLC0415 - an optional dependency

    queue: Any = LiteQueue(str(fresh(path)))
    queue.conn.execute(f"PRAGMA synchronous = {synchronous}")
    for _ in range(n):
        queue.put("noop")
    start = time.perf_counter()
    for _ in range(n):
        message = queue.pop()
        queue.done(message.message_id)
    elapsed = time.perf_counter() - start
    queue.close()
    return n / elapsed


def persistqueue_loop(path: Path, n: int) -> float:
    """persist-queue's SQLiteAckQueue at its default durability: put N, then get and ack each."""
    from persistqueue import SQLiteAckQueue  # noqa: PLC0415 - an optional dependency

    path.mkdir(parents=True, exist_ok=False)
    queue: Any = SQLiteAckQueue(str(path), multithreading=True)
    for _ in range(n):
        queue.put("noop")
    start = time.perf_counter()
    for _ in range(n):
        item = queue.get()
        queue.ack(item)
    elapsed = time.perf_counter() - start
    return n / elapsed
