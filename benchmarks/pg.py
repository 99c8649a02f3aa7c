"""PostgreSQL figures: a raw psycopg loop, durablesched's workers, and pickup latency.

Every figure runs in a schema of its own on the server at ``BENCH_PG`` (default
the local test server), dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from durablesched import PostgresStore, Scheduler
from durablesched.records import NewTask

from .common import NOW, ROOT, median, percentile, worker
from .ours import pickup_latencies, wait_done

BASE_URL = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")

#: One statement per transaction (autocommit): the claim, then the completion.
CLAIM = (
    "WITH picked AS MATERIALIZED (SELECT id FROM tasks "
    "WHERE state IN ('PENDING', 'RETRY_WAIT') AND due_at <= %s ORDER BY due_at, seq "
    "LIMIT %s FOR UPDATE SKIP LOCKED) "
    "UPDATE tasks SET state = 'RUNNING', attempts = attempts + 1, fence = fence + 1, "
    "lease_owner = 'raw', lease_expires_at = %s, updated_at = %s "
    "FROM picked WHERE tasks.id = picked.id RETURNING tasks.id, tasks.fence"
)
COMPLETE = (
    "UPDATE tasks SET state = 'SUCCEEDED', result = 'null', lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = %s, finished_at = %s "
    "FROM unnest(%s::bigint[], %s::int[]) AS done(id, fence) "
    "WHERE tasks.id = done.id AND tasks.state = 'RUNNING' AND tasks.lease_owner = 'raw' "
    "AND tasks.fence = done.fence"
)


def reachable() -> bool:
    try:
        import psycopg  # noqa: PLC0415 - optional

        psycopg.connect(BASE_URL, connect_timeout=3).close()
    except Exception:  # no driver, no server: the PostgreSQL figures are left out
        return False
    return True


@contextlib.contextmanager
def schema() -> Iterator[str]:
    """A URL whose search path is a fresh schema, dropped on exit."""
    import psycopg  # noqa: PLC0415 - optional

    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(BASE_URL, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {name}")
    try:
        yield f"{BASE_URL}?options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(BASE_URL, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {name} CASCADE")


def _fill(url: str, n: int) -> None:
    store = PostgresStore(url)
    for start in range(0, n, 10_000):
        store.submit([NewTask("noop", {}, NOW, 1) for _ in range(min(10_000, n - start))], NOW)
    store.close()


def raw_loop(n: int, batch: int) -> float:
    """Claim ``batch`` tasks in one statement, complete them in another; tasks/s."""
    import psycopg  # noqa: PLC0415 - optional

    with schema() as url:
        _fill(url, n)
        lease = NOW + timedelta(seconds=30)
        with psycopg.connect(url, autocommit=True) as conn:
            done = 0
            start = time.perf_counter()
            while done < n:
                claimed = conn.execute(CLAIM, (NOW, batch, lease, NOW)).fetchall()
                conn.execute(COMPLETE, (NOW, NOW, [r[0] for r in claimed], [r[1] for r in claimed]))
                done += len(claimed)
            elapsed = time.perf_counter() - start
    return n / elapsed


def end_to_end(n: int, slots: int, processes: int) -> dict[str, float]:
    """No-op tasks/s through real worker processes, from the first claim to the last finish."""
    import psycopg  # noqa: PLC0415 - optional

    with schema() as url:
        _fill(url, n)
        children = [
            worker(url, "--burst", "--concurrency", str(slots), "--log-level", "warning")
            for _ in range(processes)
        ]
        for child in children:
            status, _cpu, _rss = child.wait_rusage()
            assert status == 0, f"worker exited {status}"
        with psycopg.connect(url) as conn:
            row: Any = conn.execute(
                "SELECT (SELECT min(at) FROM task_events WHERE state = 'RUNNING'), "
                "max(finished_at), count(*) FROM tasks WHERE state = 'SUCCEEDED'"
            ).fetchone()
    first, last, done = row
    assert done == n, f"only {done} of {n} tasks succeeded"
    return {"tasks_per_s": n / (last - first).total_seconds()}


def pickup(samples: int) -> dict[str, float]:
    """Submitted here, started by an idle worker in another process: p50 and p99 in ms."""
    with schema() as url:
        PostgresStore(url).close()
        child = worker(url, "--concurrency", "1", "--log-level", "warning")
        store = PostgresStore(url)
        scheduler = Scheduler(store)
        try:
            wait_done(scheduler, scheduler.submit("noop"), 30)  # the worker is up
            latencies = pickup_latencies(scheduler, samples)
        finally:
            store.close()
            child.stop()
    return {
        "pickup_p50_ms": median(latencies) * 1e3,
        "pickup_p99_ms": percentile(latencies, 99) * 1e3,
    }


#: How each peer's table says how many jobs wait, and how many are not finished.
PEER_COUNTS = {
    "pgqueuer": ("SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FROM pgqueuer"),
    "procrastinate": (
        "SELECT count(*) FILTER (WHERE status = 'todo'), "
        "count(*) FILTER (WHERE status IN ('todo', 'doing')) FROM procrastinate_jobs"
    ),
}


def peer(name: str, n: int, processes: int, concurrency: int) -> float:
    """A peer's own workers draining N no-op jobs: jobs/s from the first pick to the last finish.

    Timed by polling the peer's own table, as the huey figure is.
    """
    import psycopg  # noqa: PLC0415 - optional

    def run(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # noqa: S603 - the peer through its own API
            [sys.executable, "-m", "benchmarks.pg_peers_app", name, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def finish(proc: subprocess.Popen[bytes]) -> None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-2000:]

    with schema() as url:
        finish(run("install", url))
        finish(run("enqueue", url, str(n)))
        workers = [run("work", url, str(concurrency)) for _ in range(processes)]
        first = last = None
        with psycopg.connect(url, autocommit=True) as conn:
            end = time.monotonic() + 600
            while time.monotonic() < end:
                row: Any = conn.execute(PEER_COUNTS[name]).fetchone()
                waiting, unfinished = row
                now = time.perf_counter()
                if first is None and waiting < n:
                    first = now
                if unfinished == 0:
                    last = now
                    break
                time.sleep(0.002)
        for proc in workers:
            if proc.poll() is None:
                proc.terminate()
            proc.communicate(timeout=30)  # reaps it and closes its pipe
    assert first is not None and last is not None, f"{name} did not finish"
    return n / (last - first)
