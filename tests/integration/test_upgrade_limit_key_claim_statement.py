"""Migration 0018 (PostgreSQL: the claim statement counts its starts per key, the UPDATE
trigger does not fire for a claim; SQLite: nothing) on a database at 0017 with keyed tasks
RUNNING and waiting: the limit per key holds across the upgrade, the downgrade (0017's
trigger counting a claim again) and the upgrade again."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine, text

from durablesched.records import NewTask
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config

from ..conftest import T0, at
from .test_upgrade_limit_key_claims import (
    claim_keys,
    claim_old,
    database,
    keyed_queue_at,
    open_store,
    running_per_key,
    stamp,
    triggers,
)

__all__ = ["database"]  # the fixture, shared


def insert_old(engine: Engine, task_id: int, key: str, due: int = 1) -> None:
    """A keyed task of queue q, due at second ``due``, as the code from 0017 to 0021
    inserted it: SQLite, into the view whose trigger keeps its key; PostgreSQL, into
    tasks (its INSERT trigger fires)."""
    into = "durablesched_new_keyed_tasks" if engine.dialect.name == "sqlite" else "tasks"
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {into} (id, seq, name, args, state, due_at, attempts, "
                "max_attempts, fence, idempotency_key, created_at, updated_at, queue, priority, "
                "limit_key) VALUES (:id, :id, 't', '{}', 'PENDING', :due, 0, 3, 0, NULL, :due, "
                ":due, 'q', 0, :key)"
            ),
            {"id": task_id, "due": stamp(engine, due), "key": key},
        )


def update_trigger(engine: Engine) -> str:
    """How the UPDATE trigger on tasks is defined (SQLite: its SQL; PostgreSQL: its WHEN)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            sql = "SELECT sql FROM sqlite_master WHERE name = 'durablesched_limit_key_update'"
        else:
            sql = (
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE tgname = 'durablesched_limit_key_update' "
                "AND tgrelid = to_regclass('tasks')"
            )
        return str(conn.execute(text(sql)).scalar_one())


def test_0018_keeps_limits_per_key_up_down_and_up(database: tuple[str, Engine]) -> None:
    url, engine = database
    postgres = engine.dialect.name == "postgresql"
    try:
        keyed_queue_at(engine, "0017", 1)
        before, old_trigger = triggers(engine), update_trigger(engine)
        for task_id in range(1001, 1007):  # ids the store's counter does not hand out
            insert_old(engine, task_id, f"k{task_id % 2}")
        assert claim_old(engine) == [(1001, "k1"), (1002, "k0")]  # the keys' heads only
        assert running_per_key(engine) == {"k0": 1, "k1": 1}
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        # PostgreSQL: a claim's change no longer fires the trigger; SQLite: it fires a
        # trigger of its own (migration 0020), the UPDATE trigger every other change.
        if postgres:
            assert triggers(engine) == before
            assert "'RUNNING'" not in old_trigger and "'RUNNING'" in update_trigger(engine)
        else:
            assert triggers(engine) == before | {"durablesched_limit_key_claim"}
            when = update_trigger(engine).split(" BEGIN ")[0]
            assert when.startswith(old_trigger.split(" BEGIN ")[0] + " AND NOT (")
        store = open_store(url, engine)
        try:
            assert store.schema_revision == HEAD_REVISION
            assert claim_keys(store, 5, 3) == []  # both keys at their limit
            store.submit([NewTask("t", {}, at(1), 3, None, None, "q", 0, "k2")] * 2, T0)
            assert claim_keys(store, 5, 4) == ["k2"]  # counted by the claim statement
            assert running_per_key(engine) == {"k0": 1, "k1": 1, "k2": 1}
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0017")
        assert (triggers(engine), update_trigger(engine)) == (before, old_trigger)
        insert_old(engine, 2001, "k3")
        insert_old(engine, 2002, "k3")
        assert claim_old(engine) == [(2001, "k3")]  # 0017's trigger counts this claim
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
