"""The durable backend on SQL, for SQLite and PostgreSQL alike: the Store protocol.

One store, one set of statements (:mod:`.statements`); where the two databases
must differ the statement comes from the engine's :class:`SQLDialect`, defined
in that database's module (:mod:`.sqlite`, :mod:`.postgres`). Every outcome
write names the claim that made it in its WHERE clause.

Where things are: transactions and the driver-level path in
:mod:`.transactions`, submission in :mod:`.submitting`, the claim in
:mod:`.claiming`, outcomes in :mod:`.outcomes` and :mod:`.group_commit`, expired
leases in :mod:`.reclaiming`. This class holds the short operations itself and
hands the rest to those modules.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from durablesched.errors import InvalidTransitionError, TaskNotFoundError
from durablesched.records import (
    CancelOutcome,
    Claim,
    Environment,
    ErrorInfo,
    LeaseStatus,
    NewTask,
    Outcome,
    OutcomeResult,
    Reclaimed,
    Submitted,
    TaskEvent,
    TaskRecord,
)
from durablesched.states import TaskState, check_transition
from durablesched.store.protocol import ChangeWatcher, Effect, RetryDelay
from durablesched.store.sql import group_commit, reclaiming
from durablesched.store.sql.claiming import claim_rows, claims_from_rows
from durablesched.store.sql.codec import dump, error_from_json, error_json, from_db_time, record
from durablesched.store.sql.dialect import SQLDialect
from durablesched.store.sql.migrate import check_schema
from durablesched.store.sql.outcomes import (
    claim_params,
    record_cancel,
    record_failure,
    record_success,
)
from durablesched.store.sql.statements import (
    SQL_ALLOCATE,
    SQL_CANCEL_RUNNING,
    SQL_CANCEL_WAITING,
    SQL_CONFIRM_MOVE,
    SQL_COPIED,
    SQL_COUNT_BY_STATE,
    SQL_CREATED,
    SQL_EVENT_ID,
    SQL_FIND_KEY,
    SQL_GET,
    SQL_HAND_OVER,
    SQL_HISTORY,
    SQL_IN_TRANSIT,
    SQL_INSERT_COPY,
    SQL_INSTANCE,
    SQL_KEY_HELD_BY_OTHER,
    SQL_LEASES,
    SQL_LIVE_IDS,
    SQL_NEXT_DUE,
    SQL_NEXT_EXPIRY,
    SQL_OLDEST_OVERDUE,
    SQL_OVERDUE_BY_NAME,
    SQL_PURGE_BATCH,
    SQL_RECENT_FAILURES,
    SQL_RECORD_COPY,
    SQL_RELEASE,
    SQL_REQUEUE,
    SQL_RUNNING,
    SQL_STATE,
    SQL_STATE_AND_ENVIRONMENT,
    sql_list_tasks,
)
from durablesched.store.sql.submitting import insert
from durablesched.store.sql.transactions import Transactions
from durablesched.store.sql.translate import translated


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
    ) -> None:
        super().__init__(engine, dialect, busy_timeout=busy_timeout)
        try:
            with translated(f"opening {engine.url.render_as_string(hide_password=True)}"):
                self.schema_revision = check_schema(engine, migrate=migrate)
        except BaseException:
            engine.dispose()
            raise

    # -- submitting and reading -----------------------------------------------------------------

    def submit(
        self,
        tasks: Sequence[NewTask],
        now: datetime,
        *,
        connection: Connection | None = None,
    ) -> list[Submitted]:
        """Store tasks; with ``connection``, inside the caller's own transaction.

        The caller's connection must be in a write transaction on this database
        (one from ``store.engine.begin()`` is): the tasks exist if and only if
        that transaction commits.
        """
        if connection is not None:
            with translated("submitting tasks"):
                return insert(self, connection, tasks, now)
        with self._write("submitting tasks") as conn:
            return insert(self, conn, tasks, now)

    def get(self, task_id: int) -> TaskRecord | None:
        with self._read(f"reading task {task_id}") as conn:
            row = conn.execute(SQL_GET, {"id": task_id}).first()
        return None if row is None else record(row)

    def history(self, task_id: int) -> list[TaskEvent]:
        with self._read(f"reading the history of task {task_id}") as conn:
            created = conn.execute(SQL_CREATED, {"id": task_id}).scalar()
            rows = conn.execute(SQL_HISTORY, {"id": task_id}).all()
        if created is None:
            return []
        # Submission is the row itself; later transitions are in task_events.
        events = [TaskEvent(task_id, from_db_time(created), TaskState.PENDING, 0, None)]
        events.extend(
            TaskEvent(r.task_id, from_db_time(r.at), TaskState(r.state), r.attempt, r.detail)
            for r in rows
        )
        return events

    def list_tasks(
        self, *, state: TaskState | None = None, name: str | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = TaskState(state).value
        if name is not None:
            params["name"] = name
        sql = sql_list_tasks(state=state is not None, name=name is not None)
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
    ) -> list[Claim]:
        if limit <= 0:
            return []
        with self._write("claiming tasks") as conn:
            rows = claim_rows(
                self,
                conn,
                owner=owner,
                limit=limit,
                now=now,
                lease=lease,
                names=names,
                process_names=process_names,
            )
        return claims_from_rows(rows, owner, now, lease)

    def heartbeat(
        self, owner: str, claims: Sequence[Claim], now: datetime, lease: timedelta
    ) -> list[LeaseStatus]:
        if not claims:
            return []
        params = {
            "fences": dump({str(c.task_id): c.fence for c in claims if c.owner == owner}),
            "owner": owner,
            "now": self._t(now),
            "lease_expires_at": self._t(now + lease),
        }
        with self._write("renewing leases") as conn:
            # id, fence, lease_expires_at, cancel_requested_at
            rows = sorted(self._rows(conn, self.dialect.heartbeat, params), key=lambda r: int(r[0]))
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
    ) -> bool:
        outcome = Outcome(claim, result=result, children=tuple(children), effects=tuple(effects))
        with self._write(f"recording the success of task {claim.task_id}") as conn:
            return record_success(self, conn, outcome, now) is not None

    def fail(
        self, claim: Claim, error: ErrorInfo, retry_at: datetime | None, now: datetime
    ) -> TaskState | None:
        with self._write(f"recording the failure of task {claim.task_id}") as conn:
            return record_failure(self, conn, Outcome(claim, error=error, retry_at=retry_at), now)

    def acknowledge_cancel(
        self, claim: Claim, now: datetime, *, detail: str = "cancellation acknowledged"
    ) -> bool:
        with self._write(f"cancelling task {claim.task_id}") as conn:
            return record_cancel(self, conn, claim, now, detail) is not None

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
    ) -> tuple[list[OutcomeResult], list[Claim]]:
        """Group commit: every outcome, then a claim into the freed slots, in one transaction.

        Each outcome with effects or children runs under a savepoint, so one
        that raises is undone alone and comes back as its exception.
        """
        steps = group_commit.plan(outcomes)
        with self._write("recording outcomes and claiming") as conn:
            results = group_commit.record_outcomes(self, conn, outcomes, now, steps)
            rows = (
                claim_rows(
                    self,
                    conn,
                    owner=owner,
                    limit=limit,
                    now=now,
                    lease=lease,
                    names=names,
                    process_names=process_names,
                )
                if limit > 0
                else []
            )
        return results, claims_from_rows(rows, owner, now, lease)

    def release(self, claims: Sequence[Claim], now: datetime) -> int:
        released = 0
        with self._write("giving back unfinished tasks") as conn:
            for claim in sorted(claims, key=lambda c: c.task_id):
                params = claim_params(self, claim, now)
                row = conn.execute(SQL_RELEASE, params).first()
                if row is None:
                    continue
                released += 1
                state = TaskState(row.state)
                detail = (
                    f"given back by {claim.owner} at shutdown"
                    if state is TaskState.PENDING
                    else "cancelled at shutdown"
                )
                self._event(conn, claim.task_id, now, state, row.attempts, detail)
            if released:
                self._wake_others(conn)
        return released

    # -- cancellation and expiry ----------------------------------------------------------------

    def request_cancel(self, task_id: int, now: datetime) -> CancelOutcome:
        params: dict[str, Any] = {"id": task_id, "now": self._t(now)}
        with self._write(f"cancelling task {task_id}") as conn:
            row = conn.execute(SQL_CANCEL_WAITING, params).first()
            if row is not None:
                self._event(
                    conn, task_id, now, TaskState.CANCELLED, row.attempts, "cancelled before start"
                )
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

    def next_wakeup(self, now: datetime, names: Collection[str] | None = None) -> datetime | None:
        params: dict[str, Any] = {"now": self._t(now)}
        due_sql = SQL_NEXT_DUE
        if names is not None:
            due_sql = self.dialect.next_due_named
            params["names"] = sorted(names)
        with self._read("finding the next due time") as conn:
            times = [
                conn.execute(due_sql, params).scalar(),
                conn.execute(SQL_NEXT_EXPIRY, params).scalar(),
            ]
        found = [from_db_time(t) for t in times if t is not None]
        return min(found, default=None)

    def watch_changes(self, poll_interval: float = 0.01) -> ChangeWatcher | None:
        """Overridden per database: how this process hears of other processes' commits."""
        return None

    def close(self) -> None:
        self._close_transactions()

    # -- operator actions (not part of the Store protocol) ----------------------------------------

    def requeue(self, task_id: int, now: datetime) -> None:
        """FAILED or CANCELLED back to PENDING, due ``now``, with a fresh attempt budget.

        :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError`
        if the task is in another state or another task now holds its key.
        """
        stamp = self._t(now)
        with self._write(f"requeueing task {task_id}") as conn:
            if self.dialect.lock_submissions is not None:
                conn.execute(self.dialect.lock_submissions)
            state = conn.execute(SQL_STATE, {"id": task_id}).scalar()
            if state is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            check_transition(TaskState(state), TaskState.PENDING, operator=True)
            holder = conn.execute(SQL_KEY_HELD_BY_OTHER, {"id": task_id}).scalar()
            if holder is not None:
                raise InvalidTransitionError(
                    f"task {task_id}'s idempotency key is now held by task {holder}"
                )
            seq = conn.execute(SQL_ALLOCATE, {"n": 1}).scalar_one()
            conn.execute(SQL_REQUEUE, {"id": task_id, "now": stamp, "seq": seq})
            self._event(conn, task_id, now, TaskState.PENDING, 0, "requeued")
            self._wake_others(conn)

    def stats(self, now: datetime) -> dict[str, Any]:
        """Counts per state, the oldest overdue task, running leases, recent failures."""
        params = {"now": self._t(now), "since": self._t(now - timedelta(hours=1))}
        with self._read("reading statistics") as conn:
            counts = {r.state: r.n for r in conn.execute(SQL_COUNT_BY_STATE)}
            oldest = conn.execute(SQL_OLDEST_OVERDUE, params).first()
            overdue = conn.execute(SQL_OVERDUE_BY_NAME, params).all()
            running = conn.execute(SQL_RUNNING).all()
            failures = conn.execute(SQL_RECENT_FAILURES, params).all()
        return {
            "counts": {state.value: counts.get(state.value, 0) for state in TaskState},
            "oldest_overdue": None
            if oldest is None
            else {
                "id": oldest.id,
                "name": oldest.name,
                "due_at": from_db_time(oldest.due_at),
                "lag_seconds": (now - from_db_time(oldest.due_at)).total_seconds(),
            },
            "overdue_by_name": [
                {"name": r.name, "tasks": r.n, "oldest_due_at": from_db_time(r.oldest)}
                for r in overdue
            ],
            "running": [
                {
                    "id": r.id,
                    "name": r.name,
                    "attempt": r.attempts,
                    "lease_owner": r.lease_owner,
                    "lease_expires_at": from_db_time(r.lease_expires_at),
                    "cancel_requested": r.cancel_requested_at is not None,
                }
                for r in running
            ],
            "failures_last_hour": [
                {
                    "id": r.id,
                    "name": r.name,
                    "attempts": r.attempts,
                    "finished_at": from_db_time(r.finished_at),
                    "error": error_from_json(r.last_error),
                }
                for r in failures
            ],
        }

    def purge(self, before: datetime, *, batch: int = 10_000) -> int:
        """Delete finished tasks (with their events and keys) finished before ``before``.

        Bounded batches, one transaction each, so writers are never blocked
        for long. Never touches a live task. Returns how many were deleted.
        """
        total = 0
        while True:
            with self._write("purging finished tasks") as conn:
                deleted = conn.execute(
                    SQL_PURGE_BATCH, {"before": self._t(before), "batch": batch}
                ).rowcount
            total += deleted
            if deleted < batch:
                return total

    # -- copy (not part of the Store protocol) ----------------------------------------------------

    def instance(self) -> int:
        """This database's random identity, made by its migrations."""
        with self._read("reading the database identity") as conn:
            return int(conn.execute(SQL_INSTANCE).scalar_one())

    def hand_over(
        self, destination: int, now: datetime, *, after: int = 0, batch: int = 500
    ) -> list[tuple[TaskRecord, TaskState]]:
        """Take up to ``batch`` live tasks with ids above ``after`` out of this database.

        Each becomes CANCELLED here, with a history line saying it is moving to
        ``destination``; returns each as it was (record, state before). Until
        :meth:`confirm_move`, :meth:`in_transit` finds them again.
        """
        with self._write("handing over live tasks") as conn:
            live = {
                r.id: r.state for r in conn.execute(SQL_LIVE_IDS, {"after": after, "batch": batch})
            }
            if not live:
                return []
            rows = conn.execute(SQL_HAND_OVER, {"ids": sorted(live), "now": self._t(now)}).all()
            moved = sorted(
                ((record(r), TaskState(live[r.id])) for r in rows), key=lambda m: m[0].id
            )
            for task, state in moved:
                self._event(
                    conn,
                    task.id,
                    now,
                    TaskState.CANCELLED,
                    task.attempts,
                    _moving(destination, state),
                )
        return moved

    def in_transit(self, destination: int) -> list[tuple[TaskRecord, TaskState]]:
        """Tasks handed over to ``destination`` whose arrival was never confirmed."""
        prefix = _moving(destination, None)
        with self._read("finding tasks in transit") as conn:
            rows = conn.execute(SQL_IN_TRANSIT, {"prefix": prefix + "%"}).all()
        return [(record(r), TaskState(r.detail.rsplit("was ", 1)[1].rstrip(")"))) for r in rows]

    def confirm_move(
        self, destination: int, moved: Sequence[tuple[TaskRecord, TaskState, int]]
    ) -> None:
        """Rewrite each hand-over line to say which task it became there."""
        with self._write("confirming moved tasks") as conn:
            for task, state, new_id in moved:
                event_id = conn.execute(
                    SQL_EVENT_ID, {"task_id": task.id, "detail": _moving(destination, state)}
                ).scalar()
                if event_id is not None:
                    conn.execute(
                        SQL_CONFIRM_MOVE,
                        {
                            "event_id": event_id,
                            "detail": f"moved to database {destination} as task {new_id} "
                            f"(was {state.value})",
                        },
                    )

    def receive(
        self, source: int, moved: Sequence[tuple[TaskRecord, TaskState]], now: datetime
    ) -> list[tuple[int, str]]:
        """Store tasks handed over by database ``source``, each at most once ever.

        Returns, per task, (its id here, how): "copied", "already" (copied
        before) or "key" (a task here already holds its idempotency key).
        """
        results: list[tuple[int, str]] = []
        with self._write("receiving copied tasks") as conn:
            if self.dialect.lock_submissions is not None:
                conn.execute(self.dialect.lock_submissions)
            stamp = self._t(now)
            for task, state in moved:
                ref = {"source": source, "source_id": task.id}
                known = conn.execute(SQL_COPIED, ref).scalar()
                if known is not None:
                    results.append((int(known), "already"))
                    continue
                holder = None
                if task.idempotency_key is not None:
                    holder = conn.execute(SQL_FIND_KEY, {"key": task.idempotency_key}).scalar()
                if holder is not None:
                    conn.execute(SQL_RECORD_COPY, {**ref, "task_id": holder, "now": stamp})
                    results.append((int(holder), "key"))
                    continue
                new_id = int(conn.execute(SQL_ALLOCATE, {"n": 1}).scalar_one())
                conn.execute(
                    SQL_INSERT_COPY,
                    {
                        "id": new_id,
                        "name": task.name,
                        "args": dump(task.args),
                        "state": state.value,
                        "due_at": self._t(task.due_at),
                        "attempts": task.attempts,
                        "max_attempts": task.max_attempts,
                        "last_error": None
                        if task.last_error is None
                        else error_json(task.last_error),
                        "key": task.idempotency_key,
                        "created_at": self._t(task.created_at),
                        "now": stamp,
                    },
                )
                self._event(
                    conn,
                    new_id,
                    now,
                    state,
                    task.attempts,
                    f"copied from database {source} task {task.id}",
                )
                conn.execute(SQL_RECORD_COPY, {**ref, "task_id": new_id, "now": stamp})
                results.append((new_id, "copied"))
            self._wake_others(conn)
        return results


def _running_cancel(environment: str | None) -> CancelOutcome:
    return CancelOutcome.ENFORCED if environment == Environment.PROCESS else CancelOutcome.REQUESTED


def _moving(destination: int, state: TaskState | None) -> str:
    """The hand-over line of a task moving to ``destination`` (its prefix, without ``state``)."""
    head = f"moving to database {destination} "
    return head if state is None else f"{head}(was {state.value})"
