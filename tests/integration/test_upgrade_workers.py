"""Migration 0008 (live workers) on a database at 0007 with tasks, history and a
schedule in it: everything stays as it was, workers register, the view answers, the
migration goes down and up again, and the schema then equals the metadata."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from durablesched import PostgresStore, SchemaError, SQLiteStore, TaskState, WorkerInfo
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config, head_revision
from durablesched.store.sql.postgres import create_postgres_engine
from durablesched.store.sql.sqlite import create_sqlite_engine
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, at, schema_diff


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Engine]:
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        return url, create_postgres_engine(url)
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def _open(url: str, **kwargs: object) -> SQLStore:
    if url.startswith("postgresql"):
        return PostgresStore(url, **kwargs)  # type: ignore[arg-type]
    return SQLiteStore(url, **kwargs)  # type: ignore[arg-type]


def _t(url: str, when: datetime) -> object:
    if url.startswith("postgresql"):
        return when
    return when.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _at_0007(url: str, engine: Engine) -> None:
    """The schema at 0007 with two tasks (one running), their history and a schedule."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0007")
        conn.execute(text("UPDATE durablesched_counters SET value = 2 WHERE name = 'task_seq'"))
        for task_id, state in ((1, "PENDING"), (2, "RUNNING")):
            running = state == "RUNNING"
            conn.execute(
                text(
                    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, "
                    "max_attempts, fence, lease_owner, lease_expires_at, created_at, updated_at) "
                    "VALUES (:id, :id, 'old', '{}', :state, :t, :n, 3, :n, :owner, :lease, :t, :t)"
                ),
                {
                    "id": task_id,
                    "state": state,
                    "t": _t(url, T0),
                    "n": int(running),
                    "owner": "old-worker" if running else None,
                    "lease": _t(url, at(60)) if running else None,
                },
            )
            conn.execute(
                text(
                    "INSERT INTO task_events (task_id, at, state, attempt, detail) "
                    "VALUES (:id, :t, :state, :n, NULL)"
                ),
                {"id": task_id, "t": _t(url, T0), "state": state, "n": int(running)},
            )


def test_upgrade_from_0007_keeps_everything_and_adds_workers(
    database: tuple[str, Engine],
) -> None:
    url, engine = database
    try:
        _at_0007(url, engine)
        with pytest.raises(SchemaError, match="durablesched migrate"):
            _open(url)
        store = _open(url, migrate=True)
        try:
            assert store.schema_revision == head_revision() == HEAD_REVISION
            assert [(t.id, t.state) for t in store.list_tasks()] == [
                (1, TaskState.PENDING),
                (2, TaskState.RUNNING),
            ]
            assert [e.state for e in store.history(2)][-1] is TaskState.RUNNING
            assert store.list_workers(T0) == []
            worker = WorkerInfo(
                "old-worker", "h", 7, {"default": 2}, 2, "0.1.0", T0, T0, timedelta(seconds=30)
            )
            store.register_worker(worker, T0)
            store.heartbeat("old-worker", [], at(20), timedelta(seconds=30))
            assert store.list_workers(at(20))[0].last_seen == at(20)
            # The queue works on: the old PENDING task is claimed.
            assert [c.task_id for c in store.claim("new", 5, at(20), timedelta(seconds=30))] == [1]
            with store.engine.connect() as conn:
                (row,) = conn.execute(text("SELECT id, state, queues FROM workers")).all()
                conn.rollback()
            # The view judges by the database's clock: T0 (2030) is ahead of it.
            assert (row.id, row.state, row.queues) == ("old-worker", "alive", '{"default": 2}')
        finally:
            store.close()
        with engine.connect() as conn:
            diff = schema_diff(conn)
            conn.rollback()
        assert diff == []
    finally:
        engine.dispose()


def test_the_workers_migration_goes_down_and_up_again(database: tuple[str, Engine]) -> None:
    url, engine = database
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
            command.downgrade(alembic_config(conn), "0007")
            command.upgrade(alembic_config(conn), "head")
    finally:
        engine.dispose()
    store = _open(url)
    try:
        worker = WorkerInfo("w", "h", 1, None, 1, "0.1.0", T0, T0, timedelta(seconds=5))
        store.register_worker(worker, T0)
        assert store.list_workers(T0) == [worker]
    finally:
        store.close()
