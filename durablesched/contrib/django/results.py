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
"""

from __future__ import annotations

import contextlib

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask

from durablesched.attempts import AttemptOutcome, attempts_from_history
from durablesched.records import ErrorInfo, TaskEvent, TaskRecord, call_args
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
    task: Task, record: TaskRecord, history: list[TaskEvent], backend: str
) -> TaskResult:
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
    # The task as it was enqueued: its priority and queue were the row's (if the
    # settings changed since and refuse them, the task as defined will do).
    with contextlib.suppress(InvalidTask):
        task = task.using(priority=record.priority, queue_name=record.queue)
    positional, keywords = call_args(record.args)
    result = TaskResult(
        task=task,
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


def _task_error(error: ErrorInfo | None) -> TaskError | None:
    if error is None:
        return None
    return TaskError(
        exception_class_path=error.type,
        traceback=error.traceback or f"{error.type}: {error.message}",
    )
