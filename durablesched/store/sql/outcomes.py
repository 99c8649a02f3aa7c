"""Recording one attempt's outcome: success, failure or acknowledged cancellation.

Each write names the claim in its WHERE clause (``VALID`` in statements.py):
a claim that is no longer valid changes nothing and the answer is None.
Used by ``complete``, ``fail`` and ``acknowledge_cancel``, and by a group
commit for the outcomes it cannot record in bulk.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from durablesched.errors import InvalidTransitionError
from durablesched.records import Claim, Outcome, OutcomeResult, effective_key
from durablesched.states import TaskState
from durablesched.store.sql.codec import dump, error_json
from durablesched.store.sql.signals import deliver
from durablesched.store.sql.statements import (
    SQL_ACK_CANCEL,
    SQL_COMPLETE,
    SQL_FAIL,
    SQL_IS_VALID,
    SQL_RECORD_KEY,
)
from durablesched.store.sql.submitting import insert
from durablesched.store.sql.transactions import Transactions


def claim_params(tx: Transactions, claim: Claim, now: datetime) -> dict[str, Any]:
    """The parameters of ``VALID``: the claim's task, owner and fence, and ``now``."""
    return {
        "id": claim.task_id,
        "owner": claim.owner,
        "fence": claim.fence,
        "now": tx._t(now),
    }


def record_outcome(
    tx: Transactions, conn: Connection, outcome: Outcome, now: datetime
) -> OutcomeResult:
    """Any outcome; one with effects or children under a savepoint, undone alone if it raises."""
    if outcome.error is not None:
        return record_failure(tx, conn, outcome, now)
    if outcome.cancelled:
        try:
            return record_cancel(tx, conn, outcome.claim, now)
        except InvalidTransitionError as e:
            return e
    if not (outcome.effects or outcome.children or outcome.signals):
        return record_success(tx, conn, outcome, now)
    savepoint = conn.begin_nested()
    try:
        state = record_success(tx, conn, outcome, now)
    except Exception as e:  # an effect raised, a signal was refused: undo this outcome alone
        savepoint.rollback()
        return e
    savepoint.commit()
    return state


def record_success(
    tx: Transactions, conn: Connection, outcome: Outcome, now: datetime
) -> TaskState | None:
    """SUCCEEDED with the result, its key, the children, the effects and the signals."""
    claim = outcome.claim
    result_json = dump(outcome.result)
    params = claim_params(tx, claim, now)
    row = conn.execute(SQL_COMPLETE, {**params, "result": result_json}).first()
    if row is None:
        return None
    conn.execute(
        SQL_RECORD_KEY,
        {
            "key": effective_key(claim.task_id, row.idempotency_key),
            "task_id": claim.task_id,
            "now": params["now"],
            "result": result_json,
        },
    )
    # Effects and signals before children: an effect that raises (or a signal refused)
    # undoes the outcome, and children stored first would have taken ids that
    # PostgreSQL's sequence never gives back.
    for effect in outcome.effects:
        effect(conn)
    for sent in outcome.signals:
        deliver(tx, conn, sent, now)
    if outcome.children:
        insert(tx, conn, outcome.children, now)
    tx._event(conn, claim.task_id, now, TaskState.SUCCEEDED, row.attempts, None)
    return TaskState.SUCCEEDED


def record_failure(
    tx: Transactions, conn: Connection, outcome: Outcome, now: datetime
) -> TaskState | None:
    """RETRY_WAIT due at the outcome's ``retry_at``, or FAILED."""
    assert outcome.error is not None
    params = {
        **claim_params(tx, outcome.claim, now),
        "give_up": 1 if outcome.retry_at is None else 0,
        "retry_at": None if outcome.retry_at is None else tx._t(outcome.retry_at),
        "error": error_json(outcome.error),
    }
    row = conn.execute(SQL_FAIL, params).first()
    if row is None:
        return None
    state = TaskState(row.state)
    tx._event(
        conn, outcome.claim.task_id, now, state, row.attempts, outcome.error.message, outcome.error
    )
    return state


def record_cancel(
    tx: Transactions,
    conn: Connection,
    claim: Claim,
    now: datetime,
    detail: str = "cancellation acknowledged",
) -> TaskState | None:
    """CANCELLED, if cancellation was requested; InvalidTransitionError if it was not."""
    params = claim_params(tx, claim, now)
    row = conn.execute(SQL_ACK_CANCEL, params).first()
    if row is None:
        if conn.execute(SQL_IS_VALID, params).first() is not None:
            raise InvalidTransitionError(
                f"task {claim.task_id} cannot acknowledge a cancellation nobody requested"
            )
        return None
    tx._event(conn, claim.task_id, now, TaskState.CANCELLED, row.attempts, detail)
    return TaskState.CANCELLED
