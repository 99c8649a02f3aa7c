"""Task functions by name: the object a worker process imports as ``module:attr``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from durablesched.clock import positive_duration
from durablesched.errors import (
    ConfigurationError,
    InvalidTaskError,
    ScheduleConflictError,
    UnknownTaskNameError,
)
from durablesched.queues import check_priority, check_queue
from durablesched.records import DEFAULT_QUEUE, ENVIRONMENT_CHOICES, Environment
from durablesched.retry import DEFAULT_RETRY, RetryPolicy
from durablesched.schedules.declaration import Schedule, checked_schedule

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: What stands for the TaskContext when a submit binds a task's arguments.
_CONTEXT = object()


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A registered task: its function, how it is retried, where and how long it may run."""

    name: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    pass_context: bool
    #: "thread" or "process"; None means the worker's default.
    environment: str | None = None
    #: How long one attempt may run; None means no limit.
    timeout: timedelta | None = None
    #: The queue its tasks wait in, and their priority there, unless a submit says.
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    #: An ``async def`` function: it runs on the worker's event loop. Worked out
    #: once: ``inspect`` costs more per call than a no-op task.
    is_async: bool = field(init=False)
    #: The function's signature, or None where Python cannot tell it (some builtins).
    signature: inspect.Signature | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))
        try:
            signature: inspect.Signature | None = inspect.signature(self.fn)
        except (TypeError, ValueError):
            signature = None
        object.__setattr__(self, "signature", signature)

    def mismatch(self, arg_names: Iterable[str], positional: int = 0) -> str | None:
        """Why the worker's call with these keyword arguments (after ``positional`` ones)
        would fail, or None if it binds.

        The call is the worker's: the context first when ``pass_context``, then
        the positional arguments, then the keywords. Only the names and the number
        of positional ones matter, not the values.
        """
        if self.signature is None:
            return None
        names = dict.fromkeys(arg_names)
        values = [None] * positional
        try:
            if self.pass_context:
                self.signature.bind(_CONTEXT, *values, **names)
            else:
                self.signature.bind(*values, **names)
        except TypeError as e:
            return str(e)
        return None

    def call_signature(self) -> str:
        """The function as a person reads it: ``build_report(ctx, month, *, draft=False)``."""
        name = getattr(self.fn, "__name__", None) or type(self.fn).__name__
        if self.signature is None:
            return f"{name}(...)"
        bare = [
            p.replace(annotation=inspect.Parameter.empty)
            for p in self.signature.parameters.values()
        ]
        plain = self.signature.replace(parameters=bare, return_annotation=inspect.Signature.empty)
        return f"{name}{plain}"


class TaskRegistry:
    """Maps task names to functions. Rows naming anything else never run.

    A worker only ever calls functions registered here: a task name read from
    the database is looked up in this dict, never imported.
    """

    def __init__(self, *, default_retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.default_retry = default_retry
        self._tasks: dict[str, TaskDefinition] = {}
        self._names: frozenset[str] = frozenset()
        self._schedules: dict[str, Schedule] = {}

    def task(
        self,
        name: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        pass_context: bool = False,
        environment: str | None = None,
        timeout: timedelta | float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
    ) -> Callable[[F], F]:
        """Register the decorated function under ``name`` (default: its qualified name).

        With ``pass_context=True`` the function receives the :class:`TaskContext`
        as its first argument, before the task's keyword arguments.
        ``environment`` ("thread" or "process", default: the worker's) says
        where its attempts run, and ``timeout`` (seconds or a timedelta) how
        long one may run: see docs/execution.md. ``queue`` and ``priority`` (-100
        to 100, higher first) are where its tasks wait, unless a submit says.
        """

        def decorate(fn: F) -> F:
            self.register(
                fn,
                name=name,
                retry=retry,
                pass_context=pass_context,
                environment=environment,
                timeout=timeout,
                queue=queue,
                priority=priority,
            )
            return fn

        return decorate

    def register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        pass_context: bool = False,
        environment: str | None = None,
        timeout: timedelta | float | None = None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
    ) -> TaskDefinition:
        task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
        if not task_name or not task_name.strip():
            raise ConfigurationError("a task name must not be empty")
        if task_name in self._tasks:
            raise ConfigurationError(f"a task named {task_name!r} is already registered")
        if environment is not None and environment not in set(Environment):
            raise ConfigurationError(
                f"task {task_name!r}: environment must be {ENVIRONMENT_CHOICES}, "
                f"got {environment!r}"
            )
        definition = TaskDefinition(
            task_name,
            fn,
            retry or self.default_retry,
            pass_context,
            environment,
            _timeout(task_name, timeout),
            _configured(check_queue, queue, f"task {task_name!r}: queue"),
            _configured(check_priority, priority, f"task {task_name!r}: priority"),
        )
        self._tasks[task_name] = definition
        self._names = frozenset(self._tasks)
        return definition

    def schedule(self, task: str, *, name: str | None = None, **settings: Any) -> Schedule:
        """Declare a schedule of the registered task ``task``; workers sync it when they start.

        ``name`` (default: the task's name) identifies the schedule: several
        may run one task with different ``args``. The settings are
        :func:`durablesched.schedules.declaration.schedule`'s (``cron`` and
        ``timezone``, or ``every``; ``args``, ``misfire``, ``max_catch_up``,
        ``misfire_grace``, ``overlap``, ``queue``, ``priority``), see
        docs/schedules.md. Declaring a name again with the same settings is
        allowed; with others, :class:`ScheduleConflictError`.
        """
        declared = checked_schedule(self, task, name=name, **settings)
        existing = self._schedules.get(declared.name)
        if existing is not None and existing != declared:
            raise ScheduleConflictError(
                f"a schedule named {declared.name!r} is already declared with other settings"
            )
        self._schedules[declared.name] = declared
        return declared

    @property
    def schedules(self) -> list[Schedule]:
        """The schedules declared here, by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]

    def get(self, name: str) -> TaskDefinition:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskNameError(f"no task is registered under the name {name!r}") from None

    def find(self, name: str) -> TaskDefinition | None:
        """The definition registered under ``name``, or None: :meth:`get` without the
        exception, for a worker that looks up every task it claims."""
        return self._tasks.get(name)

    @property
    def names(self) -> frozenset[str]:
        """Every registered name: what a worker of this registry may claim."""
        return self._names

    def retry_policy(self, name: str) -> RetryPolicy:
        """The policy for ``name``, or the default for names this registry lacks."""
        definition = self._tasks.get(name)
        return definition.retry if definition else self.default_retry

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)


def _configured(check: Callable[[object, str], T], value: object, what: str) -> T:
    """A definition's queue or priority, checked: a bad one is a ConfigurationError."""
    try:
        return check(value, what)
    except InvalidTaskError as e:
        raise ConfigurationError(str(e)) from None


def _timeout(name: str, value: timedelta | float | None) -> timedelta | None:
    return None if value is None else positive_duration(value, f"task {name!r}: timeout")
