"""A durablesched task as Django's ``TaskResult``: its state, times, workers and errors.

| durablesched | Django ``TaskResultStatus`` |
| --- | --- |
| PENDING, RETRY_WAIT | READY (waiting for its first or next attempt) |
| RUNNING | RUNNING |
| SUCCEEDED | SUCCESSFUL |
| FAILED, CANCELLED | FAILED |

``started_at`` and ``last_attempted_at`` are the first and last claims in the
task's history, ``worker_ids`` the worker of each claim (so ``attempts`` and
``TaskContext.attempt`` count claims), and ``errors`` one entry per failed
attempt, oldest first, each with its class path and traceback: the task's
attempts (:func:`durablesched.attempts.attempts_from_history`).

A worker builds the same result without reading (:mod:`.running`): for a task's
first claim, from the claim alone (:func:`first_claim_result`: its history is
its submission and that claim); once the attempt's final outcome commits, from
the result its start was given and that outcome (:func:`finished_result`).
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask

from durablesched.attempts import AttemptOutcome, attempts_from_history
from durablesched.records import Claim, ErrorInfo, Outcome, TaskEvent, TaskRecord, call_args
from durablesched.states import TaskState

STATUS = {
    TaskState.PENDING: TaskResultStatus.READY,
    TaskState.RETRY_WAIT: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskState.FAILED: TaskResultStatus.FAILED,
    TaskState.CANCELLED: TaskResultStatus.FAILED,
}


def task_result(
    task: Task[..., Any], record: TaskRecord, history: list[TaskEvent], backend: str
) -> TaskResult[..., Any]:
    """``record`` (with its ``history``) as Django sees a result of ``task``."""
    attempts = attempts_from_history(history)
    status = STATUS[record.state]
    failures = [a for a in attempts if a.outcome is AttemptOutcome.FAILED]
    errors = [
        _task_error(
            # A failure recorded before schema revision 0007 kept no error on its line:
            # the last one is still the task's last_error.
            a.error if a.error is not None or i < len(failures) - 1 else record.last_error
        )
        for i, a in enumerate(failures)
    ]
    positional, keywords = call_args(record.args)
    enqueued = as_enqueued(task, record.priority, record.queue, backend)
    result = TaskResult(
        task=deferred(enqueued, _run_after(record, history)),
        id=str(record.id),
        status=status,
        enqueued_at=record.created_at,
        started_at=attempts[0].started_at if attempts else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        finished_at=record.finished_at,
        args=positional,
        kwargs=dict(keywords),
        backend=backend,
        errors=[e for e in errors if e is not None],
        worker_ids=[a.worker_id for a in attempts],
    )
    if status is TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", record.result)
    return result


def first_claim_result(task: Task[..., Any], claim: Claim, backend: str) -> TaskResult[..., Any]:
    """The result :func:`task_result` would read for a task of ``task`` (as enqueued:
    :func:`as_enqueued`) just claimed for the first time (``claim.fence == 1``: its
    history is its submission and this claim, so no earlier worker or error)."""
    if claim.fence != 1 or claim.created_at is None or claim.claimed_at is None:
        raise ValueError(f"task {claim.task_id}: claim {claim.fence} is not a first claim")
    positional, keywords = call_args(claim.args)
    # A first claim: nothing has moved its due time yet.
    run_after = claim.due_at if claim.due_at > claim.created_at else None
    return TaskResult(
        task=deferred(task, run_after),
        id=str(claim.task_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=claim.created_at,
        started_at=claim.started_at or claim.claimed_at,
        last_attempted_at=claim.started_at or claim.claimed_at,
        finished_at=None,
        args=positional,
        kwargs=dict(keywords),
        backend=backend,
        errors=[],
        worker_ids=[claim.owner],
    )


def finished_result(
    started: TaskResult[..., Any], outcome: Outcome, state: TaskState, at: datetime
) -> TaskResult[..., Any]:
    """The result :func:`task_result` would read once the attempt that began as
    ``started`` (the task RUNNING, this attempt its last) has committed ``outcome``,
    leaving the task in the final ``state`` at ``at``: no later claim can exist."""
    errors = list(started.errors)
    error = _task_error(outcome.error)
    if error is not None:
        errors.append(error)
    status = STATUS[state]
    result = TaskResult(
        task=started.task,
        id=started.id,
        status=status,
        enqueued_at=started.enqueued_at,
        started_at=started.started_at,
        last_attempted_at=started.last_attempted_at,
        finished_at=at,
        args=started.args,
        kwargs=started.kwargs,
        backend=started.backend,
        errors=errors,
        worker_ids=list(started.worker_ids),
    )
    if status is TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", outcome.result)
    return result


def as_enqueued(task: Task[..., Any], priority: int, queue: str, backend: str) -> Task[..., Any]:
    """``task`` as it was enqueued: on the backend whose store holds the row (so that
    ``refresh()`` reads it there), with the row's priority and queue (if the settings
    changed since and refuse them, the task as defined on that backend will do)."""
    if task.backend != backend:
        with contextlib.suppress(InvalidTask):
            task = task.using(backend=backend)
    if task.priority == priority and task.queue_name == queue:
        return task
    with contextlib.suppress(InvalidTask):
        return task.using(priority=priority, queue_name=queue)
    return task


def deferred(task: Task[..., Any], run_after: datetime | None) -> Task[..., Any]:
    """``task`` with the ``run_after`` it was enqueued with (None: it was not deferred)."""
    if run_after is None or task.run_after == run_after:
        return task
    with contextlib.suppress(InvalidTask):
        return task.using(run_after=run_after)
    return task


def _run_after(record: TaskRecord, history: list[TaskEvent]) -> datetime | None:
    """The ``run_after`` a task was enqueued with: its due time if that is after its
    enqueue (a run_after in the past ran at once, as one never deferred), unless a retry
    or a requeue has moved it since (then no longer known: None)."""
    if record.due_at <= record.created_at:
        return None
    moved = any(e.state is TaskState.RETRY_WAIT or e.detail == "requeued" for e in history)
    return None if moved else record.due_at


def _task_error(error: ErrorInfo | None) -> TaskError | None:
    if error is None:
        return None
    return TaskError(
        exception_class_path=error.type,
        traceback=error.traceback or f"{error.type}: {error.message}",
    )
