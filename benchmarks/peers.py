"""The queues people use instead, each through its own API: N no-op tasks through each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import ROOT, fresh


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
    fresh(path)
    env = {**os.environ, "BENCH_HUEY_DB": str(path), "PYTHONPATH": str(ROOT)}
    probe = (
        "import sys; from benchmarks.huey_app import huey, noop\n"
        "for _ in range(int(sys.argv[1])): noop()\n"
    )
    subprocess.run([sys.executable, "-c", probe, str(n)], cwd=ROOT, env=env, check=True)  # noqa: S603
    sys.path.insert(0, str(ROOT))
    os.environ["BENCH_HUEY_DB"] = str(path)
    from huey import SqliteHuey  # noqa: PLC0415 - an optional dependency

    queue = SqliteHuey(filename=str(path))
    consumer = subprocess.Popen(  # noqa: S603 - the peer's own consumer command
        [
            sys.executable,
            "-m",
            "huey.bin.huey_consumer",
            "benchmarks.huey_app.huey",
            "-w",
            str(threads),
            "-k",
            "thread",
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
        while time.monotonic() < end:
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
    assert first is not None and last is not None
    return (n - 1) / (last - first)


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
