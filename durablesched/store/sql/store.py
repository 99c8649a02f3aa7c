"""The durable backend on SQL, for SQLite and PostgreSQL alike: the Store protocol.

One store, one set of statements (:mod:`.statements`); where the two databases
must differ the statement comes from the engine's :class:`SQLDialect`, defined
in that database's module (:mod:`.sqlite`, :mod:`.postgres`). Every outcome
write names the claim that made it in its WHERE clause.

Where things are: transactions and the driver-level path in
:mod:`.transactions`, submission in :mod:`.submitting`, the claim in
:mod:`.claiming`, outcomes in :mod:`.outcomes` and :mod:`.group_commit`, expired
leases in :mod:`.reclaiming`, the operator's actions in :mod:`.operator_actions`,
moving tasks between databases in :mod:`.moving`. This class holds the
short operations itself and hands the rest to those modules.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from durablesched.errors import TaskNotFoundError
from durablesched.queues import QueueInfo, QueueLimits
from durablesched.records import (
    OVERDUE_AFTER,
    SUBMITTED,
    Activity,
    CancelOutcome,
    Claim,
    Environment,
    ErrorInfo,
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
    SignalSend,
    StepRecord,
    Submitted,
    TaskEvent,
    TaskQuery,
    TaskRecord,
    WorkerInfo,
)
from durablesched.schedules.declaration import Fired, Schedule, ScheduleInfo
from durablesched.states import TERMINAL, TaskState
from durablesched.store.protocol import (
    ChangeWatcher,
    DBAPIConnection,
    Effect,
    FinishWatcher,
    RetryDelay,
)
from durablesched.store.sql import (
    checking,
    console,
    group_commit,
    moving,
    operator_actions,
    reclaiming,
    scheduling,
    workers,
    workflows,
)
from durablesched.store.sql.borrowed import borrow
from durablesched.store.sql.claiming import (
    claim_with_ahead,
    claims_from_rows,
    queue_limits,
    record_starts,
)
from durablesched.store.sql.codec import (
    dump,
    error_from_json,
    finished_outcomes,
    from_db_time,
    record,
)
from durablesched.store.sql.dialect import SQLDialect
from durablesched.store.sql.migrate import check_schema, current_revision
from durablesched.store.sql.outcomes import (
    claim_params,
    record_cancel,
    record_failure,
    record_success,
)
from durablesched.store.sql.statements import (
    SQL_BLOCK_KEYS,
    SQL_CANCEL_RUNNING,
    SQL_CANCEL_WAITING,
    SQL_CREATED,
    SQL_FORGET_KEYS,
    SQL_GET,
    SQL_HISTORY,
    SQL_LATEST_EVENTS,
    SQL_LEASES,
    SQL_NEXT_DUE,
    SQL_NEXT_EXPIRY,
    SQL_NEXT_KEY_FREE,
    SQL_NEXT_KEY_FREE_IN,
    SQL_PUT_QUEUE,
    SQL_QUEUE_PER_KEY,
    SQL_QUEUE_STARTS,
    SQL_QUEUES,
    SQL_RELEASE,
    SQL_SEE_WORKER,
    SQL_SEED_KEYS,
    SQL_STATE_AND_ENVIRONMENT,
    SQL_TOUCH_KEYS,
    SQL_UNBLOCK_KEYS,
    SQL_UNBLOCK_UNKEYED,
    sql_list_tasks,
)
from durablesched.store.sql.submitting import insert
from durablesched.store.sql.totals import add_totals, read_totals
from durablesched.store.sql.transactions import Transactions
from durablesched.store.sql.translate import translated
from durablesched.totals import AttemptTotal, Tally
from durablesched.totals import ended as add_ended

log = logging.getLogger("durablesched.store")


class SQLStore(Transactions):
    """A :class:`~durablesched.store.Store` on an SQLAlchemy engine (SQLite or PostgreSQL).

    Build one with :class:`~durablesched.sqlite.SQLiteStore`,
    :class:`~durablesched.postgres.PostgresStore` or :func:`durablesched.open_store`.
    """

    def __init__(
        self,
        engine: Engine,
        dialect: SQLDialect,
        *,
        migrate: bool = False,
        busy_timeout: float = 30.0,
        create: bool = True,
        verify_schema: bool = True,
    ) -> None:
        super().__init__(engine, dialect, busy_timeout=busy_timeout)
        try:
            with translated(f"opening {engine.url.render_as_string(hide_password=True)}"):
                #: The schema revision stored in the database ("" for none, possible
                #: only with ``verify_schema=False``, which a health check uses).
                self.schema_revision = (
                    check_schema(engine, migrate=migrate, create=create)
                    if verify_schema
                    else _stored_revision(engine)
                )
        except BaseException:
            engine.dispose()
            raise

    # -- submitting and reading -----------------------------------------------------------------

    def submit(
        self,
        tasks: Sequence[NewTask],
        now: datetime,
        *,
        connection: Connection | DBAPIConnection | None = None,
    ) -> list[Submitted]:
        """Store tasks; with ``connection``, inside the caller's own transaction.

        The caller's connection must be in a transaction on this database: an
        SQLAlchemy ``Connection`` (one from ``store.engine.begin()`` is), or the
        driver's own (a ``sqlite3.Connection`` in a transaction, a
        ``psycopg.Connection`` in one or not in autocommit mode). The tasks exist
        if and only if that transaction commits; nothing here commits it.
        """
        if connection is not None:
            conn = (
                connection
                if isinstance(connection, Connection)
                else borrow(connection, self.dialect, self.engine.dialect.loaded_dbapi)
            )
            with translated("submitting tasks"):
                return insert(self, conn, tasks, now)
        with self._write("submitting tasks") as conn:
            return insert(self, conn, tasks, now)

    def get(self, task_id: int) -> TaskRecord | None:
        with self._read(f"reading task {task_id}") as conn:
            row = conn.execute(SQL_GET, {"id": task_id}).first()
        return None if row is None else record(row)

    def finished(self, task_ids: Collection[int]) -> dict[int, Finished | None]:
        wanted = sorted(set(task_ids))
        found: dict[int, Finished | None] = {}
        with translated("reading which tasks finished"):
            for start in range(0, len(wanted), _IDS_PER_READ):
                chunk = wanted[start : start + _IDS_PER_READ]
                ids = {"ids": self.dialect.ids(chunk)}
                # One statement, no transaction: each task's outcome is final once read.
                found.update(
                    finished_outcomes(self._lone_rows(self.dialect.finished_outcomes, ids))
                )
        return found

    def history(self, task_id: int) -> list[TaskEvent]:
        with self._read(f"reading the history of task {task_id}") as conn:
            rows = conn.execute(SQL_HISTORY, {"id": task_id}).all()
            first = rows[0] if rows else None
            created = None
            if first is None or not _is_submission(first.state, first.attempt, first.detail):
                # Submitted by a version that wrote no submission line: it is the
                # task's creation, as that version read it.
                created = conn.execute(SQL_CREATED, {"id": task_id}).scalar()
                if created is None:
                    return []
        events = [_event(r) for r in rows]
        if created is not None:
            events.insert(
                0, TaskEvent(task_id, from_db_time(created), TaskState.PENDING, 0, SUBMITTED)
            )
        return events

    def latest_events(self, task_ids: Collection[int]) -> dict[int, TaskEvent]:
        ids = sorted(set(task_ids))
        found: dict[int, TaskEvent] = {}
        with self._read("reading the latest history lines") as conn:
            for start in range(0, len(ids), _IDS_PER_READ):
                batch = ids[start : start + _IDS_PER_READ]
                for r in conn.execute(SQL_LATEST_EVENTS, {"ids": batch}):
                    found[r.task_id] = _event(r)
        return found

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        name: str | None = None,
        limit: int = 100,
        queue: str | None = None,
    ) -> list[TaskRecord]:
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = TaskState(state).value
        if name is not None:
            params["name"] = name
        if queue is not None:
            params["queue"] = queue
        sql = sql_list_tasks(
            state=state is not None, name=name is not None, queue=queue is not None
        )
        with self._read("listing tasks") as conn:
            return [record(r) for r in conn.execute(sql, params)]

    # -- claims and leases ----------------------------------------------------------------------

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
        if limit <= 0 and ahead <= 0:
            return []
        with self._write("claiming tasks") as conn:
            rows, waiting = claim_with_ahead(
                self,
                conn,
                owner=owner,
                limit=limit,
                ahead=ahead,
                now=now,
                lease=lease,
                names=names,
                process_names=process_names,
                queues=queues,
            )
        return claims_from_rows(rows, owner, now, lease) + claims_from_rows(
            waiting, owner, now, lease, started=False
        )

    def heartbeat(
        self, owner: str, claims: Sequence[Claim], now: datetime, lease: timedelta
    ) -> list[LeaseStatus]:
        fences: dict[int, set[int]] = {}
        for c in claims:
            if c.owner == owner:
                fences.setdefault(c.task_id, set()).add(c.fence)
        stamp = self._t(now)
        if not fences:
            with self._write("marking the worker seen") as conn:
                conn.execute(SQL_SEE_WORKER, {"id": owner, "now": stamp})
            return []
        with self._write("renewing leases") as conn:
            # The statement takes one fence per task: where claims of one task
            # disagree (a stale one beside the current one), the current one's.
            chosen = {task_id: min(f) for task_id, f in fences.items()}
            doubtful = [task_id for task_id, f in fences.items() if len(f) > 1]
            if doubtful:
                for r in conn.execute(SQL_LEASES, {"ids": doubtful, "now": stamp}):
                    if r.lease_owner == owner and r.fence in fences[r.id]:
                        chosen[r.id] = r.fence
            params = {
                "fences": dump({str(task_id): fence for task_id, fence in chosen.items()}),
                "owner": owner,
                "now": stamp,
                "lease_expires_at": self._t(now + lease),
            }
            # id, fence, lease_expires_at, cancel_requested_at
            rows = sorted(self._rows(conn, self.dialect.heartbeat, params), key=lambda r: int(r[0]))
            # The worker is seen in the same transaction (no commit of its own).
            conn.execute(SQL_SEE_WORKER, {"id": owner, "now": stamp})
        return [LeaseStatus(r[0], r[1], from_db_time(r[2]), r[3] is not None) for r in rows]

    def check_leases(self, owner: str, claims: Sequence[Claim], now: datetime) -> list[LeaseStatus]:
        fences: dict[int, set[int]] = {}
        for c in claims:
            if c.owner == owner:
                fences.setdefault(c.task_id, set()).add(c.fence)
        if not fences:
            return []
        with self._read("checking leases") as conn:
            rows = conn.execute(SQL_LEASES, {"ids": list(fences), "now": self._t(now)}).all()
        return [
            LeaseStatus(
                r.id, r.fence, from_db_time(r.lease_expires_at), r.cancel_requested_at is not None
            )
            for r in rows
            if r.lease_owner == owner and r.fence in fences[r.id]
        ]

    # -- outcomes -------------------------------------------------------------------------------

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
        """Record SUCCEEDED with ``result``, the children, the effects and the signals
        (each delivered as :meth:`send_signal` delivers one), atomically,
        with the task's idempotency key: one outcome outside a group commit.

        Not on the :class:`Store` protocol (the worker records through
        ``record_and_claim``); for tools and tests. False (nothing written) if the
        claim is not valid; an effect that raises (or a signal refused: an unknown or
        finished task) undoes everything and propagates.
        """
        outcome = Outcome(
            claim,
            result=result,
            children=tuple(children),
            effects=tuple(effects),
            signals=tuple(signals),
        )
        with self._write(f"recording the success of task {claim.task_id}") as conn:
            self._lock_tasks(conn, [claim.task_id, *(s.task_id for s in signals)], [claim.task_id])
            state = record_success(self, conn, outcome, now)
            if state is None:
                return False
            self._add_totals(conn, [(claim, state)], now)
            self._tell_finished(conn, (claim.task_id,), now)
            return True

    def fail(
        self, claim: Claim, error: ErrorInfo, retry_at: datetime | None, now: datetime
    ) -> TaskState | None:
        """Record a failed attempt, RETRY_WAIT due at ``retry_at`` or FAILED (None, or a
        requested cancellation): one outcome outside a group commit, for tools and
        tests. Returns the new state, or None if the claim is not valid."""
        with self._write(f"recording the failure of task {claim.task_id}") as conn:
            self._lock_tasks(conn, [claim.task_id], [claim.task_id])
            state = record_failure(self, conn, Outcome(claim, error=error, retry_at=retry_at), now)
            self._add_totals(conn, [(claim, state)], now)
            if state in TERMINAL:
                self._tell_finished(conn, (claim.task_id,), now)
            return state

    def acknowledge_cancel(
        self, claim: Claim, now: datetime, *, detail: str = "cancellation acknowledged"
    ) -> bool:
        with self._write(f"cancelling task {claim.task_id}") as conn:
            self._lock_tasks(conn, [claim.task_id], [claim.task_id])
            if record_cancel(self, conn, claim, now, detail) is None:
                return False
            self._add_totals(conn, [(claim, TaskState.CANCELLED)], now)
            self._tell_finished(conn, (claim.task_id,), now)
            return True

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
        """Group commit: every outcome, then a claim into the freed slots, in one transaction.

        Each outcome with effects or children runs under a savepoint, so one
        that raises is undone alone and comes back as its exception.
        """
        steps = group_commit.plan(outcomes)
        ending = [o.claim.task_id for o in outcomes]
        touched = [c.task_id for c in started] + ending
        touched += [s.task_id for o in outcomes for s in o.signals]
        with self._write("recording outcomes and claiming") as conn:
            self._lock_tasks(conn, touched, ending)
            if started:
                record_starts(self, conn, started, outcomes, now)
            results = group_commit.record_outcomes(self, conn, outcomes, now, steps)
            self._add_totals(
                conn, [(o.claim, r) for o, r in zip(outcomes, results, strict=True)], now
            )
            self._tell_finished(
                conn,
                (
                    outcome.claim.task_id
                    for outcome, state in zip(outcomes, results, strict=True)
                    if state in TERMINAL
                ),
                now,
            )
            rows, waiting = claim_with_ahead(
                self,
                conn,
                owner=owner,
                limit=limit,
                ahead=ahead,
                now=now,
                lease=lease,
                names=names,
                process_names=process_names,
                queues=queues,
            )
        return results, claims_from_rows(rows, owner, now, lease) + claims_from_rows(
            waiting, owner, now, lease, started=False
        )

    def _add_totals(
        self, conn: Connection, ended: Sequence[tuple[Claim, object]], now: datetime
    ) -> None:
        """Count each attempt an outcome ended (a state: it was recorded) in the totals,
        in this transaction, on the shard of each claim's owner."""
        by_owner: dict[str, Tally] = {}
        for claim, state in ended:
            add_ended(by_owner.setdefault(claim.owner, {}), claim, state, now)
        for owner in sorted(by_owner):
            add_totals(self, conn, by_owner[owner], owner)

    def attempt_totals(self) -> list[AttemptTotal]:
        """Every ended attempt so far, per queue, task name, outcome and duration bucket
        (:mod:`durablesched.totals`): what the metrics' counters read."""
        with self._read("reading the attempt totals") as conn:
            return read_totals(conn)

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
        return workflows.record_step(self, claim, position, name, result, now, effects)

    def steps(self, task_id: int) -> list[StepRecord]:
        return workflows.steps(self, task_id)

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
        return workflows.suspend(self, claim, until, now, detail, signal, children)

    def spawn(
        self, claim: Claim, position: int, step: str, tasks: Sequence[NewTask], now: datetime
    ) -> list[Submitted] | None:
        return workflows.spawn(self, claim, position, step, tasks, now)

    def children(self, task_id: int) -> list[int]:
        return workflows.children(self, task_id)

    def forget_steps(self, task_id: int, position: int) -> int:
        return workflows.forget_steps(self, task_id, position)

    def send_signal(self, task_id: int, name: str, payload: Any, now: datetime) -> int:
        return workflows.send_signal(self, task_id, name, payload, now)

    def receive_signal(
        self, claim: Claim, position: int, step: str, name: str, now: datetime
    ) -> tuple[bool, Any] | None:
        return workflows.receive_signal(self, claim, position, step, name, now)

    def signals(self, task_id: int) -> list[SignalRecord]:
        return workflows.signals(self, task_id)

    def release(self, claims: Sequence[Claim], now: datetime, *, why: str = "at shutdown") -> int:
        released = 0
        cancelled: list[int] = []
        with self._write("giving back unfinished tasks") as conn:
            self._lock_tasks(conn, (c.task_id for c in claims), (c.task_id for c in claims))
            for claim in sorted(claims, key=lambda c: c.task_id):
                params = claim_params(self, claim, now)
                row = conn.execute(SQL_RELEASE, params).first()
                if row is None:
                    continue
                released += 1
                state = TaskState(row.state)
                detail = (
                    f"given back by {claim.owner} {why}"
                    if state is TaskState.PENDING
                    else f"cancelled {why}"
                )
                self._event(conn, claim.task_id, now, state, row.attempts, detail)
                if state is TaskState.CANCELLED:
                    cancelled.append(claim.task_id)
            if released:
                self._wake_others(conn)
            self._tell_finished(conn, cancelled, now)
        return released

    # -- cancellation and expiry ----------------------------------------------------------------

    def request_cancel(self, task_id: int, now: datetime) -> CancelOutcome:
        params: dict[str, Any] = {"id": task_id, "now": self._t(now)}
        with self._write(f"cancelling task {task_id}") as conn:
            self._lock_tasks(conn, [task_id], [task_id])
            row = conn.execute(SQL_CANCEL_WAITING, params).first()
            if row is not None:
                self._event(
                    conn, task_id, now, TaskState.CANCELLED, row.attempts, "cancelled before start"
                )
                self._tell_finished(conn, (task_id,), now)
                return CancelOutcome.CANCELLED
            asked = conn.execute(SQL_CANCEL_RUNNING, params).first()
            if asked is not None:
                self._wake_others(conn)  # its worker hears of it at once, not at a heartbeat
                return _running_cancel(asked.environment)
            row = conn.execute(SQL_STATE_AND_ENVIRONMENT, params).first()
            if row is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            # Asked before: the first request's time stands.
            return (
                _running_cancel(row.environment)
                if row.state == "RUNNING"
                else (CancelOutcome.TOO_LATE)
            )

    def reclaim_expired(self, now: datetime, retry_delay: RetryDelay) -> list[Reclaimed]:
        return reclaiming.reclaim_expired(self, now, retry_delay)

    # -- waking ---------------------------------------------------------------------------------

    def next_wakeup(
        self,
        now: datetime,
        names: Collection[str] | None = None,
        queues: Collection[str] | None = None,
    ) -> datetime | None:
        params: dict[str, Any] = {"now": self._t(now)}
        due_sql: Any = SQL_NEXT_DUE
        if (names is not None and not names) or (queues is not None and not queues):
            # No names or queues: no task of its own to wait for (``IN ()`` is no SQL).
            due_sql = None
        elif names is not None or queues is not None:
            due_sql = self.dialect.next_due(names is not None, queues is not None)
            if names is not None:
                params["names"] = sorted(names)
            if queues is not None:
                params["queues"] = sorted(queues)
        with self._read("finding the next due time") as conn:
            times = [
                None if due_sql is None else conn.execute(due_sql, params).scalar(),
                conn.execute(SQL_NEXT_EXPIRY, params).scalar(),
            ]
            found = [from_db_time(t) for t in times if t is not None]
            for row in conn.execute(SQL_QUEUES):
                limits = queue_limits(row)
                if limits.rate is None or (queues is not None and limits.name not in queues):
                    continue
                since = self._t(now - limits.rate.per)
                starts = conn.execute(SQL_QUEUE_STARTS, {"queue": limits.name, "since": since})
                frees = limits.rate_frees_at([from_db_time(t) for (t,) in starts], now)
                if frees is not None:
                    found.append(frees)
            # A key whose rate window is full: when it may start again.
            if queues is None:
                key_free = conn.execute(SQL_NEXT_KEY_FREE, params).scalar()
            elif queues:
                key_free = conn.execute(
                    SQL_NEXT_KEY_FREE_IN, {"now": params["now"], "queues": sorted(queues)}
                ).scalar()
            else:
                key_free = None
            if key_free is not None:
                found.append(from_db_time(key_free))
        return min(found, default=None)

    # -- queues ---------------------------------------------------------------------------------

    def queue_limits(self) -> list[QueueLimits]:
        with self._read("reading the queues") as conn:
            return [queue_limits(r) for r in conn.execute(SQL_QUEUES)]

    def put_queue(self, limits: QueueLimits, now: datetime) -> None:
        rate, key_rate = limits.rate, limits.rate_per_key
        params = {
            "name": limits.name,
            "concurrency": limits.concurrency,
            "rate_count": None if rate is None else rate.count,
            "rate_seconds": None if rate is None else int(rate.per.total_seconds()),
            "paused": int(limits.paused),
            "now": self._t(now),
            "concurrency_per_key": limits.concurrency_per_key,
            "rate_per_key_count": None if key_rate is None else key_rate.count,
            "rate_per_key_seconds": None if key_rate is None else int(key_rate.per.total_seconds()),
        }
        name = {"name": limits.name}
        rewritten = 0  # tasks whose key_waiting the change wrote
        with self._write(f"setting queue {limits.name!r}") as conn:
            lock_keyed = self.dialect.lock_keyed_tasks
            if lock_keyed is not None and conn.execute(SQL_QUEUE_PER_KEY, name).scalar() != (
                limits.key_cap
            ):
                conn.execute(lock_keyed, name)  # before the queue's row: see the statement
            if self.dialect.lock_queues is not None:  # before any task row (the triggers' order)
                conn.execute(self.dialect.lock_queues, {"names": [limits.name]})
            before = conn.execute(SQL_QUEUE_PER_KEY, name).scalar()
            conn.execute(SQL_PUT_QUEUE, params)
            if before != limits.key_cap:
                conn.execute(SQL_FORGET_KEYS, name)
                if limits.key_cap is None:
                    rewritten = conn.execute(SQL_UNBLOCK_KEYS, name).rowcount
                else:
                    rewritten = conn.execute(SQL_UNBLOCK_UNKEYED, name).rowcount
                    rewritten += conn.execute(SQL_BLOCK_KEYS, name).rowcount
                    conn.execute(SQL_SEED_KEYS, name)
                    conn.execute(SQL_TOUCH_KEYS, name)
            self._wake_others(conn)  # a resumed or widened queue: workers claim at once
        if rewritten and self.dialect.after_limit_rewrite is not None:
            self.dialect.after_limit_rewrite(self.engine, rewritten)

    def queue_info(self, now: datetime, *, finished: bool = True) -> list[QueueInfo]:
        return operator_actions.queue_info(self, now, finished=finished)

    def activity(self, since: datetime, now: datetime, bounds: Sequence[timedelta]) -> Activity:
        return operator_actions.activity(self, since, now, bounds)

    # -- live workers: see workers.py ------------------------------------------------------------

    def register_worker(self, worker: WorkerInfo, now: datetime) -> None:
        workers.register_worker(self, worker, now)

    def deregister_worker(self, worker_id: str) -> bool:
        return workers.deregister_worker(self, worker_id)

    def list_workers(self, now: datetime) -> list[WorkerInfo]:
        return workers.list_workers(self, now)

    def prune_workers(self, now: datetime) -> int:
        return workers.prune_workers(self, now)

    def watch_changes(self, poll_interval: float = 0.01) -> ChangeWatcher | None:
        """Overridden per database: how this process hears of other processes' commits."""
        return None

    def watch_finished(self) -> FinishWatcher | None:
        """Overridden per database: how this process hears that tasks finished."""
        return None

    def close(self) -> None:
        self._close_transactions()

    # -- schedules (ScheduleStore): see scheduling.py ----------------------------------------------

    def sync_schedules(
        self, declared: Sequence[Schedule], now: datetime, tasks: Collection[str]
    ) -> dict[str, str]:
        return scheduling.sync_schedules(self, declared, now, tasks)

    def add_schedule(self, schedule: Schedule, now: datetime) -> bool:
        return scheduling.add_schedule(self, schedule, now)

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> ScheduleInfo:
        return scheduling.pause_schedule(self, name, paused, now)

    def remove_schedule(self, name: str) -> None:
        scheduling.remove_schedule(self, name)

    def list_schedules(self) -> list[ScheduleInfo]:
        return scheduling.list_schedules(self)

    def fire_schedules(self, now: datetime, *, limit: int = 100) -> list[Fired]:
        return scheduling.fire_schedules(self, now, limit)

    def fire_schedule_now(self, name: str, now: datetime) -> Fired:
        return scheduling.fire_schedule_now(self, name, now)

    def next_fire_time(self) -> datetime | None:
        return scheduling.next_fire_time(self)

    # -- operator actions (not part of the Store protocol): see operator_actions.py ---------------

    def requeue(self, task_id: int, now: datetime, from_step: int | None = None) -> None:
        """FAILED or CANCELLED back to PENDING, due ``now``, with a fresh attempt budget
        (and, with ``from_step``, a workflow's steps from there forgotten, at once)."""
        operator_actions.requeue(self, task_id, now, from_step)

    def stats(self, now: datetime) -> QueueStats:
        """Counts per state, the oldest overdue task, running leases, recent failures."""
        return operator_actions.stats(self, now)

    def check(self, now: datetime, *, overdue_after: timedelta = OVERDUE_AFTER) -> HealthReport:
        """Integrity, schema revision, expired leases, overdue tasks: what is wrong."""
        return checking.check(self, now, overdue_after)

    def purge(self, before: datetime, *, batch: int = 10_000) -> int:
        """Delete finished tasks finished before ``before``; returns how many."""
        return operator_actions.purge(self, before, batch=batch)

    # -- what a dashboard reads and deletes (Console): see console.py ------------------------------

    def find_tasks(self, query: TaskQuery, limit: int) -> list[TaskRecord]:
        return console.find_tasks(self, query, limit)

    def minute_counts(self, since: datetime, now: datetime) -> list[MinuteCounts]:
        return console.minute_counts(self, since, now)

    def delete_task(self, task_id: int) -> None:
        console.delete_task(self, task_id)

    # -- moving tasks to another database (not part of the Store protocol): see moving.py ---------

    def instance(self) -> int:
        """This database's random identity, made by its migrations."""
        return moving.instance(self)

    def hand_over(
        self, destination: int, now: datetime, *, after: int = 0, batch: int = 500
    ) -> list[tuple[TaskRecord, TaskState]]:
        """Take up to ``batch`` live tasks with ids above ``after`` out of this database."""
        return moving.hand_over(self, destination, now, after=after, batch=batch)

    def in_transit(self, destination: int) -> list[tuple[TaskRecord, TaskState]]:
        """Tasks handed over to ``destination`` whose arrival was never confirmed."""
        return moving.in_transit(self, destination)

    def confirm_move(
        self, destination: int, moved: Sequence[tuple[TaskRecord, TaskState, int]]
    ) -> None:
        """Rewrite each hand-over line to say which task it became there."""
        moving.confirm_move(self, destination, moved)

    def receive(
        self, source: int, moved: Sequence[tuple[TaskRecord, TaskState]], now: datetime
    ) -> list[tuple[int, str]]:
        """Store tasks handed over by database ``source``, each at most once ever."""
        return moving.receive(self, source, moved, now)


#: Task ids per read of :meth:`SQLStore.finished` and :meth:`SQLStore.latest_events`
#: (SQLite binds at most 32,766 values).
_IDS_PER_READ = 5_000


def _stored_revision(engine: Engine) -> str:
    with engine.connect() as conn:
        revision = current_revision(conn)
        conn.rollback()
    return revision or ""


def _is_submission(state: str, attempt: int, detail: str | None) -> bool:
    """A submission line: the one written with the task, or a moved task's first."""
    return state == "PENDING" and attempt == 0 and (detail or "").startswith(SUBMITTED)


def _running_cancel(environment: str | None) -> CancelOutcome:
    return CancelOutcome.ENFORCED if environment == Environment.PROCESS else CancelOutcome.REQUESTED


def _event(row: Any) -> TaskEvent:
    """A history line as read (task_id, at, state, attempt, detail, error)."""
    return TaskEvent(
        row.task_id,
        from_db_time(row.at),
        TaskState(row.state),
        row.attempt,
        row.detail,
        error_from_json(row.error),
    )
