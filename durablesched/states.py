"""The task state machine: one enum, one table of allowed transitions."""

from __future__ import annotations

from enum import StrEnum

from durablesched.errors import InvalidTransitionError


class TaskState(StrEnum):
    """Where a task is in its life. The values are stored in SQL as they are."""

    #: Submitted; runs once its due time has come and a worker has a free slot.
    PENDING = "PENDING"
    #: Claimed by a worker under a lease.
    RUNNING = "RUNNING"
    #: Finished; its result and database effects are committed.
    SUCCEEDED = "SUCCEEDED"
    #: An attempt failed (or its lease was lost); waits for its retry due time.
    RETRY_WAIT = "RETRY_WAIT"
    #: Out of attempts, or failed after cancellation was requested. Final.
    FAILED = "FAILED"
    #: Cancelled before it started, or acknowledged a requested cancellation. Final.
    CANCELLED = "CANCELLED"


#: Every allowed (from, to) pair. RUNNING -> CANCELLED additionally needs a
#: cancellation request, which the stores check where they know it.
TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (TaskState.PENDING, TaskState.RUNNING),
        (TaskState.PENDING, TaskState.CANCELLED),
        (TaskState.RUNNING, TaskState.SUCCEEDED),
        (TaskState.RUNNING, TaskState.RETRY_WAIT),
        (TaskState.RUNNING, TaskState.FAILED),
        (TaskState.RUNNING, TaskState.CANCELLED),
        (TaskState.RETRY_WAIT, TaskState.RUNNING),
        (TaskState.RETRY_WAIT, TaskState.CANCELLED),
    }
)

#: Not part of a task's own life, but operator actions on it: a worker shutting
#: down gives back a claim it cannot finish (RUNNING -> PENDING, the attempt
#: not counted), and ``durablesched retry`` requeues a finished failure.
OPERATOR_TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (TaskState.RUNNING, TaskState.PENDING),
        (TaskState.FAILED, TaskState.PENDING),
        (TaskState.CANCELLED, TaskState.PENDING),
    }
)

#: States a worker may claim from, once due.
CLAIMABLE: frozenset[TaskState] = frozenset({TaskState.PENDING, TaskState.RETRY_WAIT})
#: States with no way out.
TERMINAL: frozenset[TaskState] = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}
)
#: States in which a submit key stays taken (see docs/api.md, idempotent submit).
KEY_HOLDING: frozenset[TaskState] = frozenset(
    {TaskState.PENDING, TaskState.RUNNING, TaskState.RETRY_WAIT, TaskState.SUCCEEDED}
)


def check_transition(old: TaskState, new: TaskState, *, operator: bool = False) -> None:
    """Raise :class:`InvalidTransitionError` unless ``old -> new`` is allowed.

    ``operator=True`` also admits the :data:`OPERATOR_TRANSITIONS`.
    """
    if (old, new) not in TRANSITIONS and not (operator and (old, new) in OPERATOR_TRANSITIONS):
        raise InvalidTransitionError(f"illegal task state transition {old} -> {new}")
