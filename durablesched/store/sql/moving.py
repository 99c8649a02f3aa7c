"""A SQL store's side of moving live tasks to another database (see ``store/move.py``).

The source hands tasks over (CANCELLED here, a history line naming the
destination), the destination receives each at most once ever, and the source
confirms the move by rewriting that line. Not part of the Store protocol;
``SQLStore`` offers each step as a method of the same name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row

from durablesched.errors import StoreError
from durablesched.records import SUBMITTED, TaskRecord, join_trace
from durablesched.states import TaskState
from durablesched.store.sql.codec import dump, error_json, opt_time, record
from durablesched.store.sql.statements import (
    SQL_CONFIRM_MOVE,
    SQL_COPIED,
    SQL_DEBOUNCE_HELD,
    SQL_ENSURE_QUEUE,
    SQL_EVENT_ID,
    SQL_FIND_KEY,
    SQL_HAND_OVER,
    SQL_IN_TRANSIT,
    SQL_INSERT_COPY,
    SQL_INSTANCE,
    SQL_LIVE_IDS,
    SQL_RECORD_COPY,
    SQL_TOUCH_TASK,
)
from durablesched.store.sql.submitting import allocate
from durablesched.store.sql.transactions import Transactions


def instance(tx: Transactions) -> int:
    """This database's random identity, made by its migrations."""
    with tx._read("reading the database identity") as conn:
        return int(conn.execute(SQL_INSTANCE).scalar_one())


def hand_over(
    tx: Transactions, destination: int, now: datetime, *, after: int = 0, batch: int = 500
) -> list[tuple[TaskRecord, TaskState]]:
    """Take up to ``batch`` live tasks with ids above ``after`` out of this database.

    Each becomes CANCELLED here, with a history line saying it is moving to
    ``destination``; returns each as it was (record, state before). Until
    :func:`confirm_move`, :func:`in_transit` finds them again.
    """
    with tx._write("handing over live tasks") as conn:
        found = conn.execute(SQL_LIVE_IDS, {"after": after, "batch": batch}).all()
        if not found:
            return []
        live = {r.id: r.state for r in found}
        # Their rows and their parents' (a moved child's end wakes its parent) locked in
        # id order first, as every transaction that ends tasks does (PostgreSQL): taken
        # in the hand-over's order, a parent would be locked after its child.
        tx._lock_tasks(conn, live, live)
        # Read before the hand-over: a task leaving PENDING gives its debounce key up.
        debounce = {r.id: r.debounce_key for r in found}
        rows = conn.execute(SQL_HAND_OVER, {"ids": sorted(live), "now": tx._t(now)}).all()
        moved = sorted(
            ((_debouncing(r, debounce[r.id]), TaskState(live[r.id])) for r in rows),
            key=lambda m: m[0].id,
        )
        for task, state in moved:
            tx._event(
                conn,
                task.id,
                now,
                TaskState.CANCELLED,
                task.attempts,
                _moving(destination, state, task.debounce_key),
            )
        tx._tell_finished(conn, (task.id for task, _ in moved), now)
    return moved


def in_transit(tx: Transactions, destination: int) -> list[tuple[TaskRecord, TaskState]]:
    """Tasks handed over to ``destination`` whose arrival was never confirmed."""
    prefix = _moving(destination, None)
    with tx._read("finding tasks in transit") as conn:
        rows = conn.execute(SQL_IN_TRANSIT, {"prefix": prefix + "%"}).all()
    moved = []
    for r in rows:
        state, debounce_key = _parse_moving(r.detail[len(prefix) :])
        moved.append((_debouncing(r, debounce_key), state))
    return moved


def confirm_move(
    tx: Transactions, destination: int, moved: Sequence[tuple[TaskRecord, TaskState, int]]
) -> None:
    """Rewrite each hand-over line to say which task it became there."""
    with tx._write("confirming moved tasks") as conn:
        for task, state, new_id in moved:
            detail = _moving(destination, state, task.debounce_key)
            event_id = conn.execute(SQL_EVENT_ID, {"task_id": task.id, "detail": detail}).scalar()
            if event_id is not None:
                conn.execute(
                    SQL_CONFIRM_MOVE,
                    {
                        "event_id": event_id,
                        "detail": f"moved to database {destination} as task {new_id} "
                        f"(was {state.value})",
                    },
                )


def receive(
    tx: Transactions,
    source: int,
    moved: Sequence[tuple[TaskRecord, TaskState]],
    now: datetime,
) -> list[tuple[int, str]]:
    """Store tasks handed over by database ``source``, each at most once ever.

    Returns, per task, (its id here, how): "copied", "already" (copied
    before) or "key" (a task here already holds its idempotency key).
    """
    results: list[tuple[int, str]] = []
    with tx._write("receiving copied tasks") as conn:
        if tx.dialect.lock_receiving is not None:
            conn.execute(tx.dialect.lock_receiving, {"source": source})
        for task, state in moved:
            results.append(_arrive(tx, conn, source, task, state, now))
        tx._wake_others(conn)
    return results


def _arrive(  # noqa: PLR0917 - receive's loop body, given its variables in order
    tx: Transactions,
    conn: Connection,
    source: int,
    task: TaskRecord,
    state: TaskState,
    now: datetime,
) -> tuple[int, str]:
    """One arriving task: found before, deduplicated by key, or stored anew."""
    stamp = tx._t(now)
    ref = {"source": source, "source_id": task.id}
    known = conn.execute(SQL_COPIED, ref).scalar()
    if known is not None:
        return int(known), "already"
    holder = None
    if task.idempotency_key is not None:
        holder = conn.execute(SQL_FIND_KEY, {"key": task.idempotency_key}).scalar()
    if holder is not None:
        conn.execute(SQL_RECORD_COPY, {**ref, "task_id": holder, "now": stamp})
        return int(holder), "key"
    new_id = int(allocate(tx, conn, 1)[0])
    debounce_key = task.debounce_key
    if debounce_key is not None and conn.execute(SQL_DEBOUNCE_HELD, {"key": debounce_key}).first():
        debounce_key = None  # a task here debounces that key: the arrival runs as it is
    stored = conn.execute(
        SQL_INSERT_COPY,
        {
            "id": new_id,
            "name": task.name,
            "args": dump(join_trace(task.args, task.trace)),
            "state": state.value,
            "due_at": tx._t(task.due_at),
            "attempts": task.attempts,
            "max_attempts": task.max_attempts,
            "last_error": None if task.last_error is None else error_json(task.last_error),
            "key": task.idempotency_key,
            "created_at": tx._t(task.created_at),
            "now": stamp,
            "queue": task.queue,
            "priority": task.priority,
            "limit_key": task.limit_key,
            "debounce_key": debounce_key,
            "debounce_until": (
                None
                if debounce_key is None or task.debounce_until is None
                else tx._t(task.debounce_until)
            ),
        },
    ).first()
    if stored is None:
        # A submit here took the key after the look-up (PostgreSQL: submitters take no
        # common lock) and has committed: the key's task is the arrival, as above.
        holder = conn.execute(SQL_FIND_KEY, {"key": task.idempotency_key}).scalar()
        if holder is None:
            raise StoreError(
                f"task {task.id}'s idempotency key {task.idempotency_key!r} changed hands "
                "while it arrived: run the move again"
            )
        conn.execute(SQL_RECORD_COPY, {**ref, "task_id": holder, "now": stamp})
        return int(holder), "key"
    conn.execute(SQL_ENSURE_QUEUE, {"name": task.queue})
    if task.limit_key is not None:
        conn.execute(SQL_TOUCH_TASK, {"id": new_id})
    # Its first line is its submission, when and where it happened; then its arrival.
    tx._event(
        conn,
        new_id,
        task.created_at,
        TaskState.PENDING,
        0,
        f"{SUBMITTED} to database {source} as task {task.id}",
    )
    tx._event(
        conn, new_id, now, state, task.attempts, f"copied from database {source} task {task.id}"
    )
    conn.execute(SQL_RECORD_COPY, {**ref, "task_id": new_id, "now": stamp})
    return new_id, "copied"


def _moving(destination: int, state: TaskState | None, debounce_key: str | None = None) -> str:
    """The hand-over line of a task moving to ``destination`` (its prefix, without ``state``):
    the state it was in and, if it had one, its debounce key (as JSON), which the task
    gave up when it became CANCELLED here: a move cut short hands it over from this line."""
    head = f"moving to database {destination} "
    if state is None:
        return head
    if debounce_key is None:
        return f"{head}(was {state.value})"
    return f"{head}(was {state.value}, debounce key {json.dumps(debounce_key)})"


def _parse_moving(rest: str) -> tuple[TaskState, str | None]:
    """What a hand-over line says after its prefix (:func:`_moving`): the state the task was
    in and its debounce key."""
    inner = rest.removeprefix("(was ").removesuffix(")")
    state, _, key = inner.partition(", debounce key ")
    return TaskState(state), (json.loads(key) if key else None)


def _debouncing(row: Row[Any], debounce_key: str | None) -> TaskRecord:
    """The record of a task handed over (``row``, of ``TASK_COLUMNS``) with the debounce key
    it had before (the row's is gone: it left PENDING) and that key's window's end."""
    until = None if debounce_key is None else opt_time(row.debounce_until)
    return replace(record(row), debounce_key=debounce_key, debounce_until=until)
