"""A durablesched worker running a Django project's tasks.

Each task found by :mod:`.discovery` is registered under its module path with
a small runner: Django's connections are checked (``close_old_connections``)
before and after the attempt, ``task_started`` is sent before the function is
called, and ``task_finished`` once the task's final outcome has committed
(the worker's ``after_commit`` hook), never before. A retry is not a finish.

The ``TaskResult`` each signal carries (and a ``takes_context`` task gets) is
built without reading the task where the worker already knows it: a first claim
from the claim itself, and a finish from the result its start was given plus
the outcome just committed. Only a later claim (a retry, or a task given back
by a stopping worker) is read, to learn its earlier workers and errors. Each is
the result ``get_result`` would read at that moment (:mod:`.results`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.db import close_old_connections
from django.tasks import Task, TaskContext, TaskResult
from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from durablesched.context import TaskContext as DurableContext
from durablesched.contrib.django.backend import DurableSchedBackend
from durablesched.contrib.django.results import as_enqueued, finished_result, first_claim_result
from durablesched.errors import InvalidTaskError, NoRetry
from durablesched.records import Claim, Outcome
from durablesched.registry import TaskRegistry
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState
from durablesched.worker.loop import Worker

#: The states after which a task runs no more: Django's task_finished is sent for these.
FINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})


#: The attempt running on this thread: Django's context given to the task, and ours.
_RUNNING: ContextVar[tuple[TaskContext[..., Any], DurableContext] | None] = ContextVar(
    "durablesched_django_attempt", default=None
)


def durable(context: TaskContext[..., Any]) -> DurableContext:
    """durablesched's own context of the attempt Django's ``context`` belongs to.

    Call it in a ``takes_context=True`` task, with the context it was given, to
    reach what Django's context lacks: ``on_success(effect)`` (database work
    committed in the transaction that records the task's success, or never),
    ``cancel_requested`` and ``raise_if_cancelled()``, ``timed_out``, and the
    rest of :class:`durablesched.TaskContext` (docs/django.md).
    :class:`InvalidTaskError` for a context that is not of a running attempt.
    """
    running = _RUNNING.get()
    if running is None or running[0] is not context:
        raise InvalidTaskError(
            "durable() takes the TaskContext a running takes_context=True task was given"
        )
    return running[1]


class DjangoTasks:
    """The project's tasks as a durablesched registry, and the signals around them."""

    def __init__(self, backend: DurableSchedBackend) -> None:
        self.backend = backend
        #: The result task_started was sent with, per running attempt (task id, fence),
        #: until its outcome commits: what task_finished's result is built from.
        self._started: dict[tuple[int, int], TaskResult[..., Any]] = {}
        #: Each task as enqueued with a priority and queue (Task.using validates: slow).
        self._enqueued: dict[tuple[str, int, str], Task[..., Any]] = {}
        self.registry = TaskRegistry(default_retry=backend.retry)
        found = backend.tasks.by_path
        unknown = sorted(set(backend.task_options) - set(found))
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{backend.alias!r}]['OPTIONS']['tasks'] names {unknown}, which are not "
                "tasks of the project (an installed app's tasks module or task_modules)"
            )
        for path, task in sorted(found.items()):
            self.registry.register(
                self._runner(task),
                name=path,
                pass_context=True,
                retry=backend.retry_for(path),
                timeout=backend.timeout_for(path),
            )

    def started(self, task: Task[..., Any], claim: Claim) -> TaskResult[..., Any]:
        """The result of the attempt ``claim`` starts, as ``get_result`` would read it now;
        kept for :meth:`after_commit`. Read only for a task claimed before."""
        backend = self.backend
        if claim.fence == 1 and claim.created_at is not None and claim.claimed_at is not None:
            key = (task.module_path, claim.priority, claim.queue)
            enqueued = self._enqueued.get(key)
            if enqueued is None:
                enqueued = self._enqueued[key] = as_enqueued(
                    task, claim.priority, claim.queue, backend.alias
                )
            result = first_claim_result(enqueued, claim, backend.alias)
        else:
            result = backend.get_result(str(claim.task_id))
        self._started[claim.task_id, claim.fence] = result
        return result

    def _runner(self, task: Task[..., Any]) -> Callable[..., Any]:
        backend = self.backend
        started = self.started

        def run(ctx: DurableContext, /, *args: Any, **kwargs: Any) -> Any:
            close_old_connections()
            try:
                result = started(task, ctx.claim)
                task_started.send(type(backend), task_result=result)
                if task.takes_context:
                    context = TaskContext(task_result=result)
                    token = _RUNNING.set((context, ctx))
                    try:
                        value = task.call(context, *args, **kwargs)
                    finally:
                        _RUNNING.reset(token)
                else:
                    value = task.call(*args, **kwargs)
                try:
                    return normalize_json(value)
                except (TypeError, ValueError) as e:
                    # Its body ran: a retry would repeat its effects to return the same.
                    raise NoRetry(
                        f"the result of task {task.module_path!r} must be JSON-serialisable: "
                        f"{e} (failed at once, not retried)"
                    ) from None
            finally:
                close_old_connections()

        run.__qualname__ = run.__name__ = f"run {task.module_path}"
        return run

    def after_commit(self, outcome: Outcome, state: TaskState | None, at: datetime) -> None:
        """Send ``task_finished`` for a task whose final outcome has just committed (at
        ``at``): built from its start's result, or read if it never started here (a
        row naming no task, arguments that do not fit)."""
        claim = outcome.claim
        started = self._started.pop((claim.task_id, claim.fence), None)
        if state not in FINAL:
            return
        if started is not None:
            result = finished_result(started, outcome, state, at)
        else:
            try:
                result = self.backend.get_result(str(claim.task_id))
            except TaskResultDoesNotExist:
                return  # purged already, or not a task of this project
        task_finished.send(type(self.backend), task_result=result)

    def worker(self, **options: Any) -> Worker:
        """A worker on the backend's store running these tasks (``options``: Worker's).

        A row naming no task of the project fails at once (``unknown_tasks="fail"``)
        unless ``options`` say otherwise: the project's worker runs every task of
        its backend, so no other worker would ever run it.
        """
        options.setdefault("unknown_tasks", "fail")
        scheduler = Scheduler(self.backend.scheduler.store, registry=self.registry)
        return Worker(scheduler, after_commit=self.after_commit, **options)
