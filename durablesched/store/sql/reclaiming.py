"""Crash recovery: finalising tasks whose worker stopped renewing its lease.

The lost attempt counts. Each UPDATE re-checks state, fence and expiry
(``SQL_RECLAIM``), so a completion that landed a moment earlier is never
overwritten.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Row

from durablesched.errors import LeaseExpired
from durablesched.records import ErrorInfo, Reclaimed
from durablesched.states import TERMINAL, TaskState
from durablesched.store.protocol import RetryDelay
from durablesched.store.sql.codec import error_json, from_db_time
from durablesched.store.sql.statements import SQL_ANY_EXPIRED, SQL_EXPIRED, SQL_RECLAIM
from durablesched.store.sql.totals import add_totals
from durablesched.store.sql.transactions import Transactions
from durablesched.totals import NO_DURATION, Tally, add

log = logging.getLogger("durablesched.store")


def reclaim_expired(tx: Transactions, now: datetime, retry_delay: RetryDelay) -> list[Reclaimed]:
    """CANCELLED if cancellation was requested, FAILED if attempts are exhausted, else
    RETRY_WAIT after ``retry_delay``. A read looks first: no expiry, no write lock.

    Nothing is reclaimed while this process saw the write lock held long just now
    (:meth:`Transactions.lock_settling`): live owners' heartbeats come first."""
    stamp = tx._t(now)
    with tx._read("looking for expired leases") as conn:
        if conn.execute(SQL_ANY_EXPIRED, {"now": stamp}).first() is None:
            return []
    reclaimed: list[Reclaimed] = []
    tallies: dict[str, Tally] = {}  # by the lost owner: each adds to its own shard
    with tx._write("reclaiming expired leases") as conn:
        if tx.lock_settling():
            # The write lock was held a long while (by anyone, even outside the
            # queue): live workers' heartbeats queued behind it too. Let them renew
            # before their leases are judged; a dead worker's waits one turn more.
            log.info("reclaim deferred: the write lock was held a long while just now")
            return reclaimed
        expired = conn.execute(SQL_EXPIRED, {"now": stamp}).all()
        # Each one's fate first (the retry policy is the caller's code: run before any
        # row is locked), then, on PostgreSQL, the rows and the parents a failed or
        # cancelled one wakes, locked in id order, as every outcome's transaction does
        # (a parent locked after its child's row would go against a group commit holding
        # both in order); each UPDATE re-checks state, fence and expiry.
        fates = [fate(r, now, retry_delay) for r in expired]
        ending = (r.id for r, f in zip(expired, fates, strict=True) if f.state in TERMINAL)
        tx._lock_tasks(conn, (r.id for r in expired), ending)
        for r, (state, due_at, finished_at, detail, error) in zip(expired, fates, strict=True):
            updated = conn.execute(
                SQL_RECLAIM,
                {
                    "id": r.id,
                    "fence": r.fence,
                    "now": stamp,
                    "state": state.value,
                    "due_at": None if due_at is None else tx._t(due_at),
                    "finished_at": None if finished_at is None else tx._t(finished_at),
                    "error": error_json(error),
                },
            ).rowcount
            if updated:
                failed = state is not TaskState.CANCELLED  # the attempt failed: say why
                tx._event(conn, r.id, now, state, r.attempts, detail, error if failed else None)
                reclaimed.append(Reclaimed(r.id, r.name, r.attempts, r.lease_owner, state))
                tally = tallies.setdefault(r.lease_owner, {})
                add(tally, (r.queue, r.name, "reclaimed", NO_DURATION), 0)
        for owner in sorted(tallies):
            add_totals(tx, conn, tallies[owner], owner)
        tx._tell_finished(conn, (r.task_id for r in reclaimed if r.state in TERMINAL), now)
    return reclaimed


class Fate(NamedTuple):
    """What a reclaim makes of one expired attempt."""

    state: TaskState
    due_at: datetime | None
    finished_at: datetime | None
    detail: str
    error: ErrorInfo


def fate(r: Row[Any], now: datetime, retry_delay: RetryDelay) -> Fate:
    """CANCELLED if cancellation was requested, FAILED if attempts are exhausted, else
    RETRY_WAIT after ``retry_delay``."""
    detail = (
        f"lease of {r.lease_owner} expired at "
        f"{from_db_time(r.lease_expires_at).isoformat()} during attempt {r.attempts}"
    )
    error = ErrorInfo.recorded(LeaseExpired, detail)
    if r.cancel_requested_at is not None:
        return Fate(TaskState.CANCELLED, None, now, detail, error)
    if r.attempts >= r.max_attempts:
        return Fate(TaskState.FAILED, None, now, detail, error)
    due_at = now + retry_delay(r.name, r.attempts)
    return Fate(TaskState.RETRY_WAIT, due_at, None, detail, error)
