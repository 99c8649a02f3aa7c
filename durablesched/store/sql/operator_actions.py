"""What an operator does to a SQL store (the CLI's retry, stats and purge).

Not part of the Store protocol: the worker never needs them. ``SQLStore``
offers each as a method of the same name.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import TextClause, exc

from durablesched.errors import InvalidTransitionError, TaskNotFoundError
from durablesched.queues import QueueInfo
from durablesched.records import Activity, DurationCounts, QueueStats, reclaim_owner
from durablesched.states import TERMINAL, TaskState
from durablesched.store.sql.claiming import queue_limits
from durablesched.store.sql.codec import error_from_json, from_db_time
from durablesched.store.sql.statements import (
    SQL_ACTIVITY_COUNTS,
    SQL_ACTIVITY_RECLAIMS,
    SQL_COUNT_BY_STATE,
    SQL_KEY_HELD_BY_OTHER,
    SQL_KEYS_AT_LIMIT,
    SQL_OLDEST_OVERDUE,
    SQL_OVERDUE_BY_NAME,
    SQL_PURGE_BATCH,
    SQL_QUEUE_COUNTS,
    SQL_QUEUES,
    SQL_RECENT_FAILURES,
    SQL_REQUEUE,
    SQL_RUNNING,
    SQL_STATE,
    SQL_WAITING_BY_QUEUE,
    sql_activity_durations,
)
from durablesched.store.sql.submitting import allocate
from durablesched.store.sql.transactions import Transactions
from durablesched.store.sql.workflows import forget_steps_on

#: The states a requeue takes a task from (docs/cli.md, ``durablesched retry``).
REQUEUEABLE = frozenset({TaskState.FAILED.value, TaskState.CANCELLED.value})


def requeue(tx: Transactions, task_id: int, now: datetime, from_step: int | None = None) -> None:
    """FAILED or CANCELLED back to PENDING, due ``now``, with a fresh attempt budget; with
    ``from_step``, a workflow's steps from that position forgotten in the same transaction
    (``retry --from-step``: a refused requeue forgets nothing).

    :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError`
    if the task is in another state or another task now holds its key.
    """
    stamp = tx._t(now)
    with tx._write(f"requeueing task {task_id}") as conn:
        state = conn.execute(SQL_STATE, {"id": task_id}).scalar()
        if state is None:
            raise TaskNotFoundError(f"no task with id {task_id}")
        if state not in REQUEUEABLE:
            # Not check_transition: RUNNING -> PENDING is an operator transition too
            # (a give-back), but never a requeue's.
            raise InvalidTransitionError(
                f"task {task_id} is {state}: only a FAILED or CANCELLED task can be requeued"
            )
        holder = conn.execute(SQL_KEY_HELD_BY_OTHER, {"id": task_id}).scalar()
        if holder is not None:
            raise InvalidTransitionError(
                f"task {task_id}'s idempotency key is now held by task {holder}"
            )
        seq = allocate(tx, conn, 1)[0]
        try:
            conn.execute(SQL_REQUEUE, {"id": task_id, "now": stamp, "seq": seq})
        except exc.IntegrityError:
            # A submit with the same key committed since the look-up above
            # (PostgreSQL: submitters take no common lock): the key is taken.
            raise InvalidTransitionError(
                f"task {task_id}'s idempotency key is now held by another task"
            ) from None
        if from_step is not None:
            forget_steps_on(conn, task_id, from_step)
        tx._event(conn, task_id, now, TaskState.PENDING, 0, "requeued")
        tx._wake_others(conn)


def stats(tx: Transactions, now: datetime) -> QueueStats:
    """Counts per state, the oldest overdue task, running leases, recent failures."""
    params = {"now": tx._t(now), "since": tx._t(now - timedelta(hours=1))}
    with tx._read("reading statistics") as conn:
        counts = {r.state: r.n for r in conn.execute(SQL_COUNT_BY_STATE)}
        oldest = conn.execute(SQL_OLDEST_OVERDUE, params).first()
        overdue = conn.execute(SQL_OVERDUE_BY_NAME, params).all()
        running = conn.execute(SQL_RUNNING).all()
        failures = conn.execute(SQL_RECENT_FAILURES, params).all()
    return {
        "counts": {state.value: counts.get(state.value, 0) for state in TaskState},
        "oldest_overdue": None
        if oldest is None
        else {
            "id": oldest.id,
            "name": oldest.name,
            "due_at": from_db_time(oldest.due_at),
            "lag_seconds": (now - from_db_time(oldest.due_at)).total_seconds(),
        },
        "overdue_by_name": [
            {"name": r.name, "tasks": r.n, "oldest_due_at": from_db_time(r.oldest)} for r in overdue
        ],
        "running": [
            {
                "id": r.id,
                "name": r.name,
                "attempt": r.attempts,
                "lease_owner": r.lease_owner,
                "lease_expires_at": from_db_time(r.lease_expires_at),
                "cancel_requested": r.cancel_requested_at is not None,
            }
            for r in running
        ],
        "failures_last_hour": [
            {
                "id": r.id,
                "name": r.name,
                "attempts": r.attempts,
                "finished_at": from_db_time(r.finished_at),
                "error": error_from_json(r.last_error),
            }
            for r in failures
        ],
    }


def purge(tx: Transactions, before: datetime, *, batch: int = 10_000) -> int:
    """Delete finished tasks (with their events and keys) finished before ``before``.

    Bounded batches, one transaction each, so writers are never blocked
    for long. Never touches a live task. Returns how many were deleted.
    """
    total = 0
    while True:
        with tx._write("purging finished tasks") as conn:
            deleted = conn.execute(
                SQL_PURGE_BATCH, {"before": tx._t(before), "batch": batch}
            ).rowcount
        total += deleted
        if deleted < batch:
            return total


def queue_info(tx: Transactions, now: datetime, *, finished: bool = True) -> list[QueueInfo]:
    """Every queue: its limits, tasks per state, how many run, how long the oldest waits
    (without ``finished``, the live states only, through ``ix_tasks_state_name``)."""
    shown = [s for s in TaskState if finished or s not in TERMINAL]
    with tx._read("reading the queues") as conn:
        infos: dict[str, QueueInfo] = {}
        for row in conn.execute(SQL_QUEUES):
            limits = queue_limits(row)
            infos[limits.name] = QueueInfo(
                name=limits.name,
                paused=limits.paused,
                concurrency=limits.concurrency,
                rate=None if limits.rate is None else str(limits.rate),
                concurrency_per_key=limits.concurrency_per_key,
                rate_per_key=None if limits.rate_per_key is None else str(limits.rate_per_key),
                keys_at_limit=0,
                counts={state.value: 0 for state in shown},
                running=0,
                oldest_waiting_seconds=None,
                waiting=0,
            )
        for queue, at_limit in conn.execute(SQL_KEYS_AT_LIMIT):
            if queue in infos:
                infos[queue]["keys_at_limit"] = at_limit
        counts = SQL_QUEUE_COUNTS if finished else tx.dialect.live_queue_counts
        for r in conn.execute(counts, {"now": tx._t(now)}):
            info = infos.get(r.queue)
            if info is None:
                continue  # a queue whose row was made by hand and removed: not ours to show
            info["counts"][r.state] = r.tasks
            if r.state == TaskState.RUNNING.value:
                info["running"] = r.tasks
            if r.oldest_due is not None:
                waited = (now - from_db_time(r.oldest_due)).total_seconds()
                oldest = info["oldest_waiting_seconds"]
                info["oldest_waiting_seconds"] = waited if oldest is None else max(oldest, waited)
        for queue, waiting in conn.execute(SQL_WAITING_BY_QUEUE):
            info = infos.get(queue)
            if info is not None:
                info["waiting"] = waiting
                info["running"] -= waiting
    return [infos[name] for name in sorted(infos)]


def activity(
    tx: Transactions, since: datetime, now: datetime, bounds: Sequence[timedelta]
) -> Activity:
    """What the window's history says happened (``Store.activity``): three reads, each
    through ``ix_task_events_at``."""
    window = {"since": tx._t(since), "now": tx._t(now)}
    limits = {f"b{i}": b // timedelta(microseconds=1) for i, b in enumerate(bounds)}
    durations_sql = _durations_sql(len(bounds), tx.dialect.elapsed_us)
    with tx._read("reading recent history") as conn:
        counts = conn.execute(SQL_ACTIVITY_COUNTS, window).all()
        reclaims = conn.execute(SQL_ACTIVITY_RECLAIMS, window).scalars().all()
        durations = conn.execute(durations_sql, {**window, **limits}).all()
    attempts: Counter[tuple[str, str]] = Counter()
    for r in counts:
        state = TaskState(r.state)
        kind = _KIND.get(state, "failed")
        attempts[(r.queue, kind)] += r.n
        if state is TaskState.RETRY_WAIT:
            attempts[(r.queue, "retried")] += r.n
        if r.reclaim:
            attempts[(r.queue, "reclaimed")] += r.n
    losses = Counter(owner for owner in map(reclaim_owner, reclaims) if owner is not None)
    return Activity(
        attempts=dict(attempts),
        lease_losses=dict(losses),
        durations={
            r.name: DurationCounts(
                int(r.n), int(r.total), tuple(int(r[3 + i]) for i in range(len(bounds)))
            )
            for r in durations
        },
    )


#: The kind of attempt count a history line's state adds to (FAILED, RETRY_WAIT: "failed").
_KIND = {
    TaskState.RUNNING: "started",
    TaskState.SUCCEEDED: "succeeded",
    TaskState.CANCELLED: "cancelled",
}


@functools.cache
def _durations_sql(bounds: int, elapsed_us: str) -> TextClause:
    return sql_activity_durations(bounds, elapsed_us)
