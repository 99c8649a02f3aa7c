"""Storing new tasks: idempotency keys looked up, ids allocated, one executemany for the rest.

Used by ``submit`` and by a success's children, in the caller's transaction. On
PostgreSQL that transaction may stay open long after the submit (a Django
``atomic()`` block): nothing here takes a lock that another submit must wait for,
except the one a task with the same idempotency key must (docs/scaling.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from durablesched.errors import StoreError
from durablesched.records import DEFAULT_QUEUE, NewTask, Submitted
from durablesched.store.sql.codec import dump, from_db_time
from durablesched.store.sql.statements import (
    SQL_ALLOCATE,
    SQL_ENSURE_QUEUE,
    SQL_FIND_KEY,
    SQL_INSERT_DEBOUNCED,
    SQL_QUEUE_EXISTS,
)
from durablesched.store.sql.transactions import Executor, Transactions

#: How many times a keyed insert that met a key holder looks for it and tries again
#: before giving up: each turn the holder left the key-holding states in between.
KEY_TURNS = 10


def insert(
    tx: Transactions, conn: Executor, tasks: Sequence[NewTask], now: datetime
) -> list[Submitted]:
    """Store ``tasks`` in ``conn``'s transaction; a task whose key is held is not stored."""
    if not tasks:
        return []
    if any(task.debounce_key is not None for task in tasks):
        return _with_debounced(tx, conn, tasks, now)
    if all(task.idempotency_key is None for task in tasks):
        # The bulk path: no key to look up, every task is new.
        ids = insert_new(tx, conn, tasks, now)
        return list(map(Submitted, ids, itertools.repeat(True, len(ids)), itertools.repeat(now)))
    # Each slot is either the holder of a key already stored, or (index into
    # `new`, created?) where a repeat of a key within this batch is not created.
    slots: list[Submitted | tuple[int, bool]] = []
    new: list[NewTask] = []
    batch_keys: dict[str, int] = {}
    for task in tasks:
        key = task.idempotency_key
        if key is not None:
            if key in batch_keys:
                slots.append((batch_keys[key], False))
                continue
            holder = conn.execute(SQL_FIND_KEY, {"key": key}).first()
            if holder is not None:
                # (id, created_at), by position: a borrowed driver's rows are tuples.
                slots.append(Submitted(holder[0], False, from_db_time(holder[1])))
                continue
            batch_keys[key] = len(new)
        slots.append((len(new), True))
        new.append(task)
    stored: list[int | Submitted] = []
    if new:
        stored = (
            list(insert_new(tx, conn, new, now))
            if tx.dialect.insert_keyed_task is None
            else insert_racing(tx, conn, tx.dialect.insert_keyed_task, new, now)
        )
    result: list[Submitted] = []
    for slot in slots:
        if isinstance(slot, Submitted):
            result.append(slot)
            continue
        got = stored[slot[0]]
        # A key another transaction stored in the meantime: its task, not created here.
        result.append(got if isinstance(got, Submitted) else Submitted(got, slot[1], now))
    return result


def _with_debounced(
    tx: Transactions, conn: Executor, tasks: Sequence[NewTask], now: datetime
) -> list[Submitted]:
    """Each debounced task on its own, the runs of others between them together (as
    ``insert``), in order: ids are taken in the order the tasks were given."""
    result: list[Submitted] = []
    run: list[NewTask] = []
    for task in tasks:
        if task.debounce_key is None:
            run.append(task)
            continue
        result.extend(insert(tx, conn, run, now))
        run = []
        result.append(_debounce(tx, conn, task, now))
    result.extend(insert(tx, conn, run, now))
    return result


def _debounce(tx: Transactions, conn: Executor, task: NewTask, now: datetime) -> Submitted:
    """A debounced task stored, or the pending task with its key updated (last wins)."""
    (task_id,) = allocate(tx, conn, 1)
    ensure_queues(tx, conn, [task])
    until = task.debounce_until
    params = {
        "id": task_id,
        "name": task.name,
        "args": task.args_json if task.args_json is not None else dump(task.args),
        "due_at": tx._t(task.due_at),
        "max_attempts": task.max_attempts,
        "now": tx._t(now),
        "queue": task.queue,
        "priority": task.priority,
        "limit_key": task.limit_key,
        "debounce_key": task.debounce_key,
        "debounce_until": None if until is None else tx._t(until),
    }
    stored, created_at = conn.execute(SQL_INSERT_DEBOUNCED, params).first()
    if stored != task_id:
        return Submitted(stored, False, from_db_time(created_at))
    if task.limit_key is not None and tx.dialect.touch_new_key is not None:
        tx._rows(conn, tx.dialect.touch_new_key, (task_id,))
    record_submissions(tx, conn, [task_id])
    tx._wake_others(conn)
    return Submitted(task_id, True, now)


def allocate(tx: Transactions, conn: Executor, n: int) -> Sequence[int]:
    """``n`` fresh task ids (and ``seq`` values), ascending, never handed out before."""
    if tx.dialect.allocate is not None:
        return [row[0] for row in tx._rows(conn, tx.dialect.allocate, {"n": n})]
    end = conn.execute(SQL_ALLOCATE, {"n": n}).scalar_one()
    return range(end - n + 1, end + 1)


def record_submissions(tx: Transactions, conn: Executor, ids: Sequence[int]) -> None:
    """Each new task's first history line, its submission: one INSERT ... SELECT over
    the ids just inserted (ascending), not one row per task."""
    if not ids:
        return
    tx._rows(
        conn,
        tx.dialect.submitted_events,
        {"first": ids[0], "last": ids[-1], "ids": ids},
    )


def insert_new(
    tx: Transactions, conn: Executor, new: Sequence[NewTask], now: datetime
) -> Sequence[int]:
    """Insert tasks known to be new, with fresh ids; one executemany for them all."""
    ids = allocate(tx, conn, len(new))
    ensure_queues(tx, conn, new)
    rows = _rows(tx, ids, new, now)
    keyed_sql = tx.dialect.insert_keyed_row
    if keyed_sql is not None and any(task.limit_key is not None for task in new):
        # Tasks with a limit key through the view whose trigger keeps their keys (in
        # id order); the others without any trigger.
        keyed = [row for row, task in zip(rows, new, strict=True) if task.limit_key is not None]
        plain = [row for row, task in zip(rows, new, strict=True) if task.limit_key is None]
        if plain:
            tx._many(conn, tx.dialect.insert_task, plain)
        tx._many(conn, keyed_sql, keyed)
    else:
        # Straight to the driver's executemany: this is the bulk-submit hot path.
        tx._many(conn, tx.dialect.insert_task, rows)
    record_submissions(tx, conn, ids)
    tx._wake_others(conn)
    return ids


def insert_racing(
    tx: Transactions, conn: Executor, keyed_sql: str, new: Sequence[NewTask], now: datetime
) -> list[int | Submitted]:
    """Insert tasks whose keys were free when looked up, with writers running alongside:
    per task, its new id, or the task that took its key in the meantime.

    Tasks without a key go in at once. Keyed ones go one at a time in key order, each
    storing nothing if a key-holding task has its key, so that two batches sharing
    keys lock them in the same order and cannot deadlock. A transaction still open
    that stored the key makes that insert wait until it ends; then its task is the
    answer if it committed, and this one is stored if it rolled back.
    """
    ids = allocate(tx, conn, len(new))
    ensure_queues(tx, conn, new)
    rows = _rows(tx, ids, new, now)
    plain = [row for row, task in zip(rows, new, strict=True) if task.idempotency_key is None]
    if plain:
        tx._many(conn, tx.dialect.insert_task, plain)
    stored: list[int | Submitted] = list(ids)
    keyed = [i for i, task in enumerate(new) if task.idempotency_key is not None]
    for i in sorted(keyed, key=lambda i: str(new[i].idempotency_key)):
        holder = _insert_keyed(tx, conn, keyed_sql, rows[i])
        if holder is not None:
            stored[i] = holder
    record_submissions(tx, conn, [i for i in stored if isinstance(i, int)])
    tx._wake_others(conn)
    return stored


def _insert_keyed(
    tx: Transactions, conn: Executor, sql: str, row: tuple[Any, ...]
) -> Submitted | None:
    """Insert one keyed task; None if stored, else the task that holds its key."""
    key = row[6]
    for _ in range(KEY_TURNS):
        if tx._rows(conn, sql, row):
            return None
        # A statement of its own sees what the key's holder committed while we waited.
        holder = conn.execute(SQL_FIND_KEY, {"key": key}).first()
        if holder is not None:
            return Submitted(holder[0], False, from_db_time(holder[1]))
    raise StoreError(f"idempotency key {key!r} kept changing hands: submit again")


def ensure_queues(tx: Transactions, conn: Executor, new: Sequence[NewTask]) -> None:
    """Make the row of each queue of ``new`` that has none (the default's is the schema's).

    Where the database has concurrent writers (``queues_apart``), a missing row is
    made and committed in a short transaction of the store's own: made in the
    caller's, it would hold up every other transaction submitting to the same new
    queue until the caller commits. An empty queue left by a rollback is harmless.
    """
    names = sorted({task.queue for task in new} - {DEFAULT_QUEUE})
    if not tx.dialect.queues_apart:
        for name in names:
            conn.execute(SQL_ENSURE_QUEUE, {"name": name})
        return
    missing = [n for n in names if conn.execute(SQL_QUEUE_EXISTS, {"name": n}).first() is None]
    if missing:
        with tx.engine.begin() as own:
            for name in missing:
                own.execute(SQL_ENSURE_QUEUE, {"name": name})


def _rows(
    tx: Transactions, ids: Sequence[int], new: Sequence[NewTask], now: datetime
) -> list[tuple[Any, ...]]:
    """The INSERT_TASK parameters of each task, with its id."""
    to_db = tx._t
    stamp = to_db(now)
    # A batch usually shares one due time: each distinct one is converted once.
    due = {when: to_db(when) for when in {task.due_at for task in new}}
    to_json = dump  # a local, for the loop below
    return [
        (
            task_id,
            task_id,
            task.name,
            task.args_json if task.args_json is not None else to_json(task.args),
            due[task.due_at],
            task.max_attempts,
            task.idempotency_key,
            stamp,
            stamp,
            task.queue,
            task.priority,
            task.limit_key,
        )
        for task_id, task in zip(ids, new, strict=True)
    ]
