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

from sqlalchemy import text

from durablesched.records import Claim, StepRecord
from durablesched.states import TaskState
from durablesched.store.protocol import Effect
from durablesched.store.sql.codec import dump, from_db_time
from durablesched.store.sql.outcomes import claim_params
from durablesched.store.sql.statements import VALID
from durablesched.store.sql.transactions import Transactions

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
#: A task's checkpoints, by position.
SQL_STEPS = text(
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
        params = claim_params(tx, claim, now)
        if conn.execute(SQL_LOCK_VALID, params).first() is None:
            return False
        inserted = conn.execute(
            SQL_INSERT_STEP,
            {
                **params,
                "position": position,
                "name": name,
                "result": result_json,
                "attempt": claim.attempt,
            },
        ).rowcount
        if not inserted:
            return False
        for effect in effects:
            effect(conn)
        return True


def suspend(
    tx: Transactions, claim: Claim, until: datetime, now: datetime, detail: str
) -> TaskState | None:
    """``Store.suspend``."""
    with tx._write(f"suspending task {claim.task_id}") as conn:
        params = {**claim_params(tx, claim, now), "until": tx._t(until)}
        row = conn.execute(SQL_SUSPEND, params).first()
        if row is None:
            return None
        state = TaskState(row.state)
        if state is TaskState.CANCELLED:
            detail = "cancelled while suspending"
            tx._tell_finished(conn, (claim.task_id,))
        tx._event(conn, claim.task_id, now, state, row.attempts, detail)
        tx._wake_others(conn)  # its due time may be sooner than a sleeping worker's next
        return state


def steps(tx: Transactions, task_id: int) -> list[StepRecord]:
    """``Store.steps``."""
    with tx._read(f"reading the steps of task {task_id}") as conn:
        rows = conn.execute(SQL_STEPS, {"id": task_id}).all()
    return [
        StepRecord(
            r.task_id,
            r.position,
            r.name,
            None if r.result is None else json.loads(r.result),
            from_db_time(r.recorded_at),
            r.attempt,
        )
        for r in rows
    ]


__all__ = ["record_step", "steps", "suspend"]
