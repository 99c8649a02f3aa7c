"""The task list's last page costs what its first does, for every filter (issue 28,
item 5): each page walks an index from its cursor, from either end, on SQLite and
PostgreSQL. The statement the store runs is captured and its plan read: an index of
the filter's, no scan of the table; on PostgreSQL, the rows it reads are counted."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from durablesched import PostgresStore, SQLiteStore, TaskState
from durablesched.records import OLDEST, NewTask, TaskQuery
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, at

#: Finished tasks, then the newest few still pending: a PENDING page found by walking
#: the whole list's order would read every finished row before the end.
FINISHED, PENDING, PAGE = 20_000, 300, 51


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLStore]:
    if request.param == "postgres":
        built: SQLStore = PostgresStore(request.getfixturevalue("pg_url"))
    else:
        built = SQLiteStore(tmp_path / "deep.db")
    built.submit([NewTask(f"t{i % 3}", {}, at(i % 50), 1) for i in range(FINISHED)], T0)
    with built.engine.begin() as conn:  # finished as a worker would leave them, at once
        conn.execute(
            text("UPDATE tasks SET state = 'SUCCEEDED', attempts = 1, finished_at = :at"),
            {"at": built._t(at(100))},
        )
    later = T0 + timedelta(hours=1)
    built.submit([NewTask("fresh", {}, later, 1) for _ in range(PENDING)], later)
    # Statistics, and (PostgreSQL) the index entries of the rows' older versions gone,
    # as autovacuum leaves a table: a bitmap scan would count them otherwise.
    with built.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE" if built.engine.dialect.name == "sqlite" else "VACUUM ANALYZE"))
    yield built
    built.close()


def captured(store: SQLStore, query: TaskQuery, limit: int = PAGE) -> tuple[str, Any]:
    """The statement and parameters ``find_tasks`` runs for ``query``."""
    seen: list[tuple[str, Any]] = []

    def grab(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "created_at DESC, id DESC" in statement:
            seen.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        store.find_tasks(query, limit)
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)
    assert len(seen) == 1
    return seen[0]


def read_rows(store: SQLStore, query: TaskQuery) -> tuple[str, int]:
    """The plan of ``query``'s page, and (PostgreSQL) the rows its scans read."""
    statement, params = captured(store, query)
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            raw = conn.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            plan = raw.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
            conn.rollback()
            return "\n".join(str(row[-1]) for row in plan), 0
        answer = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params
        ).scalar()
        conn.rollback()
    nodes = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk((answer if isinstance(answer, list) else json.loads(str(answer)))[0]["Plan"])
    scans = [n for n in nodes if "Scan" in n["Node Type"]]
    # A bitmap's heap scan reads again what its index scan found: counted once.
    read = sum(
        n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0)
        for n in scans
        if n["Node Type"] != "Bitmap Index Scan"
    )
    return json.dumps([n.get("Index Name", n["Node Type"]) for n in scans]), read


def pages_of(store: SQLStore, state: TaskState | None) -> dict[str, TaskQuery]:
    """The first page, the last reached through 'older' links, and the last read from
    the oldest end, of one filter."""
    every = store.find_tasks(TaskQuery(state=state), 100_000)
    tenth = every[-10]
    return {
        "first": TaskQuery(state=state),
        "last, through older": TaskQuery(state=state, before=(tenth.created_at, tenth.id)),
        "last, from the end": TaskQuery(state=state, after=OLDEST),
        "back towards the newest": TaskQuery(
            state=state, after=(every[-200].created_at, every[-200].id)
        ),
    }


@pytest.mark.parametrize("state", [TaskState.PENDING, TaskState.SUCCEEDED, None])
def test_the_last_page_of_each_filter_reads_what_the_first_does(
    store: SQLStore, state: TaskState | None
) -> None:
    index = "ix_tasks_state_created" if state is TaskState.PENDING else "ix_tasks_created"
    reads = {}
    for label, query in pages_of(store, state).items():
        plan, reads[label] = read_rows(store, query)
        assert "SCAN tasks\n" not in plan + "\n" and "Seq Scan" not in plan, (label, plan)
        if store.engine.dialect.name == "sqlite":
            assert index in plan, (label, plan)
    if store.engine.dialect.name == "postgresql":  # the rows each page's walk read
        if state is TaskState.SUCCEEDED:
            # Its first page steps over the newest, pending, tasks: no page reads more
            # than the first does and a page more.
            assert reads["first"] <= 2 * PAGE + PENDING, reads
            assert all(n <= reads["first"] + PAGE for n in reads.values()), reads
        else:
            assert all(n <= 2 * PAGE for n in reads.values()), reads


def test_pages_back_and_forth_meet_every_task_once(store: SQLStore) -> None:
    for state in (TaskState.PENDING, TaskState.SUCCEEDED, None):
        every = [t.id for t in store.find_tasks(TaskQuery(state=state), 100_000)]
        # From the oldest end back to the newest, through the 'after' cursors.
        seen: list[int] = []
        query = TaskQuery(state=state, after=OLDEST)
        while page := store.find_tasks(query, 500):
            seen = [t.id for t in page] + seen
            newest = page[0]
            query = TaskQuery(state=state, after=(newest.created_at, newest.id))
        assert seen == every, state
