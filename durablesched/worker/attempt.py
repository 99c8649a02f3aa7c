"""One attempt of a task: its context, its call where the task says, its end as an Outcome.

Runs on the task thread that took the attempt, holding no lock of the
worker's while user code runs. A plain function is called on that thread; an
``async def`` one runs on the worker's event loop, in the one thread this
module owns (``durablesched-asyncio``, started on first use), while the task
thread waits for it; an attempt in the process environment runs in a child
forked by :mod:`durablesched.worker.environments`, which the task thread
watches. Timeouts and cancellation end up here as an :class:`Outcome` (or as
none, when an enforced cancel was already recorded).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from durablesched.context import AttemptSignals, TaskContext
from durablesched.errors import (
    DurableSchedError,
    InvalidTaskError,
    ProcessCrashed,
    TaskCancelled,
    TaskTimeout,
    UnknownTaskNameError,
    WorkerStopping,
    WorkflowSuspended,
)
from durablesched.handles import RUNNING_TASK
from durablesched.records import POSITIONAL, Claim, Environment, ErrorInfo, Outcome, call_args
from durablesched.registry import TaskDefinition, TaskRegistry
from durablesched.scheduler import Scheduler
from durablesched.submission import canonical_json
from durablesched.worker.environments import run_in_child, unstorable
from durablesched.worker.options import WorkerOptions
from durablesched.worker.slots import Running, Slots

# The logger name the worker's lines have always carried, whichever module
# logs them: people filter logs by it.
log = logging.getLogger("durablesched.worker")


class AttemptRunner:
    """Runs the attempts of one worker's claims and says how each ended.

    Reads the options ``environment`` (where a task that does not say runs its
    attempts) and ``cancel_grace``; retry delays draw their jitter from ``rng``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        slots: Slots,
        options: WorkerOptions,
        rng: random.Random,
    ) -> None:
        self._scheduler = scheduler
        self._registry = registry
        self._slots = slots
        self._environment = options.environment
        self._cancel_grace = options.cancel_grace
        self._fail_unknown = options.unknown_tasks == "fail"
        self._rng = rng
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        #: (registry names, those that run in a process), recomputed if the names change.
        self._process_cache: tuple[frozenset[str], frozenset[str]] | None = None
        #: Per task name, how to check its stored arguments, worked out on first use.
        self._checks: dict[str, _ArgumentCheck] = {}
        #: How many attempts gave their claim back for the shutdown (ctx.sleep).
        self.given_back = 0
        self._given_back_lock = threading.Lock()

    def prepare(self, claims: list[Claim]) -> list[Running]:
        """The record of each claimed attempt, with the context its task will see."""
        started = []
        for claim in claims:
            signals = AttemptSignals()
            ctx = TaskContext(claim, self._scheduler, signals)
            definition = self._registry.find(claim.name)
            if definition is not None:
                # Its timeout counts from its start (ahead.begin), not from its claim.
                ctx.environment = self.environment_of(definition)
            else:  # an unknown one (unknown_tasks="fail") fails without running
                ctx.environment = Environment.THREAD
            running = Running(claim, ctx, signals, definition)
            running.waiting = claim.started_at is None and claim.claimed_at is not None
            started.append(running)
        return started

    def run(self, running: Running) -> Outcome | None:  # noqa: PLR0911 - a return per way it ends
        """One attempt, where its task says; None if it was already recorded (enforced)."""
        claim, ctx, definition = running.claim, running.context, running.definition
        started = time.monotonic()
        if definition is None:
            # Claimed by a worker told to fail what it cannot run (unknown_tasks="fail"):
            # no attempt could do better, so it is not retried.
            unknown = UnknownTaskNameError(
                f"no task is registered under the name {claim.name!r} in worker "
                f"{claim.owner} (unknown_tasks='fail'): failed without running"
            )
            return Outcome(
                claim, error=ErrorInfo.recorded(UnknownTaskNameError, str(unknown)), retry_at=None
            )
        inside = RUNNING_TASK.set(True)  # a handle refuses to wait in here
        try:
            mismatch = self._mismatch(definition, claim, ctx)
            if mismatch is not None:
                return Outcome(claim, error=ErrorInfo.from_exception(mismatch), retry_at=None)
            if ctx.environment == Environment.PROCESS:
                return self._run_in_process(definition, claim, ctx, running.signals)
            if definition.is_async:
                value: Any = self._run_async(definition, claim, ctx, running.signals)
            else:
                value = _call(definition, claim, ctx)
        except (TaskCancelled, asyncio.CancelledError, concurrent.futures.CancelledError) as exc:
            if ctx.cancel_requested:
                return Outcome(claim, cancelled=True)
            return self.failure(claim, exc)
        except TimeoutError as exc:
            if ctx.timed_out:  # the async timeout: cancelled at its next await
                return self.failure(claim, _overran(definition, started))
            return self.failure(claim, exc)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            return self._raised(running, exc)
        finally:
            RUNNING_TASK.reset(inside)
        if ctx.timed_out:
            # Finished, but too late: a timed-out attempt is a failure wherever it ran.
            return self.failure(claim, _overran(definition, started))
        return _succeeded(claim, ctx, value)

    def _raised(self, running: Running, exc: BaseException) -> Outcome | None:
        """The outcome of an attempt that raised ``exc``; None if it gave its claim back."""
        if isinstance(exc, WorkerStopping) and running.context.shutdown_requested:
            self._give_back(running)
            return None
        if isinstance(exc, WorkflowSuspended) and running.context.suspended:
            # A durable wait gave the claim back itself (docs/workflows.md): no outcome.
            running.given_back = True
            running.signals.mark_lease_lost()
            return None
        # A task's sys.exit() or raised KeyboardInterrupt is its own failure (retried
        # per its policy), not the worker's: no signal raises them on a task thread.
        return self.failure(running.claim, exc)

    def _give_back(self, running: Running) -> None:
        """An attempt that stopped for its worker's shutdown (``ctx.sleep`` raised
        :class:`WorkerStopping`): its claim goes back to PENDING now, the attempt not
        counted, rather than when the grace period ends."""
        claim = running.claim
        running.given_back = True
        try:
            released = self._scheduler.store.release([claim], self._scheduler.clock.now())
        except DurableSchedError as e:
            # Its lease lapses and a reclaim takes it back (counted, as after a crash).
            log.error("could not give back task %s at shutdown: %s", claim.task_id, e)
            released = 0
        running.signals.mark_lease_lost()  # the claim is no longer this attempt's
        if released:
            with self._given_back_lock:
                self.given_back += released
            log.info(
                "given back: task %s (%s) attempt %s stopped for the shutdown; not counted",
                claim.task_id,
                claim.name,
                claim.attempt,
            )

    def _mismatch(
        self, definition: TaskDefinition, claim: Claim, ctx: TaskContext
    ) -> TypeError | None:
        """Why the stored arguments cannot be passed to the function, or None if they can.

        Every attempt would fail the same way, so the caller records it once,
        as FAILED, before any user code runs (in this process or a child).
        """
        check = self._checks.get(claim.name)
        if check is None or check.definition is not definition:
            check = self._checks[claim.name] = _ArgumentCheck(definition)
        if check.fits(claim.args):
            return None
        positional, keywords = call_args(claim.args)
        try:
            if definition.pass_context:
                check.bind(ctx, *positional, **keywords)
            else:
                check.bind(*positional, **keywords)
        except TypeError as exc:
            stored = sorted(keywords) + ([f"{len(positional)} positional"] if positional else [])
            return TypeError(
                f"task {claim.name!r} cannot take its stored arguments "
                f"{stored}: {exc} (not retried: every attempt would fail so)"
            )
        return None

    def _run_in_process(
        self, definition: TaskDefinition, claim: Claim, ctx: TaskContext, signals: AttemptSignals
    ) -> Outcome | None:
        started = time.monotonic()
        detail = f"terminated after {self._cancel_grace:g}s grace: cancellation enforced"

        def enforce() -> None:
            # Invalidate the claim before the child dies: whatever it was about to
            # report can no longer count.
            running = self._slots.get(claim.task_id)
            if running is not None:
                running.ended = True
            try:
                self._scheduler.store.acknowledge_cancel(
                    claim, self._scheduler.clock.now(), detail=detail
                )
            except DurableSchedError as e:
                # The request is stored: the reclaim of the lapsed lease ends it CANCELLED.
                log.error("could not record the enforced cancel of task %s: %s", claim.task_id, e)

        ended = run_in_child(
            definition,
            claim.args,
            ctx,
            deadline=ctx.deadline,
            cancel_grace=self._cancel_grace,
            on_enforce=enforce,
            signals=signals,
        )
        if ended.how == "terminated":
            log.info(
                "%s: task %s (%s) attempt %s: its process was terminated",
                "lease lost" if ctx.lease_lost else "cancel enforced",
                claim.task_id,
                claim.name,
                claim.attempt,
            )
            return None
        if ended.how == "timeout":
            return self.failure(claim, _overran(definition, started, killed=True))
        if ended.how == "cancelled":
            return Outcome(claim, cancelled=True)
        if ended.error is not None:
            retry = ended.retry
            if ended.how == "crashed":  # no exception came back: the policy's view of one
                retry = definition.retry.retries(ProcessCrashed(ended.error.message))
            return self.failure_info(claim, ended.error, retry=retry)
        return Outcome(claim, result=ended.result, children=ended.children, signals=ended.signals)

    def _run_async(
        self, definition: TaskDefinition, claim: Claim, ctx: TaskContext, signals: AttemptSignals
    ) -> Any:
        """An ``async def`` task on the worker's event loop; cancel arrives at its next await."""
        loop = self._event_loop()

        async def call() -> Any:
            RUNNING_TASK.set(True)  # in this coroutine's own context: a handle refuses to wait
            task = asyncio.current_task()
            assert task is not None
            signals.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))
            positional, keywords = call_args(claim.args)
            if definition.pass_context:
                awaitable = definition.fn(ctx, *positional, **keywords)
            else:
                awaitable = definition.fn(*positional, **keywords)
            try:
                if ctx.deadline is None:
                    return await awaitable
                async with asyncio.timeout(max(0.0, ctx.deadline - time.monotonic())):
                    return await awaitable
            except (SystemExit, KeyboardInterrupt) as exc:
                # Let out of a coroutine, asyncio re-raises these in the event loop,
                # which would stop it for every async task of the worker: carried
                # out as a value instead, and raised on the task thread.
                return _Exit(exc)

        value = asyncio.run_coroutine_threadsafe(call(), loop).result()
        if isinstance(value, _Exit):
            raise value.exc
        return value

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="durablesched-asyncio", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def environment_of(self, definition: TaskDefinition) -> Environment:
        if definition.environment is not None:
            return Environment(definition.environment)
        return self._environment

    def claim_names(self) -> frozenset[str] | None:
        """The names this worker claims: its registry's, or every name (None) when it
        fails the tasks it cannot run (``unknown_tasks="fail"``)."""
        return None if self._fail_unknown else self._registry.names

    def process_names(self) -> frozenset[str]:
        """The names whose attempts run in a child process (their cancel is enforced)."""
        names = self._registry.names
        cached = self._process_cache
        if cached is None or cached[0] is not names:
            chosen = frozenset(
                n
                for n in names
                if self.environment_of(self._registry.get(n)) == Environment.PROCESS
            )
            self._process_cache = (names, chosen)
            return chosen
        return cached[1]

    def failure(self, claim: Claim, exc: BaseException) -> Outcome:
        """A failed attempt, retried if it has attempts left and its policy retries ``exc``."""
        retry = self._registry.retry_policy(claim.name).retries(exc)
        return self.failure_info(claim, ErrorInfo.from_exception(exc), retry=retry)

    def failure_info(self, claim: Claim, error: ErrorInfo, *, retry: bool = True) -> Outcome:
        if claim.exhausted or not retry:
            return Outcome(claim, error=error, retry_at=None)
        now = self._scheduler.clock.now()
        return Outcome(
            claim, error=error, retry_at=now + self.retry_delay(claim.name, claim.attempt)
        )

    def retry_delay(self, name: str, attempt: int) -> timedelta:
        return self._registry.retry_policy(name).delay(attempt, self._rng)


def _succeeded(claim: Claim, ctx: TaskContext, value: Any) -> Outcome:
    """The outcome of an attempt that returned ``value``: a success if JSON can store it,
    else a failure at once."""
    try:
        result = canonical_json(value, f"the result of task {claim.name!r}")
    except InvalidTaskError as exc:
        return Outcome(claim, error=ErrorInfo.from_exception(unstorable(exc)), retry_at=None)
    return Outcome(
        claim,
        result=result,
        children=tuple(ctx.children),
        effects=tuple(ctx.effects),
        signals=tuple(ctx.sent_signals),
    )


def _call(definition: TaskDefinition, claim: Claim, ctx: TaskContext) -> Any:
    """The task's function with its stored arguments (and the context, if it takes one)."""
    args = claim.args
    if POSITIONAL in args:
        positional, keywords = call_args(args)
        if definition.pass_context:
            return definition.fn(ctx, *positional, **keywords)
        return definition.fn(*positional, **keywords)
    if definition.pass_context:
        return definition.fn(ctx, **args)
    return definition.fn(**args)


class _Exit:
    """A SystemExit or KeyboardInterrupt an async task raised, carried off the event loop."""

    __slots__ = ("exc",)

    def __init__(self, exc: SystemExit | KeyboardInterrupt) -> None:
        self.exc = exc


class _ArgumentCheck:
    """Whether stored arguments fit a task's function, from its signature read once.

    The common function (named parameters, perhaps ``**kwargs``) is checked
    with two set comparisons on the argument names; anything else (positional-
    only parameters, ``*args``) by ``Signature.bind``, which costs about 5 µs,
    as much as a no-op attempt. ``bind`` also words the error.
    """

    __slots__ = ("accepted", "any_name", "bind", "definition", "required")

    def __init__(self, definition: TaskDefinition) -> None:
        self.definition = definition
        self.bind: Callable[..., object] = _any
        #: None: no quick answer, use bind.
        self.required: frozenset[str] | None = None
        self.accepted: frozenset[str] = frozenset()
        self.any_name = False
        try:
            signature = inspect.signature(definition.fn)
        except (TypeError, ValueError):  # no signature to read: let the call decide
            self.required, self.any_name = frozenset(), True
            return
        self.bind = signature.bind
        parameters = list(signature.parameters.values())
        if definition.pass_context:
            if not parameters or parameters[0].kind not in _POSITIONAL:
                return
            parameters = parameters[1:]
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        if any(p.kind not in named and p.kind != inspect.Parameter.VAR_KEYWORD for p in parameters):
            return
        self.accepted = frozenset(p.name for p in parameters if p.kind in named)
        self.required = frozenset(
            p.name for p in parameters if p.kind in named and p.default is inspect.Parameter.empty
        )
        self.any_name = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)

    def fits(self, args: dict[str, Any]) -> bool:
        """True if ``args`` surely fit; False if ``bind`` must say."""
        required = self.required
        if required is None or POSITIONAL in args:
            return False
        names = args.keys()
        return names >= required and (self.any_name or names <= self.accepted)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _any(*_args: object, **_kwargs: object) -> None:
    """The check of a function with no signature to read: anything may be tried."""


def _overran(definition: TaskDefinition, started: float, *, killed: bool = False) -> TaskTimeout:
    assert definition.timeout is not None
    limit = definition.timeout.total_seconds()
    how = "its process was killed" if killed else f"it ran {time.monotonic() - started:.3f}s"
    return TaskTimeout(f"timed out: the limit is {limit:g}s and {how}")
