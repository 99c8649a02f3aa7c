"""The demo: a queue in a local SQLite file, two worker processes, one killed mid-task.

It submits tasks due over the next few seconds (some fail and retry, one fails
for good, one is cancelled while pending, one submits a child, one runs long),
starts two workers, kills with SIGKILL the one holding the long task, and shows
the other reclaiming and finishing it. It ends with the final state read
through the SQL views, and leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from durablesched import Scheduler, SQLiteStore, TaskState

HERE = Path(__file__).resolve().parent
DB = Path.cwd() / "durablesched-demo.db"
LEASE = "2"
DEADLINE = 60.0


def start_worker(name: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - our own command with fixed arguments
        [
            sys.executable,
            "-m",
            "durablesched",
            "worker",
            "--db",
            str(DB),
            "--app",
            "demo_app:registry",
            "--concurrency",
            "2",
            "--lease",
            LEASE,
            "--grace",
            "5",
        ],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def main() -> int:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{DB}{suffix}").unlink(missing_ok=True)
    store = SQLiteStore(DB)
    scheduler = Scheduler(store)
    started = time.monotonic()
    names: dict[int, str] = {}

    def submit(label: str, name: str, args: dict[str, object], **kw: object) -> int:
        task_id = scheduler.submit(name, args, **kw)  # type: ignore[arg-type]
        names[task_id] = label
        return task_id

    print(f"queue file: {DB}\n")
    long_id, cancel_id = submit_all(submit)
    print(f"cancel task {cancel_id} while pending: {scheduler.cancel(cancel_id)}\n")

    logs = [DB.parent / f"durablesched-demo-worker-{i}.log" for i in (1, 2)]
    workers = [start_worker(f"w{i}", log) for i, log in enumerate(logs, 1)]
    seen_events = 0
    killed = False
    try:
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            seen_events = print_new_events(store, names, seen_events, started)
            long_task = scheduler.get(long_id)
            if not killed and long_task.state is TaskState.RUNNING and long_task.lease_owner:
                pid = int(long_task.lease_owner.split(":")[1])
                victim = next(w for w in workers if w.pid == pid)
                victim.send_signal(signal.SIGKILL)
                victim.wait(10)
                killed = True
                print(
                    f"{time.monotonic() - started:6.2f}s  SIGKILL worker pid {pid} while it holds "
                    f"task {long_id} (long job); its lease ({LEASE}s) will expire"
                )
            live = [t for t in scheduler.list_tasks(limit=1000) if t.state not in _FINAL]
            if not live and killed:
                break
            time.sleep(0.1)  # the demo polls the file to print a live timeline
        print_new_events(store, names, seen_events, started)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        store.close()

    show_final_state(long_id)
    long_task_state = _final_state(long_id)
    print(f"\nthe long job was reclaimed and finished by the surviving worker: {long_task_state}")
    print(f"worker logs: {', '.join(str(p) for p in logs)}")
    return 0 if long_task_state == "SUCCEEDED" else 1


def submit_all(submit: Callable[..., int]) -> tuple[int, int]:
    """Tasks due over the next few seconds; returns the long job's id and the one to cancel."""
    submit("greet ada", "greet", {"who": "ada"}, delay=0.5)
    submit("greet bob", "greet", {"who": "bob"}, delay=1.0)
    submit("flaky", "flaky", {})
    submit("doomed", "doomed", {}, max_attempts=2)
    submit("parent", "parent", {"items": 3}, delay=1.5)
    long_id = submit("long job", "long_job", {"seconds": 30})
    cancel_id = submit("cancel me", "greet", {"who": "nobody"}, delay=3)
    return long_id, cancel_id


def show_final_state(long_id: int) -> None:
    print("\nfinal state, through the SQL views:\n")
    with sqlite3.connect(DB) as conn:
        print_query(conn, "SELECT state, tasks FROM queue_summary ORDER BY state")
        print()
        print_query(conn, "SELECT id, name, state, attempts, result FROM tasks ORDER BY id")
        print()
        print_query(conn, "SELECT id, name, attempts, error_type, error_message FROM tasks_failed")
        print()
        # The id is written into the statement (an int, never text) so that the
        # line shown is the query as you would type it into sqlite3.
        print_query(
            conn,
            f"SELECT task_id, state, attempt, detail FROM task_events "
            f"WHERE task_id = {long_id:d} ORDER BY id",
        )


_FINAL = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}


def _final_state(task_id: int) -> str:
    with sqlite3.connect(DB) as conn:
        return str(conn.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()[0])


def print_new_events(store: SQLiteStore, names: dict[int, str], seen: int, started: float) -> int:
    with sqlite3.connect(DB) as conn:
        rows = conn.execute(
            "SELECT id, task_id, state, attempt, detail FROM task_events WHERE id > ? ORDER BY id",
            (seen,),
        ).fetchall()
    for event_id, task_id, state, attempt, detail in rows:
        label = names.get(task_id, "child")
        extra = f"  ({detail})" if detail else ""
        print(
            f"{time.monotonic() - started:6.2f}s  task {task_id:>2} {label:<10} "
            f"{state:<10} attempt {attempt}{extra}"
        )
        seen = event_id
    return seen


def print_query(conn: sqlite3.Connection, sql: str) -> None:
    """Print ``sql`` as typed at the sqlite3 prompt, then its rows as a table."""
    cursor = conn.execute(sql)
    headers = [d[0] for d in cursor.description]
    rows = [["-" if v is None else str(v) for v in row] for row in cursor.fetchall()]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    print("sqlite> " + sql)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    raise SystemExit(main())
