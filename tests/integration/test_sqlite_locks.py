"""A write that waited more than a second for a lock says so, naming the lock."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from durablesched import SQLiteStore
from durablesched.records import NewTask

from ..conftest import T0, WAIT

#: How long the lock is held: a bit more than the warning's second.
HOLD = 1.2


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "durablesched.store" and r.levelno == logging.WARNING
    ]


def test_a_write_kept_waiting_by_another_connection_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "q.db")
    store.submit([NewTask("first", {}, T0, 1)], T0)  # the kept connection exists, unhurried
    assert warnings_of(caplog) == []
    holder = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    submitted = threading.Event()

    def submit() -> None:
        store.submit([NewTask("t", {}, T0, 1)], T0)
        submitted.set()

    waiter = threading.Thread(target=submit)
    try:
        held_since = time.monotonic()
        waiter.start()
        assert not submitted.wait(HOLD)  # it cannot write while the lock is held
        held = time.monotonic() - held_since
    finally:
        holder.execute("COMMIT")
        holder.close()
    waiter.join(WAIT)
    store.close()
    assert submitted.is_set() and held >= HOLD
    (message,) = warnings_of(caplog)
    assert message.startswith("submitting tasks waited 1.")
    assert message.endswith("for the database's write lock (another connection held it)")


def test_a_write_kept_waiting_by_another_thread_of_the_process_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "q.db")
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with store._write("a long write"):
            holding.set()
            done.wait(HOLD)  # never set: holds the write connection for HOLD seconds

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(WAIT)
    store.submit([NewTask("t", {}, T0, 1)], T0)
    holder.join(WAIT)
    store.close()
    (message,) = warnings_of(caplog)
    assert message.startswith("submitting tasks waited 1.")
    assert message.endswith("for this process's write connection (another thread was writing)")
