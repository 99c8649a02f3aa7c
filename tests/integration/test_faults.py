"""Faults: a full disk, a read-only database; nothing half-written, clear errors."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from durablesched import SQLiteStore, StoreError, TaskState
from durablesched.records import NewTask

from ..conftest import T0, at

LEASE = timedelta(seconds=30)


def limit_growth(store: SQLiteStore, path: Path) -> None:
    """Simulate a full disk: no connection may grow the file past its current size."""
    with sqlite3.connect(path) as conn:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
    store.close()  # every connection opened from now on gets the cap

    @event.listens_for(store.engine, "connect")
    def _cap(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")


def integrity(path: Path) -> tuple[str, int]:
    with sqlite3.connect(path) as conn:
        (check,) = conn.execute("PRAGMA integrity_check").fetchone()
        (count,) = conn.execute("SELECT count(*) FROM tasks").fetchone()
    return str(check), int(count)


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "full.db"


def test_disk_full_during_submit_fails_clearly_and_keeps_what_was_stored(path: Path) -> None:
    store = SQLiteStore(path)
    store.submit([NewTask("keep", {"i": i}, T0, 3) for i in range(10)], T0)
    limit_growth(store, path)
    big = [NewTask("big", {"blob": "x" * 5000, "i": i}, T0, 3) for i in range(500)]
    with pytest.raises(StoreError, match="submitting tasks failed: database or disk is full"):
        store.submit(big, T0)
    store.close()
    assert integrity(path) == ("ok", 10)
    # The stored tasks are untouched and still claimable once there is room again.
    store = SQLiteStore(path)
    claims = store.claim("w", 20, T0, LEASE)
    assert [c.args["i"] for c in claims] == list(range(10))
    store.close()


def test_disk_full_during_success_leaves_the_task_running_until_it_can_be_recorded(
    path: Path,
) -> None:
    store = SQLiteStore(path)
    (s,) = store.submit([NewTask("t", {}, T0, 3)], T0)
    (claim,) = store.claim("w", 1, T0, LEASE)
    limit_growth(store, path)
    with pytest.raises(
        StoreError, match=r"recording the success of task \d+ failed: database or disk is full"
    ):
        store.complete(claim, {"blob": "y" * 200_000}, at(11))
    task = store.get(s.task_id)
    assert task is not None
    assert (task.state, task.lease_owner, task.result) == (TaskState.RUNNING, "w", None)
    store.close()
    assert integrity(path) == ("ok", 1)
    # Room again: the same (still valid) claim records its success; or the lease runs
    # out and the task is reclaimed. Here it is recorded.
    store = SQLiteStore(path)
    assert store.complete(claim, {"small": 1}, at(12))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM idempotency_keys").fetchone() == (1,)
    store.close()


def test_a_read_only_database_refuses_writes_clearly_and_still_reads(path: Path) -> None:
    store = SQLiteStore(path)
    (s,) = store.submit([NewTask("t", {}, T0, 3)], T0)
    store.close()
    ro = SQLiteStore(f"sqlite:///file:{path}?mode=ro&uri=true")
    try:
        task = ro.get(s.task_id)
        assert task is not None and task.state is TaskState.PENDING
        with pytest.raises(
            StoreError, match="submitting tasks failed: attempt to write a readonly"
        ):
            ro.submit([NewTask("t", {}, T0, 3)], T0)
        with pytest.raises(StoreError, match="claiming tasks failed: attempt to write a readonly"):
            ro.claim("w", 1, T0, LEASE)
    finally:
        ro.close()
    assert integrity(path) == ("ok", 1)
