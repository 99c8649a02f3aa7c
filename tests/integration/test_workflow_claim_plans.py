"""Suspended workflows are never walked by a claim of a due task (issue 31's target:
sleeping and waiting workflows cost the claim of other tasks nothing), shown by what
each database does.

A workflow suspended waiting for a signal is PENDING, due at the end of time; a
sleeping one, due at its wake time: both in the claim's index (``ix_tasks_queue_claimable``,
priority DESC, due_at, seq), after every due task of their priority. A claim that
finds its tasks stops before them: SQLite's virtual machine steps and PostgreSQL's
index pages read do not grow with how many wait.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from durablesched.records import NewTask
from durablesched.states import TaskState
from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLITE, SQLiteStore
from durablesched.workflows.steps import FOREVER

from ..conftest import T0, at

LEASE = timedelta(minutes=10)
SUSPENDED = 20


def suspend_waiting(store: SQLiteStore | PostgresStore, waiting: int) -> None:
    """``SUSPENDED`` workflows claimed and suspended waiting for a signal, as
    ``ctx.wait_for_signal`` leaves them, then ``waiting`` more rows where those are (PENDING,
    due at the end of time; made in one submit, where suspending each costs a transaction)."""
    store.submit([NewTask("flow", {}, at(1), 3, None, None, "q") for _ in range(SUSPENDED)], T0)
    for claim in store.claim("w", SUSPENDED, at(2), LEASE, ["flow"]):
        assert (
            store.suspend(claim, FOREVER, at(2), detail="waiting", signal="go") is TaskState.PENDING
        )
    assert {t.due_at for t in store.list_tasks(name="flow")} == {FOREVER}
    store.submit([NewTask("flow", {}, FOREVER, 3, None, None, "q")] * waiting, at(3))
    store.submit([NewTask("job", {}, at(4), 3, None, None, "q")], at(4))
    # Due tasks of another queue: what other queues have, so that a walk of every due
    # row in due order is no cheaper a plan than the queue's own walk.
    store.submit([NewTask("job", {}, at(4), 3, None, None, "other")] * 3_000, at(4))


def sqlite_claim_steps(path: Path) -> int:
    """Virtual machine steps (in units of the progress handler's 100) of claiming the due
    task of queue q, rolled back."""
    conn = sqlite3.connect(path, isolation_level=None)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    now = to_db_time(at(10))
    params: dict[str, Any] = {
        "q0": "q",
        "l0": 1,
        "limit": 1,
        "owner": "w2",
        "now": now,
        "started": now,
        "lease_expires_at": to_db_time(at(40)),
    }
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.set_progress_handler(count, 100)
        rows = conn.execute(SQLITE.claim_for(1, 0), params).fetchall()
        conn.set_progress_handler(None, 100)
        assert [r[2] for r in rows] == ["job"]
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return steps


def test_sqlite_claim_does_not_walk_suspended_workflows(tmp_path: Path) -> None:
    costs = {}
    for waiting in (100, 5_000):
        path = tmp_path / f"waiting{waiting}.db"
        store = SQLiteStore(path)
        suspend_waiting(store, waiting)
        store.close()
        costs[waiting] = sqlite_claim_steps(path)
    # 50 times as many waiting, the same work (a walk would cost ~50 times more).
    assert costs[5_000] <= costs[100] * 1.2 + 5, costs


def test_postgres_claim_does_not_walk_suspended_workflows(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        suspend_waiting(store, 5_000)
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE tasks"))  # the suspensions' claims' dead rows
        arm = store.dialect.claim_for(1, 0).split("picked AS MATERIALIZED (", 1)[1]
        arm = arm.split(" FOR UPDATE SKIP LOCKED", 1)[0]
        sql = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + arm.replace("%(q0)s", "'q'").replace(
            "%(l0)s", "1"
        ).replace("%(now)s", f"'{at(10).isoformat()}'")
        with store.engine.connect() as conn:
            (plan,) = conn.execute(text(sql)).scalar_one()
    finally:
        store.close()
    scans: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"]:
            scans.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    assert [s.get("Index Name") for s in scans] == ["ix_tasks_queue_claimable"], scans
    (scan,) = scans
    assert scan["Actual Rows"] == 1 and scan.get("Rows Removed by Filter", 0) == 0, scan
    # The index's root, a leaf or two and the task's heap page; the 5,020 waiting rows
    # fill some 40 leaf pages that a walk through them would read.
    pages = scan["Shared Hit Blocks"] + scan["Shared Read Blocks"]
    assert pages <= 6, scan
