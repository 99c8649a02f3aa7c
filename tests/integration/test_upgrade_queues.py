"""Revision 0005 on a database of the previous schema with tasks in every state:
each lands in the "default" queue with priority 0, and the queue works on."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, text

from durablesched import TaskState, open_store
from durablesched.store.sql.migrate import alembic_config, head_revision
from durablesched.store.sql.urls import sqlite_url

from ..conftest import T0, at

STATES = [s.value for s in TaskState]


def _old_database(engine: Engine) -> None:
    """The schema at 0004, with one task in each state (as 0004's code wrote them)."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
        for i, state in enumerate(STATES, start=1):
            running = state == "RUNNING"
            conn.execute(
                text(
                    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, "
                    "max_attempts, fence, lease_owner, lease_expires_at, created_at, updated_at) "
                    "VALUES (:id, :id, 't', '{}', :state, :due, :attempts, 3, :fence, :owner, "
                    ":lease, :due, :due)"
                ),
                {
                    "id": i,
                    "state": state,
                    "due": "2030-01-01 00:00:10.000000" if engine.dialect.name == "sqlite" else T0,
                    "attempts": 1 if state != "PENDING" else 0,
                    "fence": 1 if state != "PENDING" else 0,
                    "owner": "w" if running else None,
                    "lease": (
                        None
                        if not running
                        else "2030-01-01 00:01:00.000000"
                        if engine.dialect.name == "sqlite"
                        else at(60)
                    ),
                },
            )
        conn.execute(
            text("UPDATE durablesched_counters SET value = :n WHERE name = 'task_seq'"),
            {"n": len(STATES)},
        )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_upgrade_puts_every_task_in_the_default_queue(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        str(request.getfixturevalue("pg_url"))
        if backend == "postgres"
        else sqlite_url(tmp_path / "old.db")
    )
    engine = create_engine(url)
    _old_database(engine)
    engine.dispose()
    store = open_store(url, migrate=True)
    try:
        assert store.schema_revision == head_revision()
        tasks = {t.state.value: t for t in store.list_tasks(limit=100)}
        assert set(tasks) == set(STATES)
        assert {(t.queue, t.priority) for t in tasks.values()} == {("default", 0)}
        assert [q.name for q in store.queue_limits()] == ["default"]
        # The queue works on: the PENDING and RETRY_WAIT tasks are claimed, from "default".
        claims = store.claim("w2", 10, at(30), timedelta(seconds=30))
        assert sorted(c.task_id for c in claims) == sorted(
            tasks[s].id for s in ("PENDING", "RETRY_WAIT")
        )
        assert {c.queue for c in claims} == {"default"}
        info = {q["name"]: q for q in store.queue_info(at(30))}["default"]
        assert info["running"] == 3  # the one RUNNING before, and the two just claimed
    finally:
        store.close()
