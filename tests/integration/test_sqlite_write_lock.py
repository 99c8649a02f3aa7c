"""SQLite write transactions begin IMMEDIATE: the write lock is taken before the first
read, so what a write transaction read cannot change under it.

The SQL of the firing step, the claim's limit count and the submit's key lookup
all read first and then write on that basis; on SQLite no row lock or re-check
backs them up (docs/reliability.md, "Every guard and the test that fails
without it"). With a deferred BEGIN another process could commit between the
read and the write.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from durablesched import SQLiteStore
from durablesched.records import NewTask
from durablesched.schedules import firing
from durablesched.schedules.declaration import schedule
from durablesched.store.sql import scheduling, transactions
from durablesched.store.sql import sqlite as sqlite_store

from ..conftest import WAIT
from .gates import Gate, Run

MINUTE = timedelta(minutes=1)
START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "q.db"


@pytest.fixture
def stores(path: Path) -> Iterator[tuple[SQLiteStore, SQLiteStore]]:
    """Two stores on one file: two processes' connections."""
    first, second = SQLiteStore(path), SQLiteStore(path)
    yield first, second
    first.close()
    second.close()


def test_a_write_transaction_holds_the_write_lock_from_its_first_read(
    path: Path, stores: tuple[SQLiteStore, SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = stores
    a.add_schedule(schedule("t", name="tick", every=60, overlap="allow"), START)
    gate = Gate()
    due_fires = firing.due_fires

    def planned_then_held(*args: Any, **kwargs: Any) -> Any:
        planned = due_fires(*args, **kwargs)
        gate()  # the step has read the due schedule and planned its fire
        return planned

    monkeypatch.setattr(scheduling, "due_fires", planned_then_held)
    first = Run(lambda: a.fire_schedules(START + MINUTE))
    assert gate.reached.wait(WAIT)
    # Meanwhile no other connection can begin a write: it would be told at once.
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            probe.execute("BEGIN IMMEDIATE")
    finally:
        probe.close()
    # Another store's step queues behind the first, then finds the fire made.
    second = Run(lambda: b.fire_schedules(START + MINUTE))
    gate.released.set()
    assert [f.fire_at for f in first.answer()] == [START + MINUTE]
    assert second.answer() == []
    assert len(a.list_tasks()) == 1
    assert a.next_fire_time() == START + 2 * MINUTE


def test_a_begin_that_finds_the_database_busy_is_retried_and_a_read_is_not_held(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN goes straight to the driver: a busy database must still leave it as the
    error the store retries (not the driver's own, raised to the caller), and a read
    transaction must still begin deferred (no write lock to wait for)."""
    monkeypatch.setattr(sqlite_store, "LOCK_WAIT", 0.001)  # SQLite's own handler: ~at once
    store = SQLiteStore(path)
    holder = sqlite3.connect(path, isolation_level=None)
    retried: list[float] = []

    def release_then_retry(delay: float) -> None:
        retried.append(delay)
        holder.execute("COMMIT")

    monkeypatch.setattr(
        transactions, "time", SimpleNamespace(monotonic=time.monotonic, sleep=release_then_retry)
    )
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert store.list_tasks() == []  # a read, while another connection writes
        assert retried == []  # ... without waiting for the write lock
        (submitted,) = store.submit([NewTask("t", {}, START, 1)], START)
        assert len(retried) == 1
        assert store.busy_retries == 1
        assert [t.id for t in store.list_tasks()] == [submitted.task_id]
    finally:
        holder.close()
        store.close()
