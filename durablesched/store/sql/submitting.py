"""Storing new tasks: idempotency keys looked up, ids allocated, one executemany for the rest.

Used by ``submit`` and by a success's children, in the caller's transaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime

from durablesched.records import DEFAULT_QUEUE, NewTask, Submitted
from durablesched.store.sql.codec import dump, from_db_time
from durablesched.store.sql.statements import SQL_ALLOCATE, SQL_ENSURE_QUEUE, SQL_FIND_KEY
from durablesched.store.sql.transactions import Executor, Transactions


def insert(
    tx: Transactions, conn: Executor, tasks: Sequence[NewTask], now: datetime
) -> list[Submitted]:
    """Store ``tasks`` in ``conn``'s transaction; a task whose key is held is not stored."""
    if not tasks:
        return []
    if tx.dialect.lock_submissions is not None:
        conn.execute(tx.dialect.lock_submissions, {})
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
    ids = insert_new(tx, conn, new, now) if new else []
    return [
        slot if isinstance(slot, Submitted) else Submitted(ids[slot[0]], slot[1], now)
        for slot in slots
    ]


def record_submissions(tx: Transactions, conn: Executor, ids: range) -> None:
    """Each new task's first history line, its submission: one INSERT ... SELECT over
    the ids just inserted (contiguous: allocated together), not one row per task."""
    tx._rows(conn, tx.dialect.submitted_events, {"first": ids.start, "last": ids.stop - 1})


def insert_new(
    tx: Transactions, conn: Executor, new: Sequence[NewTask], now: datetime
) -> list[int]:
    """Insert tasks known to be new, with fresh ids; one executemany for them all."""
    end = conn.execute(SQL_ALLOCATE, {"n": len(new)}).scalar_one()
    ids = range(end - len(new) + 1, end + 1)
    to_db = tx._t
    stamp = to_db(now)
    # A batch usually shares one due time: each distinct one is converted once.
    due = {when: to_db(when) for when in {task.due_at for task in new}}
    to_json = dump  # a local, for the loop below
    rows = [
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
        )
        for task_id, task in zip(ids, new, strict=True)
    ]
    for queue in {task.queue for task in new} - {DEFAULT_QUEUE}:
        conn.execute(SQL_ENSURE_QUEUE, {"name": queue})  # the default's row is the schema's
    # Straight to the driver's executemany: this is the bulk-submit hot path.
    tx._many(conn, tx.dialect.insert_task, rows)
    record_submissions(tx, conn, ids)
    tx._wake_others(conn)
    return list(ids)
