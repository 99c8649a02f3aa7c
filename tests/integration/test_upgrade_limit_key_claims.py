"""Migration 0017 (a claim counts its start on the key's row; SQLite inserts keyed tasks
through a view, with no INSERT trigger on tasks) on a database at 0016 with keyed tasks
in it, RUNNING and waiting: the limit per key holds across the upgrade, the downgrade
(0013's triggers back) and the upgrade again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from durablesched import PostgresStore, SQLiteStore
from durablesched.records import NewTask
from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config
from durablesched.store.sql.postgres import create_postgres_engine
from durablesched.store.sql.sqlite import create_sqlite_engine
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, at

LEASE = timedelta(minutes=5)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Engine]:
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        return url, create_postgres_engine(url)
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def triggers(engine: Engine) -> set[str]:
    """The names of the triggers on tasks and on the view of new keyed tasks."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        else:
            sql = (
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND "
                "tgrelid = to_regclass('tasks')"
            )
        return {str(name) for (name,) in conn.execute(text(sql))}


def open_store(url: str, engine: Engine) -> SQLStore:
    return SQLiteStore(url) if engine.dialect.name == "sqlite" else PostgresStore(url)


def stamp(engine: Engine, second: int) -> object:
    """Time ``at(second)`` as the database stores it."""
    return to_db_time(at(second)) if engine.dialect.name == "sqlite" else at(second)


def insert_old(engine: Engine, task_id: int, key: str) -> None:
    """A keyed task of queue q as the code at 0016 inserted it (its INSERT trigger fires)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, "
                "fence, created_at, updated_at, queue, priority, limit_key) VALUES (:id, :id, "
                "'t', '{}', 'PENDING', :due, 0, 3, 0, :due, :due, 'q', 0, :key)"
            ),
            {"id": task_id, "due": stamp(engine, 1), "key": key},
        )


def claim_old(engine: Engine) -> list[tuple[int, str]]:
    """A claim of everything claimable in q, as 0016's claim picks (key_waiting = 0)."""
    with engine.begin() as conn:
        rows = conn.execute(
            text(
                "UPDATE tasks SET state = 'RUNNING', attempts = 1, fence = 1, lease_owner = 'w', "
                "lease_expires_at = :lease WHERE queue = 'q' AND key_waiting = 0 "
                "AND state = 'PENDING' RETURNING id, limit_key"
            ),
            {"lease": stamp(engine, 600)},
        )
        return sorted((int(i), str(k)) for i, k in rows)


def keyed_queue_at(engine: Engine, revision: str, per_key: int) -> None:
    """The schema at ``revision``, with queue q limited to ``per_key`` running per key."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)
        conn.execute(
            text(
                "INSERT INTO durablesched_queues (name, paused, updated_at, "
                "concurrency_per_key) VALUES ('q', 0, :now, :per_key)"
            ),
            {"now": stamp(engine, 0), "per_key": per_key},
        )


def running_per_key(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT limit_key, running FROM durablesched_limit_keys"))
        return {str(k): int(n) for k, n in rows}


def claim_keys(store: SQLStore, n: int, second: int) -> list[str | None]:
    """The limit keys of the tasks a claim of ``n`` takes, at second ``second``."""
    ids = [c.task_id for c in store.claim("w", n, at(second), LEASE)]
    with store.engine.connect() as conn:
        sql = text("SELECT limit_key FROM tasks WHERE id = :id")
        return sorted((conn.execute(sql, {"id": i}).scalar() for i in ids), key=str)


def test_0017_keeps_limits_per_key_up_down_and_up(database: tuple[str, Engine]) -> None:
    url, engine = database
    try:
        keyed_queue_at(engine, "0016", 1)
        before = triggers(engine)
        assert "durablesched_limit_key_insert" in before
        for task_id in range(1001, 1007):  # ids the store's counter does not hand out
            insert_old(engine, task_id, f"k{task_id % 2}")
        assert claim_old(engine) == [(1001, "k1"), (1002, "k0")]  # the keys' heads only
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        if engine.dialect.name == "sqlite":
            assert triggers(engine) == before - {"durablesched_limit_key_insert"} | {
                "durablesched_new_keyed_task",
                "durablesched_limit_key_claim",  # migration 0020
            }
        else:
            assert triggers(engine) == before
        store = open_store(url, engine)
        try:
            assert store.schema_revision == HEAD_REVISION
            assert running_per_key(engine) == {"k0": 1, "k1": 1}
            assert claim_keys(store, 5, 3) == []  # both keys at their limit
            store.submit([NewTask("t", {}, at(1), 3, None, None, "q", 0, "k2")] * 2, T0)
            assert claim_keys(store, 5, 4) == ["k2"]
            assert running_per_key(engine) == {"k0": 1, "k1": 1, "k2": 1}
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0016")
        assert triggers(engine) == before
        insert_old(engine, 2001, "k3")
        insert_old(engine, 2002, "k3")
        assert claim_old(engine) == [(2001, "k3")]
        assert running_per_key(engine) == {"k0": 1, "k1": 1, "k2": 1, "k3": 1}
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        store = open_store(url, engine)
        try:
            assert claim_keys(store, 5, 5) == []
            assert running_per_key(engine) == {"k0": 1, "k1": 1, "k2": 1, "k3": 1}
        finally:
            store.close()
    finally:
        engine.dispose()
