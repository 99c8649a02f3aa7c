"""The raw SQLite limit: stdlib sqlite3 on durablesched's own schema and pragmas."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from durablesched import SQLiteStore
from durablesched.records import NewTask
from durablesched.sqlite import SYNCHRONOUS, to_db_time

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
