"""The metrics figures: one scrape of a 1,000,000-task database, SQLite and PostgreSQL
(issue 28: under 0.5 s on both), and what it costs a busy worker to be scraped every
second.

``python -m benchmarks.metrics [--tasks N] [--recent N] [--scrapes K] [--busy N] [--pg]``

The SQLite file is written with the driver (a month of finished history: a
submission, a claim and an outcome line per task, as a worker writes them), with
``--recent`` of those tasks finished in the last hour, and the attempt totals those
outcomes would have added (``durablesched_attempt_totals``, over its shards); with
``--pg``, the same tasks and totals go into a fresh schema of the benchmark server
(``benchmarks.pg``). Then ``metrics_text`` is timed on each. ``--busy`` tasks are then
run by a worker process with and without a scraper thread (one scrape a second) on
the SQLite file.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from durablesched import PostgresStore, Scheduler, SQLiteStore, SystemClock
from durablesched.metrics import metrics_text
from durablesched.store.protocol import Store
from durablesched.store.sql.codec import to_db_time
from durablesched.totals import SHARDS, Tally, bucket_of
from durablesched.totals import add as add_to

from .common import fresh, median, run_rate_since, worker

NAMES = [f"task.{i}" for i in range(20)]
QUEUES = ["default", "mail", "reports"]


def build(path: Path, tasks: int, recent: int) -> None:
    """``tasks`` finished tasks (``recent`` of them in the last hour) and their history."""
    SQLiteStore(fresh(path)).close()  # the schema, at head
    now = datetime.now(UTC)
    rng = random.Random(tasks)
    conn = sqlite3.connect(path)
    tallies: list[Tally] = [{} for _ in range(SHARDS)]
    with conn:
        task_rows = []
        event_rows = []
        for i in range(1, tasks + 1):
            old = i <= tasks - recent
            ago = rng.uniform(3700, 30 * 86400) if old else rng.uniform(1, 3500)
            started = now - timedelta(seconds=ago)
            ran = timedelta(seconds=rng.expovariate(20))
            ended = started + ran
            failed = rng.random() < 0.02
            state = "FAILED" if failed else "SUCCEEDED"
            us = int(ran.total_seconds() * 1_000_000)
            key = (QUEUES[i % len(QUEUES)], NAMES[i % len(NAMES)], state.lower(), bucket_of(us))
            add_to(tallies[i % SHARDS], key, us)
            created = started - timedelta(seconds=rng.uniform(0, 2))
            task_rows.append(
                (
                    i,
                    i,
                    NAMES[i % len(NAMES)],
                    "{}",
                    state,
                    to_db_time(created),
                    1,
                    1,
                    1,
                    to_db_time(created),
                    to_db_time(ended),
                    to_db_time(ended),
                    QUEUES[i % len(QUEUES)],
                )
            )
            event_rows += [
                (i, to_db_time(created), "PENDING", 0, "submitted"),
                (i, to_db_time(started), "RUNNING", 1, "claimed by w from queue default"),
                (i, to_db_time(ended), state, 1, "bad" if failed else None),
            ]
            if len(task_rows) == 100_000:
                _insert(conn, task_rows, event_rows)
                task_rows, event_rows = [], []
        _insert(conn, task_rows, event_rows)
        conn.executemany(
            "INSERT INTO durablesched_attempt_totals VALUES (?,?,?,?,?,?,?)", totals_rows(tallies)
        )
        conn.execute("UPDATE durablesched_counters SET value = ? WHERE name = 'task_seq'", (tasks,))
        for q in QUEUES[1:]:
            conn.execute("INSERT OR IGNORE INTO durablesched_queues (name) VALUES (?)", (q,))
    conn.execute("ANALYZE")
    conn.close()


def totals_rows(tallies: list[Tally]) -> list[tuple[Any, ...]]:
    """(queue, name, outcome, bucket, shard, attempts, duration_us) rows of each shard."""
    return [
        (*key, shard, n, us)
        for shard, tally in enumerate(tallies)
        for key, (n, us) in sorted(tally.items())
    ]


def build_postgres(url: str, tasks: int) -> None:
    """``tasks`` finished tasks (every 50th FAILED) in 3 queues and 20 names, a few live
    ones, and their attempt totals, written by the server itself (generate_series)."""
    import psycopg  # noqa: PLC0415 - optional

    PostgresStore(url).close()  # the schema, at head
    rng = random.Random(tasks)
    tallies: list[Tally] = [{} for _ in range(SHARDS)]
    for i in range(1, tasks + 1):
        us = int(rng.expovariate(20) * 1_000_000)
        state = "failed" if i % 50 == 0 else "succeeded"
        key = (QUEUES[i % len(QUEUES)], NAMES[i % len(NAMES)], state, bucket_of(us))
        add_to(tallies[i % SHARDS], key, us)
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, "
            "fence, created_at, updated_at, finished_at, queue) "
            "SELECT i, i, 'task.' || (i %% 20), '{}', "
            "CASE WHEN i %% 50 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END, "
            "now() - make_interval(secs => i * 2.5), 1, 1, 1, "
            "now() - make_interval(secs => i * 2.5), now() - make_interval(secs => i * 2.5), "
            "now() - make_interval(secs => i * 2.5), "
            "(ARRAY['default', 'mail', 'reports'])[1 + i %% 3] "
            "FROM generate_series(1, %s::bigint) AS i",
            (tasks,),
        )
        conn.execute(
            "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, "
            "fence, created_at, updated_at, queue) "
            "SELECT i, i, 'task.' || (i %% 20), '{}', 'PENDING', now(), 0, 3, 0, now(), now(), "
            "(ARRAY['default', 'mail', 'reports'])[1 + i %% 3] "
            "FROM generate_series(%s::bigint, %s::bigint) AS i",
            (tasks + 1, tasks + 100),
        )
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO durablesched_attempt_totals VALUES (%s,%s,%s,%s,%s,%s,%s)",
                totals_rows(tallies),
            )
        conn.execute(
            "UPDATE durablesched_counters SET value = %s WHERE name = 'task_seq'",
            (tasks + 100,),
        )
        conn.execute("ANALYZE")


def _insert(conn: sqlite3.Connection, tasks: list[Any], events: list[Any]) -> None:
    conn.executemany(
        "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence, "
        "created_at, updated_at, finished_at, queue) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        tasks,
    )
    events.sort(key=lambda e: e[1])  # the history is written in time order
    conn.executemany(
        "INSERT INTO task_events (task_id, at, state, attempt, detail) VALUES (?,?,?,?,?)",
        events,
    )


def scrape_seconds(store: Store, scrapes: int) -> list[float]:
    times = []
    for _ in range(scrapes):
        start = time.perf_counter()
        text = metrics_text(store)
        times.append(time.perf_counter() - start)
        assert b"durablesched_attempts_total" in text
    return times


def busy_rate(path: Path, n: int, *, scraped: bool) -> float:
    """No-op tasks/s of one worker process (8 slots, durability normal) on ``path``,
    with or without a scrape a second meanwhile."""
    store = SQLiteStore(path, durability="normal")
    Scheduler(store).submit_many("noop", [{} for _ in range(n)])
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(1.0):
            metrics_text(store)

    scraper = threading.Thread(target=scrape) if scraped else None
    started = SystemClock().now()
    if scraper is not None:
        scraper.start()
    child = worker(
        path, "--burst", "--concurrency", "8", "--log-level", "warning", durability="normal"
    )
    status, _cpu, _rss = child.wait_rusage()
    stop.set()
    if scraper is not None:
        scraper.join()
    assert status == 0
    return run_rate_since(store, started, n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--recent", type=int, default=36_000, help="finished in the last hour")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="tasks a worker runs, scraped or not")
    parser.add_argument("--runs", type=int, default=3, help="busy runs of each kind")
    parser.add_argument("--pg", action="store_true", help="also on PostgreSQL (benchmarks.pg)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.db"
        start = time.perf_counter()
        build(path, args.tasks, args.recent)
        print(
            f"built {args.tasks:,} tasks ({args.recent:,} in the last hour) "
            f"in {time.perf_counter() - start:.1f}s, {path.stat().st_size / 2**20:.0f} MiB"
        )
        store = SQLiteStore(path)
        try:
            times = scrape_seconds(store, args.scrapes)
        finally:
            store.close()
        print(
            f"scrape, SQLite: median {median(times) * 1000:.0f} ms, "
            f"max {max(times) * 1000:.0f} ms over {args.scrapes}"
        )
        if args.pg:
            from benchmarks import pg  # noqa: PLC0415 - optional: psycopg and a server

            with pg.schema() as url:
                start = time.perf_counter()
                build_postgres(url, args.tasks)
                took = time.perf_counter() - start
                print(f"built {args.tasks:,} tasks on PostgreSQL in {took:.1f}s")
                pg_store = PostgresStore(url)
                try:
                    times = scrape_seconds(pg_store, args.scrapes)
                finally:
                    pg_store.close()
                print(
                    f"scrape, PostgreSQL: median {median(times) * 1000:.0f} ms, "
                    f"max {max(times) * 1000:.0f} ms over {args.scrapes}"
                )
        if args.busy:
            for _ in range(args.runs):
                plain = busy_rate(path, args.busy, scraped=False)
                scraped = busy_rate(path, args.busy, scraped=True)
                print(
                    f"busy worker: {plain:.0f} tasks/s alone, {scraped:.0f} tasks/s "
                    "scraped every second"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
