"""A worker's group commit: many outcomes in one transaction, plain successes in bulk.

The plan is worked out (JSON and all) before the transaction, which then
holds the write lock for the statements alone. Outcomes go in task id order,
the order every multi-row write here locks rows in: on PostgreSQL a heartbeat
of the same tasks then waits instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from durablesched.records import Outcome, OutcomeResult, effective_key
from durablesched.states import TaskState
from durablesched.store.sql.codec import dump
from durablesched.store.sql.outcomes import record_outcome
from durablesched.store.sql.transactions import Transactions


@dataclass(frozen=True, slots=True)
class SuccessRun:
    """Plain successes of distinct tasks, recorded by one statement."""

    indexes: list[int]
    task_ids: list[int]
    #: {task id: {"o": owner, "f": fence, "r": result JSON}}, as the statement takes it.
    batch: str


#: What a group commit does, in order: a run of plain successes, or one outcome's index.
Plan = list[SuccessRun | int]


def plan(outcomes: Sequence[Outcome]) -> Plan:
    """Outcomes in task id order, runs of plain successes (no error, cancel, effects,
    children or signals) grouped."""
    steps: Plan = []
    run: dict[int, int] = {}  # task id -> index, for the current run of plain successes

    def close_run() -> None:
        if run:
            batch = {
                str(task_id): {
                    "o": outcomes[i].claim.owner,
                    "f": outcomes[i].claim.fence,
                    "r": "null" if outcomes[i].result is None else dump(outcomes[i].result),
                }
                for task_id, i in run.items()
            }
            steps.append(SuccessRun(list(run.values()), list(run), dump(batch)))
            run.clear()

    for index in sorted(range(len(outcomes)), key=lambda i: outcomes[i].claim.task_id):
        outcome = outcomes[index]
        plain = not (
            outcome.error
            or outcome.cancelled
            or outcome.effects
            or outcome.children
            or outcome.signals
        )
        if plain and outcome.claim.task_id not in run:
            run[outcome.claim.task_id] = index
            continue
        close_run()
        if plain:
            run[outcome.claim.task_id] = index
        else:
            steps.append(index)
    close_run()
    return steps


def record_outcomes(
    tx: Transactions,
    conn: Connection,
    outcomes: Sequence[Outcome],
    now: datetime,
    steps: Plan,
) -> list[OutcomeResult]:
    """Outcomes in the order of ``steps`` (the plan made before the transaction began)."""
    results: list[OutcomeResult] = [None] * len(outcomes)
    for step in steps:
        if isinstance(step, int):
            results[step] = record_outcome(tx, conn, outcomes[step], now)
            continue
        for index, state in zip(step.indexes, complete_many(tx, conn, step, now), strict=True):
            results[index] = state
    return results


def complete_many(
    tx: Transactions, conn: Connection, run: SuccessRun, now: datetime
) -> list[TaskState | None]:
    """Plain successes of distinct tasks in three statements in all (one on PostgreSQL):
    their new states."""
    stamp = tx._t(now)
    # id, attempts, idempotency_key, result
    rows = {
        r[0]: r
        for r in tx._rows(conn, tx.dialect.complete_many, {"batch": run.batch, "now": stamp})
    }
    if rows and not tx.dialect.writes_history:
        done = [rows[task_id] for task_id in run.task_ids if task_id in rows]
        tx._many(
            conn,
            tx.dialect.record_keys,
            [(effective_key(r[0], r[2]), r[0], stamp, r[3]) for r in done],
        )
        tx._many(
            conn,
            tx.dialect.insert_events,
            [(r[0], stamp, "SUCCEEDED", r[1], None) for r in done],
        )
    return [TaskState.SUCCEEDED if task_id in rows else None for task_id in run.task_ids]
