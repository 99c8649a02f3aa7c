"""A long reader lets the WAL grow; once it ends, the next write truncates it."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from durablesched import SQLiteStore
from durablesched.records import NewTask

from ..conftest import T0

LIMIT = 2**20


def wal_size(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def submit_some(store: SQLiteStore, i: int) -> None:
    store.submit([NewTask("t", {"i": i, "pad": "x" * 2000}, T0, 1) for _ in range(100)], T0)


def test_the_wal_is_cut_back_under_its_limit_once_a_long_reader_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "q.db"
    store = SQLiteStore(path, wal_limit=LIMIT)
    store._wal.check_interval = 0  # look after every commit, not once a second
    submit_some(store, 0)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    (before,) = reader.execute("SELECT count(*) FROM tasks").fetchone()
    try:
        for i in range(1, 200):  # bounded: 3 MiB of WAL comes in about 15 batches
            submit_some(store, i)
            if wal_size(path) > 3 * LIMIT:
                break
        grown = wal_size(path)
        # The reader's snapshot is still whole: the WAL could not be reset under it.
        assert reader.execute("SELECT count(*) FROM tasks").fetchone() == (before,)
    finally:
        reader.execute("COMMIT")
    assert grown > 3 * LIMIT
    assert any("a reader holds a snapshot open" in r.getMessage() for r in caplog.records)
    caplog.clear()
    submit_some(store, -1)  # the next write after the reader left truncates the WAL
    assert wal_size(path) < LIMIT
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    store.close()
    reader.close()


def test_connections_carry_the_journal_size_limit(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "q.db", wal_limit=LIMIT)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_size_limit").scalar() == LIMIT
    store.close()


def test_truncate_wal_on_demand_says_whether_it_could(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    store = SQLiteStore(path)
    submit_some(store, 0)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM tasks").fetchone()
    submit_some(store, 1)
    assert store.truncate_wal() is False  # returns at once: no busy wait for the reader
    reader.execute("COMMIT")
    reader.close()
    assert store.truncate_wal() is True
    assert wal_size(path) == 0
    store.close()
