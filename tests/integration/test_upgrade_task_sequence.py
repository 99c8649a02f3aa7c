"""The migration that gives PostgreSQL its task id sequence, on a database holding tasks:
nothing is lost, every new task's id and ``seq`` is higher than any handed out before
(the counter's value or the tasks' own, whichever is higher), the counter row goes,
and the migration goes down (the row back, as high) and up again. SQLite keeps its
counter row: the migration changes nothing there.

The revision is found by its script's name, not spelled here: it may be renumbered.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from durablesched import PostgresStore, SQLiteStore, TaskState
from durablesched.records import NewTask
from durablesched.store.sql.migrate import alembic_config
from durablesched.store.sql.postgres import create_postgres_engine
from durablesched.store.sql.sqlite import create_sqlite_engine
from durablesched.store.sql.store import SQLStore

from ..conftest import T0

LEASE = timedelta(minutes=1)


def _revisions() -> tuple[str, str]:
    """(the sequence's revision, the one before it)."""
    scripts = ScriptDirectory.from_config(alembic_config())
    for script in scripts.walk_revisions():
        if script.path.endswith("_task_id_sequence.py"):
            assert isinstance(script.down_revision, str)
            return script.revision, script.down_revision
    raise AssertionError("no task id sequence migration")


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Engine]:
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        return url, create_postgres_engine(url)
    path = tmp_path / "old.db"
    return str(path), create_sqlite_engine(path)


def _open(url: str) -> SQLStore:
    if url.startswith("postgresql"):
        return PostgresStore(url, migrate=True)
    return SQLiteStore(url, migrate=True)


def _old_tasks(engine: Engine, counter: int) -> None:
    """Three tasks as the previous release wrote them: ids 1-3, the third requeued
    (its ``seq`` 7, taken later), and the counter at ``counter``."""
    stamp = "2030-01-01 00:00:10.000000" if engine.dialect.name == "sqlite" else T0
    with engine.begin() as conn:
        for task_id, seq in ((1, 1), (2, 2), (3, 7)):
            conn.execute(
                text(
                    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, "
                    "max_attempts, fence, idempotency_key, created_at, updated_at) "
                    "VALUES (:id, :seq, 'old', '{}', 'PENDING', :at, 0, 1, 0, :key, :at, :at)"
                ),
                {"id": task_id, "seq": seq, "key": f"k{task_id}", "at": stamp},
            )
            conn.execute(
                text(
                    "INSERT INTO task_events (task_id, at, state, attempt, detail) "
                    "VALUES (:id, :at, 'PENDING', 0, 'submitted')"
                ),
                {"id": task_id, "at": stamp},
            )
        conn.execute(
            text("UPDATE durablesched_counters SET value = :n WHERE name = 'task_seq'"),
            {"n": counter},
        )


def _counter(engine: Engine) -> int | None:
    with engine.connect() as conn:
        value = conn.execute(
            text("SELECT value FROM durablesched_counters WHERE name = 'task_seq'")
        ).scalar()
        conn.rollback()
    return None if value is None else int(value)


def test_new_tasks_get_higher_ids_and_seqs_and_nothing_is_lost(
    database: tuple[str, Engine],
) -> None:
    """The counter ahead of the tasks' ids and seqs, as every release left it."""
    _upgrade_and_check(*database, counter=9, first_new=10)


def test_a_counter_behind_the_tasks_still_starts_the_sequence_above_them(pg_url: str) -> None:
    """The sequence starts above the highest id or seq found (7), not the counter (5)."""
    _upgrade_and_check(pg_url, create_postgres_engine(pg_url), counter=5, first_new=8)


def _upgrade_and_check(url: str, engine: Engine, *, counter: int, first_new: int) -> None:
    revision, before = _revisions()
    postgres = engine.dialect.name == "postgresql"
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), before)
        _old_tasks(engine, counter)
        store = _open(url)
        try:
            (new,) = store.submit([NewTask("new", {}, T0, 1, "k-new")], T0)
            # SQLite keeps its counter, which the previous release kept right.
            assert new.task_id == (first_new if postgres else counter + 1)
            assert _counter(engine) == (None if postgres else counter + 1)
            # Nothing lost: the old tasks, their keys (a repeat dedupes), their history.
            (again,) = store.submit([NewTask("old", {}, T0, 1, "k2")], T0)
            assert (again.task_id, again.created) == (2, False)
            assert [e.detail for e in store.history(3)] == ["submitted"]
            new_task = store.get(new.task_id)
            assert new_task is not None and new_task.seq > 7
            # Equal due times: claimed in (due_at, seq) order, the new one last.
            claimed = store.claim("w", 10, T0, LEASE)
            assert [c.task_id for c in claimed] == [1, 2, 3, new.task_id]
            assert {t.state for t in map(store.get, (1, 2, 3)) if t} == {TaskState.RUNNING}
        finally:
            store.close()
        if not postgres:
            return
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), before)
        assert _counter(engine) == new.task_id  # the row back, as high as the sequence went
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)
        store = _open(url)
        try:
            (after,) = store.submit([NewTask("new", {}, T0, 1)], T0)
            assert after.task_id == new.task_id + 1
        finally:
            store.close()
    finally:
        engine.dispose()
