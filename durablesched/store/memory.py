"""The in-memory backend: a heap ordered by (due_at, seq) and a registry by task id.

Every task is lost when the process exits. It exists for tests and for parity:
the contract suite runs against it and the SQLite backend alike.
"""

from __future__ import annotations

import heapq
import json
import threading
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from durablesched.errors import (
    InvalidTransitionError,
    LeaseExpired,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from durablesched.queues import QueueInfo, QueueLimits, Rate, rate_frees_at
from durablesched.records import (
    DEFAULT_QUEUE,
    FINDING_IDS,
    OVERDUE_AFTER,
    SUBMITTED,
    Activity,
    CancelOutcome,
    Claim,
    DurationCounts,
    Environment,
    ErrorInfo,
    Finding,
    Finished,
    HealthReport,
    LeaseStatus,
    MinuteCounts,
    NewTask,
    Outcome,
    OutcomeResult,
    Reclaimed,
    SignalSend,
    Submitted,
    TaskEvent,
    TaskQuery,
    TaskRecord,
    WorkerInfo,
    effective_key,
    reclaim_owner,
    split_trace,
)
from durablesched.schedules.declaration import (
    Fired,
    Origin,
    Schedule,
    ScheduleInfo,
    ScheduleStatus,
)
from durablesched.schedules.firing import PlannedFire, due_fires, run_now
from durablesched.schedules.sync import conflict, not_found, sync_plan
from durablesched.states import CLAIMABLE, KEY_HOLDING, TERMINAL, TaskState, check_transition
from durablesched.store.memory_workflows import MemoryWorkflows
from durablesched.store.protocol import (
    Awaited,
    DBAPIConnection,
    Effect,
    OnFinished,
    RetryDelay,
)
from durablesched.totals import NO_DURATION, AttemptTotal, Tally, add, totals_of
from durablesched.totals import ended as add_ended

if TYPE_CHECKING:
    from sqlalchemy import Connection  # only in submit's signature: never given here

_HeapEntry = tuple[datetime, int, int]
#: A due task waiting in its queue: (-priority, due_at, seq, id), best first.
_ReadyEntry = tuple[int, datetime, int, int]


#: The history lines that end an attempt, as ``minute_counts`` counts them.
_ENDED = frozenset({TaskState.SUCCEEDED, TaskState.RETRY_WAIT, TaskState.FAILED})
#: Run times are counted in whole microseconds, as the SQL backends count them.
_MICROSECOND = timedelta(microseconds=1)


class MemoryStore(MemoryWorkflows):
    """A :class:`~durablesched.store.Store` held in this process's memory.

    Cancellation is lazy: a cancelled task's heap entry stays until it reaches
    the top and is skipped after a look at the registry. When stale entries
    exceed ``compact_ratio`` of the heap (and the heap has at least
    ``compact_min`` entries), the heap is rebuilt from the live tasks, so its
    size stays O(claimable tasks) at an amortised O(1) per cancellation.
    """

    def __init__(self, *, compact_ratio: float = 0.5, compact_min: int = 64) -> None:
        super().__init__()
        self._lock = threading.Lock()
        #: Tasks not yet due, by due time; claim() moves the due ones to their queue's
        #: ready heap, in (priority desc, due_at, seq) order.
        self._heap: list[_HeapEntry] = []
        self._ready: dict[str, list[_ReadyEntry]] = {}
        #: The latest time a claim made tasks ready at: ready entries are due by then,
        #: and only a caller behind it can find one still to come.
        self._promoted_until: datetime | None = None
        #: Stale entries in both kinds of heap together.
        self._stale = 0
        #: Every queue a task was submitted to or limits were set for, and the limits.
        self._queues: dict[str, QueueLimits] = {DEFAULT_QUEUE: QueueLimits(DEFAULT_QUEUE)}
        #: Ended attempts, added with each outcome (``durablesched.totals``).
        self._totals: Tally = {}
        #: Every task ever submitted with a limit key, by (queue, key); and the head of each
        #: key of a queue with a concurrency per key: the key's one claimable task the
        #: claim may take (migration 0013 says when it changes).
        self._by_key: dict[tuple[str, str], set[int]] = {}
        self._heads: dict[tuple[str, str], int] = {}
        #: Keys whose rate window is full, until when; and each rated key's starts.
        self._key_blocked: dict[tuple[str, str], datetime] = {}
        self._key_starts: dict[tuple[str, str], list[datetime]] = {}
        #: Debounce keys of PENDING tasks never started, and how late each may be pushed.
        self._debounced: dict[str, int] = {}
        self._debounce_until: dict[int, datetime | None] = {}
        #: Start times each rate-limited queue's window still remembers.
        self._starts: dict[str, list[datetime]] = {}
        self._tasks: dict[int, TaskRecord] = {}
        self._events: dict[int, list[TaskEvent]] = {}
        self._running: set[int] = set()
        self._keys: dict[str, int] = {}
        #: The idempotency_keys table: key -> (task id, recorded at, result).
        self.recorded_keys: dict[str, tuple[int, datetime, Any]] = {}
        self._next_id = 1
        self._compact_ratio = compact_ratio
        self._compact_min = compact_min
        self.compactions = 0
        #: Schedules by name, and their fires by (name, fire time): (task id, skipped).
        self._schedules: dict[str, _StoredSchedule] = {}
        self._fires: dict[tuple[str, datetime], tuple[int | None, str | None]] = {}
        self._latest_fire: dict[str, datetime] = {}
        #: The latest fire of each schedule that made a task: (fire time, task id).
        self._latest_task: dict[str, tuple[datetime, int]] = {}
        #: Registered workers by id.
        self._workers: dict[str, WorkerInfo] = {}
        #: Told of every task that finishes (watch_finished), under the lock.
        self._on_finished: list[OnFinished] = []

    # -- introspection for tests and docs --------------------------------------------------

    @property
    def heap_size(self) -> int:
        return len(self._heap) + sum(map(len, self._ready.values()))

    @property
    def stale_entries(self) -> int:
        return self._stale

    # -- Store -------------------------------------------------------------------------------

    def submit(
        self,
        tasks: Sequence[NewTask],
        now: datetime,
        *,
        connection: Connection | DBAPIConnection | None = None,
    ) -> list[Submitted]:
        if connection is not None:
            raise UnsupportedOperationError(
                "the in-memory backend has no database transaction to submit in"
            )
        with self._lock:
            return [self._insert(task, now) for task in tasks]

    def get(self, task_id: int) -> TaskRecord | None:
        with self._lock:
            return self._tasks.get(task_id)

    def history(self, task_id: int) -> list[TaskEvent]:
        with self._lock:
            return list(self._events.get(task_id, ()))

    def latest_events(self, task_ids: Collection[int]) -> dict[int, TaskEvent]:
        with self._lock:
            return {i: self._events[i][-1] for i in set(task_ids) if self._events.get(i)}

    def finished(self, task_ids: Collection[int]) -> dict[int, Finished | None]:
        found: dict[int, Finished | None] = {}
        with self._lock:
            for task_id in task_ids:
                task = self._tasks.get(task_id)
                if task is None:
                    found[task_id] = None
                elif task.state in TERMINAL:
                    found[task_id] = Finished.of(task)
        return found

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        name: str | None = None,
        limit: int = 100,
        queue: str | None = None,
    ) -> list[TaskRecord]:
        with self._lock:
            rows = [
                t
                for t in self._tasks.values()
                if (state is None or t.state == state)
                and (name is None or t.name == name)
                and (queue is None or t.queue == queue)
            ]
        rows.sort(key=lambda t: (t.due_at, t.seq))
        return rows[:limit]

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
        with self._lock:
            self._promote(now)
            rated: dict[str, Rate] = {}
            if limit > 0 and (names is None or names):
                rated = dict(self._unblock_keys(limit, now, queues))
            claims = self._claim_some(
                owner,
                limit,
                now,
                lease,
                self._allowances(limit, now, queues),
                names=names,
                process_names=process_names,
            )
            for claim in claims:
                limit_key = self._tasks[claim.task_id].limit_key
                rate = rated.get(claim.queue)
                if limit_key is not None and rate is not None:
                    self._count_key_start(claim.queue, limit_key, rate, now)
            if ahead > 0:
                # Waiting in the worker: never from a limited queue, whose concurrency
                # or rate window would count it from its claim, not its start.
                wanted = self._allowances(
                    ahead, now, None if queues is None else {q: ahead for q in queues}
                )
                unlimited = {
                    q: n
                    for q, n in wanted.items()
                    if q not in self._queues or not self._queues[q].limited
                }
                claims += self._claim_some(
                    owner,
                    ahead,
                    now,
                    lease,
                    unlimited,
                    names=names,
                    process_names=process_names,
                    started=False,
                )
        return claims

    def _claim_some(
        self,
        owner: str,
        limit: int,
        now: datetime,
        lease: timedelta,
        allowed: dict[str, int],
        *,
        names: Collection[str] | None,
        process_names: Collection[str],
        started: bool = True,
    ) -> list[Claim]:
        claims: list[Claim] = []
        skipped: dict[str, list[_ReadyEntry]] = {}
        #: Limit keys claimed from in this call: one claim takes at most one task of a
        #: key (the head it found), as the SQL claim's one statement does.
        keys_taken: set[tuple[str, str]] = set()
        while len(claims) < limit:
            heads = [(self._ready[q][0], q) for q, n in allowed.items() if n and self._ready[q]]
            if not heads:
                break
            entry, queue = min(heads)
            heapq.heappop(self._ready[queue])
            task = self._live_ready(entry)
            if task is None:
                self._stale -= 1
                continue
            if (
                (names is not None and task.name not in names)
                or task.due_at > now
                or self._held_back(task)
                or (task.limit_key is not None and (queue, task.limit_key) in keys_taken)
                or self._key_window_full(task, now)
            ):
                # Another name, or made ready by a claim at a later time (its caller
                # read the clock after this one's): not due at this claim's time.
                skipped.setdefault(queue, []).append(entry)
                continue
            allowed[queue] -= 1
            if task.limit_key is not None and self._heads.get(key := (queue, task.limit_key)):
                keys_taken.add(key)
            if queue in self._starts:
                self._starts[queue].append(now)
            claims.append(
                self._start(task, owner, now, lease, task.name in process_names, started=started)
            )
        for queue, entries in skipped.items():
            for entry in entries:
                heapq.heappush(self._ready[queue], entry)
        return claims

    def heartbeat(
        self, owner: str, claims: Sequence[Claim], now: datetime, lease: timedelta
    ) -> list[LeaseStatus]:
        renewed: list[LeaseStatus] = []
        with self._lock:
            seen = self._workers.get(owner)
            if seen is not None:
                self._workers[owner] = replace(seen, last_seen=now)
            for claim in sorted(claims, key=lambda c: c.task_id):
                task = self._valid(claim, owner, now)
                if task is None or (renewed and renewed[-1].task_id == task.id):
                    continue  # lost, or the same claim given twice: one status per task
                task = self._put(replace(task, lease_expires_at=now + lease, updated_at=now))
                renewed.append(
                    LeaseStatus(
                        task.id,
                        task.fence,
                        now + lease,
                        task.cancel_requested_at is not None,
                    )
                )
        return renewed

    def check_leases(self, owner: str, claims: Sequence[Claim], now: datetime) -> list[LeaseStatus]:
        with self._lock:
            valid = [self._valid(c, owner, now) for c in sorted(claims, key=lambda c: c.task_id)]
        # One status per task, as heartbeat answers, even for a claim given twice.
        unique = {t.id: t for t in valid if t is not None and t.lease_expires_at is not None}
        return [
            LeaseStatus(t.id, t.fence, t.lease_expires_at, t.cancel_requested_at is not None)
            for t in unique.values()
            if t.lease_expires_at is not None
        ]

    def complete(
        self,
        claim: Claim,
        result: Any,
        now: datetime,
        *,
        children: Sequence[NewTask] = (),
        effects: Sequence[Effect] = (),
        signals: Sequence[SignalSend] = (),
    ) -> bool:
        """As :meth:`SQLStore.complete <durablesched.store.sql.store.SQLStore.complete>`;
        effects are refused (no database). Also the in-memory group commit's step."""
        if effects:
            raise UnsupportedOperationError(
                "the in-memory backend has no database: effects registered with "
                "on_success() need the SQLite backend"
            )
        with self._lock:
            task = self._valid(claim, claim.owner, now)
            if task is None:
                return False
            for sent in signals:  # all or nothing: checked before anything changes
                refused = self._signal_refused(sent.task_id, finishing=task.id)
                if refused is not None:
                    raise refused
            for child in children:
                self._insert(child, now)
            self._finish(task, TaskState.SUCCEEDED, now, result=result)
            for sent in signals:
                self._deliver(sent.task_id, sent.name, sent.payload, now)
            add_ended(self._totals, claim, TaskState.SUCCEEDED, now)
            key = effective_key(task.id, task.idempotency_key)
            self.recorded_keys.setdefault(key, (task.id, now, result))
            return True

    def fail(
        self, claim: Claim, error: ErrorInfo, retry_at: datetime | None, now: datetime
    ) -> TaskState | None:
        """As :meth:`SQLStore.fail <durablesched.store.sql.store.SQLStore.fail>`."""
        with self._lock:
            task = self._valid(claim, claim.owner, now)
            if task is None:
                return None
            if retry_at is None or task.cancel_requested_at is not None:
                self._finish(task, TaskState.FAILED, now, error=error)
                add_ended(self._totals, claim, TaskState.FAILED, now)
                return TaskState.FAILED
            self._retry_later(task, retry_at, now, error, detail=error.message)
            add_ended(self._totals, claim, TaskState.RETRY_WAIT, now)
            return TaskState.RETRY_WAIT

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
        if started:
            self._record_starts(started, now)
        results: list[OutcomeResult] = [None] * len(outcomes)
        for index in sorted(range(len(outcomes)), key=lambda i: outcomes[i].claim.task_id):
            try:
                results[index] = self._record(outcomes[index], now)
            except (InvalidTransitionError, UnsupportedOperationError, TaskNotFoundError) as e:
                results[index] = e  # nothing of it was written
        claims = (
            self.claim(
                owner,
                limit,
                now,
                lease,
                names,
                process_names=process_names,
                queues=queues,
                ahead=ahead,
            )
            if limit > 0 or ahead > 0
            else []
        )
        return results, claims

    def _record_starts(self, started: Sequence[Claim], now: datetime) -> None:
        with self._lock:
            for claim in sorted(started, key=lambda c: c.task_id):
                task = self._valid(claim, claim.owner, now)
                if task is None or task.started_at is not None or claim.started_at is None:
                    continue
                self._put(replace(task, started_at=claim.started_at))
                events = self._events[task.id]
                last = max(i for i, e in enumerate(events) if e.state is TaskState.RUNNING)
                events[last] = replace(events[last], at=claim.started_at)

    def _record(self, outcome: Outcome, now: datetime) -> TaskState | None:
        if outcome.error is not None:
            return self.fail(outcome.claim, outcome.error, outcome.retry_at, now)
        if outcome.cancelled:
            return TaskState.CANCELLED if self.acknowledge_cancel(outcome.claim, now) else None
        done = self.complete(
            outcome.claim,
            outcome.result,
            now,
            children=outcome.children,
            effects=outcome.effects,
            signals=outcome.signals,
        )
        return TaskState.SUCCEEDED if done else None

    def acknowledge_cancel(
        self, claim: Claim, now: datetime, *, detail: str = "cancellation acknowledged"
    ) -> bool:
        with self._lock:
            task = self._valid(claim, claim.owner, now)
            if task is None:
                return False
            if task.cancel_requested_at is None:
                raise InvalidTransitionError(
                    f"task {task.id} cannot acknowledge a cancellation nobody requested"
                )
            self._finish(task, TaskState.CANCELLED, now, detail=detail)
            add_ended(self._totals, claim, TaskState.CANCELLED, now)
            return True

    def release(self, claims: Sequence[Claim], now: datetime, *, why: str = "at shutdown") -> int:
        released = 0
        with self._lock:
            for claim in claims:
                task = self._valid(claim, claim.owner, now)
                if task is None:
                    continue
                released += 1
                if task.cancel_requested_at is not None:
                    self._finish(task, TaskState.CANCELLED, now, detail=f"cancelled {why}")
                    continue
                check_transition(task.state, TaskState.PENDING, operator=True)
                task = self._put(
                    replace(
                        task,
                        state=TaskState.PENDING,
                        attempts=task.attempts - 1,
                        lease_owner=None,
                        lease_expires_at=None,
                        updated_at=now,
                    )
                )
                self._running.discard(task.id)
                heapq.heappush(self._heap, (task.due_at, task.seq, task.id))
                self._event(task, now, f"given back by {claim.owner} {why}")
        return released

    def request_cancel(self, task_id: int, now: datetime) -> CancelOutcome:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            if task.state in TERMINAL:
                return CancelOutcome.TOO_LATE
            if task.state in CLAIMABLE:
                # The heap entry stays behind, stale, until claim or compaction.
                self._finish(task, TaskState.CANCELLED, now, detail="cancelled before start")
                self._stale += 1
                self._maybe_compact()
                return CancelOutcome.CANCELLED
            if task.cancel_requested_at is None:
                self._put(replace(task, cancel_requested_at=now, updated_at=now))
            if task.environment == Environment.PROCESS:
                return CancelOutcome.ENFORCED
            return CancelOutcome.REQUESTED

    def reclaim_expired(self, now: datetime, retry_delay: RetryDelay) -> list[Reclaimed]:
        reclaimed: list[Reclaimed] = []
        with self._lock:
            for task_id in sorted(self._running):
                task = self._tasks[task_id]
                assert task.lease_expires_at is not None and task.lease_owner is not None
                if task.lease_expires_at > now:
                    continue
                owner = task.lease_owner
                detail = (
                    f"lease of {owner} expired at {task.lease_expires_at.isoformat()} "
                    f"during attempt {task.attempts}"
                )
                error = ErrorInfo.recorded(LeaseExpired, detail)
                if task.cancel_requested_at is not None:
                    state = TaskState.CANCELLED
                    self._finish(task, state, now, error=error, detail=detail)
                elif task.attempts >= task.max_attempts:
                    state = TaskState.FAILED
                    self._finish(task, state, now, error=error, detail=detail)
                else:
                    state = TaskState.RETRY_WAIT
                    due = now + retry_delay(task.name, task.attempts)
                    self._retry_later(task, due, now, error, detail=detail)
                reclaimed.append(Reclaimed(task.id, task.name, task.attempts, owner, state))
                add(self._totals, (task.queue, task.name, "reclaimed", NO_DURATION), 0)
        return reclaimed

    def attempt_totals(self) -> list[AttemptTotal]:
        with self._lock:
            return totals_of(self._totals)

    def next_wakeup(
        self,
        now: datetime,
        names: Collection[str] | None = None,
        queues: Collection[str] | None = None,
    ) -> datetime | None:
        with self._lock:
            while self._heap and self._live_entry(self._heap[0]) is None:
                heapq.heappop(self._heap)
                self._stale -= 1
            top = self._heap[0] if self._heap else None
            if (
                top is not None
                and top[0] > now
                and (names is None or self._tasks[top[2]].name in names)
                and (queues is None or self._tasks[top[2]].queue in queues)
            ):
                due: datetime | None = top[0]
            else:
                # Due tasks sit on top that this caller did not claim, or the first
                # task to come is of another name or queue: only then is a full scan needed.
                due = min(
                    (
                        entry[0]
                        for entry in self._heap
                        if entry[0] > now
                        and (task := self._live_entry(entry)) is not None
                        and (names is None or task.name in names)
                        and (queues is None or task.queue in queues)
                    ),
                    default=None,
                )
            if self._promoted_until is not None and now < self._promoted_until:
                # A claim at a later time made tasks ready that are still to come at
                # ``now`` (its caller read the clock after this one's).
                late = (
                    entry[1]
                    for entries in self._ready.values()
                    for entry in entries
                    if entry[1] > now
                    and (task := self._live_ready(entry)) is not None
                    and (names is None or task.name in names)
                    and (queues is None or task.queue in queues)
                )
                due = min((t for t in (due, *late) if t is not None), default=None)
            rates = [
                frees
                for q, limits in self._queues.items()
                if (queues is None or q in queues)
                and (frees := limits.rate_frees_at(self._starts.get(q, []), now)) is not None
            ]
            rates += [
                until
                for (q, _), until in self._key_blocked.items()
                if until > now and (queues is None or q in queues)
            ]
            leases = [
                t.lease_expires_at
                for t in (self._tasks[i] for i in self._running)
                if t.lease_expires_at is not None and t.lease_expires_at > now
            ]
        if due is not None:
            leases.append(due)
        return min(leases + rates, default=None)

    # -- queues --------------------------------------------------------------------------------

    def queue_limits(self) -> list[QueueLimits]:
        with self._lock:
            return sorted(self._queues.values(), key=lambda q: q.name)

    def put_queue(self, limits: QueueLimits, now: datetime) -> None:
        with self._lock:
            before = self._queues.get(limits.name)
            self._queues[limits.name] = limits
            if (before.key_cap if before is not None else None) != limits.key_cap:
                # As SQL_FORGET_KEYS and SQL_TOUCH_KEYS do: heads chosen afresh.
                for q, key in list(self._heads):
                    if q == limits.name:
                        del self._heads[(q, key)]
                for q, key in list(self._key_blocked):
                    if q == limits.name:
                        del self._key_blocked[(q, key)]
                for q, key in sorted(self._by_key, key=lambda k: min(self._by_key[k], default=0)):
                    if q == limits.name:
                        self._sync_key(q, key)
            if limits.rate is None:
                self._starts.pop(limits.name, None)
            else:
                self._starts.setdefault(limits.name, [])

    def queue_info(self, now: datetime, *, finished: bool = True) -> list[QueueInfo]:
        shown = [s for s in TaskState if finished or s not in TERMINAL]
        with self._lock:
            infos: dict[str, QueueInfo] = {
                q.name: QueueInfo(
                    name=q.name,
                    paused=q.paused,
                    concurrency=q.concurrency,
                    rate=None if q.rate is None else str(q.rate),
                    concurrency_per_key=q.concurrency_per_key,
                    rate_per_key=None if q.rate_per_key is None else str(q.rate_per_key),
                    keys_at_limit=0,
                    counts={state.value: 0 for state in shown},
                    running=0,
                    oldest_waiting_seconds=None,
                    waiting=0,
                )
                for q in self._queues.values()
            }
            for task in self._tasks.values():
                if not finished and task.state in TERMINAL:
                    continue
                info = infos[task.queue]
                info["counts"][task.state.value] += 1
                if task.state is TaskState.RUNNING:
                    info["waiting" if task.started_at is None else "running"] += 1
                elif task.state in CLAIMABLE and task.due_at <= now:
                    waited = (now - task.due_at).total_seconds()
                    oldest = info["oldest_waiting_seconds"]
                    info["oldest_waiting_seconds"] = (
                        waited if oldest is None else max(oldest, waited)
                    )
            for (queue, _), ids in self._by_key.items():
                cap = self._queues[queue].concurrency_per_key
                running = sum(
                    1 for i in ids if i in self._tasks and self._tasks[i].state is TaskState.RUNNING
                )
                if (cap is not None and running >= cap) or (queue, _) in self._key_blocked:
                    infos[queue]["keys_at_limit"] += 1
        return [infos[name] for name in sorted(infos)]

    def check(self, now: datetime, *, overdue_after: timedelta = OVERDUE_AFTER) -> HealthReport:
        """As :meth:`Operator.check <durablesched.store.protocol.Operator.check>`: expired
        leases, overdue tasks and schedules (memory has no file or schema to check)."""
        with self._lock:
            expired = sorted(
                (t.lease_expires_at, t.id)
                for t in (self._tasks[i] for i in self._running)
                if t.lease_expires_at is not None and t.lease_expires_at <= now
            )
            paused = {q for q, limits in self._queues.items() if limits.paused}
            overdue = sorted(
                (t.due_at, t.seq, t.id)
                for t in self._tasks.values()
                if t.state in CLAIMABLE
                and t.due_at < now - overdue_after
                and t.queue not in paused  # held back by the operator, not late
            )
        findings: list[Finding] = []
        if expired:
            ids = tuple(i for _, i in expired[:FINDING_IDS])
            findings.append(Finding.expired_leases(len(expired), expired[0][0], ids, now))
        if overdue:
            ids = tuple(i for _, _, i in overdue[:FINDING_IDS])
            findings.append(Finding.overdue(len(overdue), overdue[0][0], ids, now, overdue_after))
        with self._lock:
            late = sorted(
                (row.next_fire_at, name)
                for name, row in self._schedules.items()
                if row.status == ScheduleStatus.ACTIVE and row.next_fire_at < now - overdue_after
            )
        if late:
            names = [name for _, name in late]
            findings.append(Finding.overdue_schedules(names, late[0][0], now, overdue_after))
        return HealthReport(tuple(findings))

    def activity(self, since: datetime, now: datetime, bounds: Sequence[timedelta]) -> Activity:
        limits = [b // _MICROSECOND for b in bounds]
        attempts: Counter[tuple[str, str]] = Counter()
        losses: Counter[str] = Counter()
        runs: dict[str, list[int]] = {}
        with self._lock:
            for task_id, events in self._events.items():
                task = self._tasks[task_id]
                for i, e in enumerate(events):
                    if not since < e.at <= now or e.state is TaskState.PENDING:
                        continue
                    if e.state is TaskState.RUNNING:
                        attempts[(task.queue, "started")] += 1
                        continue
                    before = events[i - 1]  # a task's first line is its submission
                    if e.state is TaskState.CANCELLED and before.state is not TaskState.RUNNING:
                        continue  # cancelled while waiting: no attempt ended
                    kind = {
                        TaskState.SUCCEEDED: "succeeded",
                        TaskState.CANCELLED: "cancelled",
                    }.get(e.state, "failed")
                    attempts[(task.queue, kind)] += 1
                    if e.state is TaskState.RETRY_WAIT:
                        attempts[(task.queue, "retried")] += 1
                    owner = reclaim_owner(e.detail)
                    if owner is not None:
                        attempts[(task.queue, "reclaimed")] += 1
                        losses[owner] += 1
                    elif before.state is TaskState.RUNNING:
                        runs.setdefault(task.name, []).append((e.at - before.at) // _MICROSECOND)
        return Activity(
            attempts=dict(attempts),
            lease_losses=dict(losses),
            durations={
                name: DurationCounts(
                    len(us), sum(us), tuple(sum(1 for u in us if u <= b) for b in limits)
                )
                for name, us in runs.items()
            },
        )

    # -- Console: what a dashboard reads and deletes --------------------------------------------

    def find_tasks(self, query: TaskQuery, limit: int) -> list[TaskRecord]:
        with self._lock:
            rows = [t for t in self._tasks.values() if query.matches(t)]
        rows.sort(key=lambda t: (t.created_at, t.id), reverse=query.after is None)
        if query.after is None:
            return rows[: max(limit, 0)]
        return rows[: max(limit, 0)][::-1]  # the oldest after the cursor, newest first

    def minute_counts(self, since: datetime, now: datetime) -> list[MinuteCounts]:
        counts: dict[datetime, list[int]] = {}
        with self._lock:
            for events in self._events.values():
                for e in events:
                    if not since < e.at <= now or e.state not in _ENDED:
                        continue
                    minute = e.at.astimezone(UTC).replace(second=0, microsecond=0)
                    pair = counts.setdefault(minute, [0, 0])
                    pair[e.state is not TaskState.SUCCEEDED] += 1
        return [MinuteCounts(m, *counts[m]) for m in sorted(counts)]

    def delete_task(self, task_id: int) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            if task.state not in TERMINAL:
                raise InvalidTransitionError(
                    f"task {task_id} is {task.state}: only a finished task (SUCCEEDED, FAILED "
                    "or CANCELLED) can be deleted; cancel it first"
                )
            del self._tasks[task_id]
            del self._events[task_id]
            self._forget_workflow(task_id)
            key = task.idempotency_key
            if key is not None and self._keys.get(key) == task_id:
                del self._keys[key]
            for recorded, (holder, _, _) in list(self.recorded_keys.items()):
                if holder == task_id:
                    del self.recorded_keys[recorded]
            # A fire that made it stays, naming no task (SQL's ON DELETE SET NULL).
            for fire, (made, skipped) in list(self._fires.items()):
                if made == task_id:
                    self._fires[fire] = (None, skipped)
            for name, (_, made) in list(self._latest_task.items()):
                if made == task_id:
                    self._latest_task.pop(name)
                    left = [(at, i) for (n, at), (i, _) in self._fires.items() if n == name and i]
                    if left:
                        self._latest_task[name] = max(left)

    # -- live workers ---------------------------------------------------------------------

    def register_worker(self, worker: WorkerInfo, now: datetime) -> None:
        with self._lock:
            self._prune_workers(now)
            self._workers[worker.id] = replace(
                worker, queues=None if worker.queues is None else dict(worker.queues)
            )

    def deregister_worker(self, worker_id: str) -> bool:
        with self._lock:
            return self._workers.pop(worker_id, None) is not None

    def list_workers(self, now: datetime) -> list[WorkerInfo]:
        with self._lock:
            held: Counter[tuple[str | None, bool]] = Counter(
                (t.lease_owner, t.started_at is None)
                for t in map(self._tasks.__getitem__, self._running)
            )
            workers = [
                replace(w, running=held[w.id, False], waiting=held[w.id, True])
                for w in self._workers.values()
                if not w.forgotten(now)
            ]
        return sorted(workers, key=lambda w: (w.started_at, w.id))

    def prune_workers(self, now: datetime) -> int:
        with self._lock:
            return self._prune_workers(now)

    def _prune_workers(self, now: datetime) -> int:
        forgotten = [w.id for w in self._workers.values() if w.forgotten(now)]
        for worker_id in forgotten:
            del self._workers[worker_id]
        return len(forgotten)

    def watch_changes(self, poll_interval: float = 0.01) -> None:
        """No other process can write here: in-process notifications are enough."""
        return None

    def watch_finished(self) -> MemoryFinishWatcher:
        """Told by this store itself, as each task finishes."""
        return MemoryFinishWatcher(self)

    def _watch_finished(self, on_finished: OnFinished, watching: bool) -> None:
        with self._lock:
            if watching:
                self._on_finished.append(on_finished)
            elif on_finished in self._on_finished:
                self._on_finished.remove(on_finished)

    def close(self) -> None:
        """Nothing to release; the tasks vanish with the process."""

    # -- schedules (ScheduleStore) -------------------------------------------------------------

    def sync_schedules(
        self, declared: Sequence[Schedule], now: datetime, tasks: Collection[str]
    ) -> dict[str, str]:
        with self._lock:
            stored = {name: (s.schedule, s.status, s.origin) for name, s in self._schedules.items()}
            changes = sync_plan(stored, declared, tasks)
            for name, (_change, schedule, status) in changes.items():
                row = self._schedules.get(name)
                if row is None:
                    assert schedule is not None
                    self._schedules[name] = _StoredSchedule(
                        schedule, status, Origin.CODE, schedule.times().next_after(now), now, now
                    )
                    continue
                if schedule is not None:
                    if not schedule.same_timing(row.schedule):
                        row.next_fire_at = schedule.times().next_after(now)
                    row.schedule = schedule
                    row.origin = Origin.CODE
                row.status = status
                row.updated_at = now
            return {name: change for name, (change, _, _) in changes.items()}

    def add_schedule(self, schedule: Schedule, now: datetime) -> bool:
        with self._lock:
            row = self._schedules.get(schedule.name)
            if row is not None:
                if row.schedule != schedule:
                    raise conflict(schedule.name)
                return False
            self._schedules[schedule.name] = _StoredSchedule(
                schedule,
                ScheduleStatus.ACTIVE,
                Origin.OPERATOR,
                schedule.times().next_after(now),
                now,
                now,
            )
            return True

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> ScheduleInfo:
        with self._lock:
            row = self._schedule_row(name)
            if paused and row.status != ScheduleStatus.PAUSED:
                row.status = ScheduleStatus.PAUSED
                row.updated_at = now
            elif not paused and row.status != ScheduleStatus.ACTIVE:
                row.status = ScheduleStatus.ACTIVE
                row.next_fire_at = row.schedule.times().next_after(now)
                row.updated_at = now
            return self._schedule_info(row)

    def remove_schedule(self, name: str) -> None:
        with self._lock:
            self._schedule_row(name)
            del self._schedules[name]
            for key in [k for k in self._fires if k[0] == name]:
                del self._fires[key]
            self._latest_fire.pop(name, None)
            self._latest_task.pop(name, None)

    def list_schedules(self) -> list[ScheduleInfo]:
        with self._lock:
            return [self._schedule_info(self._schedules[n]) for n in sorted(self._schedules)]

    def fire_schedules(self, now: datetime, *, limit: int = 100) -> list[Fired]:
        fired: list[Fired] = []
        with self._lock:
            due = sorted(
                (row.next_fire_at, name)
                for name, row in self._schedules.items()
                if row.status == ScheduleStatus.ACTIVE and row.next_fire_at <= now
            )[:limit]
            for _, name in due:
                row = self._schedules[name]
                previous = self._latest_task.get(name)
                state = None if previous is None else self._tasks[previous[1]].state
                fires, row.next_fire_at = due_fires(row.schedule, row.next_fire_at, now, state)
                for fire in fires:
                    done = self._record_fire(name, fire, now)
                    if done is not None:
                        fired.append(done)
        return fired

    def fire_schedule_now(self, name: str, now: datetime) -> Fired:
        with self._lock:
            row = self._schedule_row(name)
            done = self._record_fire(name, run_now(row.schedule, now), now)
            if done is None:  # run-now twice at one instant: the first stands
                task_id, skipped = self._fires[(name, now)]
                return Fired(name, now, False, task_id, skipped)
            return done

    def next_fire_time(self) -> datetime | None:
        with self._lock:
            return min(
                (
                    row.next_fire_at
                    for row in self._schedules.values()
                    if row.status == ScheduleStatus.ACTIVE
                ),
                default=None,
            )

    def _schedule_row(self, name: str) -> _StoredSchedule:
        row = self._schedules.get(name)
        if row is None:
            raise not_found(name)
        return row

    def _last_fire(self, name: str) -> tuple[datetime, int | None, str | None] | None:
        at = self._latest_fire.get(name)
        if at is None:
            return None
        task_id, skipped = self._fires[(name, at)]
        return at, task_id, skipped

    def _record_fire(self, name: str, fire: PlannedFire, now: datetime) -> Fired | None:
        """Record one fire and make its task; None if that fire was recorded before."""
        if (name, fire.at) in self._fires:
            return None
        task_id = None if fire.task is None else self._insert(fire.task, now).task_id
        self._fires[(name, fire.at)] = (task_id, fire.skipped)
        if name not in self._latest_fire or fire.at > self._latest_fire[name]:
            self._latest_fire[name] = fire.at
        if task_id is not None and (
            name not in self._latest_task or fire.at > self._latest_task[name][0]
        ):
            self._latest_task[name] = (fire.at, task_id)
        return Fired(name, fire.at, fire.catch_up, task_id, fire.skipped)

    def _schedule_info(self, row: _StoredSchedule) -> ScheduleInfo:
        last = self._last_fire(row.schedule.name)
        task_id = last[1] if last else None
        return ScheduleInfo(
            schedule=row.schedule,
            status=row.status,
            origin=row.origin,
            next_fire_at=row.next_fire_at,
            last_fire_at=last[0] if last else None,
            last_task_id=task_id,
            last_task_state=None if task_id is None else self._tasks[task_id].state,
            last_skip=last[2] if last else None,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    # -- internals (the caller holds the lock) -------------------------------------------------

    def _insert(self, new: NewTask, now: datetime) -> Submitted:
        if new.debounce_key is not None and new.debounce_key in self._debounced:
            return self._debounce(new, now)
        if new.idempotency_key is not None and new.idempotency_key in self._keys:
            holder = self._tasks[self._keys[new.idempotency_key]]
            return Submitted(holder.id, False, holder.created_at)
        task_id = self._next_id
        self._next_id += 1
        # As it would read back from a database: tuples become lists, and so on.
        args, trace = split_trace(
            json.loads(new.args_json) if new.args_json is not None else new.args
        )
        task = TaskRecord(
            id=task_id,
            seq=task_id,
            name=new.name,
            args=args,
            state=TaskState.PENDING,
            due_at=new.due_at,
            attempts=0,
            max_attempts=new.max_attempts,
            lease_owner=None,
            lease_expires_at=None,
            fence=0,
            cancel_requested_at=None,
            result=None,
            last_error=None,
            idempotency_key=new.idempotency_key,
            created_at=now,
            updated_at=now,
            finished_at=None,
            queue=new.queue,
            priority=new.priority,
            trace=trace,
            limit_key=new.limit_key,
            debounce_key=new.debounce_key,
            debounce_until=None if new.debounce_key is None else new.debounce_until,
        )
        if new.debounce_key is not None:
            self._debounced[new.debounce_key] = task_id
            self._debounce_until[task_id] = new.debounce_until
        if new.queue not in self._queues:
            self._queues[new.queue] = QueueLimits(new.queue)
        self._tasks[task_id] = task
        self._events[task_id] = [TaskEvent(task_id, now, TaskState.PENDING, 0, SUBMITTED)]
        if new.idempotency_key is not None:
            self._keys[new.idempotency_key] = task_id
        heapq.heappush(self._heap, (task.due_at, task.seq, task_id))
        if new.limit_key is not None:
            self._by_key.setdefault((new.queue, new.limit_key), set()).add(task_id)
            self._sync_key(new.queue, new.limit_key)
        return Submitted(task_id, True, now)

    def _promote(self, now: datetime) -> None:
        """Move every task due by ``now`` from the time heap to its queue's ready heap."""
        if self._promoted_until is None or now > self._promoted_until:
            self._promoted_until = now
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            task = self._live_entry(entry)
            if task is None:
                self._stale -= 1
                continue
            ready = self._ready.setdefault(task.queue, [])
            heapq.heappush(ready, (-task.priority, task.due_at, task.seq, task.id))

    def _allowances(
        self, limit: int, now: datetime, queues: Mapping[str, int] | None
    ) -> dict[str, int]:
        """How many tasks of each queue this claim may start: the caller's slots for it
        (or ``limit``), within the queue's stored limits."""
        wanted = {q: limit for q in self._ready} if queues is None else dict(queues)
        limited = {q: limits for q, limits in self._queues.items() if limits.limited}
        if not limited:
            return {q: n for q, n in wanted.items() if q in self._ready}
        running: dict[str, int] = {}
        for task_id in self._running:
            q = self._tasks[task_id].queue
            running[q] = running.get(q, 0) + 1
        allowed: dict[str, int] = {}
        for q, n in wanted.items():
            if q not in self._ready:
                continue
            limits = limited.get(q)
            if limits is not None:
                starts = self._starts.get(q)
                if starts is not None and limits.rate is not None:
                    forget = limits.rate.forget_before(now)
                    starts[:] = [t for t in starts if t > forget]
                allowed[q] = limits.allowance(n, running.get(q, 0), starts or [], now)
                continue
            allowed[q] = n
        return allowed

    def _live_ready(self, entry: _ReadyEntry) -> TaskRecord | None:
        """The task a ready entry stands for, or None if the entry is stale."""
        task = self._tasks.get(entry[3])
        if task is None or task.state not in CLAIMABLE or task.due_at != entry[1]:
            return None
        return task

    def _live_entry(self, entry: _HeapEntry) -> TaskRecord | None:
        """The task an entry stands for, or None if the entry is stale."""
        task = self._tasks.get(entry[2])
        if task is None or task.state not in CLAIMABLE or task.due_at != entry[0]:
            return None
        return task

    def _start(
        self,
        task: TaskRecord,
        owner: str,
        now: datetime,
        lease: timedelta,
        in_process: bool,
        *,
        started: bool = True,
    ) -> Claim:
        check_transition(task.state, TaskState.RUNNING)
        task = self._put(
            replace(
                task,
                environment=Environment.PROCESS if in_process else None,
                started_at=now if started else None,
                state=TaskState.RUNNING,
                attempts=task.attempts + 1,
                fence=task.fence + 1,
                lease_owner=owner,
                lease_expires_at=now + lease,
                updated_at=now,
            )
        )
        self._running.add(task.id)
        self._event(task, now, f"claimed by {owner} from queue {task.queue}")
        return Claim(
            task_id=task.id,
            name=task.name,
            args=task.args,
            attempt=task.attempts,
            max_attempts=task.max_attempts,
            owner=owner,
            fence=task.fence,
            lease_expires_at=now + lease,
            due_at=task.due_at,
            seq=task.seq,
            idempotency_key=effective_key(task.id, task.idempotency_key),
            queue=task.queue,
            trace=task.trace,
            priority=task.priority,
            created_at=task.created_at,
            claimed_at=now,
            started_at=task.started_at,
        )

    def _valid(self, claim: Claim, owner: str, now: datetime) -> TaskRecord | None:
        task = self._tasks.get(claim.task_id)
        if (
            task is None
            or task.state != TaskState.RUNNING
            or task.lease_owner != owner
            or claim.owner != owner
            or task.fence != claim.fence
            or task.lease_expires_at is None
            or task.lease_expires_at <= now
        ):
            return None
        return task

    def _retry_later(
        self, task: TaskRecord, due: datetime, now: datetime, error: ErrorInfo, *, detail: str
    ) -> None:
        check_transition(task.state, TaskState.RETRY_WAIT)
        task = self._put(
            replace(
                task,
                state=TaskState.RETRY_WAIT,
                due_at=due,
                lease_owner=None,
                lease_expires_at=None,
                last_error=error,
                updated_at=now,
            )
        )
        self._running.discard(task.id)
        heapq.heappush(self._heap, (task.due_at, task.seq, task.id))
        self._event(task, now, detail, error)

    def _finish(
        self,
        task: TaskRecord,
        state: TaskState,
        now: datetime,
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        detail: str | None = None,
    ) -> None:
        check_transition(task.state, state)
        task = self._put(
            replace(
                task,
                state=state,
                lease_owner=None,
                lease_expires_at=None,
                result=result,
                last_error=error if error is not None else task.last_error,
                updated_at=now,
                finished_at=now,
            )
        )
        self._running.discard(task.id)
        key = task.idempotency_key
        if state not in KEY_HOLDING and key is not None and self._keys.get(key) == task.id:
            del self._keys[key]
        if detail is None and error is not None:
            detail = error.message
        self._event(task, now, detail, error if state is TaskState.FAILED else None)
        self._wake_parent(task.id, now)
        for on_finished in self._on_finished:
            on_finished((task.id,))

    def _debounce(self, new: NewTask, now: datetime) -> Submitted:
        """The pending task with ``new``'s debounce key, given its arguments and due time
        (no later than its ``debounce_until``); an id is spent, as the SQL stores spend one."""
        assert new.debounce_key is not None
        self._next_id += 1
        if new.queue not in self._queues:  # made by the submit, as the SQL stores make it
            self._queues[new.queue] = QueueLimits(new.queue)
        task = self._tasks[self._debounced[new.debounce_key]]
        until = self._debounce_until.get(task.id)
        due = new.due_at if until is None or new.due_at <= until else until
        args, trace = split_trace(
            json.loads(new.args_json) if new.args_json is not None else new.args
        )
        self._stale += 1  # its entry in the heap, at the old due time
        task = self._put(replace(task, args=args, trace=trace, due_at=due, updated_at=now))
        heapq.heappush(self._heap, (task.due_at, task.seq, task.id))
        return Submitted(task.id, False, task.created_at)

    def _put(self, task: TaskRecord) -> TaskRecord:
        if task.debounce_key is not None and task.state is not TaskState.PENDING:
            # Started (or cancelled): the next submit with its key makes a new task.
            del self._debounced[task.debounce_key]
            task = replace(task, debounce_key=None, debounce_until=None)
        old = self._tasks.get(task.id)
        self._tasks[task.id] = task
        key = task.limit_key
        if key is not None:
            if old is not None and old.queue != task.queue:
                self._by_key[(old.queue, key)].discard(task.id)
                self._sync_key(old.queue, key)
                self._by_key.setdefault((task.queue, key), set()).add(task.id)
            self._sync_key(task.queue, key)
        return task

    def _sync_key(self, queue: str, key: str) -> None:
        """Bring the head of (``queue``, ``key``) up to date, as the triggers do (migrations
        0013 and 0022): while the key is below its limit and not blocked by its rate, its
        head is its first claimable task (due_at, priority desc, seq); otherwise a head
        stays while claimable."""
        limits = self._queues.get(queue)
        cap = None if limits is None else limits.key_cap
        if cap is None:
            self._heads.pop((queue, key), None)
            return
        ids = self._by_key.get((queue, key), set())
        ids &= self._tasks.keys()  # purged or deleted tasks leave
        tasks = [self._tasks[i] for i in ids]
        head = self._heads.get((queue, key))
        if head is not None and (head not in ids or self._tasks[head].state not in CLAIMABLE):
            head = None
        running = sum(1 for t in tasks if t.state is TaskState.RUNNING)
        if running < cap and (queue, key) not in self._key_blocked:
            waiting = [t for t in tasks if t.state in CLAIMABLE]
            if waiting:
                head = min(waiting, key=lambda t: (t.due_at, -t.priority, t.seq)).id
        if head is None:
            self._heads.pop((queue, key), None)
        else:
            self._heads[(queue, key)] = head

    def _held_back(self, task: TaskRecord) -> bool:
        """Whether ``task`` waits behind its limit key's head (or the key is at its limit)."""
        key = task.limit_key
        if key is None:
            return False
        limits = self._queues.get(task.queue)
        if limits is None or not limits.keyed:
            return False
        return self._heads.get((task.queue, key)) != task.id

    def _unblock_keys(
        self, limit: int, now: datetime, queues: Mapping[str, int] | None
    ) -> list[tuple[str, Rate]]:
        """As the SQL claim does before it picks: in each queue with a rate per key it may
        claim from, free the keys whose full window has passed (they get heads). Returns
        those queues and their rates per key."""
        wanted = {q: limit for q in self._queues} if queues is None else dict(queues)
        running: dict[str, int] = {}
        for task_id in self._running:
            q = self._tasks[task_id].queue
            running[q] = running.get(q, 0) + 1
        rated: list[tuple[str, Rate]] = []
        for q in sorted(wanted):
            limits = self._queues.get(q)
            if limits is None or limits.rate_per_key is None or wanted[q] <= 0:
                continue
            starts = self._starts.get(q, [])
            if limits.allowance(wanted[q], running.get(q, 0), starts, now) <= 0:
                continue
            rated.append((q, limits.rate_per_key))
            for key in sorted(
                k for (kq, k), until in self._key_blocked.items() if kq == q and until <= now
            ):
                del self._key_blocked[(q, key)]
                self._sync_key(q, key)
        return rated

    def _key_window_full(self, task: TaskRecord, now: datetime) -> bool:
        """As ``claiming._late_keys``: whether ``task``'s key has its rate's count of starts
        after ``now`` minus the window, those of claims with later times included (a
        claim reads its clock before it waits); if so the key is blocked until its window
        admits a start at ``now``."""
        limits = self._queues.get(task.queue)
        if task.limit_key is None or limits is None or limits.rate_per_key is None:
            return False
        key = (task.queue, task.limit_key)
        frees = rate_frees_at(limits.rate_per_key, self._key_starts.get(key, []), now)
        if frees is None:
            return False
        self._key_blocked[key] = frees
        self._heads.pop(key, None)
        return True

    def _count_key_start(self, queue: str, key: str, rate: Rate, now: datetime) -> None:
        """As ``claiming._count_key_start``: a start remembered; a full window blocks the key."""
        starts = self._key_starts.setdefault((queue, key), [])
        starts.append(now)
        forget = rate.forget_before(now)
        starts[:] = [t for t in starts if t > forget]
        frees = rate_frees_at(rate, starts, now)
        if frees is not None:
            self._key_blocked[(queue, key)] = frees
            self._heads.pop((queue, key), None)

    def _event(
        self, task: TaskRecord, now: datetime, detail: str | None, error: ErrorInfo | None = None
    ) -> None:
        self._events[task.id].append(
            TaskEvent(task.id, now, task.state, task.attempts, detail, error)
        )

    def _maybe_compact(self) -> None:
        size = self.heap_size
        if size >= self._compact_min and self._stale > self._compact_ratio * size:
            self._heap = [e for e in self._heap if self._live_entry(e) is not None]
            heapq.heapify(self._heap)
            for queue, ready in self._ready.items():
                self._ready[queue] = [e for e in ready if self._live_ready(e) is not None]
                heapq.heapify(self._ready[queue])
            self._stale = 0
            self.compactions += 1


class MemoryFinishWatcher:
    """A :class:`~durablesched.store.protocol.FinishWatcher` of a :class:`MemoryStore`: the
    store calls it as each task finishes (under the store's lock: it must be quick). It
    owns no thread, since only this process can write to the store."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._on_finished: OnFinished | None = None

    def start(self, on_finished: OnFinished, awaited: Awaited | None = None) -> None:
        """``awaited`` is not used: the store names each task as it finishes, and its
        outcome is read by who waits."""
        self._on_finished = on_finished
        self._store._watch_finished(on_finished, True)

    def nudge(self) -> None:
        """Nothing kept to tell: the store tells each finish as it happens."""

    def close(self) -> None:
        if self._on_finished is not None:
            self._store._watch_finished(self._on_finished, False)
            self._on_finished = None


@dataclass
class _StoredSchedule:
    """A schedule as the in-memory backend keeps it (the ``schedules`` table's row)."""

    schedule: Schedule
    status: str
    origin: str
    next_fire_at: datetime
    created_at: datetime
    updated_at: datetime
