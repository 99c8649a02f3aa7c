"""Migration 0020 (SQLite: a claim's change fires a trigger of its own, the UPDATE trigger
every other change) on a SQLite database at 0019 with keyed tasks RUNNING and waiting:
heads, counts and the limit per key hold across the upgrade, the downgrade and the
upgrade again."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine

from durablesched.records import NewTask
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config
from durablesched.store.sql.sqlite import create_sqlite_engine

from ..conftest import T0, at
from .test_upgrade_limit_key_claim_statement import insert_old, update_trigger
from .test_upgrade_limit_key_claims import (
    claim_keys,
    claim_old,
    keyed_queue_at,
    open_store,
    running_per_key,
    triggers,
)
from .test_upgrade_limit_key_waiting_index import waiting_per_key


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, Engine]:
    """A SQLite database (0020 changes nothing on PostgreSQL)."""
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def test_0020_keeps_heads_and_limits_up_down_and_up(database: tuple[str, Engine]) -> None:
    url, engine = database
    try:
        keyed_queue_at(engine, "0019", 2)
        before, old_trigger = triggers(engine), update_trigger(engine)
        for task_id in range(1001, 1009):  # ids the store's counter does not hand out
            insert_old(engine, task_id, f"k{task_id % 2}")
        assert claim_old(engine) == [(1001, "k1"), (1002, "k0")]  # the keys' heads only
        assert running_per_key(engine) == {"k0": 1, "k1": 1}
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        assert triggers(engine) == before | {"durablesched_limit_key_claim"}
        assert " AND NOT (OLD.state IN " in update_trigger(engine)
        assert waiting_per_key(engine) == {"k0": 3, "k1": 3}
        store = open_store(url, engine)
        try:
            assert store.schema_revision == HEAD_REVISION
            assert claim_keys(store, 5, 3) == ["k0", "k1"]  # counted by the claim's trigger
            assert claim_keys(store, 5, 4) == []  # both at their limit of 2
            assert running_per_key(engine) == {"k0": 2, "k1": 2}
            assert waiting_per_key(engine) == {"k0": 2, "k1": 2}
            # A new key: its first task is its head at once; with room after its claim,
            # the claim's trigger makes the next one the head.
            store.submit([NewTask("t", {}, at(1), 3, None, None, "q", 0, "k2")] * 3, T0)
            assert claim_keys(store, 5, 5) == ["k2"]
            assert claim_keys(store, 5, 6) == ["k2"]
            assert claim_keys(store, 5, 7) == []
            assert running_per_key(engine) == {"k0": 2, "k1": 2, "k2": 2}
            assert waiting_per_key(engine)["k2"] == 1
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0019")
        assert (triggers(engine), update_trigger(engine)) == (before, old_trigger)
        insert_old(engine, 2001, "k3")
        insert_old(engine, 2002, "k3")
        assert claim_old(engine) == [(2001, "k3")]  # 0019's trigger counts this claim
        assert running_per_key(engine)["k3"] == 1
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        store = open_store(url, engine)
        try:
            assert claim_keys(store, 5, 8) == ["k3"]
            assert claim_keys(store, 5, 9) == []
            assert running_per_key(engine) == {"k0": 2, "k1": 2, "k2": 2, "k3": 2}
        finally:
            store.close()
    finally:
        engine.dispose()
