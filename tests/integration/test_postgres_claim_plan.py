"""PostgreSQL keeps one plan of the claim for every claim (a generic plan of the statement
the driver prepares after five runs), and that plan seeks the claimed rows by id.

A generic plan guesses what a parameter is; when its estimated cost is above a plan
for the values given, PostgreSQL plans every run afresh instead (about a third of a
claim's time at 1,000,000 tasks, docs/queues.md). The claim's LIMIT used to be such a
guess: a tenth of the queue, which priced the plan over a hundred times a custom one's
and made the update walk ``tasks_pkey`` from its first id in a merge join.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from durablesched.records import NewTask
from durablesched.store.sql.postgres import POSTGRES, PostgresStore

from ..conftest import T0, at

LEASE = timedelta(seconds=30)
TASKS = 20_000


@pytest.fixture
def analyzed(pg_url: str) -> Iterator[PostgresStore]:
    """A store of ``TASKS`` due tasks in queue q over two priorities, its statistics known
    (the guesses of a generic plan are worked out from them)."""
    store = PostgresStore(pg_url)
    tasks = [NewTask("t", {}, at(1), 3, None, None, "q", i % 2) for i in range(TASKS)]
    store.submit(tasks, T0)
    with store.engine.connect() as conn:
        conn.execute(text("ANALYZE tasks"))
        conn.commit()
    yield store
    store.close()


def test_the_claim_is_planned_once_for_every_claim(analyzed: PostgresStore) -> None:
    # The driver prepares it after five runs; PostgreSQL plans five of those for their
    # values, then weighs a generic plan against them.
    for i in range(14):
        assert len(analyzed.claim("w", 10, at(10 + i), LEASE)) == 10
    with analyzed._write("reading the prepared statements") as conn:
        found = conn.execute(
            text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%picked AS MATERIALIZED%'"
            )
        ).all()
    assert len(found) == 1, found
    ((generic, custom),) = found
    # Every claim after those five used the generic plan.
    assert custom == 5 and generic >= 3, found


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.parametrize("keyed", [False, True])
def test_the_generic_plan_seeks_the_claimed_rows(analyzed: PostgresStore, keyed: bool) -> None:
    sql = POSTGRES.claim_for(1, 0, keyed=keyed, most=10)
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    for n, name in enumerate(names, 1):
        sql = sql.replace(f"%({name})s", f"${n}")
    values = {"q0": "q", "l0": 10, "limit": 10, "keyed": ["q"], "owner": "w"}
    values |= {"now": at(10), "started": at(10), "lease_expires_at": at(40)}
    raw = analyzed.engine.raw_connection()
    assert raw.driver_connection is not None
    try:
        cur = psycopg.ClientCursor(raw.driver_connection)  # EXECUTE's values as literals
        cur.execute(f"PREPARE claim AS {sql}")
        cur.execute("SET plan_cache_mode = force_generic_plan")
        placeholders = ", ".join(["%s"] * len(names))
        cur.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE claim({placeholders})", [values[n] for n in names]
        )
        ((plan,),) = cur.fetchall()
    finally:
        raw.rollback()
        raw.invalidate()  # the prepared statement and the setting go with the connection
    nodes = list(plan_nodes(plan[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Merge Join"], nodes
    (update,) = [n for n in nodes if n.get("Relation Name") == "tasks" and "Operation" in n]
    # The update's rows: a seek of tasks_pkey per claimed id, no walk of the table or index.
    scans = [
        n
        for n in plan_nodes(update)
        if n.get("Relation Name") == "tasks" and n["Node Type"] != "ModifyTable"
    ]
    assert scans, update
    assert all(
        s["Node Type"] == "Index Scan" and s["Index Name"] == "tasks_pkey" and "Index Cond" in s
        for s in scans
    ), scans
    # Every LIMIT the generic plan guesses is over a cut it can read: a few rows.
    limits = [n for n in nodes if n["Node Type"] == "Limit"]
    assert limits and all(n["Plan Rows"] <= 16 for n in limits), limits
