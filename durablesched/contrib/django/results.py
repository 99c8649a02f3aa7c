"""A durablesched task as Django's ``TaskResult``: its state, times, workers and errors.

| durablesched | Django ``TaskResultStatus`` |
| --- | --- |
| PENDING, RETRY_WAIT | READY (waiting for its first or next attempt) |
| RUNNING | RUNNING |
| SUCCEEDED | SUCCESSFUL |
| FAILED, CANCELLED | FAILED |

``started_at`` and ``last_attempted_at`` are the first and last claims in the
task's history, ``worker_ids`` the worker of each claim (so ``attempts`` and
``TaskContext.attempt`` count claims). ``errors`` holds the last failed
attempt's error only: durablesched keeps the class and traceback of the last
error, and only the message of earlier ones (in the history).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask

from durablesched.records import TaskEvent, TaskRecord
from durablesched.states import TaskState

STATUS = {
    TaskState.PENDING: TaskResultStatus.READY,
    TaskState.RETRY_WAIT: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskState.FAILED: TaskResultStatus.FAILED,
    TaskState.CANCELLED: TaskResultStatus.FAILED,
}

#: A claim's history line: "claimed by OWNER from queue QUEUE" (every backend writes it).
_CLAIMED = re.compile(r"^claimed by (.+) from queue \S+$")


def payload(args: Any, kwargs: Any) -> dict[str, Any]:
    """A Django call's arguments as one task's stored arguments."""
    return {"args": list(args), "kwargs": dict(kwargs)}


def task_result(
    task: Task, record: TaskRecord, history: list[TaskEvent], backend: str
) -> TaskResult:
    """``record`` (with its ``history``) as Django sees a result of ``task``."""
    claims = [e for e in history if e.state is TaskState.RUNNING]
    status = STATUS[record.state]
    errors = []
    if record.last_error is not None:
        errors.append(
            TaskError(
                exception_class_path=record.last_error.type,
                traceback=record.last_error.traceback
                or f"{record.last_error.type}: {record.last_error.message}",
            )
        )
    # The task as it was enqueued: its priority and queue were the row's (if the
    # settings changed since and refuse them, the task as defined will do).
    with contextlib.suppress(InvalidTask):
        task = task.using(priority=record.priority, queue_name=record.queue)
    stored = record.args if isinstance(record.args, dict) else {}
    result = TaskResult(
        task=task,
        id=str(record.id),
        status=status,
        enqueued_at=record.created_at,
        started_at=claims[0].at if claims else None,
        last_attempted_at=claims[-1].at if claims else None,
        finished_at=record.finished_at,
        args=list(stored.get("args", [])),
        kwargs=dict(stored.get("kwargs", {})),
        backend=backend,
        errors=errors,
        worker_ids=[_worker(e) for e in claims],
    )
    if status is TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", record.result)
    return result


def _worker(claim: TaskEvent) -> str:
    found = _CLAIMED.match(claim.detail or "")
    return found.group(1) if found else ""
