"""The submission is a history line in task_events, written with the task on the SQL
backends; tasks stored by a version that wrote none still read with one."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from durablesched import TaskEvent, TaskState
from durablesched.records import NewTask
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLiteStore
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, at


@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> SQLStore:
    store: SQLStore = (
        PostgresStore(request.getfixturevalue("pg_url"))
        if request.param == "postgres"
        else SQLiteStore(tmp_path / "q.db")
    )
    request.addfinalizer(store.close)
    return store


def test_a_bulk_submit_writes_one_submission_row_per_task(sql_store: SQLStore) -> None:
    made = sql_store.submit([NewTask("t", {"i": i}, T0, 1) for i in range(500)], T0)
    with sql_store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT task_id, state, attempt, detail FROM task_events ORDER BY id")
        ).all()
    assert [tuple(r) for r in rows] == [(m.task_id, "PENDING", 0, "submitted") for m in made]


def test_a_task_stored_without_a_submission_line_still_reads_with_one(
    sql_store: SQLStore,
) -> None:
    (made,) = sql_store.submit([NewTask("t", {}, T0, 1)], at(5))
    (claim,) = sql_store.claim("w", 1, at(10), timedelta(seconds=30))
    with sql_store.engine.begin() as conn:  # as a version before submission lines left it
        conn.execute(text("DELETE FROM task_events WHERE detail = 'submitted'"))
    assert [(e.state, e.detail) for e in sql_store.history(made.task_id)] == [
        (TaskState.PENDING, "submitted"),
        (TaskState.RUNNING, f"claimed by {claim.owner} from queue default"),
    ]
    assert sql_store.history(made.task_id)[0] == TaskEvent(
        made.task_id, at(5), TaskState.PENDING, 0, "submitted"
    )
    assert sql_store.history(made.task_id + 1) == []
