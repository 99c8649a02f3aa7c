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
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLITE, SQLiteStore
from durablesched.workflows.steps import FOREVER

from ..conftest import T0, at
from .claim_steps import sqlite_claim

LEASE = timedelta(minutes=10)
SUSPENDED = 20


def suspend_waiting(store: SQLiteStore | PostgresStore, waiting: int, delayed: int = 0) -> None:
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
    # Tasks delayed for an hour at a higher priority than the due task: ahead of it in the
    # index, none of them due.
    store.submit([NewTask("later", {}, at(3600), 3, None, None, "q", 5)] * delayed, at(4))
    # Due tasks of another queue: what other queues have, so that a walk of every due
    # row in due order is no cheaper a plan than the queue's own walk.
    store.submit([NewTask("job", {}, at(4), 3, None, None, "other")] * 3_000, at(4))


def sqlite_claim_steps(path: Path, ask: int = 1) -> int:
    """Virtual machine steps (in units of the progress handler's 100) of claiming the due
    task of queue q, asking for ``ask``, rolled back."""
    steps, rows = sqlite_claim(path, ask)
    assert [r[2] for r in rows] == ["job"]
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


def test_sqlite_claim_asking_for_more_than_is_due_walks_nothing_due_later(
    tmp_path: Path,
) -> None:
    # A worker with free slots asks for all of them: the walk cannot stop at the first
    # row not yet due of a priority, as a lower one may have due rows, but it skips to
    # that priority rather than read on through the rows due later.
    costs = {}
    for waiting in (100, 5_000):
        path = tmp_path / f"waiting{waiting}.db"
        store = SQLiteStore(path)
        suspend_waiting(store, waiting, delayed=waiting)
        store.close()
        costs[waiting] = sqlite_claim_steps(path, ask=4)
    # 50 times as many due later, the same work (a walk would cost ~50 times more).
    assert costs[5_000] <= costs[100] * 1.2 + 5, costs
    # A seek per priority, then a range of that priority's due rows, in the order claimed:
    # no sort, which would read every due row of every priority.
    plan = sqlite3.connect(tmp_path / "waiting100.db").execute(
        "EXPLAIN QUERY PLAN " + SQLITE.claim_for(1, 0),
        dict.fromkeys(["q0", "l0", "limit", "owner", "now", "started", "lease_expires_at"], ""),
    )
    details = [str(r[-1]) for r in plan]
    assert "SCAN prios" in details and not any("TEMP B-TREE" in d for d in details), details
    assert details[-1] == (
        "SEARCH tasks USING INDEX ix_tasks_queue_claimable "
        "(queue=? AND key_waiting=? AND priority=? AND due_at<?)"
    ), details


def postgres_claim_plan(store: PostgresStore, ask: int = 1) -> dict[str, Any]:
    """The plan, run (EXPLAIN ANALYZE, BUFFERS), of the rows a claim of queue q asking for
    ``ask`` picks and locks, rolled back; after a vacuum (the suspensions' claims' dead rows)."""
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE tasks"))
    arm = store.dialect.claim_for(1, 0, most=ask).split("picked AS MATERIALIZED (", 1)[1]
    arm = arm.split("), claimed AS (", 1)[0]
    sql = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + arm.replace("%(q0)s", "'q'").replace(
        "%(l0)s", str(ask)
    ).replace("%(now)s", f"'{at(10).isoformat()}'")
    with store.engine.connect() as conn:
        (plan,) = conn.execute(text(sql)).scalar_one()
        conn.rollback()
    return plan["Plan"]  # type: ignore[no-any-return]


def index_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every index scan in the plan ``node``."""
    scans = [node] if node.get("Index Name") else []
    for child in node.get("Plans", []):
        scans += index_scans(child)
    return scans


def test_postgres_claim_does_not_walk_suspended_workflows(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        suspend_waiting(store, 5_000)
        plan = postgres_claim_plan(store)
    finally:
        store.close()
    scans = index_scans(plan)
    assert {s["Index Name"] for s in scans} == {"ix_tasks_queue_claimable"}, scans
    assert all(s.get("Rows Removed by Filter", 0) == 0 for s in scans), scans
    assert plan["Actual Rows"] == 1, plan
    # The index's root, an inner page and a leaf, for the priority and for its rows, and the
    # task's heap page, read to fetch and to lock (10 when measured); the 5,020 waiting rows
    # fill some 40 leaf pages that a walk through them would read.
    pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert pages <= 12, plan


def test_postgres_claim_asking_for_more_than_is_due_reads_a_few_pages(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        suspend_waiting(store, 5_000, delayed=5_000)
        plan = postgres_claim_plan(store, ask=4)
    finally:
        store.close()
    assert plan["Actual Rows"] == 1, plan
    scans = index_scans(plan)
    assert {s["Index Name"] for s in scans} == {"ix_tasks_queue_claimable"}, scans
    assert all(s.get("Rows Removed by Filter", 0) == 0 for s in scans), scans
    # A seek per priority present (5, 0, and the one finding none below) and a range per
    # priority, each a root and a leaf, and the task's heap page: the 10,020 rows due later
    # fill some 80 leaf pages that a walk through them would read.
    pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert pages <= 20, plan
