"""Issue 21's dashboard figures: each page's server time on a 1,000,000-task database
(SQLite, and PostgreSQL), what each of the list's indexes costs a busy worker, and
what an open dashboard costs one.

``python -m benchmarks.dashboard [--tasks N] [--requests K] [--db PATH] [--pg]
[--busy N] [--runs R]``

The database holds a month of history written as a worker writes it (a submission, a
claim and an outcome line per task), ``--recent`` tasks of it in the last hour, a
tenth of the tasks with an idempotency key, 2 % failed, and a few thousand waiting
and running. With ``--db PATH`` the SQLite file is kept there and reused when it
already holds as many tasks. Each page is asked for ``--requests`` times through
the app in this process (Starlette's test client: the server's own time, the
network left out), after two to warm up; p50 and p95 are printed per page.
``--busy N`` then runs N no-op tasks with one worker process on a fresh file with
and without each index of migration 0009, and with and without a dashboard open
(its overview's live part fetched every 2 s, as the page does).
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from durablesched import PostgresStore, Scheduler, SQLiteStore, SystemClock
from durablesched.dashboard import filters
from durablesched.records import Outcome
from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.store import SQLStore

from .common import fresh, median, percentile, run_rate_since, worker

NAMES = [f"task.{i}" for i in range(20)]
QUEUES = ["default", "mail", "reports"]
#: The indexes of migration 0009, each with its columns.
INDEXES = {
    "ix_tasks_created": "(created_at, id)",
    "ix_tasks_state_created": "(state, created_at, id) WHERE state IN (CANCELLED, FAILED, ...)",
    "ix_tasks_queue_created": "(queue, created_at, id)",
    "ix_tasks_name_created": "(name, created_at, id)",
    "ix_tasks_key": "(idempotency_key) WHERE idempotency_key IS NOT NULL",
}
#: Live tasks: PENDING ones waiting in each queue, and RUNNING ones under a lease.
PENDING, RUNNING = 3_000, 30


def _rows(tasks: int, recent: int, now: datetime) -> Iterator[tuple[list[Any], list[Any]]]:
    """The task and history rows, 100,000 tasks at a time, ids in creation order."""
    rng = random.Random(tasks)
    # Creation times ascend with the id, as a single submitter makes them.
    ages = sorted((rng.uniform(3700, 30 * 86400) for _ in range(tasks - recent)), reverse=True)
    ages += sorted((rng.uniform(1, 3500) for _ in range(recent)), reverse=True)
    task_rows: list[Any] = []
    event_rows: list[Any] = []
    live_from = tasks - PENDING - RUNNING
    for i in range(1, tasks + 1):
        created = now - timedelta(seconds=ages[i - 1])
        started = created + timedelta(seconds=rng.uniform(0, 2))
        ended = started + timedelta(seconds=rng.expovariate(20))
        key = f"order-{i}" if i % 10 == 0 else None
        if i > live_from:
            running = i > tasks - RUNNING
            state = "RUNNING" if running else "PENDING"
            task_rows.append(
                (i, NAMES[i % 20], state, created, int(running), None, key, QUEUES[i % 3])
            )
            event_rows.append((i, created, "PENDING", 0, "submitted", None))
            if running:
                event_rows.append((i, started, "RUNNING", 1, "claimed by w from queue x", None))
        else:
            failed = rng.random() < 0.02
            state = "FAILED" if failed else "SUCCEEDED"
            task_rows.append((i, NAMES[i % 20], state, created, 1, ended, key, QUEUES[i % 3]))
            event_rows += [
                (i, created, "PENDING", 0, "submitted", None),
                (i, started, "RUNNING", 1, "claimed by w from queue default", None),
                (i, ended, state, 1, "bad" if failed else None, '{"type": "E", '
                 '"message": "bad", "traceback": "Traceback"}' if failed else None),
            ]  # fmt: skip
        if len(task_rows) == 100_000 or i == tasks:
            yield task_rows, event_rows
            task_rows, event_rows = [], []


def build_sqlite(path: Path, tasks: int, recent: int) -> None:
    """The SQLite file, written with the driver (seconds for a million tasks)."""
    SQLiteStore(fresh(path)).close()  # the schema, at head
    now = datetime.now(UTC)
    conn = sqlite3.connect(path)
    with conn:
        for task_rows, event_rows in _rows(tasks, recent, now):
            conn.executemany(
                "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, "
                "max_attempts, fence, lease_owner, lease_expires_at, created_at, updated_at, "
                "finished_at, idempotency_key, queue) VALUES "
                "(?, ?, ?, '{}', ?, ?, ?, 3, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (i, i, name, state, to_db_time(at), n, n,
                     "w" if state == "RUNNING" else None,
                     to_db_time(now + timedelta(hours=1)) if state == "RUNNING" else None,
                     to_db_time(at), to_db_time(end or at),
                     None if end is None else to_db_time(end), key, queue)
                    for i, name, state, at, n, end, key, queue in task_rows
                ],
            )  # fmt: skip
            event_rows.sort(key=lambda e: e[1])  # the history is written in time order
            conn.executemany(
                "INSERT INTO task_events (task_id, at, state, attempt, detail, error) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(e[0], to_db_time(e[1]), *e[2:]) for e in event_rows],
            )
        conn.execute("UPDATE durablesched_counters SET value = ? WHERE name = 'task_seq'", (tasks,))
        for q in QUEUES[1:]:
            conn.execute("INSERT OR IGNORE INTO durablesched_queues (name) VALUES (?)", (q,))
    conn.execute("ANALYZE")
    conn.close()


def build_postgres(url: str, tasks: int, recent: int) -> None:
    """The same database on PostgreSQL, copied in with COPY."""
    import psycopg  # noqa: PLC0415 - the PostgreSQL figures only

    PostgresStore(url).close()
    now = datetime.now(UTC)
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        for task_rows, event_rows in _rows(tasks, recent, now):
            with conn.cursor().copy(
                "COPY tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence, "
                "lease_owner, lease_expires_at, created_at, updated_at, finished_at, "
                "idempotency_key, queue) FROM STDIN"
            ) as copy:
                for i, name, state, at, n, end, key, queue in task_rows:
                    running = state == "RUNNING"
                    copy.write_row((i, i, name, "{}", state, at, n, 3, n,
                                    "w" if running else None,
                                    now + timedelta(hours=1) if running else None,
                                    at, end or at, end, key, queue))  # fmt: skip
            event_rows.sort(key=lambda e: e[1])
            with conn.cursor().copy(
                "COPY task_events (task_id, at, state, attempt, detail, error) FROM STDIN"
            ) as copy:
                for row in event_rows:
                    copy.write_row(row)
        conn.execute("SELECT setval('durablesched_task_seq', %s)", (tasks,))
        for q in QUEUES[1:]:
            conn.execute(
                "INSERT INTO durablesched_queues (name) VALUES (%s) ON CONFLICT DO NOTHING", (q,)
            )
        conn.execute("ANALYZE")


def pages(store: SQLStore, tasks: int) -> dict[str, str]:
    """Each page and list the benchmark asks for, by label."""
    middle = store.get(tasks // 2)
    assert middle is not None
    cursor = filters.cursor(middle.created_at, middle.id)
    old = middle.created_at
    window = (old - timedelta(hours=1), old)
    fmt = "%Y-%m-%dT%H:%M:%S"
    failed = next(iter(store.find_tasks(_query("FAILED"), 1)))
    end = {"after": filters.LAST_PAGE}

    def through_older(state: str) -> str:
        """The last page as the 'older' links reach it: before the tenth oldest task."""
        tenth = store.find_tasks(_query(state, after=True), 10)[0]
        return urlencode({"state": state, "before": filters.cursor(tenth.created_at, tenth.id)})

    return {
        "overview": "/",
        "overview (live part)": "/?fragment=1",
        "tasks": "/tasks",
        "tasks, page 10,000 deep": f"/tasks?before={cursor}",
        "tasks by state (FAILED)": "/tasks?state=FAILED",
        "tasks by state (PENDING)": "/tasks?state=PENDING",
        "tasks by state (SUCCEEDED)": "/tasks?state=SUCCEEDED",
        "tasks by state (CANCELLED: none)": "/tasks?state=CANCELLED",
        "tasks by state (RUNNING)": "/tasks?state=RUNNING",
        "tasks, the last page (oldest)": f"/tasks?{urlencode(end)}",
        "tasks by state (PENDING), the last page (oldest)": (
            f"/tasks?{urlencode({'state': 'PENDING', **end})}"
        ),
        "tasks by state (PENDING), the last page through older": (
            f"/tasks?{through_older('PENDING')}"
        ),
        "tasks by state (SUCCEEDED), the last page (oldest)": (
            f"/tasks?{urlencode({'state': 'SUCCEEDED', **end})}"
        ),
        "tasks by state (SUCCEEDED), the last page through older": (
            f"/tasks?{through_older('SUCCEEDED')}"
        ),
        "tasks by queue, the last page (oldest)": f"/tasks?{urlencode({'queue': 'mail', **end})}",
        "tasks by queue": "/tasks?queue=mail",
        "tasks by name": "/tasks?name=task.7",
        "tasks by name and state": "/tasks?name=task.7&state=FAILED",
        "tasks by key": f"/tasks?key=order-{tasks // 2 // 10 * 10}",
        "tasks created in an old hour": (
            f"/tasks?created_from={window[0]:{fmt}}&created_until={window[1]:{fmt}}"
        ),
        "task (failed, with history)": f"/tasks/{failed.id}",
        "queues": "/queues",
        "schedules": "/schedules",
        "workers": "/workers",
        "metrics (Prometheus, 1 h)": "/metrics",
    }


def _query(state: str, *, after: bool = False) -> Any:
    from durablesched.records import OLDEST, TaskQuery  # noqa: PLC0415
    from durablesched.states import TaskState  # noqa: PLC0415

    return TaskQuery(state=TaskState(state), after=OLDEST if after else None)


def time_pages(store: SQLStore, tasks: int, requests: int) -> dict[str, tuple[float, float, float]]:
    """The first request's time, then p50 and p95 (ms) of each page's server time (the
    overview's first reads the whole hour of history; later ones what settled since)."""
    from starlette.testclient import TestClient  # noqa: PLC0415 - the test extra

    from durablesched.dashboard import create_app  # noqa: PLC0415 - the dashboard extra

    figures = {}
    with TestClient(create_app(store), base_url="http://localhost") as client:
        for label, path in pages(store, tasks).items():
            times = []
            for n in range(requests + 2):
                start = time.perf_counter()
                answer = client.get(path)
                elapsed = time.perf_counter() - start
                assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
                if n == 0:
                    first = elapsed * 1000
                if n >= 2:
                    times.append(elapsed * 1000)
            figures[label] = (first, median(times), percentile(times, 95))
    return figures


def print_pages(title: str, figures: dict[str, tuple[float, float, float]]) -> None:
    print(f"\n{title}\n| page | p50 ms | p95 ms | first ms |\n| --- | --- | --- | --- |")
    for label, (first, p50, p95) in figures.items():
        print(f"| {label} | {p50:.1f} | {p95:.1f} | {first:.1f} |")


# -- what the indexes and an open dashboard cost a busy worker ---------------------------


def busy_rate(path: Path, n: int, *, poll: Callable[[], None] | None = None) -> tuple[float, float]:
    """(submit_many tasks/s, no-op tasks/s of one worker process with 8 slots, durability
    normal) on ``path``, with ``poll`` called every 2 s meanwhile if given."""
    store = SQLiteStore(path, durability="normal")
    start = time.perf_counter()
    scheduler = Scheduler(store)
    for _ in range(n // 1000):
        scheduler.submit_many("noop", [{} for _ in range(1000)])
    submitted = n / (time.perf_counter() - start)
    stop = threading.Event()

    def poller() -> None:
        while not stop.wait(2.0):
            assert poll is not None
            poll()

    thread = threading.Thread(target=poller) if poll is not None else None
    started = SystemClock().now()
    if thread is not None:
        thread.start()
    child = worker(path, "--burst", "--concurrency", "8", "--log-level", "warning",
                   durability="normal")  # fmt: skip
    status, _cpu, _rss = child.wait_rusage()
    stop.set()
    if thread is not None:
        thread.join()
    assert status == 0
    return submitted, run_rate_since(store, started, n)


def with_indexes(path: Path, kept: set[str]) -> Path:
    """A fresh file at head with only ``kept`` of the dashboard's indexes."""
    SQLiteStore(fresh(path)).close()
    conn = sqlite3.connect(path)
    for name in INDEXES:
        if name not in kept:
            conn.execute(f"DROP INDEX {name}")
    conn.commit()
    conn.close()
    return path


def store_rate(path: Path, n: int) -> tuple[float, float]:
    """(submit_many tasks/s, tasks/s through a worker's store calls) on ``path``: the
    claim and group commits of 8 outcomes a busy worker with 8 slots makes, in this
    process and one thread (durability normal), without running any task. What the
    indexes change is this work; a worker process's own rate varies by more than
    they cost from one run to the next on this machine."""
    store = SQLiteStore(path, durability="normal")
    scheduler = Scheduler(store)
    start = time.perf_counter()
    for _ in range(n // 1000):
        scheduler.submit_many("noop", [{} for _ in range(1000)])
    submitted = n / (time.perf_counter() - start)
    now, lease = SystemClock().now(), timedelta(seconds=60)
    start = time.perf_counter()
    claims = store.claim("busy", 8, now, lease)
    done = 0
    while claims:
        done += len(claims)
        outcomes = [Outcome(c, result=None) for c in claims]
        _, claims = store.record_and_claim(outcomes, now, owner="busy", limit=8, lease=lease)
    ran = done / (time.perf_counter() - start)
    store.close()
    assert done == n, f"{done} of {n}"
    return submitted, ran


def index_costs(tmp: Path, n: int, runs: int) -> None:
    """Each index alone against none of them, and all of them: rates and their cost."""
    configs = {"none": set(), **{name: {name} for name in INDEXES}, "all": set(INDEXES)}
    rates: dict[str, list[tuple[float, float]]] = {label: [] for label in configs}
    for _ in range(runs):  # interleaved, so drift in the machine's speed hits each alike
        for label, kept in configs.items():
            rates[label].append(store_rate(with_indexes(tmp / "busy.db", kept), n))
    base_submit = median([r[0] for r in rates["none"]])
    base_run = median([r[1] for r in rates["none"]])
    print(f"\na busy worker's store calls, {n:,} tasks, {runs} runs each (medians)")
    print("| indexes | submit_many tasks/s | cost | claim + group commit tasks/s | cost |")
    print("| --- | --- | --- | --- | --- |")
    for label in configs:
        submit = median([r[0] for r in rates[label]])
        run = median([r[1] for r in rates[label]])
        print(
            f"| {label} | {submit:,.0f} | {100 * (1 - submit / base_submit):+.1f} % | "
            f"{run:,.0f} | {100 * (1 - run / base_run):+.1f} % |"
        )


def open_dashboard_cost(tmp: Path, n: int, runs: int) -> None:
    """A busy worker alone, and with a dashboard's overview polled every 2 s, in pairs
    whose order alternates; the figure is the median of the pairs' ratios (the
    worker's own rate drifts by more than the cost between runs, a pair much less)."""
    from starlette.testclient import TestClient  # noqa: PLC0415 - the test extra

    from durablesched.dashboard import create_app  # noqa: PLC0415

    def one(watched: bool) -> float:
        path = with_indexes(tmp / "busy.db", set(INDEXES))
        if not watched:
            return busy_rate(path, n)[1]
        store = SQLiteStore(path)
        client = TestClient(create_app(store), base_url="http://localhost")

        def poll() -> None:
            client.get("/?fragment=1")

        try:
            return busy_rate(path, n, poll=poll)[1]
        finally:
            store.close()

    alone, watched = [], []
    for i in range(runs):
        if i % 2:
            watched.append(one(True))
            alone.append(one(False))
        else:
            alone.append(one(False))
            watched.append(one(True))
    ratios = sorted(w / a for a, w in zip(alone, watched, strict=True))
    print(
        f"\nbusy worker process: {median(alone):,.0f} tasks/s alone, {median(watched):,.0f} "
        f"with the overview open; open/alone by pair: median {median(ratios):.3f} "
        f"(cost {100 * (1 - median(ratios)):.1f} %), from {ratios[0]:.3f} to {ratios[-1]:.3f} "
        f"over {runs} pairs"
    )


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A schema of its own on the benchmark's server, dropped afterwards."""
    import psycopg  # noqa: PLC0415

    from .pg import BASE_URL  # noqa: PLC0415

    schema = f"dash_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(BASE_URL, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        sep = "&" if "?" in BASE_URL else "?"
        yield f"{BASE_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(BASE_URL, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--recent", type=int, default=36_000, help="finished in the last hour")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per page")
    parser.add_argument("--db", type=Path, help="keep (and reuse) the SQLite file here")
    parser.add_argument("--pg", action="store_true", help="PostgreSQL too")
    parser.add_argument("--busy", type=int, default=0, help="tasks a busy worker runs")
    parser.add_argument("--runs", type=int, default=3, help="busy runs of each kind")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ResourceWarning)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "dashboard.db"
        if not _holds(path, args.tasks):
            start = time.perf_counter()
            build_sqlite(path, args.tasks, min(args.recent, args.tasks // 2))
            print(f"built {args.tasks:,} tasks in SQLite in {time.perf_counter() - start:.0f}s")
        store = SQLiteStore(path)
        try:
            print_pages(
                f"SQLite, {args.tasks:,} tasks", time_pages(store, args.tasks, args.requests)
            )
        finally:
            store.close()
        if args.pg:
            with postgres_schema() as url:
                start = time.perf_counter()
                build_postgres(url, args.tasks, min(args.recent, args.tasks // 2))
                took = time.perf_counter() - start
                print(f"\nbuilt {args.tasks:,} tasks in PostgreSQL in {took:.0f}s")
                pg = PostgresStore(url)
                try:
                    figures = time_pages(pg, args.tasks, args.requests)
                    print_pages(f"PostgreSQL, {args.tasks:,} tasks", figures)
                finally:
                    pg.close()
        if args.busy:
            index_costs(Path(tmp), args.busy, args.runs)
            open_dashboard_cost(Path(tmp), args.busy, args.runs)
    return 0


def _holds(path: Path, tasks: int) -> bool:
    """Whether ``path`` is a dashboard benchmark file of ``tasks`` tasks already."""
    if not path.exists():
        return False
    conn = sqlite3.connect(path)
    try:
        (count,) = conn.execute("SELECT max(id) FROM tasks").fetchone()
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return bool(count == tasks)


if __name__ == "__main__":
    raise SystemExit(main())
