"""A task's attempts, read from its history: who ran each, when, and how it ended.

Nothing is written for this: every claim already writes a RUNNING line
("claimed by OWNER from queue QUEUE") and every end of an attempt writes the
line after it (SUCCEEDED; RETRY_WAIT or FAILED with the attempt's error;
CANCELLED; PENDING when a stopping worker gave the claim back). An attempt is
a RUNNING line and the line that follows it. The SQL view
``durablesched_attempts`` (docs/sql.md) reads the same lines the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from durablesched.records import ErrorInfo, TaskEvent
from durablesched.states import TaskState


class AttemptOutcome(StrEnum):
    """How one attempt ended."""

    #: The task succeeded: its result and effects committed with this line.
    SUCCEEDED = "SUCCEEDED"
    #: It raised, timed out or lost its lease; the task was retried or gave up.
    FAILED = "FAILED"
    #: It acknowledged a requested cancellation (or its lease lapsed after one).
    CANCELLED = "CANCELLED"
    #: A stopping worker gave the claim back unfinished: the attempt did not count,
    #: and the next claim carries the same number.
    RELEASED = "RELEASED"


#: The line after a claim, as the outcome of that claim's attempt.
_OUTCOMES = {
    TaskState.SUCCEEDED: AttemptOutcome.SUCCEEDED,
    TaskState.RETRY_WAIT: AttemptOutcome.FAILED,
    TaskState.FAILED: AttemptOutcome.FAILED,
    TaskState.CANCELLED: AttemptOutcome.CANCELLED,
    TaskState.PENDING: AttemptOutcome.RELEASED,
}
#: How a claim's history line begins and where its owner ends (every backend writes it).
_CLAIMED = "claimed by "
_FROM_QUEUE = " from queue "


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One claim of a task and how it ended (see :meth:`Scheduler.attempts`)."""

    task_id: int
    #: The attempt's number as the task counted it (what ``TaskContext.attempt`` saw):
    #: 1 for the first; a released claim's number comes again.
    number: int
    started_at: datetime
    #: The worker that claimed it (its owner id).
    worker_id: str
    #: When the line after the claim was written; None while it runs.
    finished_at: datetime | None
    #: None while it runs.
    outcome: AttemptOutcome | None
    #: A failed attempt's error (class path, message, traceback). None for other
    #: outcomes, and for a failure recorded before schema revision 0007.
    error: ErrorInfo | None


def attempts_from_history(history: Sequence[TaskEvent]) -> list[AttemptInfo]:
    """Every attempt in a task's ``history`` (oldest first), oldest first."""
    attempts: list[AttemptInfo] = []
    for index, event in enumerate(history):
        if event.state is not TaskState.RUNNING:
            continue
        after = history[index + 1] if index + 1 < len(history) else None
        outcome = None if after is None else _OUTCOMES.get(after.state)
        attempts.append(
            AttemptInfo(
                task_id=event.task_id,
                number=event.attempt,
                started_at=event.at,
                worker_id=worker_of(event.detail),
                finished_at=None if after is None else after.at,
                outcome=outcome,
                error=after.error
                if after is not None and outcome is AttemptOutcome.FAILED
                else None,
            )
        )
    return attempts


def worker_of(detail: str | None) -> str:
    """The owner named by a claim's history line ("" for a line that names none)."""
    text = detail or ""
    end = text.find(_FROM_QUEUE)
    if not text.startswith(_CLAIMED) or end < 0:
        return ""
    return text[len(_CLAIMED) : end]
