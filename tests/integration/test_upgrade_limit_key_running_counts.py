"""Migration 0021 (SQLite: each key's count of RUNNING tasks kept by its changes, and
``ix_tasks_key_running`` dropped) on a SQLite database at 0020 with keyed tasks RUNNING
and waiting: the counts made exact, then kept exact by claims, outcomes and a changed
limit, across the upgrade, the downgrade and the upgrade again."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from durablesched import QueueLimits
from durablesched.records import NewTask, Outcome
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config
from durablesched.store.sql.sqlite import create_sqlite_engine

from ..conftest import T0, at
from .test_upgrade_limit_key_claim_statement import insert_old
from .test_upgrade_limit_key_claims import (
    LEASE,
    claim_old,
    keyed_queue_at,
    open_store,
    running_per_key,
    triggers,
)


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, Engine]:
    """A SQLite database (0021 changes nothing on PostgreSQL)."""
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def counted(engine: Engine) -> dict[str, int]:
    """Each key's RUNNING tasks, counted from the tasks (what the rows must hold)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT limit_key, count(*) FROM tasks WHERE limit_key IS NOT NULL "
                "AND state = 'RUNNING' GROUP BY limit_key"
            )
        )
        return {str(k): int(n) for k, n in rows}


def has_running_index(engine: Engine) -> bool:
    with engine.connect() as conn:
        sql = "SELECT count(*) FROM sqlite_master WHERE name = 'ix_tasks_key_running'"
        return bool(conn.execute(text(sql)).scalar())


def test_0021_keeps_running_counts_exact_up_down_and_up(database: tuple[str, Engine]) -> None:
    url, engine = database
    try:
        keyed_queue_at(engine, "0020", 2)
        before = triggers(engine)
        for task_id in range(1001, 1009):  # ids the store's counter does not hand out
            insert_old(engine, task_id, f"k{task_id % 2}")
        assert claim_old(engine) == [(1001, "k1"), (1002, "k0")]
        assert running_per_key(engine) == counted(engine) == {"k0": 1, "k1": 1}
        with engine.begin() as conn:  # a count gone wrong: the upgrade counts again
            conn.execute(text("UPDATE durablesched_limit_keys SET running = 7"))
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        assert triggers(engine) == before and not has_running_index(engine)
        assert running_per_key(engine) == counted(engine) == {"k0": 1, "k1": 1}
        store = open_store(url, engine)
        try:
            assert store.schema_revision == HEAD_REVISION
            taken = store.claim("w", 5, at(3), LEASE)
            assert len(taken) == 2 and running_per_key(engine) == {"k0": 2, "k1": 2}
            assert store.claim("w", 5, at(4), LEASE) == []  # both at their limit of 2
            store.record_and_claim([Outcome(taken[0])], at(5), owner="w", limit=0, lease=LEASE)
            assert running_per_key(engine) == counted(engine)
            # A new limit counts each key's RUNNING tasks into its new row.
            store.put_queue(QueueLimits("q", concurrency_per_key=3), at(6))
            assert running_per_key(engine) == counted(engine)
            store.submit([NewTask("t", {}, at(1), 3, None, None, "q", 0, "k2")] * 2, T0)
            assert len(store.claim("w", 5, at(7), LEASE)) == 3  # k0, k1 and k2
            assert running_per_key(engine) == counted(engine)
            assert sorted(counted(engine).values()) == [1, 2, 3]
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0020")
        assert triggers(engine) == before and has_running_index(engine)
        insert_old(engine, 2001, "k3")
        insert_old(engine, 2002, "k3")
        assert (2001, "k3") in claim_old(engine)  # 0020's trigger counts these claims
        assert running_per_key(engine) == counted(engine)
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        store = open_store(url, engine)
        try:
            assert store.claim("w", 5, at(8), LEASE)  # k3's next, at least
            assert running_per_key(engine) == counted(engine)
            assert counted(engine)["k3"] == 2
        finally:
            store.close()
    finally:
        engine.dispose()
