"""Fan-out and fan-in (docs/workflows.md): ``ctx.spawn``, ``ctx.gather``, ``ctx.wait_first``.

A spawn is a step: the child is stored, linked to its parent, with the step that
records its id, in one transaction under the attempt's claim, so a replay finds the
step and never submits the child twice. ``gather`` and ``wait_first`` are steps too:
what they saw of the children is recorded once they have it, and replayed after; until
then the workflow suspends holding no slot, and a child's end wakes it, in the child's
own outcome transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from durablesched.errors import (
    CheckpointRefused,
    InvalidTaskError,
    TaskCancelled,
    TaskFailed,
    TaskNotFoundError,
)
from durablesched.handles import TaskHandle
from durablesched.records import ErrorInfo, Finished, NewTask
from durablesched.states import TaskState
from durablesched.submission import build_task
from durablesched.tracing import tracing_hook
from durablesched.workflows import waits
from durablesched.workflows.steps import FOREVER, StepLog, check_step, refused, suspended

if TYPE_CHECKING:
    from durablesched.context import TaskContext
    from durablesched.registry import Task

#: The steps fan-in records.
GATHER = "gather"
WAIT_FIRST = "wait_first"


def spawn(
    ctx: TaskContext, log: StepLog, task: Task[..., Any], args: tuple[Any, ...], kwargs: Any
) -> TaskHandle[Any]:
    """:meth:`TaskContext.spawn`."""
    name = task.definition.name
    step = f"spawn:{name}"
    check_step(ctx, step)
    position, found = log.next(ctx.name, step)
    if found is not None:
        (child_id,) = found.result["ids"]
        return TaskHandle(ctx.scheduler, child_id, name)
    child = child_task(ctx, task, args, kwargs, "its parent's checkpoint")
    submitted = ctx.scheduler.store.spawn(ctx.claim, position, step, [child], ctx.now())
    if submitted is None:
        raise refused(ctx, position, step)
    return TaskHandle(ctx.scheduler, submitted[0].task_id, name)


def child_task(
    ctx: TaskContext, task: Task[..., Any], args: tuple[Any, ...], kwargs: Any, stored_in: str
) -> NewTask:
    """A child of ``ctx``'s attempt calling ``task`` with these arguments, checked and
    traced, to be stored in ``stored_in`` transaction (where ``connection=`` has no
    meaning): what :meth:`TaskContext.enqueue` and :meth:`TaskContext.spawn` store."""
    options = task.submit_options
    if options.connection is not None:
        raise InvalidTaskError(
            f"a child task is stored in {stored_in} transaction: connection= has no meaning here"
        )
    child = build_task(
        task.definition.name,
        kwargs,
        now=ctx.now(),
        at=options.at,
        delay=options.delay,
        max_attempts=options.max_attempts,
        key=options.key,
        registry=ctx.scheduler.registry,
        queue=options.queue,
        priority=options.priority,
        positional=args or None,
        definition=task.definition,
    )
    tracer = tracing_hook.tracer
    return child if tracer is None else tracer.carry(child)


def _ids(handles: Sequence[TaskHandle[Any]], what: str) -> list[int]:
    if not handles:
        raise InvalidTaskError(f"{what} needs at least one handle")
    for handle in handles:
        if not isinstance(handle, TaskHandle):
            raise InvalidTaskError(f"{what} takes task handles, got {handle!r}")
    return [handle.id for handle in handles]  # a child enqueued for success has none: refused


def _seen(record: Finished | None) -> dict[str, Any]:
    """A finished child as the gather step records it."""
    if record is None:
        return {"state": "MISSING"}
    seen: dict[str, Any] = {"state": record.state.value, "name": record.name}
    if record.state is TaskState.SUCCEEDED:
        seen["result"] = record.result
    elif record.state is TaskState.FAILED:
        seen["attempts"] = record.attempts
        seen["error"] = None if record.last_error is None else record.last_error.to_dict()
    return seen


def _value(task_id: int, seen: dict[str, Any]) -> Any:
    """The child's result, or the exception its end stands for (not raised)."""
    state = seen["state"]
    if state == "SUCCEEDED":
        return seen["result"]
    if state == "MISSING":
        return TaskNotFoundError(f"no task with id {task_id} (deleted while waited on?)")
    if state == "CANCELLED":
        cancelled = TaskCancelled(f"task {task_id} ({seen['name']}) was cancelled")
        cancelled.task_id = task_id
        return cancelled
    error = None if seen.get("error") is None else ErrorInfo.from_dict(seen["error"])
    return TaskFailed(task_id, seen["name"], error, seen["attempts"])


def gather(
    ctx: TaskContext, log: StepLog, handles: Sequence[TaskHandle[Any]], return_exceptions: bool
) -> list[Any]:
    """:meth:`TaskContext.gather`."""
    ids = _ids(handles, "gather")
    check_step(ctx, GATHER)
    position, found = log.next(ctx.name, GATHER)
    if found is not None:
        outcomes: list[dict[str, Any]] = found.result
    else:
        finished = ctx.scheduler.store.finished(ids)
        if len(finished) < len(set(ids)):
            ended = sum(1 for r in finished.values() if r is not None)
            suspended(
                ctx,
                FOREVER,
                waits.children(position, ids, ended),
                children=(ids, ended),
            )
        outcomes = [_seen(finished[i]) for i in ids]
        if not ctx.scheduler.store.record_step(ctx.claim, position, GATHER, outcomes, ctx.now()):
            raise refused(ctx, position, GATHER)
    values = [_value(i, seen) for i, seen in zip(ids, outcomes, strict=True)]
    if not return_exceptions:
        for value in values:
            if isinstance(value, BaseException):
                raise value
    return values


def wait_first(
    ctx: TaskContext, log: StepLog, handles: Sequence[TaskHandle[Any]]
) -> TaskHandle[Any]:
    """:meth:`TaskContext.wait_first`."""
    ids = _ids(handles, "wait_first")
    check_step(ctx, WAIT_FIRST)
    position, found = log.next(ctx.name, WAIT_FIRST)
    if found is not None:
        first: int = found.result["id"]
    else:
        finished = ctx.scheduler.store.finished(ids)
        if not finished:
            suspended(
                ctx,
                FOREVER,
                waits.first_child(position, ids),
                children=(ids, 0),
            )
        first = min(
            finished,
            key=lambda i: (_finished_at(finished[i]), ids.index(i)),
        )
        if not ctx.scheduler.store.record_step(
            ctx.claim, position, WAIT_FIRST, {"id": first}, ctx.now()
        ):
            raise refused(ctx, position, WAIT_FIRST)
    return handles[ids.index(first)]


def _finished_at(record: Finished | None) -> Any:
    """Ordering key: the time it finished (a missing task first: it is known ended)."""
    if record is None or record.finished_at is None:
        return ""
    return record.finished_at.isoformat()


__all__ = ["CheckpointRefused", "gather", "spawn", "wait_first"]
