"""The values that cross the storage boundary: what is submitted, claimed and read back."""

from __future__ import annotations

import builtins
import traceback as _traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple, TypedDict

from durablesched.errors import ConfigurationError, DurableSchedError
from durablesched.states import TaskState

#: A task's JSON arguments: an object whose members become keyword arguments, and
#: whose member :data:`POSITIONAL` (if any) holds the positional ones, in order.
JSONArgs = dict[str, Any]
#: The member of a task's stored arguments that holds its positional arguments:
#: no keyword argument can be called so (a keyword is an identifier).
POSITIONAL = "*args"
#: The member of a task's stored arguments that holds the trace context it was submitted
#: in (W3C ``traceparent``, ``tracestate``), when tracing is on (docs/tracing.md). Like
#: :data:`POSITIONAL`, no keyword argument can be called so; the stores take it out of
#: the arguments as they read them (:func:`split_trace`), so no task function, record
#: or listing ever shows it.
TRACE = "*trace"
#: A trace context as a propagator writes it: header names and their values.
TraceCarrier = Mapping[str, str]


def split_trace(stored: JSONArgs) -> tuple[JSONArgs, TraceCarrier | None]:
    """Stored arguments without their trace context, and that context (None: none, or
    not a mapping of strings). ``stored`` itself is left as it was."""
    if TRACE not in stored:
        return stored, None
    args = dict(stored)
    carrier = args.pop(TRACE)
    if not isinstance(carrier, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()
    ):
        return args, None
    return args, carrier


def join_trace(args: JSONArgs, trace: TraceCarrier | None) -> JSONArgs:
    """The arguments as stored: ``args`` with the trace context (if any) under :data:`TRACE`."""
    return args if trace is None else {TRACE: dict(trace), **args}


def call_args(stored: JSONArgs) -> tuple[list[Any], dict[str, Any]]:
    """Stored arguments as the call takes them: (positional, keyword)."""
    if POSITIONAL not in stored:
        return [], stored
    keywords = dict(stored)
    positional = keywords.pop(POSITIONAL)
    return list(positional), keywords


class Environment(StrEnum):
    """Where a task's attempts run."""

    #: A worker thread: cheap; cancellation and timeouts are cooperative.
    THREAD = "thread"
    #: A child process per attempt: a few milliseconds more; both are enforced.
    PROCESS = "process"


#: The environments as an error message lists them.
ENVIRONMENT_CHOICES = " or ".join(repr(e.value) for e in Environment)


def environment(value: str | Environment) -> Environment:
    """``value`` as an :class:`Environment`, or a ConfigurationError naming the choices."""
    try:
        return Environment(value)
    except ValueError:
        raise ConfigurationError(
            f"environment must be {ENVIRONMENT_CHOICES}, got {value!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An exception as stored: enough to debug it, nothing that needs unpickling."""

    type: str
    message: str
    traceback: str

    #: Longest message or traceback stored, in characters: a task's error must not
    #: be able to fill the database (the rest is cut, and the cut says how much).
    MAX_TEXT = 65_536

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """Whatever the exception holds, something storable: an exception whose
        ``str()`` raises, or whose text holds lone surrogates (which no database
        encoding accepts), must still be recorded, or its task would stay RUNNING."""
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        try:
            message = str(exc)
        except Exception as e:
            message = f"<str() of the exception raised {type(e).__name__}>"
        return cls(
            type=_storable(kind),
            message=_storable(message),
            traceback=_storable("".join(_traceback.format_exception(exc))),
        )

    @classmethod
    def recorded(cls, error: builtins.type[DurableSchedError], message: str) -> ErrorInfo:
        """An error durablesched records itself (no traceback: nothing was raised),
        typed by the public name of its class, as in ``durablesched.LeaseExpired``."""
        return cls(type=f"durablesched.{error.__name__}", message=message, traceback="")

    def to_dict(self) -> dict[str, str]:
        """The one serialised shape of an error: in the database, the CLI's JSON and
        a child process's report alike."""
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorInfo:
        return cls(str(data["type"]), str(data["message"]), str(data["traceback"]))


def _storable(text: str) -> str:
    """``text`` as valid UTF-8 (lone surrogates escaped) and at most ErrorInfo.MAX_TEXT long."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > ErrorInfo.MAX_TEXT:
        cut = len(text) - ErrorInfo.MAX_TEXT
        text = f"{text[: ErrorInfo.MAX_TEXT]}... ({cut} more characters cut)"
    return text


#: The queue of a task that names none.
DEFAULT_QUEUE = "default"


class NewTask(NamedTuple):
    """A validated task ready to store (see :meth:`Scheduler.submit` for the checks).

    A named tuple, not a dataclass: a bulk submit makes one per task, and a
    tuple is made in a third of the time.
    """

    name: str
    args: JSONArgs
    due_at: datetime
    max_attempts: int
    idempotency_key: str | None = None
    #: ``args`` as JSON text, when the submitter already serialised it (stores
    #: then read this instead of serialising again).
    args_json: str | None = None
    #: The named queue it waits in, and its priority there (higher runs first).
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    #: The key its queue's per-key limits count it under (None: none).
    limit_key: str | None = None
    #: Debouncing (docs/api.md, "Debouncing"): while a task with this key is PENDING and
    #: has not started, this submit replaces its arguments and due time instead.
    debounce_key: str | None = None
    #: Its due time is never pushed past this (the first submit's time plus max_wait).
    debounce_until: datetime | None = None


class Finished(NamedTuple):
    """A finished task as a waiting handle needs it (``Store.finished``): its outcome,
    without the rest of its record, so that a wait costs the little it reads. A named
    tuple: immutable, and made in a fifth of a frozen dataclass's time (it is made once
    per result that a waiting handle receives)."""

    id: int
    name: str
    state: TaskState
    attempts: int
    result: Any
    last_error: ErrorInfo | None
    finished_at: datetime | None

    @classmethod
    def of(cls, record: TaskRecord) -> Finished:
        return cls(
            record.id,
            record.name,
            record.state,
            record.attempts,
            record.result,
            record.last_error,
            record.finished_at,
        )


class Submitted(NamedTuple):
    """What a submit did: the task's id, False if a live task already had the key, and
    when the task (that one, then) was stored: its ``created_at``, known without a read."""

    task_id: int
    created: bool
    enqueued_at: datetime


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A snapshot of one task as stored."""

    id: int
    seq: int
    name: str
    args: JSONArgs
    state: TaskState
    due_at: datetime
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    fence: int
    cancel_requested_at: datetime | None
    result: Any
    last_error: ErrorInfo | None
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    #: Where the current or last attempt ran: None (a worker thread: cooperative
    #: cancellation) or "process" (a child process: cancellation enforced).
    environment: str | None = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    #: The trace context it was submitted in (docs/tracing.md), kept apart from ``args``.
    trace: TraceCarrier | None = None
    #: The key its queue's per-key limits count it under (None: none).
    limit_key: str | None = None
    #: Its debounce key while it is PENDING and has never started (then None).
    debounce_key: str | None = None
    #: When its latest attempt started; None while it waits claimed ahead in a worker
    #: (RUNNING, not started: ``Worker(ahead=)``), and for a task never claimed.
    started_at: datetime | None = None
    #: While it has a debounce key: the latest due time later submits with the key may
    #: give it (the first submit's time plus its ``max_wait``; None: no such bound).
    debounce_until: datetime | None = None

    @property
    def effective_key(self) -> str:
        """The idempotency key for this task's effects: the submit key or one from the id."""
        return effective_key(self.id, self.idempotency_key)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A workflow step's checkpoint (docs/workflows.md): the JSON ``result`` of the step
    ``name`` at ``position`` (from 0) of task ``task_id``, recorded at ``recorded_at``
    by attempt ``attempt`` under that attempt's claim."""

    task_id: int
    position: int
    name: str
    result: Any
    recorded_at: datetime
    attempt: int


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """A signal sent to a task (docs/workflows.md): its JSON ``payload``, and, once a
    wait took it, when and at which step position."""

    id: int
    task_id: int
    name: str
    payload: Any
    sent_at: datetime
    consumed_at: datetime | None = None
    consumed_position: int | None = None


@dataclass(frozen=True, slots=True)
class SignalSend:
    """A signal one task sends another with its success (``ctx.signal``): delivered as
    ``Store.send_signal`` delivers one, in the transaction that records the success, so
    an attempt that fails or loses its lease sends nothing."""

    task_id: int
    name: str
    payload: Any = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's right to run one attempt of a task until ``lease_expires_at``.

    ``fence`` grows with every claim of the task; an outcome written with an
    older fence (or another owner) is refused by the store.
    """

    task_id: int
    name: str
    args: JSONArgs
    attempt: int
    max_attempts: int
    owner: str
    fence: int
    lease_expires_at: datetime
    due_at: datetime
    seq: int
    idempotency_key: str
    #: The queue it was claimed from: the worker's slots for that queue hold it.
    queue: str = DEFAULT_QUEUE
    #: The trace context it was submitted in (docs/tracing.md), kept apart from ``args``:
    #: the attempt's span links to it.
    trace: TraceCarrier | None = None
    #: The task's priority, as stored.
    priority: int = 0
    #: When the task was submitted (its record's ``created_at``); every store sets it.
    created_at: datetime | None = None
    #: When this claim was made: the time of its RUNNING history line, the attempt's
    #: start (``AttemptInfo.started_at``); every store sets it.
    claimed_at: datetime | None = None
    #: When its attempt started: ``claimed_at`` for a claim into a free slot; None for
    #: one claimed ahead (``ahead=``), waiting in its worker, until the worker starts it
    #: (the claim it runs under then carries the time).
    started_at: datetime | None = None

    @property
    def exhausted(self) -> bool:
        """True if this is the last attempt the task is allowed."""
        return self.attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended, to be recorded under its claim.

    A failure if ``error`` is set (retried at ``retry_at`` if given), an
    acknowledged cancellation if ``cancelled``, otherwise a success with
    ``result``, ``children``, ``effects`` and ``signals``.
    """

    claim: Claim
    result: Any = None
    error: ErrorInfo | None = None
    retry_at: datetime | None = None
    cancelled: bool = False
    children: tuple[NewTask, ...] = ()
    effects: tuple[Callable[[Any], object], ...] = ()
    signals: tuple[SignalSend, ...] = ()


#: What recording an outcome did: the task's new state, None if the claim was
#: no longer valid, or the exception an effect (or a refused cancellation) raised.
OutcomeResult = TaskState | Exception | None


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    """A lease renewed by a heartbeat, and whether cancellation was requested."""

    task_id: int
    fence: int
    lease_expires_at: datetime
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A task whose lease expired and what reclaiming it made of it."""

    task_id: int
    name: str
    attempt: int
    owner: str
    state: TaskState


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One line of a task's history: it entered ``state`` at ``at``."""

    task_id: int
    at: datetime
    state: TaskState
    attempt: int
    detail: str | None
    #: On the line that ends a failed attempt (RETRY_WAIT or FAILED after RUNNING):
    #: that attempt's error, class path and traceback included.
    error: ErrorInfo | None = None


class CancelOutcome(StrEnum):
    """What :meth:`Scheduler.cancel` achieved, honestly."""

    #: It had not started and now never will.
    CANCELLED = "CANCELLED"
    #: It is running in a thread; it was asked to stop and may still finish (cooperative).
    REQUESTED = "REQUESTED"
    #: It is running in a child process; it was asked to stop, and if it has not
    #: stopped within the worker's grace period, the process is terminated and the
    #: task ends CANCELLED (enforced; docs/execution.md).
    ENFORCED = "ENFORCED"
    #: It had already finished; nothing changed.
    TOO_LATE = "TOO_LATE"


#: A task submitted without a key gets this prefix and its id as its effects' key.
TASK_KEY_PREFIX = "durablesched-task-"
#: The detail of a task's first history line: it was submitted (PENDING, attempt 0).
SUBMITTED = "submitted"


def effective_key(task_id: int, submit_key: str | None) -> str:
    """The stable idempotency key a task's effects carry across all its attempts."""
    return submit_key if submit_key is not None else f"{TASK_KEY_PREFIX}{task_id}"


# -- what an operator reads: `durablesched stats` --------------------------------------------------
# Typed dicts, not classes: the record is the CLI's --json output as it is, and
# stays a plain mapping for callers that index it.


class OverdueTask(TypedDict):
    """The task that has waited longest past its due time."""

    id: int
    name: str
    due_at: datetime
    lag_seconds: float


class OverdueName(TypedDict):
    """Tasks of one name waiting past their due time."""

    name: str
    tasks: int
    oldest_due_at: datetime


class RunningTask(TypedDict):
    """A task RUNNING now, under whose lease."""

    id: int
    name: str
    attempt: int
    lease_owner: str | None
    lease_expires_at: datetime
    cancel_requested: bool


class RecentFailure(TypedDict):
    """A task that ended FAILED in the last hour."""

    id: int
    name: str
    attempts: int
    finished_at: datetime
    error: ErrorInfo | None


class QueueStats(TypedDict):
    """A queue at one moment: counts per state (every state, zeros included), the oldest
    overdue task, overdue tasks by name, running leases, and failures of the last hour."""

    counts: dict[str, int]
    oldest_overdue: OverdueTask | None
    overdue_by_name: list[OverdueName]
    running: list[RunningTask]
    failures_last_hour: list[RecentFailure]


# -- a health check (``Operator.check``, ``durablesched check``) ----------------------------------

#: How long past its due time a claimable task may wait before a check reports it.
OVERDUE_AFTER = timedelta(minutes=5)
#: How many task ids a finding names at most.
FINDING_IDS = 20


@dataclass(frozen=True)
class Finding:
    """Something a check found wrong, in one line, and what to do about it."""

    #: What was checked: "database", "integrity", "schema", "leases", "overdue",
    #: "schedules" or "keys".
    check: str
    problem: str
    advice: str
    #: The tasks concerned (at most :data:`FINDING_IDS`), oldest first.
    task_ids: tuple[int, ...] = ()

    @classmethod
    def expired_leases(
        cls, count: int, oldest: datetime, task_ids: tuple[int, ...], now: datetime
    ) -> Finding:
        seconds = (now - oldest).total_seconds()
        return cls(
            "leases",
            f"{count} RUNNING task{'s' if count != 1 else ''} on an expired lease "
            f"(the oldest expired {seconds:.0f}s ago)",
            "a running worker reclaims them on its next pass (their attempt counts and "
            "they are retried); if they stay, no worker is running: start one",
            task_ids,
        )

    @classmethod
    def overdue(
        cls,
        count: int,
        oldest: datetime,
        task_ids: tuple[int, ...],
        now: datetime,
        after: timedelta,
    ) -> Finding:
        seconds = (now - oldest).total_seconds()
        return cls(
            "overdue",
            f"{count} task{'s' if count != 1 else ''} due more than {after.total_seconds():g}s "
            f"ago and not claimed (the oldest due {seconds:.0f}s ago)",
            "is a worker running, with an --app that registers these task names, and a free "
            "slot? `durablesched stats` shows them by name",
            task_ids,
        )

    @classmethod
    def overdue_schedules(
        cls, names: Sequence[str], oldest: datetime, now: datetime, after: timedelta
    ) -> Finding:
        """Active schedules whose next fire time passed long ago: nothing fires them."""
        count = len(names)
        seconds = (now - oldest).total_seconds()
        shown = ", ".join(names[:FINDING_IDS]) + (", ..." if count > FINDING_IDS else "")
        return cls(
            "schedules",
            f"{count} active schedule{'s' if count != 1 else ''} due to fire more than "
            f"{after.total_seconds():g}s ago and not fired (the oldest due {seconds:.0f}s "
            f"ago): {shown}",
            "schedules fire inside running workers: start one (`durablesched worker`); when "
            "it starts, each schedule's misfire policy decides what the missed fires make",
        )

    @classmethod
    def limit_keys(cls, keys: Sequence[tuple[str, str]]) -> Finding:
        """Keys whose bookkeeping (``durablesched_limit_keys``, ``key_waiting``) is out of
        step with their tasks: a key held back below its limit, or let past it."""
        count = len(keys)
        shown = ", ".join(f"{q}/{k}" for q, k in keys[:FINDING_IDS])
        return cls(
            "keys",
            f"{count} limit key{'s' if count != 1 else ''} out of step with "
            f"{'their' if count != 1 else 'its'} tasks (a count of RUNNING, a head or a "
            "waiting mark): "
            f"{shown}{', ...' if count > FINDING_IDS else ''}",
            "such a key may start past its limit, or wait with room: set the queue's limits "
            "per key off and back on (`durablesched queue set QUEUE --concurrency-per-key none "
            "--rate-per-key none`, then its limits again), which counts every key of the queue "
            "afresh; and report it: nothing in durablesched should leave a key so",
        )


@dataclass(frozen=True)
class HealthReport:
    """What :meth:`~durablesched.store.protocol.Operator.check` found; healthy if nothing."""

    findings: tuple[Finding, ...]
    #: The database's schema revision (None: no schema, or a backend without one).
    revision: str | None = None
    #: The revision this release needs (None for a backend without a schema).
    head: str | None = None

    @property
    def healthy(self) -> bool:
        return not self.findings


# -- live workers (``Store.register_worker``, ``durablesched workers``) ---------------------------

#: How long after it is gone (not seen for longer than its lease) a worker's row is
#: deleted, at the next worker's registration or ``durablesched purge``; until then it
#: is listed as gone (``durablesched workers --all``), so a crash stays visible a while.
WORKER_FORGET_AFTER = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker process as it registered, and when it was last seen.

    A worker is *alive* while it was seen within its lease (its heartbeats, every
    third of a lease by default, refresh ``last_seen`` even when it holds no
    task), *gone* after that: killed, frozen, or cut off from the database. A
    worker that exits cleanly removes its row; a gone one's row is deleted
    :data:`WORKER_FORGET_AFTER` later.
    """

    #: The worker's owner id: its claims carry it (``TaskRecord.lease_owner``, history lines).
    id: str
    host: str
    pid: int
    #: The queues served, each with its slots; None: every queue.
    queues: Mapping[str, int] | None
    #: How many attempts it runs at once (with ``queues``, their slots' sum).
    concurrency: int
    #: The durablesched version it runs.
    version: str
    started_at: datetime
    last_seen: datetime
    #: How long it may go unseen and still count as alive: its task lease.
    lease: timedelta
    #: The tasks it holds RUNNING whose attempts started (when listed).
    running: int = 0
    #: The tasks it holds claimed ahead, waiting for a slot (when listed).
    waiting: int = 0

    def alive(self, now: datetime) -> bool:
        """Seen within its lease at ``now``."""
        return now - self.last_seen <= self.lease

    def state(self, now: datetime) -> str:
        """The worker's state at ``now``: "alive" or "gone"."""
        return "alive" if self.alive(now) else "gone"

    def forgotten(self, now: datetime) -> bool:
        """Gone for longer than :data:`WORKER_FORGET_AFTER` at ``now``: listed no more, and
        deleted when next pruned."""
        return now - self.last_seen > self.lease + WORKER_FORGET_AFTER


# -- what happened lately (``Store.activity``; metrics count it) ---------------------------------

#: What ``Store.activity`` counts per queue: attempts started (claimed); attempts that
#: ended succeeded, in an error (``failed``: retried or not, a reclaimed one included),
#: in an error with a retry to come (``retried``), or cancelled while running; and
#: leases that expired and were reclaimed.
ACTIVITY_KINDS = ("started", "succeeded", "failed", "retried", "cancelled", "reclaimed")
#: A reclaim's history line: ``lease of <owner> expired at <time> during attempt <n>``.
RECLAIM_PREFIX = "lease of "
RECLAIM_MARK = " expired at "


class DurationCounts(NamedTuple):
    """The attempts of one task name that ended in a window, and how long they ran."""

    #: How many (reclaimed ones left out: they ran until their lease ran out, unseen).
    runs: int
    #: Their run times (claim to outcome) added up, in whole microseconds.
    total_us: int
    #: How many ran at most each bound asked for, in the bounds' order (cumulative).
    at_most: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Activity:
    """What the history says happened in a window: :meth:`Store.activity`."""

    #: How many of each :data:`ACTIVITY_KINDS` per (queue, kind); absent: none.
    attempts: Mapping[tuple[str, str], int]
    #: Reclaimed leases per worker id (the owner whose lease expired).
    lease_losses: Mapping[str, int]
    #: Per task name, the attempts that ended and how long they ran.
    durations: Mapping[str, DurationCounts]


def reclaim_owner(detail: str | None) -> str | None:
    """The worker whose lease a reclaim's history line says expired, or None if the
    line is not a reclaim's."""
    if detail is None or not detail.startswith(RECLAIM_PREFIX) or RECLAIM_MARK not in detail:
        return None
    return detail[len(RECLAIM_PREFIX) : detail.rindex(RECLAIM_MARK)]


# -- what a dashboard reads (``Console``) --------------------------------------------------------


#: An ``after`` cursor older than every task: the list's last page, read from its end.
OLDEST = (datetime(1, 1, 1, tzinfo=UTC), 0)


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """Which tasks a page of a task list holds: newest first, by ``(created_at, id)``
    descending, each filter exact (None: any).

    ``before`` is the keyset cursor: the ``(created_at, id)`` of the last task of the
    previous page, so that the next page starts right after it without counting
    the rows before it (a page costs what it shows, however deep it is). ``after``
    is the cursor the other way: the page is then the *oldest* tasks newer than it
    (still listed newest first), so that the list can be paged back towards the
    newest, and its last page read from the oldest end (an ``after`` older than
    every task: :data:`OLDEST`) at the cost of its first.
    """

    state: TaskState | None = None
    queue: str | None = None
    name: str | None = None
    #: The task's idempotency key as submitted.
    key: str | None = None
    #: Created at or after this time.
    created_from: datetime | None = None
    #: Created before this time.
    created_until: datetime | None = None
    before: tuple[datetime, int] | None = None
    after: tuple[datetime, int] | None = None

    def matches(self, task: TaskRecord) -> bool:
        """Whether ``task`` is in the list this query describes (the in-memory reading)."""
        return (
            (self.state is None or task.state == self.state)
            and (self.queue is None or task.queue == self.queue)
            and (self.name is None or task.name == self.name)
            and (self.key is None or task.idempotency_key == self.key)
            and (self.created_from is None or task.created_at >= self.created_from)
            and (self.created_until is None or task.created_at < self.created_until)
            and (self.before is None or (task.created_at, task.id) < self.before)
            and (self.after is None or (task.created_at, task.id) > self.after)
        )


class MinuteCounts(NamedTuple):
    """The attempts that ended in one minute of history."""

    #: The minute's start, UTC.
    minute: datetime
    #: Attempts that succeeded (SUCCEEDED lines).
    succeeded: int
    #: Attempts that ended in an error, retried or not (RETRY_WAIT and FAILED lines,
    #: lost leases included).
    failed: int
