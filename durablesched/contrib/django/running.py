"""A durablesched worker running a Django project's tasks.

Each task found by :mod:`.discovery` is registered under its module path with
a small runner: Django's connections are checked (``close_old_connections``)
before and after the attempt, ``task_started`` is sent before the function is
called, and ``task_finished`` once the task's final outcome has committed
(the worker's ``after_commit`` hook), never before. A retry is not a finish.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.db import close_old_connections
from django.tasks import Task, TaskContext, TaskResult
from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from durablesched.context import TaskContext as DurableContext
from durablesched.contrib.django.backend import DurableSchedBackend
from durablesched.errors import InvalidTaskError
from durablesched.records import Claim
from durablesched.registry import TaskRegistry
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState
from durablesched.worker.loop import Worker

#: The states after which a task runs no more: Django's task_finished is sent for these.
FINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})


#: The attempt running on this thread: Django's context given to the task, and ours.
_RUNNING: ContextVar[tuple[TaskContext, DurableContext] | None] = ContextVar(
    "durablesched_django_attempt", default=None
)


def durable(context: TaskContext) -> DurableContext:
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

    def _runner(self, task: Task) -> Callable[..., Any]:
        backend = self.backend

        def run(ctx: DurableContext, /, *args: Any, **kwargs: Any) -> Any:
            close_old_connections()
            try:
                result = backend.get_result(str(ctx.task_id))
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
                return normalize_json(value)
            finally:
                close_old_connections()

        run.__qualname__ = run.__name__ = f"run {task.module_path}"
        return run

    def after_commit(self, claim: Claim, state: TaskState | None) -> None:
        """Send ``task_finished`` for a task whose final outcome has just committed."""
        if state not in FINAL:
            return
        try:
            result: TaskResult = self.backend.get_result(str(claim.task_id))
        except TaskResultDoesNotExist:
            return  # purged already
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
