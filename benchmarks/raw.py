"""The raw SQLite limit: stdlib sqlite3 on durablesched's own schema and pragmas."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from durablesched import SQLiteStore
from durablesched.records import TASK_KEY_PREFIX, NewTask
from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.sqlite import SQLITE, SYNCHRONOUS
from durablesched.store.sql.statements import SQL_QUEUES

from .common import NOW

CLAIM = (
    "UPDATE tasks SET state = 'RUNNING', attempts = attempts + 1, fence = fence + 1, "
    "lease_owner = 'raw', lease_expires_at = ?, updated_at = ? "
    "WHERE id IN (SELECT id FROM tasks INDEXED BY ix_tasks_claimable "
    "WHERE state IN ('PENDING', 'RETRY_WAIT') AND due_at <= ? ORDER BY due_at, seq LIMIT ?) "
    "RETURNING id, fence"
)
COMPLETE = (
    "UPDATE tasks SET state = 'SUCCEEDED', result = 'null', lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = ?, finished_at = ? "
    "WHERE id = ? AND state = 'RUNNING' AND lease_owner = 'raw' AND fence = ?"
)


def prepare(path: Path, n: int) -> None:
    store = SQLiteStore(path)
    store.submit([NewTask("noop", {}, NOW, 1) for _ in range(n)], NOW)
    store.close()


def claim_complete_loop(path: Path, n: int, batch: int, durability: str) -> float:
    """Claim ``batch`` tasks in one transaction, complete them in another; tasks/s."""
    prepare(path, n)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
    now = to_db_time(NOW)
    done = 0
    start = time.perf_counter()
    while done < n:
        conn.execute("BEGIN IMMEDIATE")
        claimed = conn.execute(CLAIM, (now, now, now, batch)).fetchall()
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(COMPLETE, [(now, now, task_id, fence) for task_id, fence in claimed])
        conn.execute("COMMIT")
        done += len(claimed)
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def our_statements_loop(path: Path, n: int, batch: int, durability: str) -> float:
    """durablesched's own group commit, statement for statement, with no Python around it.

    Each transaction records the previous batch's successes (the fenced UPDATE,
    their idempotency keys and history lines) and claims the next batch (with
    its history lines), as a worker's group commit does: the ceiling of what
    durablesched writes per task, against which the raw loops write no history
    and no keys. Tasks/s.
    """
    prepare(path, n)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
    conn.execute("PRAGMA foreign_keys = ON")
    now = to_db_time(NOW)
    claim = {
        "owner": "raw",
        "lease_expires_at": "9999",
        "now": now,
        "started": now,  # into a free slot: started as claimed (no claim ahead)
        "limit": batch,
        "q0": "default",
        "l0": batch,
    }
    done = 0
    held: list[tuple[int, int]] = []
    start = time.perf_counter()
    while True:
        conn.execute("BEGIN IMMEDIATE")
        if held:
            outcomes = {str(i): {"o": "raw", "f": fence, "r": "null"} for i, fence in held}
            params = {"batch": json.dumps(outcomes), "now": now}
            # id, attempts, idempotency_key, result
            rows = conn.execute(SQLITE.complete_many, params).fetchall()
            conn.executemany(
                SQLITE.record_keys, [(f"{TASK_KEY_PREFIX}{r[0]}", r[0], now, r[3]) for r in rows]
            )
            conn.executemany(
                SQLITE.insert_events, [(r[0], now, "SUCCEEDED", r[1], None) for r in rows]
            )
            done += len(rows)
        # The claim reads the queues' limits first (none here), then claims.
        conn.execute(str(SQL_QUEUES)).fetchall()
        # id, seq, name, args, attempts, max_attempts, fence, due_at, idempotency_key, ...
        rows = conn.execute(SQLITE.claim_for(1, 0), claim).fetchall()
        conn.executemany(
            SQLITE.insert_events, [(r[0], now, "RUNNING", r[4], "claimed by raw") for r in rows]
        )
        conn.execute("COMMIT")
        held = [(r[0], r[6]) for r in rows]
        if not rows:
            break
    elapsed = time.perf_counter() - start
    conn.close()
    assert done == n, f"only {done} of {n} tasks recorded"
    return n / elapsed


def executemany_insert(path: Path, n: int) -> float:
    """Rows/s of a plain executemany into the tasks table, one transaction."""
    SQLiteStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = FULL")
    now = to_db_time(NOW)
    rows = [(i, i, "noop", "{}", "PENDING", now, 0, 1, 0, now, now) for i in range(1, n + 1)]
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed
