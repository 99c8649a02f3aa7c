"""Delivering a signal on SQL (docs/workflows.md), for SQLite and PostgreSQL alike.

One step for ``Store.send_signal`` and for a success that sends signals
(``ctx.signal``, recorded by :mod:`durablesched.store.sql.outcomes` in the success's
own transaction): the target's row locked, its state checked, the signal kept, the
target woken if it waits for it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

from durablesched.errors import InvalidTransitionError, TaskNotFoundError
from durablesched.records import SignalSend
from durablesched.states import TERMINAL, TaskState
from durablesched.store.sql.codec import dump
from durablesched.store.sql.transactions import Transactions

#: The task's row, locked before a signal goes in (PostgreSQL: a suspension in flight
#: commits first, so the wake below sees what it waits for; a later one sees the signal).
SQL_LOCK_TASK = text("UPDATE tasks SET fence = fence WHERE id = :id RETURNING state")
SQL_INSERT_SIGNAL = text(
    "INSERT INTO task_signals (task_id, name, payload, sent_at) "
    "VALUES (:id, :name, :payload, :now) RETURNING id"
)
#: A task suspended waiting for this signal: due now (a signal wakes it, no polling).
SQL_WAKE_WAITING = text(
    "UPDATE tasks SET due_at = :now, updated_at = :now "
    "WHERE id = :id AND state = 'PENDING' AND due_at > :now "
    "AND EXISTS (SELECT 1 FROM task_waits w WHERE w.task_id = :id AND w.signal = :name) "
    "RETURNING id"
)


def deliver(tx: Transactions, conn: Connection, sent: SignalSend, now: datetime) -> int:
    """Keep the signal for its task and wake the task if it waits for it; its id.
    :class:`TaskNotFoundError` or :class:`InvalidTransitionError` (a finished task, the
    sender's own success included), with nothing written by this call."""
    task_id = sent.task_id
    params = {"id": task_id, "name": sent.name, "payload": dump(sent.payload), "now": tx._t(now)}
    state = conn.execute(SQL_LOCK_TASK, params).scalar()
    if state is None:
        raise TaskNotFoundError(f"no task with id {task_id}")
    if TaskState(state) in TERMINAL:
        raise InvalidTransitionError(f"task {task_id} is {state}: a finished task takes no signal")
    if tx.dialect.deliver_signal is not None:  # the three statements in one round trip
        kept: int = conn.execute(tx.dialect.deliver_signal, params).one().id
        return kept
    signal_id: int = conn.execute(SQL_INSERT_SIGNAL, params).scalar_one()
    if conn.execute(SQL_WAKE_WAITING, params).first() is not None:
        tx._wake_others(conn)
    return signal_id


__all__ = ["deliver"]
