"""Workflows on SQL (docs/workflows.md): step checkpoints, for SQLite and PostgreSQL alike.

The statements here are the same on both databases (``ON CONFLICT ... DO NOTHING``
is both's); one that must differ would go to that database's module, as the house
rule says. Every write names its claim (``VALID``): a zombie's checkpoint is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, text

from durablesched.errors import InvalidTransitionError, TaskNotFoundError
from durablesched.records import (
    Claim,
    NewTask,
    SignalRecord,
    SignalSend,
    StepRecord,
    Submitted,
)
from durablesched.states import TERMINAL, TaskState
from durablesched.store.protocol import Effect
from durablesched.store.sql.codec import dump, from_db_time, opt_time
from durablesched.store.sql.outcomes import claim_params
from durablesched.store.sql.signals import deliver
from durablesched.store.sql.statements import VALID
from durablesched.store.sql.submitting import insert
from durablesched.store.sql.transactions import Transactions
from durablesched.store.sql.translate import translated

#: The claim's task, locked (PostgreSQL: a reclaim waits for this transaction, and one
#: that committed first makes this find no row) and checked valid; changes nothing.
SQL_LOCK_VALID = text(f"UPDATE tasks SET fence = fence WHERE {VALID} RETURNING attempts")
#: The checkpoint, unless its position is recorded already.
SQL_INSERT_STEP = text(
    "INSERT INTO task_steps (task_id, position, name, result, recorded_at, attempt) "
    "VALUES (:id, :position, :name, :result, :now, :attempt) "
    "ON CONFLICT (task_id, position) DO NOTHING"
)
#: A workflow's attempt ends uncounted: PENDING due at its wake time (CANCELLED instead if
#: a cancellation was requested), as a give-back at shutdown but due later.
SQL_SUSPEND = text(
    "UPDATE tasks SET state = CASE WHEN cancel_requested_at IS NULL THEN 'PENDING' "
    "ELSE 'CANCELLED' END, "
    "attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END, "
    "due_at = CASE WHEN cancel_requested_at IS NULL THEN :until ELSE due_at END, "
    "finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE :now END, "
    "lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    f"WHERE {VALID} RETURNING state, attempts"
)
#: What a suspended workflow waits for: replaced at each suspension, or forgotten.
SQL_PUT_WAIT = text(
    "INSERT INTO task_waits (task_id, signal) VALUES (:id, :signal) "
    "ON CONFLICT (task_id) DO UPDATE SET signal = excluded.signal"
)
SQL_FORGET_WAIT = text("DELETE FROM task_waits WHERE task_id = :id")
#: A signal sent while the attempt that suspends ran: due at once, no wake-up lost.
SQL_DUE_IF_SIGNALLED = text(
    "UPDATE tasks SET due_at = :now WHERE id = :id AND state = 'PENDING' AND due_at > :now "
    "AND EXISTS (SELECT 1 FROM task_signals s WHERE s.task_id = :id AND s.name = :signal "
    "AND s.consumed_position IS NULL)"
)
#: The task's row, locked (PostgreSQL: ``forget_steps`` waits for a finish in flight).
SQL_LOCK_TASK = text("UPDATE tasks SET fence = fence WHERE id = :id RETURNING state")
SQL_STEP_AT = text("SELECT 1 FROM task_steps WHERE task_id = :id AND position = :position")
#: The oldest signal of a name no wait took yet.
SQL_PENDING_SIGNAL = text(
    "SELECT id, payload FROM task_signals WHERE task_id = :id AND name = :name "
    "AND consumed_position IS NULL ORDER BY id LIMIT 1"
)
#: Taken once: a signal some wait took already is never taken again.
SQL_TAKE_SIGNAL = text(
    "UPDATE task_signals SET consumed_at = :now, consumed_position = :position "
    "WHERE id = :signal AND consumed_position IS NULL"
)
SQL_SIGNALS = text(
    "SELECT id, task_id, name, payload, sent_at, consumed_at, consumed_position "
    "FROM task_signals WHERE task_id = :id ORDER BY id"
)
#: How many of the awaited children are finished (a suspension compares what it saw).
SQL_CHILDREN_ENDED = text(
    "SELECT COUNT(*) FROM tasks WHERE id IN :ids AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
).bindparams(bindparam("ids", expanding=True))
SQL_DUE_NOW = text(
    "UPDATE tasks SET due_at = :now WHERE id = :id AND state = 'PENDING' AND due_at > :now"
)
SQL_INSERT_CHILD = text(
    "INSERT INTO task_children (child_id, parent_id, position) VALUES (:child, :id, :position)"
)
SQL_CHILDREN = text(
    "SELECT c.child_id FROM task_children c WHERE c.parent_id = :id ORDER BY c.child_id"
)
SQL_TASK_STATE = text("SELECT state FROM tasks WHERE id = :id")
SQL_FORGET_STEPS = text("DELETE FROM task_steps WHERE task_id = :id AND position >= :position")
SQL_GIVE_BACK_SIGNALS = text(
    "UPDATE task_signals SET consumed_at = NULL, consumed_position = NULL "
    "WHERE task_id = :id AND consumed_position >= :position"
)
#: A task's checkpoints, by position (read alone: ``steps``).
STEPS = (
    "SELECT task_id, position, name, result, recorded_at, attempt FROM task_steps "
    "WHERE task_id = :id ORDER BY position"
)


def record_step(  # noqa: PLR0917 - a checkpoint's fields, as the protocol takes them
    tx: Transactions,
    claim: Claim,
    position: int,
    name: str,
    result: Any,
    now: datetime,
    effects: Sequence[Effect],
) -> bool:
    """``Store.record_step``: the checkpoint and its effects in one transaction."""
    result_json = dump(result)
    with tx._write(f"recording step {position} ({name}) of task {claim.task_id}") as conn:
        params = {
            **claim_params(tx, claim, now),
            "position": position,
            "name": name,
            "result": result_json,
            "attempt": claim.attempt,
        }
        if tx.dialect.record_step is not None:  # both statements in one round trip
            recorded = conn.execute(tx.dialect.record_step, params).first() is not None
        else:
            recorded = (
                conn.execute(SQL_LOCK_VALID, params).first() is not None
                and conn.execute(SQL_INSERT_STEP, params).rowcount > 0
            )
        if not recorded:
            return False
        for effect in effects:
            effect(conn)
        return True


def suspend(  # noqa: PLR0917 - the protocol's arguments, in its order
    tx: Transactions,
    claim: Claim,
    until: datetime,
    now: datetime,
    detail: str,
    signal: str | None,
    children: tuple[Sequence[int], int] | None,
) -> TaskState | None:
    """``Store.suspend``."""
    with tx._write(f"suspending task {claim.task_id}") as conn:
        tx._lock_tasks(conn, [claim.task_id], [claim.task_id])  # a cancel wakes its parent
        params = {**claim_params(tx, claim, now), "until": tx._t(until)}
        row = conn.execute(SQL_SUSPEND, params).first()
        if row is None:
            return None
        state = TaskState(row.state)
        if state is TaskState.CANCELLED:
            detail = "cancelled while suspending"
            tx._tell_finished(conn, (claim.task_id,), now)
        elif signal is None:
            conn.execute(SQL_FORGET_WAIT, params)
        else:
            conn.execute(SQL_PUT_WAIT, {**params, "signal": signal})
            conn.execute(SQL_DUE_IF_SIGNALLED, {**params, "signal": signal})
        if children is not None and state is TaskState.PENDING:
            ids, seen = children
            ended = conn.execute(SQL_CHILDREN_ENDED, {"ids": list(ids) or [0]}).scalar_one()
            if ended > seen:  # a child ended while this attempt ran: no wake-up is lost
                conn.execute(SQL_DUE_NOW, params)
        tx._event(conn, claim.task_id, now, state, row.attempts, detail)
        tx._wake_others(conn)  # its due time may be sooner than a sleeping worker's next
        return state


def send_signal(tx: Transactions, task_id: int, name: str, payload: Any, now: datetime) -> int:
    """``Store.send_signal``."""
    with tx._write(f"sending signal {name!r} to task {task_id}") as conn:
        return deliver(tx, conn, SignalSend(task_id, name, payload), now)


def receive_signal(  # noqa: PLR0917 - the protocol's arguments, in its order
    tx: Transactions, claim: Claim, position: int, step: str, name: str, now: datetime
) -> tuple[bool, Any] | None:
    """``Store.receive_signal``: the signal taken and its step recorded, together."""
    with tx._write(f"taking signal {name!r} for task {claim.task_id}") as conn:
        params = {**claim_params(tx, claim, now), "position": position, "name": name}
        if tx.dialect.receive_signal is not None:  # the five statements in one round trip
            return _received(
                conn.execute(
                    tx.dialect.receive_signal, {**params, "step": step, "attempt": claim.attempt}
                ).one()
            )
        if conn.execute(SQL_LOCK_VALID, params).first() is None:
            return None
        if conn.execute(SQL_STEP_AT, params).first() is not None:
            return None
        found = conn.execute(SQL_PENDING_SIGNAL, params).first()
        if found is None:
            return False, None
        payload = None if found.payload is None else json.loads(found.payload)
        conn.execute(
            SQL_INSERT_STEP,
            {
                **params,
                "name": step,
                "result": dump({"payload": payload}),
                "attempt": claim.attempt,
            },
        )
        taken = conn.execute(SQL_TAKE_SIGNAL, {**params, "signal": found.id}).rowcount
        assert taken == 1, "the task's row lock makes its consumers take turns"
        return True, payload


def _received(row: Any) -> tuple[bool, Any] | None:
    """What ``Dialect.receive_signal``'s row says, as ``Store.receive_signal`` answers."""
    if not row.valid or not row.free or (row.found and row.id is None):
        return None  # not the claim's to take, or its position taken meanwhile
    if row.id is None:
        return False, None
    return True, None if row.payload is None else json.loads(row.payload)


def signals(tx: Transactions, task_id: int) -> list[SignalRecord]:
    """``Store.signals``."""
    with tx._read(f"reading the signals of task {task_id}") as conn:
        rows = conn.execute(SQL_SIGNALS, {"id": task_id}).all()
    return [
        SignalRecord(
            r.id,
            r.task_id,
            r.name,
            None if r.payload is None else json.loads(r.payload),
            from_db_time(r.sent_at),
            opt_time(r.consumed_at),
            r.consumed_position,
        )
        for r in rows
    ]


def spawn(  # noqa: PLR0917 - the protocol's arguments, in its order
    tx: Transactions,
    claim: Claim,
    position: int,
    step: str,
    tasks: Sequence[NewTask],
    now: datetime,
) -> list[Submitted] | None:
    """``Store.spawn``: the children, their parent link and the step, together."""
    with tx._write(f"spawning children of task {claim.task_id}") as conn:
        params = {**claim_params(tx, claim, now), "position": position}
        if conn.execute(SQL_LOCK_VALID, params).first() is None:
            return None
        if conn.execute(SQL_STEP_AT, params).first() is not None:
            return None
        submitted = insert(tx, conn, tasks, now)
        for sub in submitted:
            if sub.created:
                conn.execute(SQL_INSERT_CHILD, {**params, "child": sub.task_id})
        conn.execute(
            SQL_INSERT_STEP,
            {
                **params,
                "name": step,
                "result": dump({"ids": [sub.task_id for sub in submitted]}),
                "attempt": claim.attempt,
            },
        )
        tx._wake_others(conn)
        return submitted


def forget_steps(tx: Transactions, task_id: int, position: int) -> int:
    """``Store.forget_steps``."""
    params = {"id": task_id, "position": position}
    with tx._write(f"forgetting the steps of task {task_id} from {position}") as conn:
        state = conn.execute(SQL_LOCK_TASK, params).scalar()
        if state is None:
            raise TaskNotFoundError(f"no task with id {task_id}")
        if TaskState(state) not in TERMINAL:
            raise InvalidTransitionError(
                f"task {task_id} is {state}: only a finished workflow's steps can be forgotten"
            )
        return forget_steps_on(conn, task_id, position)


def forget_steps_on(conn: Connection, task_id: int, position: int) -> int:
    """Forget the steps from ``position`` on in the caller's transaction (a finished task's:
    the caller checked), giving back the signals their waits took; how many were forgotten."""
    params = {"id": task_id, "position": position}
    forgotten: int = conn.execute(SQL_FORGET_STEPS, params).rowcount
    conn.execute(SQL_GIVE_BACK_SIGNALS, params)
    return forgotten


def children(tx: Transactions, task_id: int) -> list[int]:
    """``Store.children``."""
    with tx._read(f"reading the children of task {task_id}") as conn:
        return [r[0] for r in conn.execute(SQL_CHILDREN, {"id": task_id})]


def steps(tx: Transactions, task_id: int) -> list[StepRecord]:
    """``Store.steps``: one statement, no transaction (``Transactions._lone_rows``): every
    attempt of a workflow reads them at its first step, a resumed one as it starts, and
    a pool checkout, a BEGIN and a ROLLBACK around it cost more than the read on
    PostgreSQL. One statement reads one state: the checkpoints as some commit left them."""
    with translated(f"reading the steps of task {task_id}"):
        rows = tx._lone_rows(tx.dialect.driver(STEPS), {"id": task_id})
    return [
        StepRecord(
            task_id,
            position,
            name,
            None if result is None else json.loads(result),
            from_db_time(recorded_at),
            attempt,
        )
        for task_id, position, name, result, recorded_at, attempt in rows
    ]


__all__ = [
    "children",
    "forget_steps",
    "receive_signal",
    "record_step",
    "send_signal",
    "signals",
    "spawn",
    "steps",
    "suspend",
]
