"""Schedules' speed (issue 19): how late a fire starts, and what 10,000 schedules cost.

    PYTHONPATH=. python -m benchmarks.schedules [--seconds 20] [--rounds 3]

- fire latency: an every-second schedule on an idle worker (SQLite file, system
  clock, the worker asleep until the fire time); the time from each fire time
  to its task's start, p50, p99 and worst;
- idle CPU: a worker process on a database with 0, then 10,000 active schedules
  (none due during the measurement), its CPU time over ``--idle`` seconds;
- busy throughput: 20,000 no-op tasks run by one worker process of 8 slots with
  0 and with 10,000 active schedules, interleaved over ``--rounds``, medians.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from tempfile import mkdtemp

from durablesched import Scheduler, SQLiteStore, SystemClock, TaskContext, TaskRegistry, Worker
from durablesched.schedules.declaration import schedule

from .common import fresh, history_rate, median, percentile, worker
from .ours import until_quiet


def fire_latency(path: Path, seconds: float) -> dict[str, float]:
    """Seconds from each fire time to its task's start, on an idle in-process worker."""
    registry = TaskRegistry()
    late: list[float] = []

    @registry.task("stamp", pass_context=True)
    def stamp(ctx: TaskContext) -> None:
        assert ctx.fire_time is not None
        late.append(time.time() - ctx.fire_time.timestamp())

    registry.schedule("stamp", every=1, overlap="allow")
    store = SQLiteStore(fresh(path), durability="normal")
    w = Worker(Scheduler(store, registry=registry, clock=SystemClock()), concurrency=2)
    w.start()
    try:
        threading.Event().wait(seconds)
    finally:
        w.stop(10)
        store.close()
    samples = late[1:]  # the first fire may come while the worker is still starting
    return {
        "fires": len(samples),
        "p50_ms": median(samples) * 1e3,
        "p99_ms": percentile(samples, 99) * 1e3,
        "max_ms": max(samples) * 1e3,
    }


def add_schedules(path: Path, count: int) -> None:
    """``count`` active schedules of the no-op task, none due for months (1 January)."""
    store = SQLiteStore(path, durability="normal")
    now = datetime.now(UTC)
    for i in range(count):
        store.add_schedule(schedule("noop", name=f"s{i:05d}", cron=f"{i % 60} 0 1 1 *"), now)
    store.close()


def idle_cpu(path: Path, count: int, seconds: float) -> float:
    """Percent of one core an idle worker uses with ``count`` schedules stored."""
    SQLiteStore(fresh(path), durability="normal").close()
    add_schedules(path, count)
    child = worker(path, "--concurrency", "1", "--log-level", "warning", durability="normal")
    try:
        until_quiet(child)  # started, synced, asleep
        cpu0, t0 = child.cpu_seconds(), time.monotonic()
        threading.Event().wait(seconds)
        return (child.cpu_seconds() - cpu0) / (time.monotonic() - t0) * 100
    finally:
        child.stop()


def busy(path: Path, count: int, n: int) -> float:
    """No-op tasks/s of one worker process with 8 slots, ``count`` schedules stored."""
    store = SQLiteStore(fresh(path), durability="normal")
    Scheduler(store).submit_many("noop", [{} for _ in range(n)])
    store.close()
    add_schedules(path, count)
    child = worker(
        path, "--burst", "--concurrency", "8", "--log-level", "warning", durability="normal"
    )
    status, _, _ = child.wait_rusage()
    assert status == 0
    return history_rate(path, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="fire latency run")
    parser.add_argument("--idle", type=float, default=10.0, help="idle CPU measurement")
    parser.add_argument("--rounds", type=int, default=3, help="busy rounds per setting")
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per busy round")
    parser.add_argument("--schedules", type=int, default=10_000)
    options = parser.parse_args()
    folder = Path(mkdtemp(prefix="ds-bench-schedules-"))
    path = folder / "bench.db"
    results: dict[str, object] = {"fire_latency": fire_latency(path, options.seconds)}
    print(json.dumps(results), flush=True)
    results["idle_cpu_percent"] = {
        str(count): idle_cpu(path, count, options.idle) for count in (0, options.schedules)
    }
    print(json.dumps(results["idle_cpu_percent"]), flush=True)
    rounds: dict[str, list[float]] = {"0": [], str(options.schedules): []}
    for r in range(options.rounds):
        order = (0, options.schedules) if r % 2 == 0 else (options.schedules, 0)
        for count in order:
            rounds[str(count)].append(busy(path, count, options.tasks))
    results["busy_tasks_per_s"] = {k: {"median": median(v), "rounds": v} for k, v in rounds.items()}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
