"""A write that waited more than a second for a lock says so, naming the lock."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from durablesched import SQLiteStore, TaskState
from durablesched.records import NewTask
from durablesched.store.sql.transactions import Transactions

from ..conftest import T0, WAIT

T = TypeVar("T")

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


class HandClock:
    """A monotonic clock that moves only when told: stands in for a long wait."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


LEASE = timedelta(seconds=30)


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


def kept_waiting(store: SQLiteStore, db: Path, seconds: float, write: Callable[[], T]) -> T:
    """Run ``write`` on ``store`` while another connection holds the write lock, which
    it releases once the write is queued for it; ``seconds`` of waiting pass meanwhile
    on the store's (hand-moved) monotonic clock."""
    clock = HandClock()
    store._monotonic = clock
    queued = threading.Event()
    begin = store._begin

    def begin_watched(engine: Any, kept: Any = None) -> Any:
        if engine is store.engine:  # a write's BEGIN, not a read's
            queued.set()
        return begin(engine, kept)

    store._begin = begin_watched  # type: ignore[method-assign]
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # e.g. a sqlite3 shell left in a transaction
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(write()))
    try:
        thread.start()
        assert queued.wait(WAIT)
        clock.t += seconds
    finally:
        holder.execute("COMMIT")
        holder.close()
    thread.join(WAIT)
    del store._begin
    (value,) = result
    return value


def test_a_reclaimer_kept_waiting_longer_than_a_lease_lets_live_workers_renew_first(
    tmp_path: Path,
) -> None:
    """Issue 17 item 3: a lock held past the leases' expiry must not let the first
    writer after it end the leases of workers that are alive, only queued behind it."""
    db = tmp_path / "q.db"
    owner, reclaimer = SQLiteStore(db), SQLiteStore(db)
    owner.submit([NewTask("live", {}, T0, 3), NewTask("dead", {}, T0, 3)], T0)
    live = owner.claim("live-worker", 1, T0, LEASE)  # leases until T0+30s
    dead = owner.claim("dead-worker", 1, T0, LEASE)
    reclaimer._wall = lambda: T0 + timedelta(seconds=60)
    # It looks at T0+60s, after waiting a minute for the lock: nothing is judged...
    reclaimed = kept_waiting(
        reclaimer, db, 60, lambda: reclaimer.reclaim_expired(T0 + timedelta(seconds=60), no_delay)
    )
    assert reclaimed == []
    # ...and the live worker, whose heartbeat queued behind the lock too, renews.
    (status,) = owner.heartbeat("live-worker", live, T0 + timedelta(seconds=80), LEASE)
    assert status.task_id == live[0].task_id
    later = T0 + timedelta(seconds=95)
    assert reclaimer.reclaim_expired(later, no_delay) == []  # still settling
    reclaimer._monotonic.t += Transactions.RECLAIM_SETTLE  # type: ignore[attr-defined]
    (gone,) = reclaimer.reclaim_expired(later, no_delay)
    assert gone.task_id == dead[0].task_id  # the dead worker's turn came, one wait late
    assert owner.get(live[0].task_id).state is TaskState.RUNNING  # type: ignore[union-attr]
    owner.close()
    reclaimer.close()


def test_a_write_kept_waiting_gives_the_wait_back_to_every_valid_lease(tmp_path: Path) -> None:
    """The live worker's own write is first after the lock: its lease, and every other
    lease valid when it began waiting, is extended by the wait, so that a reclaimer
    that never waited (it came after) finds nothing to reclaim."""
    db = tmp_path / "q.db"
    owner, reclaimer = SQLiteStore(db), SQLiteStore(db)
    owner.submit([NewTask("mine", {}, T0, 3), NewTask("other", {}, T0, 3)], T0)
    mine = owner.claim("live-worker", 1, T0, LEASE)
    other = owner.claim("other-worker", 1, T0, LEASE)
    owner._wall = lambda: T0 + timedelta(seconds=80)  # when the lock is released
    beat = T0 + timedelta(seconds=20)  # the heartbeat began before the lease ran out
    (status,) = kept_waiting(
        owner, db, 60, lambda: owner.heartbeat("live-worker", mine, beat, LEASE)
    )
    assert status.lease_expires_at == beat + LEASE  # as asked; the wait is added on commit
    records = {t: owner.get(t) for t in (mine[0].task_id, other[0].task_id)}
    expiry = {t: r.lease_expires_at for t, r in records.items() if r is not None}
    assert expiry == {
        mine[0].task_id: beat + LEASE + timedelta(seconds=60),
        other[0].task_id: T0 + LEASE + timedelta(seconds=60),
    }
    assert reclaimer.reclaim_expired(T0 + timedelta(seconds=85), no_delay) == []
    owner.close()
    reclaimer.close()
