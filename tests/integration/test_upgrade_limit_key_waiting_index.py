"""Migration 0019 (SQLite: the index of a key's claimable tasks holds its waiting tasks
only; the triggers' first claimable task and the view's count follow) on a SQLite
database at 0018 with keyed tasks RUNNING and waiting: heads, counts and the limit per key
hold across the upgrade, the downgrade and the upgrade again."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from durablesched.records import NewTask
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config
from durablesched.store.sql.sqlite import create_sqlite_engine

from ..conftest import T0, at
from .test_upgrade_limit_key_claim_statement import insert_old
from .test_upgrade_limit_key_claims import (
    claim_keys,
    claim_old,
    keyed_queue_at,
    open_store,
    running_per_key,
    triggers,
)


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, Engine]:
    """A SQLite database (0019 changes nothing on PostgreSQL)."""
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def index_where(engine: Engine) -> str:
    with engine.connect() as conn:
        sql = "SELECT sql FROM sqlite_master WHERE name = 'ix_tasks_key_claimable'"
        return str(conn.execute(text(sql)).scalar_one()).split(" WHERE ", 1)[1]


def waiting_per_key(engine: Engine) -> dict[str, int]:
    """The view's count of each key's claimable tasks (``queue_limit_keys.waiting``)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT limit_key, waiting FROM queue_limit_keys"))
        return {str(k): int(n) for k, n in rows}


def test_0019_keeps_heads_and_limits_up_down_and_up(database: tuple[str, Engine]) -> None:
    url, engine = database
    try:
        keyed_queue_at(engine, "0018", 2)
        before, old_where = triggers(engine), index_where(engine)
        for task_id in range(1001, 1009):  # ids the store's counter does not hand out
            insert_old(engine, task_id, f"k{task_id % 2}")
        assert claim_old(engine) == [(1001, "k1"), (1002, "k0")]  # the keys' heads only
        assert running_per_key(engine) == {"k0": 1, "k1": 1}
        assert waiting_per_key(engine) == {"k0": 3, "k1": 3}  # a head each, two waiting
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        assert triggers(engine) == before | {"durablesched_limit_key_claim"}  # 0020
        assert "key_waiting = 0" not in old_where and "key_waiting = 1" in index_where(engine)
        assert waiting_per_key(engine) == {"k0": 3, "k1": 3}
        store = open_store(url, engine)
        try:
            assert store.schema_revision == HEAD_REVISION
            assert claim_keys(store, 5, 3) == ["k0", "k1"]  # the heads; next ones chosen
            assert claim_keys(store, 5, 4) == []  # both at their limit of 2
            assert running_per_key(engine) == {"k0": 2, "k1": 2}
            assert waiting_per_key(engine) == {"k0": 2, "k1": 2}
            # A new key's first task becomes its head at once (not in the index).
            store.submit([NewTask("t", {}, at(1), 3, None, None, "q", 0, "k2")] * 2, T0)
            assert waiting_per_key(engine)["k2"] == 2
            assert claim_keys(store, 5, 5) == ["k2"]
            assert claim_keys(store, 5, 6) == ["k2"]
            assert claim_keys(store, 5, 7) == []
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0018")
        assert (triggers(engine), index_where(engine)) == (before, old_where)
        assert waiting_per_key(engine) == {"k0": 2, "k1": 2, "k2": 0}
        insert_old(engine, 2001, "k3")
        insert_old(engine, 2002, "k3")
        assert claim_old(engine) == [(2001, "k3")]
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
