"""Where a task is claimed: the dialect's claim statement, then its rows made into claims.

The claim runs inside a write transaction (alone, or after a group commit's
outcomes); the rows become :class:`Claim` objects only after the commit, so
the write lock is held for the statements alone.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from durablesched.queues import QueueLimits, Rate, rate_frees_at
from durablesched.records import Claim, JSONArgs, Outcome, effective_key, split_trace
from durablesched.store.sql.codec import from_db_time
from durablesched.store.sql.statements import (
    MARK_STARTED,
    QUEUE_ROWS,
    SQL_BLOCK_KEY,
    SQL_FORGET_KEY_STARTS,
    SQL_FORGET_STARTS,
    SQL_FREE_KEY,
    SQL_HOLD_BACK,
    SQL_IN_PROCESS,
    SQL_KEY_HEAD,
    SQL_KEY_RELEASE,
    SQL_KEY_ROLLBACK,
    SQL_KEY_SAVEPOINT,
    SQL_KEY_STARTS,
    SQL_KEYS_TO_FREE,
    SQL_QUEUE_STARTS,
    SQL_REMEMBER_KEY_START,
    SQL_REMEMBER_START,
    SQL_RUNNING_IN_QUEUE,
    SQL_TOUCH_KEY,
    START_LINE,
)
from durablesched.store.sql.transactions import Transactions


def claim_rows(
    tx: Transactions,
    conn: Connection,
    *,
    owner: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    names: Collection[str] | None,
    process_names: Collection[str] = (),
    stored: dict[str, QueueLimits],
    queues: Mapping[str, int] | None = None,
    ahead: bool = False,
) -> list[Any]:
    """Claim in ``conn``'s transaction; the rows for :func:`claims_from_rows`, to be made into
    claims after it commits.

    Up to ``queues[q]`` tasks from each queue ``q`` (or from every queue, without
    ``queues``), ``limit`` in all, each queue within the limits stored for it.
    With ``ahead`` (a claim ahead: not started), only from queues with no stored limit,
    and ``started_at`` left NULL. ``stored``: the queues' limits, as read in this
    transaction (:func:`read_limits`).
    """
    if names is not None and not names:
        return []  # no name qualifies (and ``IN ()`` is no SQL)
    stamp = tx._t(now)
    wanted = {q: limit for q in stored} if queues is None else {q: n for q, n in queues.items()}
    if ahead:
        # A claim ahead waits in the worker: a limited queue's concurrency or rate
        # window would count it from its claim, not from its start.
        wanted = {q: n for q, n in wanted.items() if q not in stored or not stored[q].limited}
    allowed = _allowances(tx, conn, stored, wanted, now)
    arms = [(q, min(n, limit)) for q, n in sorted(allowed.items()) if n > 0]
    if not arms:
        return []
    key_rated = _unblock_keys(tx, conn, stored, [q for q, _ in arms], stamp)
    keyed = _counted_per_key(tx, stored, [q for q, _ in arms])
    params: dict[str, Any] = {
        "owner": owner,
        "lease_expires_at": tx._t(now + lease),
        "now": stamp,
        "limit": limit,
        "started": None if ahead else stamp,
    }
    for k, (queue, n) in enumerate(arms):
        params[f"q{k}"] = queue
        params[f"l{k}"] = n
    ordered = sorted(names) if names is not None else []
    params.update((f"n{i}", name) for i, name in enumerate(ordered))
    if keyed:
        params["keyed"] = keyed
    # id, seq, name, args, attempts, max_attempts, fence, due_at, idempotency_key, queue,
    # priority, created_at, limit_key (and, from the claim of ``keyed``: sync its key?)
    most = max(n for _, n in arms)
    statement = tx.dialect.claim_for(len(arms), len(ordered), keyed=bool(keyed), most=most)
    if key_rated:
        rows = _claim_within_key_rates(tx, conn, statement, params, key_rated=key_rated, now=now)
    else:
        rows = tx._rows(conn, statement, params)
    if not rows:
        return []
    _sync_keys(tx, conn, rows, set(keyed))
    in_process = [r[0] for r in rows if r[2] in process_names]
    if in_process:
        conn.execute(SQL_IN_PROCESS, {"ids": in_process})
    rated = {q for q, limits in stored.items() if limits.rate is not None and not limits.paused}
    for r in rows:
        if r[9] in rated:
            conn.execute(SQL_REMEMBER_START, {"queue": r[9], "at": stamp})
    if not tx.dialect.writes_history:
        detail = f"claimed by {owner} from queue "
        tx._many(
            conn,
            tx.dialect.insert_events,
            [(r[0], stamp, "RUNNING", r[4], detail + r[9]) for r in rows],
        )
    return rows


def read_limits(tx: Transactions, conn: Connection) -> dict[str, QueueLimits]:
    """The limits of every queue, read in ``conn``'s transaction."""
    return _stored_limits(tuple(tx._rows(conn, tx.dialect.prepared(QUEUE_ROWS), {})))


def _counted_per_key(
    tx: Transactions, stored: dict[str, QueueLimits], queues: list[str]
) -> list[str]:
    """Of ``queues``, those limited per key whose starts the claim statement counts on
    their keys' rows (``SQLDialect.claim_keyed``); none where the triggers do."""
    if tx.dialect.claim_keyed is None:
        return []
    return [q for q in queues if q in stored and stored[q].keyed]


def _sync_keys(tx: Transactions, conn: Connection, rows: list[Any], keyed: set[str]) -> None:
    """Where the claim statement counts starts per key (PostgreSQL: no trigger fires for a
    claim, migration 0018), bring up to date in the claim's transaction each key it could
    not settle: one with room for a next head or without a row (as the statement said),
    and each key of a queue the claim did not take as limited per key (its limits may
    have changed since they were read; the sync reads them under the queue's lock)."""
    if tx.dialect.sync_keys is None:
        return
    keys = sorted({_key_of(r) for r in rows if r[12] is not None and (r[9] not in keyed or r[13])})
    if keys:
        conn.execute(
            tx.dialect.sync_keys, {"queues": [q for q, _ in keys], "keys": [k for _, k in keys]}
        )


def _key_of(row: Any) -> tuple[str, str]:
    return (row[9], row[12])


def _unblock_keys(
    tx: Transactions,
    conn: Connection,
    stored: dict[str, QueueLimits],
    queues: list[str],
    stamp: Any,
) -> dict[str, Rate]:
    """In each of ``queues`` with a rate per key, free the keys whose full rate window has
    passed: each gets a head (the triggers choose it, from its first claimable task),
    claimable by this claim. Returns those queues' rates per key."""
    key_rated: dict[str, Rate] = {}
    for queue in sorted(queues):
        known = stored.get(queue)
        if known is None or known.rate_per_key is None:
            continue
        key_rated[queue] = known.rate_per_key
        keys = [k for (k,) in conn.execute(SQL_KEYS_TO_FREE, {"queue": queue, "now": stamp})]
        for key in keys:
            conn.execute(SQL_FREE_KEY, {"queue": queue, "key": key})
            conn.execute(SQL_TOUCH_KEY, {"queue": queue, "key": key})
    return key_rated


def _claim_within_key_rates(
    tx: Transactions,
    conn: Connection,
    statement: str,
    params: dict[str, Any],
    *,
    key_rated: dict[str, Rate],
    now: datetime,
) -> list[Any]:
    """The claim statement's rows, each start of a keyed, rated queue counted in its key's
    window.

    A claim reads its clock before it waits for the write lock, so claims commit with
    times out of order, and a key left with a head by a claim at a later time may be
    full at this claim's: its window counts every start after ``now`` minus the window,
    those "in its future" too. Such a key's start is undone (the statement runs after a
    savepoint and is rolled back to it), the key is blocked until its window admits a
    start at ``now``, and the statement runs again (each round blocks one more key).
    Claims in time order never roll back."""
    while True:
        conn.execute(SQL_KEY_SAVEPOINT)
        rows = tx._rows(conn, statement, params)
        full = _count_key_starts(tx, conn, rows, key_rated, now)
        if full is None:
            conn.execute(SQL_KEY_RELEASE)
            return rows
        conn.execute(SQL_KEY_ROLLBACK)
        conn.execute(SQL_KEY_RELEASE)
        key, frees = full
        _block_key(tx, conn, key, frees)


def _count_key_starts(
    tx: Transactions,
    conn: Connection,
    rows: list[Any],
    key_rated: dict[str, Rate],
    now: datetime,
) -> tuple[tuple[str, str], datetime] | None:
    """Each claimed task of a keyed, rated queue counted in its key's window; or the first
    key whose window was already full at ``now``, and when it admits a start at ``now``
    (the starts counted before it are to be rolled back)."""
    for r in sorted((r for r in rows if r[9] in key_rated and r[12] is not None), key=_key_of):
        key = _key_of(r)
        full = _count_key_start(tx, conn, key, key_rated[key[0]], now)
        if full is not None:
            return key, full
    return None


def _count_key_start(
    tx: Transactions, conn: Connection, key: tuple[str, str], rate: Rate, now: datetime
) -> datetime | None:
    """Remember a start of ``key`` (queue, limit key) if its window at ``now`` has room
    (every start after ``now`` minus the window counts, later ones too); if the window is
    then full, take its head away until it admits another start (a claim takes at most
    one task of a key). A window full already: when it admits a start, nothing done."""
    where = {"queue": key[0], "key": key[1]}
    since = tx._t(now - rate.per)
    starts = [from_db_time(t) for (t,) in conn.execute(SQL_KEY_STARTS, {**where, "since": since})]
    full = rate_frees_at(rate, starts, now)
    if full is not None:
        return full
    conn.execute(SQL_REMEMBER_KEY_START, {**where, "at": tx._t(now)})
    conn.execute(SQL_FORGET_KEY_STARTS, {**where, "before": tx._t(rate.forget_before(now))})
    frees = rate_frees_at(rate, [*starts, now], now)
    if frees is not None:
        _block_key(tx, conn, key, frees)
    return None


def _block_key(tx: Transactions, conn: Connection, key: tuple[str, str], until: datetime) -> None:
    """Leave ``key`` without a head (its head held back) until ``until``."""
    where = {"queue": key[0], "key": key[1]}
    head = conn.execute(SQL_KEY_HEAD, where).scalar()
    conn.execute(SQL_BLOCK_KEY, {**where, "until": tx._t(until)})
    if head is not None:
        conn.execute(SQL_HOLD_BACK, {"id": head})


def claim_with_ahead(
    tx: Transactions,
    conn: Connection,
    *,
    owner: str,
    limit: int,
    ahead: int,
    now: datetime,
    lease: timedelta,
    names: Collection[str] | None,
    process_names: Collection[str] = (),
    queues: Mapping[str, int] | None = None,
) -> tuple[list[Any], list[Any]]:
    """The claim into ``limit`` free slots, then up to ``ahead`` more to wait in the worker
    (from queues with no stored limit only), in ``conn``'s transaction: the two row lists.
    The queues' limits are read once, for both: one statement less, as if the claim
    ahead had followed the other at once (a limit stored in between counts from the
    next claim, as one stored just after this transaction would)."""
    if (names is not None and not names) or (limit <= 0 and ahead <= 0):
        return [], []  # no name qualifies, or no room
    stored = read_limits(tx, conn)
    rows = (
        claim_rows(
            tx,
            conn,
            owner=owner,
            limit=limit,
            now=now,
            lease=lease,
            names=names,
            process_names=process_names,
            queues=queues,
            stored=stored,
        )
        if limit > 0
        else []
    )
    waiting = (
        claim_rows(
            tx,
            conn,
            owner=owner,
            limit=ahead,
            now=now,
            lease=lease,
            names=names,
            process_names=process_names,
            queues=None if queues is None else {q: ahead for q in queues},
            ahead=True,
            stored=stored,
        )
        if ahead > 0 and not _ran_out(rows, limit, queues)
        else []
    )
    return rows, waiting


def _ran_out(rows: list[Any], limit: int, queues: Mapping[str, int] | None) -> bool:
    """The claim into free slots took fewer than it could from every queue a claim ahead
    would ask: no other task was claimable there, and a claim ahead now would find none
    (an idle worker's claim is one statement, not two; what commits meanwhile wakes it
    anew). A queue given no share (``n`` 0) was not asked: the claim ahead asks it."""
    if limit <= 0 or len(rows) >= limit:
        return False
    if queues is None:
        return True  # each queue's share was the whole limit
    taken = Counter(r[9] for r in rows)
    return all(taken[q] < min(n, limit) for q, n in queues.items())


def record_starts(
    tx: Transactions,
    conn: Connection,
    started: Sequence[Claim],
    outcomes: Sequence[Outcome],
    now: datetime,
) -> None:
    """The starts of claims ahead, in a group commit before its outcomes: each valid claim
    whose task has no start yet gets ``started_at`` and its claim's history line moved
    to that time (the attempt's start). Their rows are locked already
    (``Transactions._lock_tasks``). Two statements for the batch, each run for every
    start (two per start cost a group commit of a 1-slot worker ~80 µs a task)."""
    stamp = tx._t(now)
    params = [
        {
            "id": claim.task_id,
            "owner": claim.owner,
            "fence": claim.fence,
            "now": stamp,
            "at": tx._t(claim.started_at),
        }
        for claim in sorted(started, key=lambda c: c.task_id)
        if claim.started_at is not None
    ]
    if params:
        tx._many(conn, tx.dialect.prepared(MARK_STARTED), params)
        tx._many(conn, tx.dialect.prepared(START_LINE), params)


def queue_limits(row: Any) -> QueueLimits:
    """A ``durablesched_queues`` row (name, concurrency, rate_count, rate_seconds, paused,
    concurrency_per_key) as the limits it stores."""
    name, concurrency, rate_count, rate_seconds, paused, per_key, key_count, key_seconds = row
    rate = None if rate_count is None else Rate(rate_count, timedelta(seconds=rate_seconds))
    key_rate = None if key_count is None else Rate(key_count, timedelta(seconds=key_seconds))
    return QueueLimits(name, concurrency, rate, bool(paused), per_key, key_rate)


@functools.lru_cache(maxsize=64)
def _stored_limits(rows: tuple[tuple[Any, ...], ...]) -> dict[str, QueueLimits]:
    """The limits of every queue, from the rows every claim reads: the same rows (the
    usual case) are parsed and checked once. Callers must not change the dict."""
    return {row[0]: queue_limits(row) for row in rows}


def _allowances(
    tx: Transactions,
    conn: Connection,
    stored: dict[str, QueueLimits],
    wanted: dict[str, int],
    now: datetime,
) -> dict[str, int]:
    """How many of each queue this claim may start: what is wanted, within each limited
    queue's limits, counted after taking the queues' rows where many hosts claim at once."""
    limited = sorted(q for q in wanted if q in stored and stored[q].limited and wanted[q] > 0)
    if not limited:
        return wanted
    # Queues limited by a concurrency per key alone have nothing to count here: where the
    # claim statement takes their rows itself (``SQLDialect.claim_keyed``), it does. Any
    # other among them: all taken here, in name order (the order every claim keeps).
    counted_apart = tx.dialect.claim_keyed is not None and all(
        stored[q].per_key_concurrency_only for q in limited
    )
    if tx.dialect.lock_queues is not None and not counted_apart:
        conn.execute(tx.dialect.lock_queues, {"names": limited})
    allowed = dict(wanted)
    for queue in limited:
        limits = stored[queue]
        running = 0
        if limits.concurrency is not None:
            running = conn.execute(SQL_RUNNING_IN_QUEUE, {"queue": queue}).scalar_one()
        started: list[datetime] = []
        if limits.rate is not None:
            since = tx._t(now - limits.rate.per)
            forget = tx._t(limits.rate.forget_before(now))
            conn.execute(SQL_FORGET_STARTS, {"queue": queue, "before": forget})
            started = [
                from_db_time(t)
                for (t,) in conn.execute(SQL_QUEUE_STARTS, {"queue": queue, "since": since})
            ]
        allowed[queue] = limits.allowance(wanted[queue], running, started, now)
    return allowed


def claims_from_rows(
    rows: list[Any], owner: str, now: datetime, lease: timedelta, *, started: bool = True
) -> list[Claim]:
    """Claims from the rows :func:`claim_rows` returned, best first: (priority desc,
    due_at, seq), the order they were chosen in and should start in; claimed ahead
    (not ``started``), their ``started_at`` is None."""
    rows.sort(key=lambda r: (-r[10], r[7], r[1]))  # times compare as stored
    expires = now + lease
    # Tasks submitted together share a due time and a submission time.
    times: dict[Any, datetime] = {}
    result = []
    for row in rows:
        task_id, seq, name, args, attempts, max_attempts, fence, due_at, key, queue = row[:10]
        priority, created_at = row[10], row[11]
        when = times.get(due_at)
        if when is None:
            when = times[due_at] = from_db_time(due_at)
        created = times.get(created_at)
        if created is None:
            created = times[created_at] = from_db_time(created_at)
        trace = None
        if args == "{}":
            stored: JSONArgs = {}
        else:
            stored, trace = split_trace(json.loads(args))
        result.append(
            Claim(
                task_id=task_id,
                name=name,
                args=stored,
                attempt=attempts,
                max_attempts=max_attempts,
                owner=owner,
                fence=fence,
                lease_expires_at=expires,
                due_at=when,
                seq=seq,
                idempotency_key=effective_key(task_id, key),
                queue=queue,
                trace=trace,
                priority=priority,
                created_at=created,
                claimed_at=now,
                started_at=now if started else None,
            )
        )
    return result
