"""A busy limit key's backlog is never walked by a claim (issue 32's target), shown by
what each database does: SQLite's virtual machine steps for a claim do not grow with the
busy key's backlog, and PostgreSQL's plan reads no more index rows than it claims.

The busy key holds the queue's best tasks (higher priority, due first), so a claim
that walked the key's tasks would meet all of them before any other key's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from durablesched import QueueLimits
from durablesched.records import NewTask
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLITE, SQLiteStore

from ..conftest import T0, at
from .claim_steps import sqlite_claim

LEASE = timedelta(seconds=30)
OTHER_KEYS = 200


def fill(store: SQLiteStore | PostgresStore, busy: int) -> None:
    """One busy key with ``busy`` tasks ahead of every other key's one task."""
    store.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
    ahead = [NewTask("t", {}, at(1), 3, None, None, "q", 5, "busy") for _ in range(busy)]
    others = [NewTask("t", {}, at(2), 3, None, None, "q", 0, f"key:{i}") for i in range(OTHER_KEYS)]
    store.submit(ahead + others, T0)
    (first,) = store.claim("w", 1, at(10), LEASE)  # the busy key is now at its limit
    assert first.priority == 5


def sqlite_claim_steps(path: Path) -> int:
    """Virtual machine steps (in units of the progress handler's 100) of claiming ten
    tasks from queue q, rolled back."""
    steps, rows = sqlite_claim(path, 10)
    assert len(rows) == 10
    assert all(r[10] == 0 for r in rows)  # other keys' tasks, none of the busy key
    return steps


def test_sqlite_claim_does_not_walk_a_busy_keys_backlog(tmp_path: Path) -> None:
    costs = {}
    for busy in (100, 5_000):
        path = tmp_path / f"busy{busy}.db"
        store = SQLiteStore(path)
        fill(store, busy)
        store.close()
        costs[busy] = sqlite_claim_steps(path)
    # 50 times the backlog, the same work (a walk would cost ~50 times more).
    assert costs[5_000] <= costs[100] * 1.2 + 5, costs
    plan = sqlite3.connect(tmp_path / "busy100.db").execute(
        "EXPLAIN QUERY PLAN " + SQLITE.claim_for(1, 0),
        {
            "q0": "q",
            "l0": 1,
            "limit": 1,
            "owner": "w",
            "now": "",
            "started": "",
            "lease_expires_at": "",
        },
    )
    details = " ".join(str(r[-1]) for r in plan)
    assert "ix_tasks_queue_claimable (queue=? AND key_waiting=?)" in details, details


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


def test_postgres_claim_reads_no_more_rows_than_it_claims(pg_store: PostgresStore) -> None:
    fill(pg_store, 5_000)
    arm = pg_store.dialect.claim_for(1, 0, most=10).split("picked AS MATERIALIZED (", 1)[1]
    arm = arm.split("), claimed AS (", 1)[0]
    with pg_store.engine.connect() as conn:
        conn.execute(text("ANALYZE tasks"))
        sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + arm.replace("%(q0)s", "'q'").replace(
            "%(l0)s", "10"
        ).replace("%(now)s", f"'{at(10).isoformat()}'")
        (plan,) = conn.execute(text(sql)).scalar_one()
        conn.rollback()
    scans: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"] and node.get("Index Name"):
            scans.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    assert {s["Index Name"] for s in scans} == {"ix_tasks_queue_claimable"}, scans
    # The priorities' seeks read a row each; the rows' range no more than it claims.
    *seeks, scan = scans
    assert all(s["Actual Rows"] <= 1 for s in seeks), seeks
    assert scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0) <= 10, scan


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_queue_limit_keys_view_shows_keys_busiest_first(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store: SQLiteStore | PostgresStore = (
        SQLiteStore(tmp_path / "view.db")
        if backend == "sqlite"
        else PostgresStore(request.getfixturevalue("pg_url"))
    )
    try:
        fill(store, busy=5)  # busy: 1 running, 4 waiting; key:0 and key:1 one each
        with store.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT limit_key, running, waiting, concurrency_per_key, at_limit "
                    "FROM queue_limit_keys"
                )
            ).all()
    finally:
        store.close()
    assert [tuple(r) for r in rows][:1] == [("busy", 1, 4, 1, 1)]
    assert len(rows) == 1 + OTHER_KEYS


def test_a_change_of_limit_leaves_the_waiting_tasks_unwritten(pg_store: PostgresStore) -> None:
    """Each row a change of limit writes leaves its old version's entry in the claim's index
    until a vacuum, where claims step over it: the tasks that wait before and after are
    not written (their row versions, ``xmin``, are the same)."""
    fill(pg_store, 50)  # the busy key: 1 running, 49 waiting; every other key's task a head
    waiting = text("SELECT id, CAST(xmin AS text) FROM tasks WHERE key_waiting = 1")
    with pg_store.engine.connect() as conn:
        before = set(conn.execute(waiting).all())
    pg_store.put_queue(QueueLimits("q", concurrency_per_key=2), T0)
    with pg_store.engine.connect() as conn:
        after = set(conn.execute(waiting).all())
    # The busy key has room for a head now: one of its waiting tasks is claimable.
    assert len(before) == 49 and len(after) == 48, (before, after)
    assert after <= before
