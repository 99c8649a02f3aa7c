"""The public face of a queue: submit, inspect and cancel tasks in a store."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from durablesched.attempts import AttemptInfo, attempts_from_history
from durablesched.clock import Clock, SystemClock
from durablesched.errors import (
    ConfigurationError,
    DurableSchedError,
    InvalidTaskError,
    TaskNotFoundError,
)
from durablesched.handles import TaskHandle
from durablesched.handles import agather as agather_handles
from durablesched.handles import gather as gather_handles
from durablesched.queues import KEEP, Keep, QueueLimits, Rate, check_queue
from durablesched.records import (
    CancelOutcome,
    NewTask,
    Submitted,
    TaskEvent,
    TaskRecord,
    WorkerInfo,
)
from durablesched.registry import Task, TaskCall, TaskRegistry
from durablesched.schedules.declaration import ScheduleInfo, checked_schedule
from durablesched.states import TaskState
from durablesched.store.protocol import DBAPIConnection, Store
from durablesched.submission import (
    MAX_INT64,
    Debounce,
    FurtherCalls,
    build_many,
    build_task,
    canonical_json,
)
from durablesched.tracing import tracing_hook
from durablesched.waiting import Waiters

if TYPE_CHECKING:
    from sqlalchemy import Connection

    # The overloads' context parameter only: a type checker matches the class itself
    # there (the registry's ContextArg protocol does not match an argument's type).
    from durablesched.context import TaskContext

#: A typed task's arguments and result (see :meth:`Scheduler.enqueue`).
Q = ParamSpec("Q")
S = TypeVar("S")
T = TypeVar("T")


class Scheduler:
    """Submit, read and cancel tasks in ``store``, with time from ``clock``.

    ``registry`` is optional for a process that only submits; when given,
    submitting a name it lacks is an error. Safe to share between threads,
    including threads running tasks.
    """

    def __init__(
        self,
        store: Store,
        *,
        registry: TaskRegistry | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock: Clock = clock if clock is not None else default_clock(store)
        self._listeners: list[Callable[[str, int], None]] = []
        self._listeners_lock = threading.Lock()
        self._waiters: Waiters | None = None
        self._waiters_lock = threading.Lock()

    # -- typed tasks (docs/api.md): a Task in, a TaskHandle out ---------------------------------

    # The four forms: with or without a context first, ``async def`` or not (the
    # registry's Task.bind is typed the same way).
    @overload
    def enqueue(
        self,
        task: Task[Concatenate[TaskContext, Q], Coroutine[Any, Any, S]],
        /,
        *args: Q.args,
        **kwargs: Q.kwargs,
    ) -> TaskHandle[S]: ...
    @overload
    def enqueue(
        self, task: Task[Concatenate[TaskContext, Q], S], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    @overload
    def enqueue(
        self, task: Task[Q, Coroutine[Any, Any, S]], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    @overload
    def enqueue(self, task: Task[Q, S], /, *args: Q.args, **kwargs: Q.kwargs) -> TaskHandle[S]: ...
    def enqueue(self, task: Task[..., Any], /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Store a task that calls ``task``'s function with these arguments; its handle.

        The arguments are the function's (without the context, for a task with
        one), checked by type checkers at this call and against the signature
        before anything is written, and stored as JSON. Options that are not
        arguments come from ``task.options(...)`` (delay, key, queue, ...); with a
        ``key`` held by a live or succeeded task, the handle is that task's.
        """
        options = task.submit_options
        name = task.definition.name

        def build() -> list[NewTask]:
            return [
                build_task(
                    name,
                    kwargs,
                    now=self.clock.now(),
                    at=options.at,
                    delay=options.delay,
                    max_attempts=options.max_attempts,
                    key=options.key,
                    registry=self.registry,
                    queue=options.queue,
                    priority=options.priority,
                    positional=args or None,
                    definition=task.definition,
                    limit_key=options.limit_key,
                    debounce=options.debounce,
                    max_wait=options.max_wait,
                )
            ]

        tracer = tracing_hook.tracer
        connection = options.connection
        if tracer is None:
            submitted = self._store_all(build(), connection)[0]
        else:
            submitted = tracer.submit(
                name, build, lambda tasks: self._store_all(tasks, connection), batch=False
            )[0]
        return TaskHandle(self, submitted.task_id, name)

    def enqueue_many(self, calls: Iterable[TaskCall[T]]) -> list[TaskHandle[T]]:
        """Store many calls (``task.bind(...)``, of one task or several) in one
        transaction, all or none; their handles in the same order.

        Every call is checked before anything is written. Calls given a
        ``connection`` (``task.options(connection=...)``) must all give the same one.
        """
        items = list(calls)
        if not items:
            return []
        connection = items[0].task.submit_options.connection
        built: list[NewTask] = []

        def build() -> list[NewTask]:
            now = self.clock.now()
            registry = self.registry
            new: list[NewTask] = []
            # A task's options are checked with its first call; its further calls
            # only their arguments, as submit_many checks its batch.
            further: dict[int, FurtherCalls] = {}
            append = new.append
            last: Task[..., Any] | None = None  # the task of the call before, and its
            calls: FurtherCalls | None = None  # further calls: a batch is mostly runs
            for call in items:
                if type(call) is not TaskCall and not isinstance(call, TaskCall):
                    raise InvalidTaskError(
                        f"enqueue_many takes calls made by task.bind(...), got {call!r}"
                    )
                task, args, kwargs = call
                positional = args or None
                if task is not last:
                    calls = further.get(id(task))
                    last = task if calls is not None else None
                if calls is not None:
                    append(calls.build(kwargs, positional))
                    continue
                definition, options = task.definition, task.submit_options
                if options.connection is not connection:
                    raise InvalidTaskError(
                        "the calls of one enqueue_many must share one connection="
                    )
                first = build_task(
                    definition.name,
                    kwargs,
                    now=now,
                    at=options.at,
                    delay=options.delay,
                    max_attempts=options.max_attempts,
                    key=options.key,
                    registry=registry,
                    queue=options.queue,
                    priority=options.priority,
                    positional=positional,
                    definition=definition,
                    limit_key=options.limit_key,
                    debounce=options.debounce,
                    max_wait=options.max_wait,
                )
                further[id(task)] = FurtherCalls(first, definition, len(args), options.limit_key)
                append(first)
            built[:] = new
            return new

        def store(tasks: list[NewTask]) -> list[Submitted]:
            return self._store_all(tasks, connection)

        tracer = tracing_hook.tracer
        if tracer is None:
            submitted = store(build())
        else:
            names = {c.task.definition.name for c in items}
            label = next(iter(names)) if len(names) == 1 else "several tasks"
            submitted = tracer.submit(label, build, store, batch=True)
        return [TaskHandle(self, s.task_id, t.name) for s, t in zip(submitted, built, strict=True)]

    @overload
    def handle(self, task_id: int, task: Task[..., Coroutine[Any, Any, S]]) -> TaskHandle[S]: ...
    @overload
    def handle(self, task_id: int, task: Task[..., S]) -> TaskHandle[S]: ...
    @overload
    def handle(self, task_id: int, task: None = None) -> TaskHandle[Any]: ...
    def handle(self, task_id: int, task: Task[..., Any] | None = None) -> TaskHandle[Any]:
        """A handle on the task stored under ``task_id`` (say, one a request carried),
        typed by ``task``'s result when given. Nothing is read until the handle is asked."""
        _check_id(task_id)
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise InvalidTaskError(f"a task id is an integer, got {task_id!r}")
        return TaskHandle(self, task_id, None if task is None else task.definition.name)

    @overload
    def gather(
        self,
        *handles: TaskHandle[S],
        timeout: float | None = None,
        return_exceptions: Literal[False] = False,
    ) -> list[S]: ...
    @overload
    def gather(
        self, *handles: TaskHandle[S], timeout: float | None = None, return_exceptions: bool
    ) -> list[S | DurableSchedError]: ...
    def gather(
        self,
        *handles: TaskHandle[Any],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Block until every one of these handles' tasks is finished and return their
        results, in order (``handle.result()`` for many, in one read and one wait).

        The first task in order that did not succeed raises what its ``result()``
        would (:class:`TaskFailed`, :class:`TaskCancelled`, :class:`TaskNotFoundError`),
        once all are finished; with ``return_exceptions`` that exception stands in its
        place. ``TimeoutError`` if ``timeout`` seconds pass first (naming how many are
        not finished), ``RuntimeError`` if the scheduler is closed meanwhile. The
        handles must be of a scheduler on this one's store. Refused inside a running
        task (:class:`WaitInTaskError`; a workflow has ``ctx.gather``).
        """
        return gather_handles(self, handles, timeout, return_exceptions)

    @overload
    def agather(
        self,
        *handles: TaskHandle[S],
        timeout: float | None = None,
        return_exceptions: Literal[False] = False,
    ) -> asyncio.Future[list[S]]: ...
    @overload
    def agather(
        self, *handles: TaskHandle[S], timeout: float | None = None, return_exceptions: bool
    ) -> asyncio.Future[list[S | DurableSchedError]]: ...
    def agather(
        self,
        *handles: TaskHandle[Any],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> asyncio.Future[list[Any]]:
        """:meth:`gather` for asyncio code: a future of the running loop, resolved as
        :meth:`gather` returns or raises, in one call on the loop however many tasks
        (``asyncio.gather`` of their ``aresult()`` makes a future and a callback per
        handle). A plain method, as ``aresult``; cancelling the future stops the wait.
        """
        return agather_handles(self, handles, timeout, return_exceptions)

    @property
    def waiters(self) -> Waiters:
        """The tasks this scheduler's handles wait on: one thread and one watcher for all
        (new ones after a failure of that thread, which ended the waits it served)."""
        waiters = self._waiters
        if waiters is None or waiters.failure is not None:
            with self._waiters_lock:
                if self._waiters is None or self._waiters.failure is not None:
                    self._waiters = Waiters(self.store)
                waiters = self._waiters
        return waiters

    def close(self) -> None:
        """Stop the thread and watcher that serve waiting handles (the store stays open;
        a handle waited on later starts them again)."""
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, None
        if waiters is not None:
            waiters.close()

    # -- asyncio: the same calls, run off the event loop ---------------------------------------

    @overload
    async def aenqueue(
        self,
        task: Task[Concatenate[TaskContext, Q], Coroutine[Any, Any, S]],
        /,
        *args: Q.args,
        **kwargs: Q.kwargs,
    ) -> TaskHandle[S]: ...
    @overload
    async def aenqueue(
        self, task: Task[Concatenate[TaskContext, Q], S], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    @overload
    async def aenqueue(
        self, task: Task[Q, Coroutine[Any, Any, S]], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    @overload
    async def aenqueue(
        self, task: Task[Q, S], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    async def aenqueue(self, task: Task[..., Any], /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """:meth:`enqueue` for asyncio code: the write runs on the event loop's executor,
        not on the loop."""
        return await _off_loop(self.enqueue, task, *args, **kwargs)

    async def aenqueue_many(self, calls: Iterable[TaskCall[T]]) -> list[TaskHandle[T]]:
        """:meth:`enqueue_many`, off the event loop."""
        return await _off_loop(self.enqueue_many, list(calls))

    async def asubmit(
        self, name: str, args: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        """:meth:`submit` (the untyped form, same options), off the event loop."""
        return await _off_loop(self.submit, name, args, **options)

    async def asubmit_many(
        self, name: str, args_list: Iterable[Mapping[str, Any] | None], **options: Any
    ) -> list[int]:
        """:meth:`submit_many`, off the event loop."""
        return await _off_loop(self.submit_many, name, list(args_list), **options)

    async def aget(self, task_id: int) -> TaskRecord:
        """:meth:`get`, off the event loop."""
        return await _off_loop(self.get, task_id)

    async def ahistory(self, task_id: int) -> list[TaskEvent]:
        """:meth:`history`, off the event loop."""
        return await _off_loop(self.history, task_id)

    async def aattempts(self, task_id: int) -> list[AttemptInfo]:
        """:meth:`attempts`, off the event loop."""
        return await _off_loop(self.attempts, task_id)

    async def alist_tasks(
        self, *, state: TaskState | None = None, name: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """:meth:`list_tasks`, off the event loop."""
        return await _off_loop(self.list_tasks, state=state, name=name, limit=limit)

    async def acancel(self, task_id: int) -> CancelOutcome:
        """:meth:`cancel`, off the event loop."""
        return await _off_loop(self.cancel, task_id)

    # -- names and dicts: the untyped form ------------------------------------------------------

    def submit(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        connection: Connection | DBAPIConnection | None = None,
        queue: str | None = None,
        priority: int | None = None,
        positional: Sequence[Any] | None = None,
        limit_key: str | None = None,
        debounce: Debounce | None = None,
        max_wait: timedelta | float | None = None,
    ) -> int:
        """Store a task and return its id.

        ``args`` are its keyword arguments (a mapping), ``positional`` its
        positional ones (a list or tuple): the worker calls ``fn(*positional,
        **args)``. Both are stored as JSON, never pickled.

        Due at ``at`` (timezone-aware), after ``delay`` (a timedelta or
        seconds), or now. With ``key``, a task already holding that key (one
        not FAILED or CANCELLED) is returned instead of a new one. With
        ``connection`` (SQL stores), the task is stored in the caller's open
        transaction and exists if and only if that transaction commits: an
        SQLAlchemy ``Connection`` on the store's database, or the driver's own
        (``sqlite3.Connection``, ``psycopg.Connection``), such as Django's.
        With ``limit_key``, the queue's limits per key count it under that key
        (docs/queues.md, "Limits per key"). With ``debounce=(key, delay)``, while a
        task with that debounce key is PENDING and has not started, this submit gives
        it these arguments and makes it due ``delay`` from now (never later than
        ``max_wait`` after the submit that made it) instead of storing another; its id
        is returned (docs/api.md, "Debouncing").
        """
        return self.submit_info(
            name,
            args,
            at=at,
            delay=delay,
            max_attempts=max_attempts,
            key=key,
            connection=connection,
            queue=queue,
            priority=priority,
            positional=positional,
            limit_key=limit_key,
            debounce=debounce,
            max_wait=max_wait,
        ).task_id

    def submit_info(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        connection: Connection | DBAPIConnection | None = None,
        queue: str | None = None,
        priority: int | None = None,
        positional: Sequence[Any] | None = None,
        limit_key: str | None = None,
        debounce: Debounce | None = None,
        max_wait: timedelta | float | None = None,
    ) -> Submitted:
        """:meth:`submit`, saying more, in the same one write: ``Submitted(task_id,
        created, enqueued_at)``, where ``enqueued_at`` is the task's stored
        ``created_at`` (with ``key``, that of the task holding it when ``created``
        is False), so that a caller need not read the task back to know it.
        """

        def build() -> list[NewTask]:
            return [
                build_task(
                    name,
                    args,
                    now=self.clock.now(),
                    at=at,
                    delay=delay,
                    max_attempts=max_attempts,
                    key=key,
                    registry=self.registry,
                    queue=queue,
                    priority=priority,
                    positional=positional,
                    limit_key=limit_key,
                    debounce=debounce,
                    max_wait=max_wait,
                )
            ]

        tracer = tracing_hook.tracer
        if tracer is None:
            return self._store_all(build(), connection)[0]
        return tracer.submit(
            name, build, lambda tasks: self._store_all(tasks, connection), batch=False
        )[0]

    def submit_many(
        self,
        name: str,
        args_list: Iterable[Mapping[str, Any] | None],
        *,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
        limit_key: str | None = None,
    ) -> list[int]:
        """Store many tasks of one name in one transaction; ids in the same order."""

        def build() -> list[NewTask]:
            return build_many(
                name,
                args_list,
                now=self.clock.now(),
                at=at,
                delay=delay,
                max_attempts=max_attempts,
                registry=self.registry,
                queue=queue,
                priority=priority,
                limit_key=limit_key,
            )

        tracer = tracing_hook.tracer
        if tracer is None:
            return self._store(build())
        return [item.task_id for item in tracer.submit(name, build, self._store_all, batch=True)]

    # -- workers ------------------------------------------------------------------------------

    def workers(self, *, include_gone: bool = False) -> list[WorkerInfo]:
        """The worker processes running on this store: alive ones (seen within their
        lease), by start time; with ``include_gone``, also those not seen for longer
        (killed, frozen or cut off), until they are forgotten a day later.

        ``WorkerInfo.state(now)`` says which a worker is at a given time.
        """
        now = self.clock.now()
        return [w for w in self.store.list_workers(now) if include_gone or w.alive(now)]

    # -- queues -------------------------------------------------------------------------------

    def queues(self) -> list[QueueLimits]:
        """Every queue known to the store, with its limits, by name."""
        return self.store.queue_limits()

    def set_queue(
        self,
        name: str,
        *,
        concurrency: int | Keep | None = KEEP,
        rate: Rate | str | Keep | None = KEEP,
        paused: bool | Keep = KEEP,
        concurrency_per_key: int | Keep | None = KEEP,
        rate_per_key: Rate | str | Keep | None = KEEP,
    ) -> QueueLimits:
        """Change a queue's limits (None removes one; what is not given stays); the queue is
        made if new. Every worker obeys the change from its next claim. Returns the limits.

        ``concurrency_per_key``: at most that many tasks of one ``limit_key`` running at once;
        ``rate_per_key`` (as ``rate``): at most so many of one key started in any window
        (docs/queues.md, "Limits per key")."""
        check_queue(name)
        current = {q.name: q for q in self.store.queue_limits()}.get(name, QueueLimits(name))
        if isinstance(rate, str):
            rate = Rate.parse(rate)
        if isinstance(rate_per_key, str):
            rate_per_key = Rate.parse(rate_per_key)
        if not isinstance(paused, Keep | bool):
            raise InvalidTaskError(f"paused must be True or False, got {paused!r}")
        limits = QueueLimits(
            name,
            current.concurrency if isinstance(concurrency, Keep) else concurrency,
            current.rate if isinstance(rate, Keep) else rate,
            current.paused if isinstance(paused, Keep) else paused,
            current.concurrency_per_key
            if isinstance(concurrency_per_key, Keep)
            else concurrency_per_key,
            current.rate_per_key if isinstance(rate_per_key, Keep) else rate_per_key,
        )
        self.store.put_queue(limits, self.clock.now())
        return limits

    def pause_queue(self, name: str) -> QueueLimits:
        """Start nothing new from this queue, on any worker; running tasks finish."""
        return self.set_queue(name, paused=True)

    def resume_queue(self, name: str) -> QueueLimits:
        return self.set_queue(name, paused=False)

    def get(self, task_id: int) -> TaskRecord:
        """The task as stored now; :class:`TaskNotFoundError` if there is none."""
        _check_id(task_id)
        task = self.store.get(task_id)
        if task is None:
            raise TaskNotFoundError(f"no task with id {task_id}")
        return task

    def history(self, task_id: int) -> list[TaskEvent]:
        """Every state the task went through, oldest first."""
        _check_id(task_id)
        events = self.store.history(task_id)
        if not events:
            raise TaskNotFoundError(f"no task with id {task_id}")
        return events

    def attempts(self, task_id: int) -> list[AttemptInfo]:
        """Every attempt of the task, oldest first: its number, worker, start, end,
        outcome and (for a failure) error, read from its history in one read.

        A claim given back by a stopping worker is listed (RELEASED) though it did
        not count; :class:`TaskNotFoundError` for an unknown id.
        """
        return attempts_from_history(self.history(task_id))

    def list_tasks(
        self, *, state: TaskState | None = None, name: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """Tasks in (due_at, seq) order, optionally of one state or name."""
        if isinstance(limit, int) and limit > MAX_INT64:
            raise ConfigurationError(f"limit must be at most {MAX_INT64}, got {limit}")
        if isinstance(name, str) and not name.isascii():
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigurationError(
                    f"name must be valid Unicode (no task has a lone surrogate in its name), "
                    f"got {name!r}"
                ) from None
        return self.store.list_tasks(state=state, name=name, limit=limit)

    def cancel(self, task_id: int, *, children: bool = True) -> CancelOutcome:
        """Cancel a task, and say honestly what that achieved.

        CANCELLED: it had not started and never will. REQUESTED: it is running
        and has been asked to stop; cancellation is cooperative, so it may still
        succeed. TOO_LATE: it had already finished.

        A workflow's unfinished spawned children (``ctx.spawn``), and theirs, are
        cancelled with it unless ``children=False`` (docs/workflows.md).
        """
        _check_id(task_id)
        outcome = self.store.request_cancel(task_id, self.clock.now())
        if outcome is CancelOutcome.REQUESTED:
            self._notify("cancel", task_id)
        if children and outcome is not CancelOutcome.TOO_LATE:
            spawned = self.store.children(task_id)
            finished = self.store.finished(spawned) if spawned else {}
            for child in spawned:
                if child not in finished:
                    self.cancel(child, children=True)
        return outcome

    def signal(self, task_id: int, name: str, payload: Any = None) -> int:
        """Send the workflow ``task_id`` a signal ``name`` with a JSON ``payload``; returns
        the signal's id. Kept until a ``ctx.wait_for_signal(name)`` of the task takes it
        (each signal by one wait); a workflow suspended waiting for it is due at once
        (docs/workflows.md). :class:`TaskNotFoundError` for an unknown id,
        :class:`InvalidTransitionError` for a finished task, :class:`InvalidTaskError`
        for a payload JSON cannot hold or an empty name.
        """
        _check_id(task_id)
        if not isinstance(name, str) or not name:
            raise InvalidTaskError(f"a signal's name must be a non-empty string, got {name!r}")
        value = canonical_json(payload, f"the payload of signal {name!r}")
        signal_id = self.store.send_signal(task_id, name, value, self.clock.now())
        self._notify("submit", task_id)  # a worker here may claim it now
        return signal_id

    # -- schedules managed at run time (docs/schedules.md) -------------------------------------

    def add_schedule(self, task: str, *, name: str | None = None, **settings: Any) -> bool:
        """Store a schedule, as ``durablesched schedule add`` does; True if added, False if
        the same one was there. The settings are ``registry.schedule``'s; with a registry,
        the task must be in it. :class:`ScheduleConflictError` if one of that name exists
        with other settings; any other bad setting is an :class:`InvalidScheduleError`.
        """
        declared = checked_schedule(self.registry, task, name=name, **settings)
        added = self.store.add_schedule(declared, self.clock.now())
        self._notify("schedule", 0)
        return added

    def pause_schedule(self, name: str) -> ScheduleInfo:
        """Fire nothing from this schedule until resumed."""
        return self.store.pause_schedule(name, True, self.clock.now())

    def resume_schedule(self, name: str) -> ScheduleInfo:
        """Fire again, from the first fire time after now (a pause is not caught up)."""
        info = self.store.pause_schedule(name, False, self.clock.now())
        self._notify("schedule", 0)
        return info

    def remove_schedule(self, name: str) -> None:
        """Delete the schedule and its record of fires; the tasks it made stay.

        A schedule declared in code comes back when a worker of that code starts.
        """
        self.store.remove_schedule(name)

    def run_schedule_now(self, name: str) -> int:
        """Make the schedule's task now, leaving its next fire time as it was; its id."""
        fired = self.store.fire_schedule_now(name, self.clock.now())
        assert fired.task_id is not None
        self._notify("submit", fired.task_id)
        return fired.task_id

    def schedules(self) -> list[ScheduleInfo]:
        """Every stored schedule, by name, with its next and last fire."""
        return self.store.list_schedules()

    def subscribe(self, listener: Callable[[str, int], None]) -> Callable[[], None]:
        """Call ``listener(event, task_id)`` on 'submit', 'cancel' and 'schedule' in this
        process.

        Workers use it to wake up at once; returns a function that unsubscribes.
        """
        with self._listeners_lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._listeners_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _store(self, tasks: list[NewTask]) -> list[int]:
        return [item.task_id for item in self._store_all(tasks)]

    def _store_all(
        self, tasks: list[NewTask], connection: Connection | DBAPIConnection | None = None
    ) -> list[Submitted]:
        if not tasks:
            return []
        submitted = self.store.submit(tasks, self.clock.now(), connection=connection)
        created = [item.task_id for item in submitted if item.created]
        if created:
            # One wake-up per batch: a woken worker claims everything due anyway.
            self._notify("submit", created[0])
        return submitted

    def _notify(self, event: str, task_id: int) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(event, task_id)


async def _off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the running loop's default executor (a thread), with
    the caller's context variables (its trace among them)."""
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


def _check_id(task_id: int) -> None:
    """An id no 64-bit column can hold names no task (the SQL drivers would overflow)."""
    if isinstance(task_id, int) and not -MAX_INT64 - 1 <= task_id <= MAX_INT64:
        raise TaskNotFoundError(f"no task with id {task_id}: ids are 64-bit integers")


def default_clock(store: Store) -> Clock:
    """The store's own lease clock if it has one (PostgreSQL: the server's), else this host's."""
    make = getattr(store, "server_clock", None)
    if callable(make):
        clock: Clock = make()
        return clock
    return SystemClock()
