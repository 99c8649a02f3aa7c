"""What a running task sees of itself: its identity, cancellation, children and effects.

The worker tells an attempt of a cancel request, its own shutdown or a lost
lease through its :class:`AttemptSignals`, which the attempt's
:class:`TaskContext` reads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, overload

from durablesched.clock import thread_timeout
from durablesched.errors import (
    InvalidTaskError,
    TaskCancelled,
    TaskTimeout,
    UnsupportedOperationError,
    WorkerStopping,
)
from durablesched.handles import TaskHandle
from durablesched.records import Claim, Environment, NewTask, SignalSend
from durablesched.registry import Task
from durablesched.schedules.declaration import parse_fire_key
from durablesched.store.protocol import Effect
from durablesched.submission import build_task, canonical_json
from durablesched.tracing import tracing_hook
from durablesched.workflows import children as _children
from durablesched.workflows.steps import (
    StepEffect,
    StepLog,
    arun_step,
    run_step,
    sleep_until,
    wait_for_signal,
)

if TYPE_CHECKING:
    from durablesched.retry import RetryPolicy

    from .scheduler import Scheduler


_EVENT_LOCK = threading.Lock()
#: A typed child's arguments and result (see :meth:`TaskContext.enqueue`).
Q = ParamSpec("Q")
S = TypeVar("S")
#: A step's result.
R = TypeVar("R")


class AttemptSignals:
    """What the worker tells one running attempt: a cancel request, shutdown, a lost lease.

    The worker owns it and is the only writer; the attempt's :class:`TaskContext`
    only reads it, so the worker never reaches into the context. Plain flags: a
    Condition per task costs more than the no-op tasks it serves; one is made
    only for a task that waits, and the hook list only for an async one.
    """

    # No __init__: every field starts as its class-level default and is set on
    # the instance only when it changes, so the one made per attempt (on the
    # worker's hot path) costs no Python call.
    #: Someone asked the attempt to stop.
    cancelled: bool = False
    #: A heartbeat found the claim gone: no outcome of the attempt will count.
    lease_lost: bool = False
    #: The worker is stopping: the attempt should finish (or checkpoint) within its grace.
    shutdown: bool = False
    #: Made by the first wait; notified whenever one of the flags above is set.
    _changed: threading.Condition | None = None
    _hooks: list[Callable[[], object]] | None = None

    def request_cancel(self) -> None:
        """Ask the attempt to stop: set the flag, wake a waiter, call the hooks."""
        with _EVENT_LOCK:
            self.cancelled = True
            if self._changed is not None:
                self._changed.notify_all()
            hooks = list(self._hooks or ())
        for hook in hooks:
            hook()

    def on_cancel(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` when cancellation is requested (at once if it already was)."""
        with _EVENT_LOCK:
            if self._hooks is None:
                self._hooks = []
            self._hooks.append(hook)
            already = self.cancelled
        if already:
            hook()

    def request_shutdown(self) -> None:
        """Tell the attempt its worker is stopping, and wake a waiter. Not a cancel:
        the hooks are not called (an async task is not cancelled by it)."""
        with _EVENT_LOCK:
            self.shutdown = True
            if self._changed is not None:
                self._changed.notify_all()

    def mark_lease_lost(self) -> None:
        with _EVENT_LOCK:
            self.lease_lost = True
            if self._changed is not None:
                self._changed.notify_all()

    def wait_for_cancel(self, timeout: float | None) -> bool:
        """Block up to ``timeout`` seconds for a cancel request; True if one came."""
        return self._wait_until(lambda: self.cancelled, timeout)

    def wait(self, timeout: float | None) -> bool:
        """Block up to ``timeout`` seconds for a cancel request, shutdown or a lost lease;
        True if one came."""
        return self._wait_until(lambda: self.cancelled or self.shutdown or self.lease_lost, timeout)

    def _wait_until(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait for ``predicate``, ``timeout`` seconds at most (None or ``math.inf``: no
        bound; a lock's wait refuses more than ``threading.TIMEOUT_MAX``)."""
        with _EVENT_LOCK:
            if self._changed is None:
                self._changed = threading.Condition(_EVENT_LOCK)
            return self._changed.wait_for(
                predicate, None if timeout is None else thread_timeout(timeout)
            )


class TaskContext:
    """Handed to a task registered with ``pass_context=True``.

    Children submitted here and effects registered with :meth:`on_success`
    take effect only together with this attempt's success: a failed or lost
    attempt leaves none of them behind.
    """

    def __init__(
        self, claim: Claim, scheduler: Scheduler, signals: AttemptSignals | None = None
    ) -> None:
        self.claim = claim
        self.scheduler = scheduler
        # Set by whoever runs the attempt (the worker); only read here.
        self._signals = signals if signals is not None else AttemptSignals()
        self.children: list[NewTask] = []
        self.effects: list[Effect] = []
        #: Signals to other tasks, sent with this attempt's success (:meth:`signal`).
        self.sent_signals: list[SignalSend] = []
        #: "thread" or "process": where this attempt runs (docs/execution.md).
        self.environment = Environment.THREAD
        #: ``time.monotonic()`` past which this attempt has overrun its timeout.
        self.deadline: float | None = None
        #: The task's recorded steps, read at its first step (docs/workflows.md).
        self._step_log: StepLog | None = None
        #: A durable wait suspended the workflow: this attempt's claim is given up.
        self.suspended = False

    @property
    def task_id(self) -> int:
        return self.claim.task_id

    @property
    def name(self) -> str:
        return self.claim.name

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self.claim.attempt

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt of this task: hand it to external systems.

        It makes an external effect effectively-once only if the destination
        deduplicates on it; see docs/durability.md.
        """
        return self.claim.idempotency_key

    def now(self) -> datetime:
        return self.scheduler.clock.now()

    # -- a task a schedule made (docs/schedules.md): read from its idempotency key --

    @property
    def schedule(self) -> str | None:
        """The name of the schedule that made this task, or None if none did."""
        fire = parse_fire_key(self.claim.idempotency_key)
        return None if fire is None else fire.schedule

    @property
    def fire_time(self) -> datetime | None:
        """The fire time this task was made for (UTC), or None if no schedule made it.

        With its schedule, it is what ``idempotency_key`` carries: unique per fire.
        """
        fire = parse_fire_key(self.claim.idempotency_key)
        return None if fire is None else fire.fire_at

    @property
    def catch_up(self) -> bool:
        """True if this fire was missed while no worker ran and made late by the
        schedule's misfire policy."""
        fire = parse_fire_key(self.claim.idempotency_key)
        return fire is not None and fire.catch_up

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked this task to stop (or its lease was lost)."""
        signals = self._signals
        return signals.cancelled or signals.lease_lost

    @property
    def shutdown_requested(self) -> bool:
        """True once the worker running this attempt is stopping (SIGTERM, ``shutdown()``).

        A long task should checkpoint and return (or raise) before the
        worker's grace period ends: after it, the claim is given back and
        nothing this attempt reports counts (docs/execution.md).
        """
        return self._signals.shutdown

    @property
    def timed_out(self) -> bool:
        """True once this attempt ran past its task's timeout: it will count as a failure."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat found the claim gone: no outcome of this attempt will count."""
        return self._signals.lease_lost

    def raise_if_cancelled(self) -> None:
        """Acknowledge a requested cancellation by raising :class:`TaskCancelled`,
        or an overrun timeout by raising :class:`TaskTimeout`."""
        if self.cancel_requested:
            raise TaskCancelled(f"task {self.task_id} stopped on request")
        if self.timed_out:
            raise TaskTimeout(f"task {self.task_id} ran past its timeout")

    def wait_for_cancel(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for a cancellation request; True if one came."""
        return self._signals.wait_for_cancel(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, returning early (True) once the task should stop:
        a cancel request, the worker's shutdown or a lost lease. False if the time ran out.

        Use it instead of ``time.sleep`` in a task that waits between steps, and stop
        when it says so: ``if ctx.wait(5): return`` (or raise). A loop that goes on
        races through its remaining steps, since every later wait returns at once;
        :meth:`sleep` raises instead. :attr:`cancel_requested` and
        :attr:`shutdown_requested` say which came.
        """
        return self._signals.wait(timeout)

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or raise as soon as the attempt should stop: the way to
        wait between the steps of a loop that must not run on after that.

        :class:`TaskCancelled` on a cancel request or a lost lease (the task ends
        CANCELLED; a lost lease's outcome counts for nothing anyway),
        :class:`TaskTimeout` once the task's timeout passes (woken at it: a
        failure, retried per its policy), :class:`~durablesched.WorkerStopping` once
        the worker is stopping (the claim is given back at once, the attempt not
        counted: the next worker runs the task again). Let them propagate. A task
        that has something to save first uses :meth:`wait` and returns or raises.
        """
        if isinstance(seconds, timedelta):
            raise InvalidTaskError(
                "ctx.sleep(seconds) waits within the attempt; a durable sleep that holds "
                "no slot is ctx.sleep_for(timedelta) or ctx.sleep_until(datetime) "
                "(docs/workflows.md)"
            )
        end = time.monotonic() + max(0.0, seconds)
        while True:
            self.raise_if_cancelled()
            if self._signals.shutdown:
                raise WorkerStopping(
                    f"task {self.task_id}: its worker is stopping; it is given back, "
                    "not counted as an attempt"
                )
            now = time.monotonic()
            if now >= end:
                return
            wake = end if self.deadline is None else min(end, self.deadline)
            self._signals.wait(max(0.0, wake - now))

    def submit(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        positional: Sequence[Any] | None = None,
    ) -> None:
        """Submit a child task that appears only if this attempt succeeds."""
        child = build_task(
            name,
            args,
            now=self.now(),
            at=at,
            delay=delay,
            max_attempts=max_attempts,
            key=key,
            registry=self.scheduler.registry,
            positional=positional,
        )
        tracer = tracing_hook.tracer
        if tracer is not None:
            child = tracer.carry(child)  # the child's attempts link to this one
        self.children.append(child)

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
        """The typed form of :meth:`submit`: a child task calling ``task``'s function with
        these arguments (checked as ``scheduler.enqueue`` checks them), stored only if
        this attempt succeeds, in the transaction that records the success.

        Its handle cannot be waited on here (:class:`WaitInTaskError`: the wait would
        hold this worker slot), and has its id only once stored.
        """
        self.children.append(_children.child_task(self, task, args, kwargs, "its parent's success"))
        return TaskHandle(self.scheduler, None, task.definition.name)

    def signal(self, task_id: int, name: str, payload: Any = None) -> None:
        """Send the task ``task_id`` a signal ``name`` with a JSON ``payload``, as
        ``scheduler.signal`` does, but only if this attempt succeeds: it is delivered in
        the transaction that records the success (a failed attempt, or one whose lease
        was lost, sends nothing; a replayed workflow sends it once, with its one success).

        Checked now: a non-empty name, a payload JSON can hold, another task's id. The
        target is checked when the success is recorded: an unknown or finished task
        refuses the signal, and the success with it, as an effect that raises does (the
        attempt fails with :class:`TaskNotFoundError` or :class:`InvalidTransitionError`
        and is retried by its policy). Works in every environment (docs/workflows.md).
        """
        if not isinstance(task_id, int) or isinstance(task_id, bool):
            raise InvalidTaskError(f"a signal's task id is an int, got {task_id!r}")
        if task_id == self.task_id:
            raise InvalidTaskError(
                f"task {task_id} cannot signal itself with its success: it is finished by then"
            )
        if not isinstance(name, str) or not name:
            raise InvalidTaskError(f"a signal's name must be a non-empty string, got {name!r}")
        value = canonical_json(payload, f"the payload of signal {name!r}")
        self.sent_signals.append(SignalSend(task_id, name, value))

    # -- workflows (docs/workflows.md) ---------------------------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        retry: RetryPolicy | None = None,
        effect: StepEffect | None = None,
    ) -> R:
        """Run ``fn(*args)`` as this workflow's next step, named ``name``, once: its JSON
        result is recorded under this attempt's claim, and every later attempt of the
        task gets the recorded result back here without calling ``fn``.

        A step identifies itself by ``name`` and its position (the order of the task's
        ``step`` calls); replay finding another name recorded at the position raises
        :class:`~durablesched.errors.WorkflowChanged`. ``fn`` raising is retried within
        the attempt by ``retry`` (default: the task's policy) before the error reaches
        the task. ``effect(connection, result)`` runs in the checkpoint's own
        transaction (SQL backends): exactly once, as a success's effects are. The
        result is returned as it reads back (a tuple as a list), on every attempt
        alike. :class:`~durablesched.errors.CheckpointRefused` if the claim was lost.
        """
        result: R = run_step(self, self._steps(), name, fn, args, retry=retry, effect=effect)
        return result

    @overload
    async def astep(
        self,
        name: str,
        fn: Callable[..., Coroutine[Any, Any, R]],
        /,
        *args: Any,
        retry: RetryPolicy | None = None,
        effect: StepEffect | None = None,
    ) -> R: ...
    @overload
    async def astep(
        self,
        name: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        retry: RetryPolicy | None = None,
        effect: StepEffect | None = None,
    ) -> R: ...
    async def astep(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retry: RetryPolicy | None = None,
        effect: StepEffect | None = None,
    ) -> Any:
        """:meth:`step` for an ``async def`` task: ``fn`` may be ``async def`` (awaited) or
        plain; the store is called on a thread, so the event loop never blocks on it."""
        log = self._step_log
        if log is None:
            log = await asyncio.to_thread(self._steps)
        return await arun_step(self, log, name, fn, args, retry=retry, effect=effect)

    def sleep_until(self, at: datetime) -> None:
        """A durable sleep: this workflow goes on at ``at`` (timezone-aware), holding no
        worker, thread or slot meanwhile. Recorded as a step named ``sleep`` (its wake
        time), so a replay keeps the time first set. If ``at`` is still to come, the
        attempt ends here, not counted, by raising
        :class:`~durablesched.errors.WorkflowSuspended` (let it propagate): the task is
        PENDING, due at ``at``, and the attempt claimed then replays past the sleep.
        """
        sleep_until(self, self._steps(), at)

    def sleep_for(self, delay: timedelta) -> None:
        """:meth:`sleep_until` ``now() + delay``, ``now()`` read the first time this step
        is reached (a replay keeps that wake time)."""
        if not isinstance(delay, timedelta):
            raise InvalidTaskError(f"sleep_for takes a timedelta, got {delay!r}")
        sleep_until(self, self._steps(), self.now() + delay)

    def wait_for_signal(self, name: str, timeout: timedelta | None = None) -> Any:
        """The payload of a signal ``name`` sent to this task (``scheduler.signal``, the
        CLI's ``durablesched signal``), or None once ``timeout`` passed without one.

        A signal sent before the wait is kept for it; each signal is taken by one wait,
        oldest first; a replay returns the same payload to the same wait. While none has
        come, the workflow suspends as :meth:`sleep_until` does (``WorkflowSuspended``:
        let it propagate), PENDING until the signal arrives (which makes it due at once)
        or the timeout passes. Recorded as two steps, ``wait:<name>`` (the deadline) and
        ``signal:<name>`` (what came).
        """
        return wait_for_signal(self, self._steps(), name, timeout)

    @overload
    def spawn(
        self,
        task: Task[Concatenate[TaskContext, Q], Coroutine[Any, Any, S]],
        /,
        *args: Q.args,
        **kwargs: Q.kwargs,
    ) -> TaskHandle[S]: ...
    @overload
    def spawn(
        self, task: Task[Concatenate[TaskContext, Q], S], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    @overload
    def spawn(
        self, task: Task[Q, Coroutine[Any, Any, S]], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> TaskHandle[S]: ...
    @overload
    def spawn(self, task: Task[Q, S], /, *args: Q.args, **kwargs: Q.kwargs) -> TaskHandle[S]: ...
    def spawn(self, task: Task[..., Any], /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Submit a child task now, durably, as this workflow's next step: stored (with
        its id, and linked to this task) in the transaction that records the step, so a
        replay returns the same child's handle and never submits it twice. Arguments
        and ``task.options(...)`` as :meth:`enqueue` takes them. Unlike :meth:`enqueue`
        the child exists whatever this attempt's outcome. Wait for it with
        :meth:`gather` or :meth:`wait_first` (docs/workflows.md).
        """
        return _children.spawn(self, self._steps(), task, args, kwargs)

    def gather(self, *handles: TaskHandle[Any], return_exceptions: bool = False) -> list[Any]:
        """The results of these children, in order, once every one is finished: until
        then the workflow suspends holding no slot (``WorkflowSuspended``: let it
        propagate), and each child's end wakes it. A failed child raises its
        :class:`~durablesched.TaskFailed` (a cancelled one :class:`TaskCancelled`)
        unless ``return_exceptions``, which puts the exception in its place. Recorded
        as a step: a replay returns the same results.
        """
        return _children.gather(self, self._steps(), handles, return_exceptions)

    def wait_first(self, *handles: TaskHandle[Any]) -> TaskHandle[Any]:
        """The first of these children to finish (suspending until one has); recorded as a
        step, so a replay returns the same one. Its result: ``ctx.gather(handle)``."""
        return _children.wait_first(self, self._steps(), handles)

    # -- the durable waits in async form: the store is called on a thread ---------------------

    async def asleep_until(self, at: datetime) -> None:
        """:meth:`sleep_until` for an ``async def`` task (the event loop never waits on
        the database)."""
        await asyncio.to_thread(self.sleep_until, at)

    async def asleep_for(self, delay: timedelta) -> None:
        """:meth:`sleep_for` for an ``async def`` task."""
        await asyncio.to_thread(self.sleep_for, delay)

    async def await_for_signal(self, name: str, timeout: timedelta | None = None) -> Any:
        """:meth:`wait_for_signal` for an ``async def`` task."""
        return await asyncio.to_thread(self.wait_for_signal, name, timeout)

    async def aspawn(self, task: Task[..., Any], /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """:meth:`spawn` for an ``async def`` task."""
        return await asyncio.to_thread(lambda: self.spawn(task, *args, **kwargs))

    async def agather(
        self, *handles: TaskHandle[Any], return_exceptions: bool = False
    ) -> list[Any]:
        """:meth:`gather` for an ``async def`` task."""
        return await asyncio.to_thread(
            lambda: self.gather(*handles, return_exceptions=return_exceptions)
        )

    async def await_first(self, *handles: TaskHandle[Any]) -> TaskHandle[Any]:
        """:meth:`wait_first` for an ``async def`` task."""
        return await asyncio.to_thread(self.wait_first, *handles)

    def _steps(self) -> StepLog:
        log = self._step_log
        if log is None:
            log = self._step_log = StepLog(self.scheduler.store.steps(self.task_id))
        return log

    def on_success(self, effect: Effect) -> None:
        """Run ``effect(connection)`` inside the transaction that records success.

        If the lease was lost, that transaction rolls back and the effect never
        happens. Keep effects short: they run while the database write lock is held.
        Not available in the process environment: the child process has no
        database connection (submit children, or use the idempotency key).
        """
        if self.environment == Environment.PROCESS:
            raise UnsupportedOperationError(
                f"task {self.name!r} runs in the process environment, where database "
                "effects cannot be committed with its success (docs/execution.md)"
            )
        self.effects.append(effect)
