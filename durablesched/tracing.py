"""The tracing hook: where submits and attempts tell a tracer what they do.

No tracer is installed by default: ``tracing_hook.tracer`` is None, each hook point costs
one read of it, and nothing else happens (no span, no context stored, no import
of any tracing library). :func:`durablesched.otel.instrument` installs the
OpenTelemetry one (docs/tracing.md); anything with the :class:`Tracer` methods
would do.

The hook points:

* ``Scheduler.submit``/``submit_info``/``submit_many`` hand the building and the
  storing of their tasks to :meth:`Tracer.submit`, which stores the context of
  the submit in each task (:func:`with_trace`: under :data:`~durablesched.records.TRACE`
  in its arguments, which the stores take out again as they read them);
* ``TaskContext.submit`` (a child task) asks :meth:`Tracer.carry` for the
  context of the running attempt;
* the worker starts :meth:`Tracer.attempt` on the task thread, runs the attempt
  inside :meth:`AttemptTrace.running`, and ends it with the attempt's outcome
  once that is committed (or known to be lost).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from durablesched.records import TRACE, Claim, ErrorInfo, NewTask, Submitted, TraceCarrier
from durablesched.states import TaskState
from durablesched.submission import to_json

log = logging.getLogger("durablesched.tracing")

# -- how an attempt ended, as its span says (the attribute durablesched.task.outcome) -------------

#: It returned and its success was committed.
SUCCEEDED = "succeeded"
#: It failed and will be retried.
RETRY = "retry"
#: It failed for good (attempts exhausted, or not retryable).
FAILED = "failed"
#: It acknowledged a cancel request, or its process was stopped on one.
CANCELLED = "cancelled"
#: Its outcome was refused: its lease had expired and another worker reclaimed it.
LEASE_LOST = "lease_lost"
#: The worker stopped before it ended and gave its claim back (not counted as an attempt).
RELEASED = "released"

_OUTCOMES: dict[TaskState, str] = {
    TaskState.SUCCEEDED: SUCCEEDED,
    TaskState.RETRY_WAIT: RETRY,
    TaskState.FAILED: FAILED,
    TaskState.CANCELLED: CANCELLED,
}


def outcome_of(state: TaskState | None) -> str:
    """What an attempt's span says of an outcome that left its task in ``state``
    (None: the store refused it, the lease was lost)."""
    if state is None:
        return LEASE_LOST
    return _OUTCOMES.get(state, state.value.lower())


class AttemptTrace(Protocol):
    """The trace of one attempt, from its start on a task thread to its recorded end."""

    def running(self) -> AbstractContextManager[object]:
        """Entered on the task thread around the task's own code: what the task traces
        is part of this attempt."""
        ...

    def end(self, outcome: str, error: ErrorInfo | None = None) -> None:
        """The attempt is over: ``outcome`` is one of this module's outcome names, ``error``
        what it raised, if it did. Called from any thread; only the first call counts."""
        ...


class Tracer(Protocol):
    """What a tracer installed with :func:`install` is asked to do."""

    def submit(
        self,
        name: str,
        build: Callable[[], list[NewTask]],
        store: Callable[[list[NewTask]], list[Submitted]],
        *,
        batch: bool,
    ) -> list[Submitted]:
        """One submit (``batch``: a ``submit_many``) of tasks named ``name``: call ``build``
        for the validated tasks, give each the submit's context (:func:`with_trace`),
        ``store`` them, and return what storing returned. What either raises goes on."""
        ...

    def carry(self, task: NewTask) -> NewTask:
        """``task`` with the caller's current context: a child task submitted by a task."""
        ...

    def attempt(self, claim: Claim, owner: str) -> AttemptTrace:
        """The trace of the attempt ``claim`` started by worker ``owner``, begun now."""
        ...


class Hook:
    """The one switch the hook points read: ``tracing_hook.tracer``, the installed tracer, or
    None (the default), which traces nothing."""

    __slots__ = ("tracer",)

    def __init__(self) -> None:
        self.tracer: Tracer | None = None


#: Read by every hook point; set by :func:`install`.
tracing_hook = Hook()


def install(tracer: Tracer | None) -> Tracer | None:
    """Make ``tracer`` the one every submit and attempt of this process tells (None:
    trace nothing); returns the one it replaces. Attempts already running keep the
    trace they started with."""
    previous, tracing_hook.tracer = tracing_hook.tracer, tracer
    return previous


def start_attempt(tracer: Tracer, claim: Claim, owner: str) -> AttemptTrace | None:
    """``tracer.attempt(claim, owner)``, or None (logged) if the tracer fails: a broken
    tracer must not keep an attempt from running, nor hold its slot."""
    try:
        return tracer.attempt(claim, owner)
    except Exception:
        log.exception("tracing: could not start the span of task %s", claim.task_id)
        return None


def end_attempt(trace: AttemptTrace, outcome: str, error: ErrorInfo | None = None) -> None:
    """``trace.end(outcome, error)``, logging what it raises: it is called where the
    worker frees slots, which a tracer's failure must not stop."""
    try:
        trace.end(outcome, error)
    except Exception:
        log.exception("tracing: could not end an attempt's span (%s)", outcome)


def with_trace(task: NewTask, carrier: TraceCarrier) -> NewTask:
    """``task`` storing ``carrier`` (a propagator's headers) with its arguments, under
    :data:`~durablesched.records.TRACE`; ``task`` itself if the carrier is empty.

    The JSON already made of the arguments is extended, not made again.
    """
    if not carrier:
        return task
    carried = dict(carrier)
    args = {TRACE: carried, **task.args}
    args_json = task.args_json
    if args_json is not None:
        head = '{"' + TRACE + '":' + to_json(carried, "the trace context")
        args_json = head + ("}" if args_json == "{}" else "," + args_json[1:])
    return task._replace(args=args, args_json=args_json)
