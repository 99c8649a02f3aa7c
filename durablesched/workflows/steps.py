"""Workflow steps (docs/workflows.md): run once, recorded as a checkpoint, replayed after.

A task that takes a context is a workflow as soon as it calls :meth:`TaskContext.step
<durablesched.TaskContext.step>`: each call is one step, identified by its name and its
position (0, 1, ... in the order the task calls them). The first attempt to reach a
step runs it and records its JSON result under the attempt's claim (fenced: a zombie
records nothing), with the step's database effects in the same transaction; every
later attempt re-runs the task from the top and gets the recorded result back without
calling the step. A recorded step of another name at a position is a changed workflow
(:class:`~durablesched.errors.WorkflowChanged`), never a silently wrong result.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from durablesched.errors import (
    CheckpointRefused,
    InvalidTaskError,
    NoRetry,
    TaskCancelled,
    TaskTimeout,
    UnsupportedOperationError,
    WorkerStopping,
    WorkflowChanged,
    WorkflowSuspended,
)
from durablesched.records import Environment, StepRecord
from durablesched.retry import DEFAULT_RETRY, RetryPolicy
from durablesched.submission import canonical_json
from durablesched.workflows import waits

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from durablesched.context import TaskContext

#: A step's database effect: called with the checkpoint's connection and the step's result.
StepEffect = Callable[["Connection", Any], object]
#: What a step's own failures never retry: the attempt is over (cancel, timeout,
#: shutdown, a refused checkpoint) or the failure is final.
_NOT_RETRIED = (
    TaskCancelled,
    TaskTimeout,
    WorkerStopping,
    CheckpointRefused,
    NoRetry,
    WorkflowSuspended,
)
#: The step a durable sleep records: its wake time.
SLEEP = "sleep"
#: The due time of a workflow that waits for a signal with no timeout: only the signal
#: brings it back (or an operator's retry).
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)


class StepLog:
    """One attempt's view of its task's checkpoints: read once, at its first step."""

    __slots__ = ("position", "recorded")

    def __init__(self, recorded: list[StepRecord]) -> None:
        self.recorded = {s.position: s for s in recorded}
        #: The position of the next step the task calls.
        self.position = 0

    def next(self, task: str, name: str) -> tuple[int, StepRecord | None]:
        """The next step's position and its checkpoint, if recorded; WorkflowChanged if
        a step of another name was recorded there."""
        position = self.position
        self.position += 1
        found = self.recorded.get(position)
        if found is not None and found.name != name:
            raise WorkflowChanged(
                f"task {task!r} (id {found.task_id}) changed under a workflow in flight: step "
                f"{position} is {name!r} in this code but {found.name!r} was recorded there "
                "(docs/workflows.md, 'Deploying changed workflow code')"
            )
        return position, found


def check_step(ctx: TaskContext, name: str) -> None:
    """Refuse what no step can do: a name that is no string, the process environment;
    stop at once if the attempt should (a cancel request, a lost lease, its timeout)."""
    if not isinstance(name, str) or not name:
        raise InvalidTaskError(f"a step's name must be a non-empty string, got {name!r}")
    if ctx.environment == Environment.PROCESS:
        raise UnsupportedOperationError(
            f"task {ctx.name!r} runs in the process environment, where a step's checkpoint "
            "cannot be recorded (the child has no database connection): run workflows in "
            "the thread or async environment (docs/workflows.md)"
        )
    ctx.raise_if_cancelled()


def policy_of(ctx: TaskContext, retry: RetryPolicy | None) -> RetryPolicy:
    registry = ctx.scheduler.registry
    if retry is not None:
        return retry
    return DEFAULT_RETRY if registry is None else registry.retry_policy(ctx.name)


def retried(policy: RetryPolicy, tries: int, exc: Exception) -> float | None:
    """Seconds to wait before trying a step again after its ``tries``-th failure, or None
    if the failure goes to the task."""
    if isinstance(exc, _NOT_RETRIED) or tries >= policy.max_attempts or not policy.retries(exc):
        return None
    return policy.delay(tries).total_seconds()


def stored(ctx: TaskContext, name: str, value: Any) -> Any:
    """The step's result as it will read back on replay (a tuple as a list, ...); a value
    JSON cannot hold fails the task at once (the step ran: a retry would repeat it)."""
    try:
        return canonical_json(value, f"the result of step {name!r} of task {ctx.name!r}")
    except InvalidTaskError as exc:
        raise NoRetry(str(exc)) from exc


def refused(ctx: TaskContext, position: int, name: str) -> CheckpointRefused:
    return CheckpointRefused(
        f"step {position} ({name!r}) of task {ctx.task_id} was not recorded: attempt "
        f"{ctx.attempt}'s claim is no longer valid (its lease was lost); this attempt stops"
    )


def effects_of(
    effect: StepEffect | None, result: Any
) -> tuple[Callable[[Connection], object], ...]:
    if effect is None:
        return ()
    return (lambda conn: effect(conn, result),)


def run_step(
    ctx: TaskContext,
    log: StepLog,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    retry: RetryPolicy | None,
    effect: StepEffect | None,
) -> Any:
    """:meth:`TaskContext.step`, on the task's thread."""
    check_step(ctx, name)
    position, found = log.next(ctx.name, name)
    if found is not None:
        return found.result
    policy = policy_of(ctx, retry)
    tries = 0
    while True:
        tries += 1
        try:
            value = fn(*args)
            break
        except Exception as exc:
            wait = retried(policy, tries, exc)
            if wait is None:
                raise
            ctx.sleep(wait)  # raises at once on a cancel, a lost lease, the shutdown
    result = stored(ctx, name, value)
    store = ctx.scheduler.store
    if not store.record_step(
        ctx.claim, position, name, result, ctx.now(), effects=effects_of(effect, result)
    ):
        raise refused(ctx, position, name)
    return result


async def arun_step(
    ctx: TaskContext,
    log: StepLog,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    retry: RetryPolicy | None,
    effect: StepEffect | None,
) -> Any:
    """:meth:`TaskContext.astep`, on the event loop: the store is called on a thread."""
    check_step(ctx, name)
    position, found = log.next(ctx.name, name)
    if found is not None:
        return found.result
    policy = policy_of(ctx, retry)
    tries = 0
    while True:
        tries += 1
        try:
            value = fn(*args)
            if inspect.isawaitable(value):
                value = await value
            break
        except Exception as exc:
            wait = retried(policy, tries, exc)
            if wait is None:
                raise
            end = time.monotonic() + wait
            while time.monotonic() < end:  # a cancel arrives as CancelledError meanwhile
                ctx.raise_if_cancelled()
                if ctx.shutdown_requested:
                    raise WorkerStopping(
                        f"task {ctx.task_id}: its worker is stopping; it is given back"
                    ) from exc
                await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))
    result = stored(ctx, name, value)
    recorded = await asyncio.to_thread(
        ctx.scheduler.store.record_step,
        ctx.claim,
        position,
        name,
        result,
        ctx.now(),
        effects=effects_of(effect, result),
    )
    if not recorded:
        raise refused(ctx, position, name)
    return result


def sleep_until(ctx: TaskContext, log: StepLog, at: datetime) -> None:
    """:meth:`TaskContext.sleep_until`: a step recording the wake time (the first time
    reached: later attempts keep it), then, if it is still to come, the suspension."""
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise InvalidTaskError(f"a wake time must be a timezone-aware datetime, got {at!r}")
    check_step(ctx, SLEEP)
    position, found = log.next(ctx.name, SLEEP)
    now = ctx.now()
    store = ctx.scheduler.store
    if found is None:
        wake = at
        if not store.record_step(ctx.claim, position, SLEEP, wake.isoformat(), now):
            raise refused(ctx, position, SLEEP)
    else:
        wake = datetime.fromisoformat(found.result)
    if wake <= now:
        return
    suspended(ctx, wake, waits.sleeping(position, wake))


def suspended(
    ctx: TaskContext,
    until: datetime,
    detail: str,
    signal: str | None = None,
    children: tuple[Sequence[int], int] | None = None,
) -> NoReturn:
    """Suspend the workflow (``Store.suspend``) and end the attempt."""
    store = ctx.scheduler.store
    state = store.suspend(
        ctx.claim, until, ctx.now(), detail=detail, signal=signal, children=children
    )
    if state is None:
        raise CheckpointRefused(
            f"task {ctx.task_id} could not suspend: attempt {ctx.attempt}'s claim is no longer "
            "valid (its lease was lost); this attempt stops"
        )
    ctx.suspended = True
    raise WorkflowSuspended(f"task {ctx.task_id} {detail}")


def wait_for_signal(ctx: TaskContext, log: StepLog, name: str, timeout: timedelta | None) -> Any:
    """:meth:`TaskContext.wait_for_signal`: two steps, ``wait:<name>`` (its deadline, set
    the first time reached) and ``signal:<name>`` (what it got: ``{"payload": ...}``, or
    ``{"timeout": true}``), with a suspension between them while nothing came."""
    if not isinstance(name, str) or not name:
        raise InvalidTaskError(f"a signal's name must be a non-empty string, got {name!r}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise InvalidTaskError(f"wait_for_signal's timeout is a timedelta, got {timeout!r}")
    waiting, step = f"wait:{name}", f"signal:{name}"
    check_step(ctx, waiting)
    store = ctx.scheduler.store
    now = ctx.now()
    position, found = log.next(ctx.name, waiting)
    if found is None:
        deadline = None if timeout is None else now + timeout
        at = None if deadline is None else deadline.isoformat()
        if not store.record_step(ctx.claim, position, waiting, at, now):
            raise refused(ctx, position, waiting)
    else:
        deadline = None if found.result is None else datetime.fromisoformat(found.result)
    position, found = log.next(ctx.name, step)
    if found is not None:
        return found.result.get("payload")
    got = store.receive_signal(ctx.claim, position, step, name, now)
    if got is None:
        raise refused(ctx, position, step)
    if got[0]:
        return got[1]
    if deadline is not None and deadline <= now:
        if not store.record_step(ctx.claim, position, step, {"timeout": True}, now):
            raise refused(ctx, position, step)
        return None
    detail = waits.signal(position, name, deadline)
    suspended(ctx, FOREVER if deadline is None else deadline, detail, signal=name)
