"""Migration 0014 (PENDING tasks in ix_tasks_state_created) on a database at 0013 with
tasks in it: every task stays, PENDING pages walk the index, and the migration goes
down (the index as 0009 made it) and up again."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from durablesched import PostgresStore, SQLiteStore, TaskState
from durablesched.records import OLDEST, NewTask, TaskQuery
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config
from durablesched.store.sql.postgres import create_postgres_engine
from durablesched.store.sql.sqlite import create_sqlite_engine

from ..conftest import T0, at


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Engine]:
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        return url, create_postgres_engine(url)
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def definition(engine: Engine) -> str:
    """How the database itself defines ix_tasks_state_created."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            sql = "SELECT sql FROM sqlite_master WHERE name = 'ix_tasks_state_created'"
        else:
            sql = (
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_tasks_state_created' "
                "AND schemaname = current_schema()"
            )
        found = conn.execute(text(sql)).scalar()
        conn.rollback()
    return str(found)


def test_0014_puts_pending_tasks_in_the_state_index_and_goes_back(
    database: tuple[str, Engine],
) -> None:
    url, engine = database
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0013")
        assert "PENDING" not in definition(engine)
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        assert "PENDING" in definition(engine) and "SUCCEEDED" not in definition(engine)
        opened = SQLiteStore(url) if engine.dialect.name == "sqlite" else PostgresStore(url)
        try:
            assert opened.schema_revision == HEAD_REVISION
            opened.submit([NewTask("job", {"n": n}, at(10), 1) for n in range(3)], T0)
            pending = TaskQuery(state=TaskState.PENDING, after=OLDEST)
            assert [t.args for t in opened.find_tasks(pending, 2)] == [{"n": 1}, {"n": 0}]
        finally:
            opened.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0013")
        assert "PENDING" not in definition(engine) and "RETRY_WAIT" in definition(engine)
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        assert "PENDING" in definition(engine)
    finally:
        engine.dispose()
