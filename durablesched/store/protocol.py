"""The storage boundary every backend implements, in tasks, owners, leases and times.

Every method takes ``now`` (and the owner, where one is involved) as an
argument: a store never reads a clock of its own, so the same calls give the
same answers on every backend. A *valid claim* is one whose task is RUNNING
with the claim's owner and fence and whose lease has not expired at ``now``;
every outcome write is conditional on it in one atomic step, and a write with
an invalid claim changes nothing and returns a falsy value.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from durablesched.queues import QueueInfo, QueueLimits
from durablesched.records import (
    OVERDUE_AFTER,
    Activity,
    CancelOutcome,
    Claim,
    Finished,
    HealthReport,
    LeaseStatus,
    MinuteCounts,
    NewTask,
    Outcome,
    OutcomeResult,
    QueueStats,
    Reclaimed,
    SignalRecord,
    StepRecord,
    Submitted,
    TaskEvent,
    TaskQuery,
    TaskRecord,
    WorkerInfo,
)
from durablesched.schedules.declaration import Fired, Schedule, ScheduleInfo
from durablesched.states import TaskState
from durablesched.totals import AttemptTotal

if TYPE_CHECKING:
    # Only SQL backends hand an effect a connection: the in-memory one must not
    # need SQLAlchemy installed, or imported, to use this protocol.
    from sqlalchemy import Connection


class DBAPIConnection(Protocol):
    """A database driver's own connection (PEP 249), such as ``sqlite3.Connection`` or
    ``psycopg.Connection``: what a framework like Django holds. ``submit(connection=)``
    takes one that is in a transaction (docs/api.md)."""

    def cursor(self) -> Any: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


#: Database work a task registers to commit together with its success.
Effect = Callable[["Connection"], object]
#: How long a task called ``name`` waits after failed attempt ``attempt``.
RetryDelay = Callable[[str, int], timedelta]


#: Told of commits seen (None) or of the watcher's failure; may answer True (or a number
#: of seconds): see :meth:`ChangeWatcher.start`.
OnChange = Callable[[Exception | None], bool | float | None]


def quiet_for(answer: bool | float, longest: float) -> float:
    """How long a watcher answered ``answer`` (truthy) by its consumer keeps quiet: True
    asks for its ``longest``, a number of seconds for as long, if shorter."""
    return longest if answer is True else min(answer, longest)


class ChangeWatcher(Protocol):
    """Notices, on a thread of its own, that another connection committed."""

    def start(self, on_change: OnChange) -> None:
        """Call ``on_change(None)`` after commits seen; ``on_change(error)`` once if it fails.

        ``on_change(None)`` answering True says the consumer has no use for news
        for a while (a worker whose every slot is taken): the watcher may then
        keep quiet, for at most a quarter of a second, until :meth:`nudge`. A number
        answered instead of True shortens that quiet to so many seconds.
        """
        ...

    def nudge(self) -> None:
        """End a quiet period now: the consumer can use news again."""
        ...

    def close(self) -> None: ...


#: Told that tasks finished: their ids, or None when the watcher cannot say which (or
#: their :class:`Outcomes`, read with the look that saw them finish); may answer True or
#: a number of seconds: see :meth:`FinishWatcher.start`.
OnFinished = Callable[[Collection[int] | None], bool | float | None]


class Outcomes(dict[int, "Finished | None"]):
    """What a finish watcher that reads outcomes in its own look (SQLite) reports: each
    awaited task it saw finish, with its outcome as :meth:`Store.finished` gives it
    (None: no task has that id any more) but for ``finished_at``, left None (no wait's
    outcome holds it), so that nobody reads them again. ``cost``:
    the CPU seconds of the looks that found them (what they cost the watcher's thread)."""

    __slots__ = ("cost",)

    def __init__(self, cost: float = 0.0) -> None:
        super().__init__()
        self.cost = cost


#: Whether a task is waited on (:meth:`FinishWatcher.start`): asked from the watcher's
#: thread, so it may answer True for a wait that has just ended (its outcome is then
#: dropped) or False for one that has just begun (that wait reads its task itself).
Awaited = Callable[[int], bool]


class FinishWatcher(Protocol):
    """Notices, on a thread of its own, that tasks finished, in this process or another:
    what wakes a process's waiting task handles (docs/api.md, "Handles")."""

    def start(self, on_finished: OnFinished, awaited: Awaited | None = None) -> None:
        """Call ``on_finished(ids)`` after tasks finished (None: some may have, read them
        all); nothing is lost between this call and the first report.

        Given ``awaited``, a watcher that can (SQLite) reads the outcomes of the tasks it
        sees finish that ``awaited`` says are waited on, in the same statement as its
        look, and reports them as :class:`Outcomes`; the others are not reported. A wait
        that begins after the look asked about its task reads that task itself.

        ``on_finished`` answering True asks for a batch: the watcher may keep what
        finishes next to itself, for at most a quarter of a second, until :meth:`nudge`,
        and then tell it all at once (never lose it). A number of seconds answered
        instead asks for a batch of that length at most: the watcher then looks again
        by itself, without a nudge.
        """
        ...

    def nudge(self) -> None:
        """End a batch now: tell what finished since the last report."""
        ...

    def close(self) -> None: ...


class ScheduleStore(Protocol):
    """Where schedules are kept and fired: the part of :class:`Store` that makes periodic tasks.

    A *fire* is a (schedule, fire time) pair, recorded at most once ever (a
    UNIQUE key in the SQL backends): it makes one task, through the same path
    as :meth:`Store.submit`, due at the fire time, with the idempotency key
    ``schedule:<name>:<fire time>`` (see :func:`~durablesched.schedules.declaration.fire_key`),
    or records why it made none. Schedules are keyed by name.
    """

    def sync_schedules(
        self, declared: Sequence[Schedule], now: datetime, tasks: Collection[str]
    ) -> dict[str, str]:
        """Make the schedules declared in code the stored ones, by name, in one step.

        New names are added (first fire: the first fire time after ``now``);
        changed settings are updated (the next fire time is recomputed only if
        the times changed, so fires missed while no worker ran stay missed, for
        the misfire policy); a schedule from code that is no longer declared,
        though its task is among ``tasks`` (the registry's: another app's
        schedules are not this one's to remove), is kept, firing nothing, as
        "removed from code" (declared again, it comes back). Pauses stand.
        Schedules added by an operator are left alone unless declared in code.
        Returns what happened to each name that changed: "added", "updated",
        "restored" or "removed from code".
        """
        ...

    def add_schedule(self, schedule: Schedule, now: datetime) -> bool:
        """Store an operator's schedule; True if added, False if the same one was there.

        :class:`ScheduleConflictError` (nothing changes) if one of that name
        exists with other settings.
        """
        ...

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> ScheduleInfo:
        """Pause (fire nothing) or resume a schedule; resumed, it fires from its first
        fire time after ``now`` (what passed while paused is not caught up).

        :class:`ScheduleNotFoundError` for an unknown name.
        """
        ...

    def remove_schedule(self, name: str) -> None:
        """Delete a schedule and its record of fires (its tasks stay).

        :class:`ScheduleNotFoundError` for an unknown name.
        """
        ...

    def list_schedules(self) -> list[ScheduleInfo]:
        """Every stored schedule, by name, with its last fire and that fire's task's state."""
        ...

    def fire_schedules(self, now: datetime, *, limit: int = 100) -> list[Fired]:
        """Fire what is due at ``now``: up to ``limit`` active schedules whose next fire
        time has come, earliest first.

        For each, in one atomic step: the fires its misfire policy keeps
        (:func:`~durablesched.schedules.timing.plan`), each recorded once, each
        making a task (or, with ``overlap="skip"`` while the task of the
        schedule's previous fire is PENDING, RUNNING or RETRY_WAIT, recording
        the skip), and the next fire time advanced, on the condition that no
        one else advanced it first: a second caller fires nothing.
        """
        ...

    def fire_schedule_now(self, name: str, now: datetime) -> Fired:
        """Make the schedule's task now, whatever its status and next fire time (which
        stay as they are), as the fire ``(name, now)`` marked run-now.

        :class:`ScheduleNotFoundError` for an unknown name.
        """
        ...

    def next_fire_time(self) -> datetime | None:
        """The earliest next fire time of an active schedule, or None."""
        ...


class Store(ScheduleStore, Protocol):
    """Durable (or not) home of tasks, as the scheduler and the worker use it.

    Implementations must be thread-safe. Every method here is called by the
    library; what operators and tools need besides is :class:`Operator`.

    A task's arguments are stored as given, a trace context among them (the
    member :data:`~durablesched.records.TRACE`, docs/tracing.md); every read
    (a ``TaskRecord``, a ``Claim``) gives it apart, through
    :func:`~durablesched.records.split_trace`, as ``trace``.
    """

    def submit(
        self,
        tasks: Sequence[NewTask],
        now: datetime,
        *,
        connection: Connection | DBAPIConnection | None = None,
    ) -> list[Submitted]:
        """Store ``tasks`` as PENDING, in order, all or none.

        With ``connection`` (SQL backends only: an SQLAlchemy ``Connection`` or the
        driver's own), inside the caller's own transaction: the tasks exist if and
        only if it commits.

        A task whose idempotency key is held by a task in a key-holding state
        (PENDING, RUNNING, RETRY_WAIT, SUCCEEDED) is not stored; its entry in
        the result carries the holder's id and ``created=False``.
        """
        ...

    def get(self, task_id: int) -> TaskRecord | None:
        """The task, or None if no task has that id."""
        ...

    def history(self, task_id: int) -> list[TaskEvent]:
        """Every state the task entered, oldest first (empty for an unknown id)."""
        ...

    def latest_events(self, task_ids: Collection[int]) -> dict[int, TaskEvent]:
        """The last line of each of these tasks' histories (unknown ids left out), in one
        read however many ids: what a listing shows of many tasks at once (a suspended
        workflow's line says what it waits for: :mod:`durablesched.workflows.waits`)."""
        ...

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        name: str | None = None,
        limit: int = 100,
        queue: str | None = None,
    ) -> list[TaskRecord]:
        """Up to ``limit`` tasks, filtered, in (due_at, seq) order."""
        ...

    def finished(self, task_ids: Collection[int]) -> dict[int, Finished | None]:
        """Those of ``task_ids`` that are finished (SUCCEEDED, FAILED, CANCELLED), each
        with its outcome, and those that no task has (None); live tasks are left out.

        One read however many ids: it answers every handle a process waits on.
        """
        ...

    def claim(
        self,
        owner: str,
        limit: int,
        now: datetime,
        lease: timedelta,
        names: Collection[str] | None = None,
        *,
        process_names: Collection[str] = (),
        queues: Mapping[str, int] | None = None,
        ahead: int = 0,
    ) -> list[Claim]:
        """Claim up to ``limit`` claimable tasks due at ``now``, best first: (priority desc,
        due_at, seq), across the queues claimed from.

        With ``queues``, at most ``queues[q]`` tasks of each queue ``q`` (a worker's
        free slots for it); without, from every queue. Each queue's stored limits
        hold: a paused queue gives nothing, a concurrency limit counts what RUNS
        anywhere, a rate limit counts the attempts started in its window.

        Each becomes RUNNING with ``owner``, a lease until ``now + lease``, one
        more attempt and a new fence. With ``names``, only tasks of those names
        qualify (a worker never claims what it cannot run). Tasks named in
        ``process_names`` are marked as running in a child process (their
        cancellation is enforced); the others as running in a thread. Each claim
        carries its task's queue, priority and ``created_at``, and ``claimed_at =
        now``, the time of the RUNNING line its claim writes in the history, and
        ``started_at = now``.

        With ``ahead``, up to ``ahead`` more tasks after those, in the same step and
        order, only from queues with no stored limit (no concurrency, no rate, not
        paused), and within ``queues`` if given (up to ``ahead`` of each): claimed
        ahead, to wait in the worker for a slot, with ``started_at`` None.
        """
        ...

    def heartbeat(
        self, owner: str, claims: Sequence[Claim], now: datetime, lease: timedelta
    ) -> list[LeaseStatus]:
        """Extend every still-valid claim to ``now + lease`` in one step, and mark the
        worker ``owner`` seen at ``now`` (if it registered) in the same step: with no
        claims, that alone.

        The result is in task id order; claims missing from it were lost.
        """
        ...

    def check_leases(self, owner: str, claims: Sequence[Claim], now: datetime) -> list[LeaseStatus]:
        """What :meth:`heartbeat` would answer, read without renewing anything.

        A read takes no write lock: a worker uses it to hear of cancel requests
        between heartbeats without queueing behind other processes' writes.
        """
        ...

    def record_and_claim(
        self,
        outcomes: Sequence[Outcome],
        now: datetime,
        *,
        owner: str,
        limit: int,
        lease: timedelta,
        names: Collection[str] | None = None,
        process_names: Collection[str] = (),
        queues: Mapping[str, int] | None = None,
        ahead: int = 0,
        started: Sequence[Claim] = (),
    ) -> tuple[list[OutcomeResult], list[Claim]]:
        """Record every outcome, then claim up to ``limit`` tasks: a worker's group commit.

        A success becomes SUCCEEDED with its result, children and effects, and
        records the task's idempotency key with the result; a failure becomes
        RETRY_WAIT due at its ``retry_at``, or FAILED when that is None or a
        cancellation was requested (a requested cancellation is never retried);
        a cancellation is recorded as :meth:`acknowledge_cancel` would. Each
        answers with the task's new state,
        None if its claim was no longer valid, or the exception its effects
        (or a cancellation nobody requested) raised, in which case nothing of
        that outcome was written. Outcomes are recorded in task id order (the
        order rows are locked in, so concurrent writers cannot deadlock; so
        children get the same ids on every backend); answers come in the order
        given. The claim is :meth:`claim`'s.

        ``started``: claims ahead whose attempts started (each with its
        ``started_at``), recorded first: a valid one whose task has no start yet
        gets ``started_at``, and its RUNNING history line that time (the attempt's
        start, which timed it).
        """
        ...

    def acknowledge_cancel(
        self, claim: Claim, now: datetime, *, detail: str = "cancellation acknowledged"
    ) -> bool:
        """RUNNING -> CANCELLED for a task whose cancellation was requested.

        False if the claim is not valid; :class:`InvalidTransitionError` if
        the claim is valid but no cancellation was requested. ``detail`` is
        the history line (a worker that terminated the task says so).
        """
        ...

    def release(self, claims: Sequence[Claim], now: datetime, *, why: str = "at shutdown") -> int:
        """Give back valid claims a stopping worker cannot finish; returns how many.

        Each goes back to PENDING, due at once, without counting the attempt;
        one whose cancellation was requested becomes CANCELLED instead. ``why``
        ends the history line ("given back by OWNER at shutdown"; a worker giving
        back a claim ahead that waited too long says so).
        """
        ...

    def request_cancel(self, task_id: int, now: datetime) -> CancelOutcome:
        """Cancel a task that has not started, or ask a running one to stop.

        For a running task: ENFORCED if its attempt runs in a child process,
        REQUESTED if in a thread.

        :class:`TaskNotFoundError` for an unknown id.
        """
        ...

    def reclaim_expired(self, now: datetime, retry_delay: RetryDelay) -> list[Reclaimed]:
        """Finalise every RUNNING task whose lease expired at or before ``now``.

        The lost attempt counts: CANCELLED if cancellation was requested, FAILED
        if attempts are exhausted, otherwise RETRY_WAIT due after
        ``retry_delay``. Re-checks state and expiry in the same step, so a task
        completed a moment earlier is never overwritten.
        """
        ...

    # -- workflows (docs/workflows.md) ---------------------------------------------------------

    def record_step(
        self,
        claim: Claim,
        position: int,
        name: str,
        result: Any,
        now: datetime,
        *,
        effects: Sequence[Effect] = (),
    ) -> bool:
        """Record a workflow step's checkpoint: ``result`` (JSON) of step ``name`` at
        ``position`` of the claim's task, by the claim's attempt, at ``now``, and run
        ``effects`` in the same transaction (SQL backends only, as :meth:`record_and_claim`
        runs a success's).

        Only under a valid claim (fenced as an outcome is: on PostgreSQL the task's row
        is locked first, so a reclaim cannot slip in between the check and the commit).
        False, with nothing written, if the claim is not valid or ``position`` is already
        recorded; an effect that raises undoes everything and propagates. The task's
        record and history do not change.
        """
        ...

    def suspend(
        self,
        claim: Claim,
        until: datetime,
        now: datetime,
        *,
        detail: str,
        signal: str | None = None,
        children: tuple[Sequence[int], int] | None = None,
    ) -> TaskState | None:
        """End a workflow's attempt without counting it: the task goes back to PENDING due
        at ``until`` (its wake time), its lease and slot given up, with the history line
        ``detail`` (what it waits for). One whose cancellation was requested becomes
        CANCELLED instead. None, with nothing written, if the claim is not valid.
        With ``signal``, a signal of that name sent to it makes it due at once
        (:meth:`send_signal`); without, what it waited for before is forgotten.
        With ``children`` ``(ids, seen)``: if more than ``seen`` of those tasks are
        finished by now (one ended while the attempt ran), it is due at ``now`` instead
        (a child's end wakes its suspended parent: see :meth:`spawn`).

        What a durable sleep does (docs/workflows.md): no worker holds the task while
        it waits, and only its due time brings it back (a claim, as any task).
        """
        ...

    def send_signal(self, task_id: int, name: str, payload: Any, now: datetime) -> int:
        """Keep a signal for the task until a wait takes it; returns its id. A task
        suspended waiting for a signal of this ``name`` becomes due at ``now`` in the same
        step (its record's ``due_at`` and ``updated_at``; no history line).

        :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError`
        for a finished task (no wait can take it any more).
        """
        ...

    def receive_signal(
        self, claim: Claim, position: int, step: str, name: str, now: datetime
    ) -> tuple[bool, Any] | None:
        """Take the oldest signal ``name`` not yet taken, for the claim's task, and record
        it as the step ``step`` at ``position`` (result ``{"payload": payload}``), in one
        step: ``(True, payload)``. ``(False, None)`` if none is waiting (nothing written);
        None if the claim is not valid or the position is recorded already. Each signal
        is taken by one wait only.
        """
        ...

    def signals(self, task_id: int) -> list[SignalRecord]:
        """Every signal sent to the task, oldest first (empty for an unknown id)."""
        ...

    def spawn(
        self, claim: Claim, position: int, step: str, tasks: Sequence[NewTask], now: datetime
    ) -> list[Submitted] | None:
        """Store ``tasks`` as children of the claim's task (as :meth:`submit` stores them,
        keys included) and record the step ``step`` at ``position`` (result ``{"ids":
        [...]}``), together, under a valid claim: a replay finds the step and never
        spawns twice. None, with nothing written, if the claim is not valid or the
        position is recorded already.

        A child created here is its parent's (:meth:`children`): when it finishes
        (any way: an outcome, a reclaim, a cancel), the same transaction makes its
        parent due at once if the parent is PENDING and due later (a suspended
        workflow waiting for its children): its ``due_at`` and ``updated_at`` become the
        time of the child's end (due at the wake, as a signal makes it), with no
        history line.
        """
        ...

    def children(self, task_id: int) -> list[int]:
        """The ids of the children the task spawned, in order (empty for an unknown id)."""
        ...

    def forget_steps(self, task_id: int, position: int) -> int:
        """Forget a finished workflow's steps from ``position`` on, so that its next run
        (``retry --from-step``) runs them again and keeps those before: their checkpoints
        are deleted and the signals their waits took are given back, to be taken again.
        Children it spawned stay. Returns how many steps were forgotten.

        :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError` for
        a live task (its attempt could be replaying them).
        """
        ...

    def steps(self, task_id: int) -> list[StepRecord]:
        """Every step checkpoint of the task, by position (empty for an unknown id)."""
        ...

    def next_wakeup(
        self,
        now: datetime,
        names: Collection[str] | None = None,
        queues: Collection[str] | None = None,
    ) -> datetime | None:
        """The earliest time after ``now`` when a claim or a reclaim could succeed: a task
        falls due (of ``names``, in ``queues``, if given), a lease expires, or a full rate
        window admits a start again."""
        ...

    def queue_limits(self) -> list[QueueLimits]:
        """Every queue known (submitted to, or given limits), with its limits, by name."""
        ...

    def put_queue(self, limits: QueueLimits, now: datetime) -> None:
        """Store a queue's limits (the queue is made if new); running workers obey them
        from their next claim."""
        ...

    def queue_info(self, now: datetime, *, finished: bool = True) -> list[QueueInfo]:
        """Every queue with its limits, tasks per state, running count and oldest wait.

        With ``finished=False`` the counts hold the live states only (PENDING,
        RUNNING, RETRY_WAIT), read through the indexes of live tasks: cheap however
        many finished tasks the history keeps (metrics read them so).
        """
        ...

    def attempt_totals(self) -> list[AttemptTotal]:
        """Every attempt ended so far, summed per queue, task name, outcome and duration
        bucket (:mod:`durablesched.totals`), in key order: monotonic, added in the very
        transaction that recorded each outcome (success, failure, retry, cancel, reclaim;
        a give-back at shutdown is no outcome), and never taken away, purges included.
        What the metrics' counters and histogram read; a read of a few rows per key.
        """
        ...

    def activity(self, since: datetime, now: datetime, bounds: Sequence[timedelta]) -> Activity:
        """What the history says happened after ``since`` and at or before ``now``.

        Per queue, the :data:`~durablesched.records.ACTIVITY_KINDS`: claims, and
        attempts that ended (a history line whose previous line in its task's
        history is the claim) succeeded, failed, retried, cancelled or reclaimed;
        reclaimed leases per worker; per task name, the attempts that ended
        (reclaims left out), their total run time in microseconds and how many ran
        at most each of ``bounds`` (increasing). Counted by the database through an
        index on the history's times: a window costs what it holds, however long
        the history is (docs/metrics.md).
        """
        ...

    # -- live workers ---------------------------------------------------------------------

    def register_worker(self, worker: WorkerInfo, now: datetime) -> None:
        """Store ``worker`` as given (a row of the same id is replaced: a worker
        registering again), and delete the rows of workers forgotten at ``now``
        (:meth:`prune_workers`), in one step.

        Pruning here costs nothing on the busy path (a worker registers once, at
        start) and keeps the rows bounded by the workers started in a day.
        """
        ...

    def deregister_worker(self, worker_id: str) -> bool:
        """Delete the worker's row (a clean exit); False if there was none."""
        ...

    def list_workers(self, now: datetime) -> list[WorkerInfo]:
        """Every registered worker not yet forgotten at ``now`` (see
        :meth:`WorkerInfo.forgotten`), alive or gone, by (started_at, id)."""
        ...

    def prune_workers(self, now: datetime) -> int:
        """Delete the rows of workers forgotten at ``now``: gone for longer than
        :data:`~durablesched.records.WORKER_FORGET_AFTER`. Returns how many."""
        ...

    def watch_changes(self, poll_interval: float = 0.01) -> ChangeWatcher | None:
        """A watcher for commits by other processes, or None if there can be none.

        ``poll_interval`` is how often it looks where it cannot be told.

        Workers use it to pick up tasks submitted elsewhere without reading the
        tasks table in a loop. Each caller gets its own watcher.
        """
        ...

    def watch_finished(self) -> FinishWatcher | None:
        """A watcher told when tasks finish, or None if this store cannot tell (waiting
        handles then read at a bounded interval). Each caller gets its own watcher."""
        ...

    def close(self) -> None:
        """Release connections and files. The store is unusable afterwards."""
        ...


class Operator(Protocol):
    """What the CLI and operators' tools need of a durable store besides :class:`Store`.

    Implemented by the SQL backends; the in-memory backend has no operator (it
    offers :meth:`check` alone, with the same answers).
    """

    #: Transactions that found the database busy and were retried (a sign of contention).
    busy_retries: int
    #: The schema's Alembic revision, as the store found (or migrated) it.
    schema_revision: str

    def requeue(self, task_id: int, now: datetime, from_step: int | None = None) -> None:
        """FAILED or CANCELLED back to PENDING, due ``now``, with a fresh attempt budget.
        With ``from_step``, a workflow's steps from that position on are forgotten in the
        same transaction (``retry --from-step``; see ``forget_steps``): a refused requeue
        forgets none.

        :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError`
        for a task in any other state.
        """
        ...

    def stats(self, now: datetime) -> QueueStats:
        """Counts per state, the oldest overdue task, running leases, recent failures."""
        ...

    def check(self, now: datetime, *, overdue_after: timedelta = OVERDUE_AFTER) -> HealthReport:
        """What is wrong, each with what to do; nothing changes.

        The database's own integrity (SQLite's ``integrity_check``; on PostgreSQL,
        that its tables and indexes exist and are valid), its schema revision
        against this release's, RUNNING tasks whose lease expired at or before
        ``now`` (a worker should reclaim them), and claimable tasks due more than
        ``overdue_after`` before ``now`` that nobody claimed. Healthy if it finds
        nothing; a damaged database is a finding, not an exception.
        """
        ...

    def purge(self, before: datetime, *, batch: int = 10_000) -> int:
        """Delete finished tasks finished before ``before``, ``batch`` at a time; returns
        how many. Live tasks are never deleted."""
        ...

    # -- moving live tasks to another database: durablesched.store.move drives these --

    def instance(self) -> int:
        """This database's random identity, made by its migrations."""
        ...

    def hand_over(
        self, destination: int, now: datetime, *, after: int = 0, batch: int = 500
    ) -> list[tuple[TaskRecord, TaskState]]:
        """Take up to ``batch`` live tasks with ids above ``after`` out of this database:
        each becomes CANCELLED here with a history line naming ``destination``, and
        comes back with the state it had."""
        ...

    def in_transit(self, destination: int) -> list[tuple[TaskRecord, TaskState]]:
        """Tasks handed over to ``destination`` whose arrival was never confirmed."""
        ...

    def confirm_move(
        self, destination: int, moved: Sequence[tuple[TaskRecord, TaskState, int]]
    ) -> None:
        """Rewrite each hand-over line to say which task it became there."""
        ...

    def receive(
        self, source: int, moved: Sequence[tuple[TaskRecord, TaskState]], now: datetime
    ) -> list[tuple[int, str]]:
        """Store tasks handed over by database ``source``, each at most once ever; for
        each, its id here and how it arrived: "copied", "already" (by an earlier run cut
        short) or "key" (a task holding its idempotency key was there)."""
        ...


class Console(Protocol):
    """What a dashboard needs of a store besides :class:`Store`: a page of a filtered
    task list, per-minute counts of a window of history, and deleting a finished task.

    Every backend implements it (the in-memory one too). Each read is bounded by an
    index in the SQL backends (docs/dashboard.md, "Speed").
    """

    def find_tasks(self, query: TaskQuery, limit: int) -> list[TaskRecord]:
        """Up to ``limit`` tasks matching ``query``, newest first: ``(created_at, id)``
        descending, from just after ``query.before`` if given (keyset pagination); with
        ``query.after``, the ``limit`` oldest tasks newer than it, newest first."""
        ...

    def minute_counts(self, since: datetime, now: datetime) -> list[MinuteCounts]:
        """Attempts that ended after ``since`` and at or before ``now``, per minute of
        their end (UTC), oldest first; minutes with none are left out.

        Read from the history through its index on time: an hour costs what it holds.
        """
        ...

    def delete_task(self, task_id: int) -> None:
        """Delete a finished task (SUCCEEDED, FAILED or CANCELLED) with its history and
        recorded key, as ``purge`` deletes old ones; a schedule's fire that made it
        stays, naming no task.

        :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError`
        for a live task (cancel it first).
        """
        ...


class DurableStore(Store, Operator, Console, Protocol):
    """A database-backed store, as :func:`durablesched.open_store` opens one."""
