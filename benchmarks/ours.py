"""durablesched's own figures: submit, end to end, claim and pickup latency, idle CPU, memory."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from durablesched import MemoryStore, Scheduler, SQLiteStore
from durablesched.records import NewTask

from .common import (
    NOW,
    ROOT,
    Child,
    fresh,
    history_rate,
    median,
    percentile,
    succeeded,
    worker,
)


def submit_single(path: Path, n: int) -> float:
    store = SQLiteStore(fresh(path))
    scheduler = Scheduler(store)
    start = time.perf_counter()
    for _ in range(n):
        scheduler.submit("noop")
    elapsed = time.perf_counter() - start
    store.close()
    return n / elapsed


def submit_many(path: Path, n: int, *, with_args: bool = False) -> float:
    """Tasks/s of one submit_many of ``n`` no-argument tasks (or ones with an argument each)."""
    store = SQLiteStore(fresh(path))
    scheduler = Scheduler(store)
    args: list[dict[str, object]] = [{"n": i} if with_args else {} for i in range(n)]
    start = time.perf_counter()
    scheduler.submit_many("noop", args)
    elapsed = time.perf_counter() - start
    store.close()
    return n / elapsed


def end_to_end(
    path: Path,
    n: int,
    slots: int,
    processes: int,
    durability: str,
    *,
    log_level: str = "warning",
    environment: str = "thread",
    task: str = "noop",
    app: str = "benchmarks.noop_app:registry",
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Tasks/s from the first claim to the last finish, measured from the table.

    ``log_level`` "warning" matches huey's consumer run with ``-q``; "info"
    writes the two per-task lines (start, outcome) a worker logs by default.
    ``task`` of ``app`` replaces the no-op task (and the workers get ``env``).
    """
    store = SQLiteStore(fresh(path), durability=durability)  # type: ignore[arg-type]
    Scheduler(store).submit_many(task, [{} for _ in range(n)])
    store.close()
    children = [
        worker(
            path,
            "--burst",
            "--concurrency",
            str(slots),
            "--log-level",
            log_level,
            "--environment",
            environment,
            durability=durability,
            app=app,
            env=env,
        )
        for _ in range(processes)
    ]
    peak_rss = 0
    for child in children:
        status, _cpu, rss = child.wait_rusage()
        assert status == 0, f"worker exited {status}"
        peak_rss = max(peak_rss, rss)
    return {"tasks_per_s": history_rate(path, n), "peak_rss_mib": peak_rss / 1024}


def contention_envelope(
    path: Path, levels: list[tuple[int, int]], seconds: float
) -> dict[str, dict[str, float]]:
    """Submitting and claiming processes at once on one file: busy retries per level.

    Each level runs ``submitters`` processes submitting one task per
    transaction for ``seconds`` against ``workers`` worker processes (4 slots
    each) until every task has run; it reports the transactions that found the
    database busy and were retried (in submitters and in workers), and any
    error that reached a process (none should: a retry is invisible to the user).
    """
    report: dict[str, dict[str, float]] = {}
    for submitters, workers in levels:
        db = fresh(path)
        SQLiteStore(db).close()
        logs = [path.with_name(f"{path.name}.worker{i}.log") for i in range(workers)]
        claimers = [
            worker(db, "--concurrency", "4", "--log-level", "warning", stderr=log) for log in logs
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        started = time.monotonic()
        procs = [
            subprocess.Popen(  # noqa: S603 - our own script
                [sys.executable, "-m", "benchmarks.submitter", str(db), str(seconds)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(submitters)
        ]
        submitted = submit_retries = errors = 0
        for proc in procs:
            out, err = proc.communicate(timeout=seconds + 120)
            if proc.returncode != 0:
                errors += 1
                continue
            result = json.loads(out)
            submitted += result["submitted"]
            submit_retries += result["busy_retries"]
            errors += err.count("Error")
        deadline = time.monotonic() + 300
        while succeeded(db) < submitted and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.monotonic() - started
        done = succeeded(db)
        for claimer in claimers:
            claimer.stop()
        worker_retries = 0
        for log in logs:
            text = log.read_text()
            errors += text.count("ERROR")
            worker_retries += sum(
                int(n) for n in re.findall(r"retried on a busy database: (\d+)", text)
            )
        report[f"{submitters}x{workers}"] = {
            "submitted_per_s": submitted / seconds,
            "finished_per_s": done / wall,
            "submit_busy_retries": submit_retries,
            "worker_busy_retries": worker_retries,
            "errors": errors + (submitted - done),
        }
    return report


def claim_latencies(
    path: Path, tables: dict[str, tuple[int, int]], samples: int
) -> dict[str, dict[str, float]]:
    """Seconds per claim of one task, per table of (pending, finished) rows.

    The claims are taken in turn, one on each table, so that every table is
    sampled under the same conditions: a claim is mostly its commit's fsync,
    whose time on a shared machine swings by a factor of three within minutes.
    """
    stores = {}
    for index, (name, (pending, finished)) in enumerate(tables.items()):
        db = fresh(path.with_name(f"{path.name}.{index}"))
        store = SQLiteStore(db)
        batch = 50_000
        for start in range(0, pending + finished, batch):
            count = min(batch, pending + finished - start)
            store.submit([NewTask("noop", {}, NOW, 1) for _ in range(count)], NOW)
        store.close()
        if finished:
            with sqlite3.connect(db) as conn:
                conn.execute(
                    "UPDATE tasks SET state = 'SUCCEEDED', finished_at = created_at WHERE id <= ?",
                    (finished,),
                )
        stores[name] = (SQLiteStore(db), pending)
    lease = timedelta(seconds=30)
    times: dict[str, list[float]] = {name: [] for name in stores}
    for i in range(samples):
        for name, (store, pending) in stores.items():
            if i < pending:
                t0 = time.perf_counter()
                store.claim("bench", 1, NOW, lease)
                times[name].append(time.perf_counter() - t0)
    for store, _ in stores.values():
        store.close()
    return {
        name: {"p50_us": median(t) * 1e6, "p99_us": percentile(t, 99) * 1e6}
        for name, t in times.items()
    }


def pickup_and_idle(path: Path, samples: int, idle_seconds: float | None) -> dict[str, float]:
    """Cross-process pickup latency (submit here, started there) and idle CPU of a worker.

    The idle CPU is measured over ``idle_seconds``; with None (the smoke run, which
    checks that the figure is produced, not its value), until the worker is seen
    idle: see :func:`until_quiet`.
    """
    SQLiteStore(fresh(path)).close()
    child = worker(path, "--concurrency", "1")
    store = SQLiteStore(path)
    scheduler = Scheduler(store)
    try:
        # Wait for the worker to be up: it picks up a first task.
        first = scheduler.submit("noop")
        wait_done(scheduler, first, 30)
        cpu0 = child.cpu_seconds()
        t0 = time.monotonic()
        if idle_seconds is None:
            until_quiet(child)
        else:
            time.sleep(idle_seconds)  # the measurement: an idle worker over this period
        idle = (child.cpu_seconds() - cpu0) / (time.monotonic() - t0)
        latencies = pickup_latencies(scheduler, samples)
    finally:
        store.close()
        child.stop()
    return {
        "pickup_p50_ms": median(latencies) * 1e3,
        "pickup_p99_ms": percentile(latencies, 99) * 1e3,
        "idle_cpu_percent": idle * 100,
    }


#: How long a worker's CPU time must stand still for :func:`until_quiet` to call it idle.
QUIET = 0.25


def until_quiet(child: Child, most: float = 10.0) -> None:
    """Return once ``child``'s CPU time has not moved for :data:`QUIET` seconds, or after
    ``most`` seconds (a worker that never goes quiet gets its figure all the same: a high
    one)."""
    end = time.monotonic() + most
    last, since = child.cpu_seconds(), time.monotonic()
    while (now := time.monotonic()) < end:
        cpu = child.cpu_seconds()
        if cpu != last:
            last, since = cpu, now
        elif now - since >= QUIET:
            return
        time.sleep(0.01)


def pickup_latencies(scheduler: Scheduler, samples: int) -> list[float]:
    """Seconds from submit (here) to start (in an idle worker elsewhere), one task at a time."""
    latencies = []
    for _ in range(samples):
        submitted = scheduler.clock.now()
        task_id = scheduler.submit("noop")
        wait_done(scheduler, task_id, 10)
        started = next(e.at for e in scheduler.history(task_id) if e.state == "RUNNING")
        latencies.append((started - submitted).total_seconds())
        time.sleep(0.02)  # let the worker go idle again between samples
    return latencies


def wait_done(scheduler: Scheduler, task_id: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while scheduler.get(task_id).state != "SUCCEEDED":
        if time.monotonic() > end:
            raise TimeoutError(f"task {task_id} was not picked up")
        time.sleep(0.0005)


MEMORY_PROBE = """
import json, sys
from pathlib import Path
from durablesched import MemoryStore
from durablesched.records import NewTask
from datetime import datetime, timezone
def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
n = int(sys.argv[1])
now = datetime(2020, 1, 1, tzinfo=timezone.utc)
store = MemoryStore()
before = rss()
for start in range(0, n, 10_000):
    store.submit([NewTask("noop", {}, now, 5) for _ in range(min(10_000, n - start))], now)
print(json.dumps({"bytes_per_task": (rss() - before) / n}))
"""


def memory_backend(n: int) -> float:
    out = subprocess.run(  # noqa: S603 - our own probe
        [sys.executable, "-c", MEMORY_PROBE, str(n)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out)["bytes_per_task"])


def attempt_start_cost(n: int) -> dict[str, float]:
    """Milliseconds per attempt of a no-op task: in a thread (a call) and in a child process."""
    from durablesched.context import TaskContext  # noqa: PLC0415 - only this figure needs it
    from durablesched.records import Claim  # noqa: PLC0415
    from durablesched.registry import TaskRegistry  # noqa: PLC0415
    from durablesched.worker.environments import run_in_child  # noqa: PLC0415

    registry = TaskRegistry()
    registry.register(lambda: None, name="noop")
    definition = registry.get("noop")
    claim = Claim(1, "noop", {}, 1, 1, "bench", 1, NOW, NOW, 1, "k")
    ctx = TaskContext(claim, Scheduler(MemoryStore()))
    start = time.perf_counter()
    for _ in range(n):
        definition.fn()
    thread = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for _ in range(n):
        ended = run_in_child(
            definition, {}, ctx, deadline=None, cancel_grace=1.0, on_enforce=lambda: None
        )
        assert ended.how == "result", ended
    process = (time.perf_counter() - start) / n
    return {"thread_ms": thread * 1e3, "process_ms": process * 1e3}
