"""``DurableSchedBackend``: Django's task API on durablesched's queue, in the app's database.

``Task.enqueue()`` inside ``transaction.atomic()`` writes the task on Django's
own connection, in the block's transaction (``Scheduler.submit(connection=)``
with the driver's connection): a rolled-back block leaves no task. Outside a
block it commits at once, on the store's own connection. Reads go through the
store, so a task enqueued in a block that has not committed yet is not found.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.tasks import Task, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from durablesched.clock import SystemClock
from durablesched.contrib.django.database import store_for
from durablesched.contrib.django.discovery import ProjectTasks
from durablesched.contrib.django.results import task_result
from durablesched.errors import ConfigurationError, InvalidTaskArgumentsError, TaskNotFoundError
from durablesched.records import CancelOutcome
from durablesched.retry import DEFAULT_RETRY, RetryPolicy
from durablesched.scheduler import Scheduler
from durablesched.store.durability import DURABILITIES

P = ParamSpec("P")
R = TypeVar("R")

#: What OPTIONS may hold, and what each is (docs/django.md).
OPTION_NAMES = ("database", "durability", "retry", "task_modules", "tasks", "timeout")
#: The keys of OPTIONS["retry"]: RetryPolicy's fields (delays in seconds; exception
#: classes, or their dotted paths, for retry_on and dont_retry_on).
RETRY_NAMES = (
    "max_attempts",
    "initial",
    "multiplier",
    "maximum",
    "jitter",
    "retry_on",
    "dont_retry_on",
)
#: A Django task runs once unless the settings ask for more: Django's own backends
#: never retry, and a task written for them need not be safe to run twice.
DJANGO_RETRY = replace(DEFAULT_RETRY, max_attempts=1)
#: What OPTIONS["tasks"][module path] may hold: the task's own retry and timeout.
TASK_OPTION_NAMES = ("retry", "timeout")


class DurableSchedBackend(BaseTaskBackend):
    """A Django Tasks backend storing tasks in durablesched's tables in a Django database.

    ``OPTIONS``: ``database`` (the Django database alias, default "default"),
    ``durability`` ("full" or "normal"), ``retry`` (``max_attempts``,
    ``initial``, ``multiplier``, ``maximum``, ``jitter``, ``retry_on``,
    ``dont_retry_on``: durablesched's :class:`RetryPolicy`, delays in seconds;
    default one attempt, as Django's own backends: more only when asked),
    ``task_modules`` (modules holding tasks besides each installed app's
    ``tasks``).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTION_NAMES))
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}; "
                f"known: {', '.join(OPTION_NAMES)}"
            )
        self.database: str = self.options.get("database", DEFAULT_DB_ALIAS)
        self.durability = self.options.get("durability", "full")
        if self.durability not in DURABILITIES:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']['durability'] must be one of "
                f"{', '.join(DURABILITIES)}, got {self.durability!r}"
            )
        where = f"TASKS[{alias!r}]['OPTIONS']"
        self.retry = _retry_policy(f"{where}['retry']", self.options.get("retry"), DJANGO_RETRY)
        self.timeout = _timeout(f"{where}['timeout']", self.options.get("timeout"))
        self.task_options = _task_options(where, self.options.get("tasks"), self)
        self.tasks = ProjectTasks(alias, self.options.get("task_modules", ()))
        self._scheduler: Scheduler | None = None

    def retry_for(self, path: str) -> RetryPolicy:
        """The retry policy of the task at module path ``path``: its own, else the backend's."""
        return self.task_options.get(path, (self.retry, self.timeout))[0]

    def timeout_for(self, path: str) -> float | None:
        """How long (seconds) one attempt of the task at ``path`` may run; None: no limit."""
        return self.task_options.get(path, (self.retry, self.timeout))[1]

    @property
    def scheduler(self) -> Scheduler:
        """A scheduler on this backend's store (opened on first use, not at start-up)."""
        store = store_for(self.database, self.durability)  # reopened if it was closed
        if self._scheduler is None or self._scheduler.store is not store:
            # The host's clock, as Django's timezone.now(): a deferred task is due at
            # the time the app computed (PostgreSQL's leases still follow the server).
            self._scheduler = Scheduler(store, clock=SystemClock())
        return self._scheduler

    def enqueue(
        self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[P, R]:
        self.validate_task(task)
        self.tasks.check(task)
        args, kwargs = _normalized(task, args, kwargs)
        scheduler = self.scheduler
        connection = connections[self.database]
        raw = None
        if connection.in_atomic_block:
            connection.ensure_connection()
            raw = connection.connection  # the driver's own, in the block's transaction
        submitted = scheduler.submit_info(
            task.module_path,
            dict(kwargs),
            positional=list(args),
            at=task.run_after,
            max_attempts=self.retry_for(task.module_path).max_attempts,
            queue=task.queue_name,
            priority=task.priority,
            connection=raw,
        )
        result: TaskResult[P, R] = TaskResult(
            task=task,
            id=str(submitted.task_id),
            status=TaskResultStatus.READY,
            enqueued_at=submitted.enqueued_at,  # the stored time, from the one write
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: Any) -> TaskResult[..., Any]:
        task_id = _task_id(result_id)
        scheduler = self.scheduler
        try:
            record = scheduler.get(task_id)
            history = scheduler.history(task_id)
        except TaskNotFoundError:
            raise TaskResultDoesNotExist(result_id) from None
        task = self.tasks.get(record.name)
        if task is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: its task {record.name!r} is not a task of this project"
            )
        return task_result(task, record, history, self.alias)

    def cancel(self, result_id: Any) -> CancelOutcome:
        """Cancel a task: see :meth:`durablesched.Scheduler.cancel` for what each outcome means."""
        task_id = _task_id(result_id)
        try:
            return self.scheduler.cancel(task_id)
        except TaskNotFoundError:
            raise TaskResultDoesNotExist(result_id) from None


def cancel(result_id: Any, *, backend: str = "default") -> CancelOutcome:
    """Cancel the task of ``result_id`` on the durablesched backend ``backend``."""
    chosen = task_backends[backend]
    if not isinstance(chosen, DurableSchedBackend):
        raise InvalidTaskBackend(f"task backend {backend!r} is not a DurableSchedBackend")
    return chosen.cancel(result_id)


def _normalized(
    task: Task[P, R], args: list[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as Django's ``TaskResult`` normalises them (tuples as lists, UTF-8
    ``bytes`` as text), or :class:`InvalidTaskArgumentsError` (a ``TypeError``, as
    Django's own backends raise) for what JSON cannot hold."""
    try:
        positional: list[Any] = [normalize_json(a) for a in args]
        keywords: dict[str, Any] = {k: normalize_json(v) for k, v in kwargs.items()}
    except (TypeError, ValueError) as e:
        raise InvalidTaskArgumentsError(
            f"the arguments of task {task.module_path!r} must be JSON-serialisable: {e}"
        ) from None
    return positional, keywords


def _task_id(result_id: Any) -> int:
    """A result id as a task id; TaskResultDoesNotExist for one that cannot be any."""
    text = str(result_id)
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise TaskResultDoesNotExist(result_id)
    value = int(text)
    if value > 2**63 - 1:
        raise TaskResultDoesNotExist(result_id)
    return value


def _retry_policy(where: str, options: Any, default: RetryPolicy) -> RetryPolicy:
    """A retry dict of the settings over ``default``: what it leaves out is the default's."""
    if options is None:
        return default
    if not isinstance(options, dict) or set(options) - set(RETRY_NAMES):
        raise InvalidTaskBackend(f"{where} must be a dict of {', '.join(RETRY_NAMES)}")
    values = dict(options)
    for name in ("initial", "maximum"):
        if name in values:
            values[name] = timedelta(seconds=values[name])
    for name in ("retry_on", "dont_retry_on"):
        if name in values:
            try:
                values[name] = _exception_classes(values[name])
            except ImportError as e:
                raise InvalidTaskBackend(f"{where}['{name}']: {e}") from None
    try:
        return replace(default, **values)
    except (ConfigurationError, TypeError) as e:
        raise InvalidTaskBackend(f"{where}: {e}") from None


def _exception_classes(value: Any) -> Any:
    """Exception classes as settings name them: classes, or dotted paths to import."""
    many = value if isinstance(value, list | tuple) else [value]
    return tuple(import_string(v) if isinstance(v, str) else v for v in many)


def _timeout(where: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise InvalidTaskBackend(f"{where} must be a number of seconds above 0, got {value!r}")
    return float(value)


def _task_options(
    where: str, options: Any, backend: DurableSchedBackend
) -> dict[str, tuple[RetryPolicy, float | None]]:
    """OPTIONS["tasks"]: each task's (module path) own retry policy and timeout; what a
    task does not set is the backend's."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidTaskBackend(f"{where}['tasks'] must map task module paths to options")
    found: dict[str, tuple[RetryPolicy, float | None]] = {}
    for path, own in options.items():
        here = f"{where}['tasks'][{path!r}]"
        if not isinstance(own, dict) or set(own) - set(TASK_OPTION_NAMES):
            raise InvalidTaskBackend(f"{here} must be a dict of {', '.join(TASK_OPTION_NAMES)}")
        found[str(path)] = (
            _retry_policy(f"{here}['retry']", own.get("retry"), backend.retry),
            _timeout(f"{here}['timeout']", own["timeout"]) if "timeout" in own else backend.timeout,
        )
    return found
