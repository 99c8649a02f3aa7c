"""Migration 0006 (schedules) on a database at 0005 with tasks in it: the tasks stay as
they were, the schedules work, and the schema then equals the metadata."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from durablesched import PostgresStore, SchemaError, SQLiteStore, TaskState
from durablesched.schedules.declaration import schedule
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


def test_upgrade_from_0005_keeps_the_tasks_and_adds_schedules(
    database: tuple[str, Engine],
) -> None:
    url, engine = database
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0005")
            # Tasks as the release at 0005 stored them: one waiting, one finished.
            conn.execute(text("UPDATE durablesched_counters SET value = 2 WHERE name = 'task_seq'"))
            for task_id, state in ((1, "PENDING"), (2, "SUCCEEDED")):
                conn.execute(
                    text(
                        "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, "
                        "max_attempts, fence, idempotency_key, created_at, updated_at) "
                        "VALUES (:id, :id, 'old', '{}', :state, :t, 0, 3, 0, :key, :t, :t)"
                    ),
                    {"id": task_id, "state": state, "t": _t(url, T0), "key": f"k{task_id}"},
                )
        with pytest.raises(SchemaError, match="durablesched migrate"):
            _open(url)
        store = _open(url, migrate=True)
        try:
            assert store.schema_revision == head_revision() == HEAD_REVISION
            old = store.get(1)
            assert old is not None and (old.name, old.state, old.idempotency_key) == (
                "old",
                TaskState.PENDING,
                "k1",
            )
            store.add_schedule(schedule("t", name="tick", every=60), T0)
            (fired,) = store.fire_schedules(at(70))
            assert fired.task_id == 3  # ids go on from the tasks already there
            assert [t.id for t in store.list_tasks(state=TaskState.PENDING)] == [1, 3]
        finally:
            store.close()
        with engine.connect() as conn:
            diff = schema_diff(conn)
            conn.rollback()
        assert diff == []
    finally:
        engine.dispose()


def _t(url: str, when: datetime) -> object:
    if url.startswith("postgresql"):
        return when
    return when.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def test_the_schedules_migration_goes_down_and_up_again_on_postgres(pg_url: str) -> None:
    engine = create_postgres_engine(pg_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
            command.downgrade(alembic_config(conn), "0005")
            assert "schedules" not in {
                r[0]
                for r in conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
                )
            }
            command.upgrade(alembic_config(conn), "head")
    finally:
        engine.dispose()
    store = PostgresStore(pg_url)
    store.add_schedule(schedule("t", name="tick", every=60), T0)
    assert store.fire_schedules(T0 + timedelta(minutes=2)) != []
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_purged_task_leaves_its_fire_recorded(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("pg_url")) if kind == "postgres" else str(tmp_path / "p.db")
    store = _open(url)
    try:
        store.add_schedule(schedule("t", name="tick", every=60), T0)
        (fired,) = store.fire_schedules(T0 + timedelta(minutes=1))
        (claim,) = store.claim("w", 1, T0 + timedelta(minutes=1), timedelta(seconds=30))
        store.complete(claim, None, T0 + timedelta(minutes=1))
        assert store.purge(T0 + timedelta(days=1)) == 1
        (info,) = store.list_schedules()
        assert (info.last_fire_at, info.last_task_id, info.last_task_state) == (
            fired.fire_at,
            None,
            None,
        )
        # The fire stays recorded: it is never made again.
        assert store.fire_schedules(T0 + timedelta(minutes=1, seconds=30)) == []
    finally:
        store.close()
