"""Task functions by name: the object a worker process imports as ``module:attr``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    NamedTuple,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from durablesched.clock import positive_duration
from durablesched.errors import (
    ConfigurationError,
    InvalidTaskError,
    ScheduleConflictError,
    UnknownTaskNameError,
)
from durablesched.queues import check_priority, check_queue
from durablesched.records import DEFAULT_QUEUE, ENVIRONMENT_CHOICES, Environment
from durablesched.retry import DEFAULT_RETRY, ExceptionTypes, RetryPolicy
from durablesched.schedules.declaration import Schedule, checked_schedule

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from durablesched.store.protocol import DBAPIConnection

T = TypeVar("T")
#: A task function's parameters and return type, as a :class:`Task` carries them.
P = ParamSpec("P")
R = TypeVar("R")
#: The same, as a typed submit takes them (after the context; awaited, for ``async def``).
Q = ParamSpec("Q")
S = TypeVar("S")


class ContextArg(Protocol):
    """What a task registered with ``pass_context=True`` takes first: a
    :class:`~durablesched.TaskContext`, as type checkers match it. A protocol, so
    that the typed submit calls can leave it out of the arguments they check
    without this module importing the context (which imports the scheduler)."""

    @property
    def task_id(self) -> int: ...

    @property
    def idempotency_key(self) -> str: ...

    def raise_if_cancelled(self) -> None: ...


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
    #: Makes a task's limit key of its arguments (called as the function is), unless a
    #: submit gives one: see docs/queues.md, "Limits per key".
    limit_key: Callable[..., str] | None = None
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
        retry_on: ExceptionTypes | None = None,
        dont_retry_on: ExceptionTypes | None = None,
        limit_key: Callable[..., str] | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register the decorated function under ``name`` (default: its qualified name),
        and stand a :class:`Task` in its place: call it and the function runs here;
        hand it to ``scheduler.enqueue`` and a worker runs it.

        With ``pass_context=True`` the function receives the :class:`TaskContext`
        as its first argument, before the task's own arguments.
        ``environment`` ("thread" or "process", default: the worker's) says
        where its attempts run, and ``timeout`` (seconds or a timedelta) how
        long one may run: see docs/execution.md. ``queue`` and ``priority`` (-100
        to 100, higher first) are where its tasks wait, unless a submit says.
        ``retry_on`` and ``dont_retry_on`` (an exception class or a tuple of them)
        replace those of ``retry`` (default: the registry's policy): which
        failures are retried at all (see :class:`RetryPolicy`). ``limit_key``, called
        with a task's arguments, makes its limit key (docs/queues.md, "Limits per key").
        """

        def decorate(fn: Callable[P, R]) -> Task[P, R]:
            definition = self.register(
                fn,
                name=name,
                retry=retry,
                pass_context=pass_context,
                environment=environment,
                timeout=timeout,
                queue=queue,
                priority=priority,
                retry_on=retry_on,
                dont_retry_on=dont_retry_on,
                limit_key=limit_key,
            )
            return Task(definition)

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
        retry_on: ExceptionTypes | None = None,
        dont_retry_on: ExceptionTypes | None = None,
        limit_key: Callable[..., str] | None = None,
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
        policy = retry or self.default_retry
        try:
            if retry_on is not None:
                policy = replace(policy, retry_on=retry_on)
            if dont_retry_on is not None:
                policy = replace(policy, dont_retry_on=dont_retry_on)
        except ConfigurationError as e:
            raise ConfigurationError(f"task {task_name!r}: {e}") from None
        definition = TaskDefinition(
            task_name,
            fn,
            policy,
            pass_context,
            environment,
            _timeout(task_name, timeout),
            _configured(check_queue, queue, f"task {task_name!r}: queue"),
            _configured(check_priority, priority, f"task {task_name!r}: priority"),
            limit_key,
        )
        if limit_key is not None and not callable(limit_key):
            raise ConfigurationError(
                f"task {task_name!r}: limit_key must be a function of the task's arguments, "
                f"got {limit_key!r}"
            )
        self._tasks[task_name] = definition
        self._names = frozenset(self._tasks)
        return definition

    def schedule(
        self, task: str | Task[..., Any], *, name: str | None = None, **settings: Any
    ) -> Schedule:
        """Declare a schedule of the registered task ``task``; workers sync it when they start.

        ``name`` (default: the task's name) identifies the schedule: several
        may run one task with different ``args``. The settings are
        :func:`durablesched.schedules.declaration.schedule`'s (``cron`` and
        ``timezone``, or ``every``; ``args``, ``misfire``, ``max_catch_up``,
        ``misfire_grace``, ``overlap``, ``queue``, ``priority``), see
        docs/schedules.md. Declaring a name again with the same settings is
        allowed; with others, :class:`ScheduleConflictError`.
        """
        if isinstance(task, Task):
            task = task.name
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
        """The definition registered under ``name``; :class:`UnknownTaskNameError` if none."""
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


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How one submission of a :class:`Task` is stored, apart from its arguments: what
    :meth:`Task.options` sets (None: the task's own setting, or the default). Checked
    as ``Scheduler.submit`` checks its keywords, when the task is enqueued."""

    at: datetime | None = None
    delay: timedelta | float | None = None
    key: str | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    limit_key: str | None = None
    #: Debouncing, as ``Scheduler.submit`` takes it: (key, delay), and the longest wait.
    debounce: tuple[str, timedelta | float] | None = None
    max_wait: timedelta | float | None = None
    #: The caller's open transaction to store the task in (SQL stores; docs/api.md).
    connection: Connection | DBAPIConnection | None = None


#: No options at all: what a task decorated and not yet given any carries.
NO_OPTIONS = TaskOptions()


class Task(Generic[P, R]):
    """A registered task function, typed: what ``@registry.task`` puts in its place.

    Calling it calls the function, here and now (tests and scripts keep working);
    ``scheduler.enqueue(task, *args, **kwargs)`` stores a task that a worker runs,
    its arguments checked by a type checker against the function's parameters and
    its result typed by the function's return type. ``task.options(...)`` gives the
    same task with the settings a submission has besides its arguments.
    """

    definition: TaskDefinition
    #: How it is enqueued: set by :meth:`options`, empty on the decorated task.
    submit_options: TaskOptions

    def __init__(self, definition: TaskDefinition, options: TaskOptions = NO_OPTIONS) -> None:
        self.definition = definition
        self.submit_options = options
        # Name, docstring and signature are the function's: help(), inspect and
        # documentation tools see the function.
        functools.update_wrapper(self, definition.fn)

    @property
    def name(self) -> str:
        """The name it is registered and stored under."""
        return self.definition.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        fn: Callable[P, R] = self.definition.fn
        return fn(*args, **kwargs)

    def options(
        self,
        *,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        connection: Connection | DBAPIConnection | None = None,
        limit_key: str | None = None,
        debounce: tuple[str, timedelta | float] | None = None,
        max_wait: timedelta | float | None = None,
    ) -> Task[P, R]:
        """This task, enqueued with these settings: due ``at`` (timezone-aware) or after
        ``delay``, with an idempotency ``key``, in ``queue`` at ``priority``, given
        ``max_attempts``, stored in the caller's transaction ``connection``; each as
        :meth:`Scheduler.submit` takes it. Settings given before stay unless given again.

        Kept apart from the task's arguments, so that no option can take a
        parameter's name: ``scheduler.enqueue(send.options(delay=60), to="ada")``.
        """
        old = self.submit_options
        when = (at, delay) if at is not None or delay is not None else (old.at, old.delay)
        options = TaskOptions(
            at=when[0],
            delay=when[1],  # the later of at= and delay= stands
            key=old.key if key is None else key,
            queue=old.queue if queue is None else queue,
            priority=old.priority if priority is None else priority,
            max_attempts=old.max_attempts if max_attempts is None else max_attempts,
            connection=old.connection if connection is None else connection,
            limit_key=old.limit_key if limit_key is None else limit_key,
            debounce=old.debounce if debounce is None else debounce,
            max_wait=old.max_wait if max_wait is None else max_wait,
        )
        return Task(self.definition, options)

    # The four forms of a typed submit: with or without a context first, ``async def``
    # or not. Scheduler.enqueue and TaskContext.enqueue are typed the same way.
    @overload
    def bind(
        self: Task[Concatenate[ContextArg, Q], Coroutine[Any, Any, S]],
        *args: Q.args,
        **kwargs: Q.kwargs,
    ) -> TaskCall[S]: ...
    @overload
    def bind(
        self: Task[Concatenate[ContextArg, Q], S], *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskCall[S]: ...
    @overload
    def bind(
        self: Task[Q, Coroutine[Any, Any, S]], *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskCall[S]: ...
    @overload
    def bind(self: Task[Q, S], *args: Q.args, **kwargs: Q.kwargs) -> TaskCall[S]: ...
    def bind(self, *args: Any, **kwargs: Any) -> TaskCall[Any]:
        """One call of this task, not run: what ``scheduler.enqueue_many`` takes a list of.

        Its arguments are the task's, as ``scheduler.enqueue`` takes them (a task
        with a context: without it), and checked the same way."""
        # The tuple made directly: the named tuple's own __new__ is a Python function
        # (a batch makes one call per task).
        call: TaskCall[Any] = _new_call(TaskCall, (self, args, kwargs))
        return call

    def __repr__(self) -> str:
        return f"<Task {self.name!r}: {self.definition.call_signature()}>"


class TaskCall(NamedTuple, Generic[R]):
    """A task with its arguments, not yet stored (``task.bind(...)``). A named tuple: a
    batch makes one per call."""

    task: Task[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


#: Makes a :class:`TaskCall` of its three fields without the named tuple's ``__new__``.
_new_call = tuple.__new__


def _configured(check: Callable[[object, str], T], value: object, what: str) -> T:
    """A definition's queue or priority, checked: a bad one is a ConfigurationError."""
    try:
        return check(value, what)
    except InvalidTaskError as e:
        raise ConfigurationError(str(e)) from None


def _timeout(name: str, value: timedelta | float | None) -> timedelta | None:
    return None if value is None else positive_duration(value, f"task {name!r}: timeout")
