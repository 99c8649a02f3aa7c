"""Migration 0009 (the dashboard's indexes) on a database at 0008 with tasks in it:
every task stays, the list pages through them, the migration goes down and up
again, and the schema then equals the metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from durablesched import PostgresStore, SchemaError, SQLiteStore, TaskState
from durablesched.records import TaskQuery
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config, head_revision
from durablesched.store.sql.postgres import create_postgres_engine
from durablesched.store.sql.sqlite import create_sqlite_engine
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, schema_diff

INDEXES = {
    "ix_tasks_created",
    "ix_tasks_state_created",
    "ix_tasks_queue_created",
    "ix_tasks_name_created",
    "ix_tasks_key",
}


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


def _indexes(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        names = {ix["name"] for ix in inspect(conn).get_indexes("tasks")}
        conn.rollback()
    return {n for n in names if n is not None}


def test_upgrade_from_0008_keeps_every_task_and_adds_the_indexes(
    database: tuple[str, Engine],
) -> None:
    url, engine = database
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0008")
        assert not _indexes(engine) & INDEXES
        # Tasks written at 0008 as that release wrote them: ids from the counter row
        # (this release takes them from a sequence on PostgreSQL, made by a later step).
        stamp = "2030-01-01 00:00:00.000000" if engine.dialect.name == "sqlite" else T0
        with engine.begin() as conn:
            for i in range(1, 4):
                conn.execute(
                    text(
                        "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, "
                        "max_attempts, fence, idempotency_key, created_at, updated_at) "
                        "VALUES (:id, :id, 'old', '{}', 'PENDING', :at, 0, 1, 0, :key, :at, :at)"
                    ),
                    {"id": i, "key": f"k{i - 1}", "at": stamp},
                )
            conn.execute(text("UPDATE durablesched_counters SET value = 3 WHERE name = 'task_seq'"))
        with pytest.raises(SchemaError, match="durablesched migrate"):
            _open(url)
        store = _open(url, migrate=True)
        try:
            assert store.schema_revision == head_revision() == HEAD_REVISION
            assert [t.id for t in store.find_tasks(TaskQuery(), 10)] == [3, 2, 1]
            assert [t.id for t in store.find_tasks(TaskQuery(key="k1"), 10)] == [2]
            page = store.find_tasks(TaskQuery(state=TaskState.PENDING, name="old"), 2)
            last = page[-1]
            rest = TaskQuery(state=TaskState.PENDING, name="old", before=(last.created_at, last.id))
            assert [t.id for t in store.find_tasks(rest, 2)] == [1]
        finally:
            store.close()
        assert _indexes(engine) >= INDEXES
        with engine.connect() as conn:
            diff = schema_diff(conn)
            conn.rollback()
        assert diff == []
    finally:
        engine.dispose()


def test_the_dashboard_migration_goes_down_and_up_again(database: tuple[str, Engine]) -> None:
    _url, engine = database
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
            command.downgrade(alembic_config(conn), "0008")
        assert not _indexes(engine) & INDEXES
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
            conn.execute(text("SELECT 1"))
        assert _indexes(engine) >= INDEXES
    finally:
        engine.dispose()
