"""The durable backend on SQL, for SQLite and PostgreSQL alike: the Store protocol.

One store, one set of statements (:mod:`.statements`); where the two databases
must differ the statement comes from the engine's :class:`SQLDialect`, defined
in that database's module (:mod:`.sqlite`, :mod:`.postgres`). Every outcome
write names the claim that made it in its WHERE clause.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, exc

from durablesched.errors import (
    InvalidTransitionError,
    LeaseExpired,
    StoreError,
    TaskNotFoundError,
)
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
    effective_key,
)
from durablesched.states import TaskState, check_transition
from durablesched.store.protocol import ChangeWatcher, Effect, RetryDelay
from durablesched.store.sql import group_commit
from durablesched.store.sql.codec import dump, error_from_json, error_json, from_db_time, record
from durablesched.store.sql.dialect import SQLDialect
from durablesched.store.sql.migrate import check_schema
from durablesched.store.sql.statements import (
    SQL_ACK_CANCEL,
    SQL_ALLOCATE,
    SQL_ANY_EXPIRED,
    SQL_CANCEL_RUNNING,
    SQL_CANCEL_WAITING,
    SQL_COMPLETE,
    SQL_CONFIRM_MOVE,
    SQL_COPIED,
    SQL_COUNT_BY_STATE,
    SQL_CREATED,
    SQL_EVENT_ID,
    SQL_EXPIRED,
    SQL_FAIL,
    SQL_FIND_KEY,
    SQL_GET,
    SQL_HAND_OVER,
    SQL_HISTORY,
    SQL_IN_PROCESS,
    SQL_IN_TRANSIT,
    SQL_INSERT_COPY,
    SQL_INSERT_EVENT,
    SQL_INSTANCE,
    SQL_IS_VALID,
    SQL_KEY_HELD_BY_OTHER,
    SQL_LEASES,
    SQL_LIVE_IDS,
    SQL_NEXT_DUE,
    SQL_NEXT_EXPIRY,
    SQL_OLDEST_OVERDUE,
    SQL_OVERDUE_BY_NAME,
    SQL_PURGE_BATCH,
    SQL_RECENT_FAILURES,
    SQL_RECLAIM,
    SQL_RECORD_COPY,
    SQL_RECORD_KEY,
    SQL_RELEASE,
    SQL_REQUEUE,
    SQL_RUNNING,
    SQL_STATE,
    SQL_STATE_AND_ENVIRONMENT,
    sql_list_tasks,
)
from durablesched.store.sql.translate import is_busy, translated


class SQLStore:
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
        self.engine = engine
        self.dialect = dialect
        self._t = dialect.time
        self._reader = engine.execution_options(durablesched_read=True)
        self.busy_timeout = busy_timeout
        self._busy_lock = threading.Lock()
        #: The write connection kept open between transactions, and who is using it.
        self._kept: Connection | None = None
        self._kept_lock = threading.Lock()
        self._kept_owner: int | None = None
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        #: Transactions that found the database busy and were retried.
        self.busy_retries = 0
        try:
            with translated(f"opening {engine.url.render_as_string(hide_password=True)}"):
                self.schema_revision = check_schema(engine, migrate=migrate)
        except BaseException:
            engine.dispose()
            raise

    # -- transactions ---------------------------------------------------------------------------

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        """One write transaction: committed if the body returns, rolled back if it raises.

        A process's writers take turns on one connection kept open, queueing on
        a lock: the database admits one writer at a time anyway, and a thread
        woken by a lock goes at once, where SQLite's busy handler polls and
        sleeps. (A pool checkout and return also cost more than a group commit's
        statements.) A write started inside another on the same thread (an
        effect that submits on its own) gets a connection of its own.
        """
        with translated(what):
            nested = self._kept_owner == threading.get_ident()
            if not nested:
                if not self._kept_lock.acquire(timeout=self.busy_timeout):
                    raise StoreError(
                        f"{what} failed: another thread held the database for "
                        f"{self.busy_timeout:g}s (database is locked)"
                    )
                self._kept_owner = threading.get_ident()
            try:
                conn = self._begin(self.engine, None if nested else self._kept)
                if not nested:
                    self._kept = conn
                try:
                    yield conn
                    conn.commit()
                except BaseException:
                    # A kept connection starts afresh next time: it may be what failed.
                    if not nested:
                        self._kept = None
                    try:
                        conn.rollback()
                    finally:
                        conn.close()
                    raise
                if nested:
                    conn.close()
            finally:
                if not nested:
                    self._kept_owner = None
                    self._kept_lock.release()

    @contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        with translated(what):
            conn = self._begin(self._reader)
            try:
                yield conn
            finally:
                conn.rollback()
                conn.close()

    def _begin(self, engine: Engine, kept: Connection | None = None) -> Connection:
        """A connection (``kept``, if given and still usable) in a new transaction; a busy
        database is retried, never surfaced early.

        Only BEGIN can find the database busy (SQLite writes take the lock up
        front), so retrying it repeats no work.
        """
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.002
        while True:
            if kept is not None and not kept.closed and not kept.invalidated:
                conn, kept = kept, None
            else:
                conn = engine.connect()
            try:
                conn.begin()
                return conn
            except exc.OperationalError as e:
                conn.close()
                if not is_busy(e) or time.monotonic() + delay > deadline:
                    raise
            with self._busy_lock:
                self.busy_retries += 1
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.25)

    def _rows(self, conn: Connection, sql: str, params: dict[str, Any]) -> list[Any]:
        """A hot-path statement (from the dialect) straight through the driver: its rows."""
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        except self._driver_error as e:
            raise exc.DBAPIError.instance(sql, params, e, self._driver_error) from e
        finally:
            cursor.close()

    def _many(self, conn: Connection, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """A driver-level statement once per row (history lines, keys, bulk inserts)."""
        cursor = conn.connection.cursor()
        try:
            cursor.executemany(sql, rows)
        except self._driver_error as e:
            raise exc.DBAPIError.instance(sql, rows, e, self._driver_error) from e
        finally:
            cursor.close()

    def _wake_others(self, conn: Connection) -> None:
        """Tell idle workers elsewhere, on commit, that there is work (where needed)."""
        if self.dialect.notify is not None:
            conn.execute(self.dialect.notify)

    # -- Store ----------------------------------------------------------------------------------

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
                return self._insert(connection, tasks, now)
        with self._write("submitting tasks") as conn:
            return self._insert(conn, tasks, now)

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
            rows = self._claim(
                conn,
                owner=owner,
                limit=limit,
                now=now,
                lease=lease,
                names=names,
                process_names=process_names,
            )
        return self._claims(rows, owner, now, lease)

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
            return self._complete(conn, outcome, now) is not None

    def fail(
        self, claim: Claim, error: ErrorInfo, retry_at: datetime | None, now: datetime
    ) -> TaskState | None:
        with self._write(f"recording the failure of task {claim.task_id}") as conn:
            return self._fail(conn, Outcome(claim, error=error, retry_at=retry_at), now)

    def acknowledge_cancel(
        self, claim: Claim, now: datetime, *, detail: str = "cancellation acknowledged"
    ) -> bool:
        with self._write(f"cancelling task {claim.task_id}") as conn:
            return self._acknowledge(conn, claim, now, detail) is not None

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
        plan = group_commit.plan(outcomes)
        with self._write("recording outcomes and claiming") as conn:
            results = self._record_outcomes(conn, outcomes, now, plan)
            rows = (
                self._claim(
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
        return results, self._claims(rows, owner, now, lease)

    def release(self, claims: Sequence[Claim], now: datetime) -> int:
        released = 0
        with self._write("giving back unfinished tasks") as conn:
            for claim in sorted(claims, key=lambda c: c.task_id):
                params = self._claim_params(claim, now)
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
        stamp = self._t(now)
        with self._read("looking for expired leases") as conn:
            if conn.execute(SQL_ANY_EXPIRED, {"now": stamp}).first() is None:
                return []
        reclaimed: list[Reclaimed] = []
        with self._write("reclaiming expired leases") as conn:
            for r in conn.execute(SQL_EXPIRED, {"now": stamp}).all():
                detail = (
                    f"lease of {r.lease_owner} expired at "
                    f"{from_db_time(r.lease_expires_at).isoformat()} during attempt {r.attempts}"
                )
                error = ErrorInfo.recorded(LeaseExpired, detail)
                due_at: datetime | None = None
                finished_at: datetime | None = now
                if r.cancel_requested_at is not None:
                    state = TaskState.CANCELLED
                elif r.attempts >= r.max_attempts:
                    state = TaskState.FAILED
                else:
                    state = TaskState.RETRY_WAIT
                    due_at = now + retry_delay(r.name, r.attempts)
                    finished_at = None
                updated = conn.execute(
                    SQL_RECLAIM,
                    {
                        "id": r.id,
                        "fence": r.fence,
                        "now": stamp,
                        "state": state.value,
                        "due_at": None if due_at is None else self._t(due_at),
                        "finished_at": None if finished_at is None else self._t(finished_at),
                        "error": error_json(error),
                    },
                ).rowcount
                if updated:
                    self._event(conn, r.id, now, state, r.attempts, detail)
                    reclaimed.append(Reclaimed(r.id, r.name, r.attempts, r.lease_owner, state))
        return reclaimed

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
        with self._kept_lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None
        self.engine.dispose()

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

    # -- internals ------------------------------------------------------------------------------

    def _insert(self, conn: Connection, tasks: Sequence[NewTask], now: datetime) -> list[Submitted]:
        if not tasks:
            return []
        if self.dialect.lock_submissions is not None:
            conn.execute(self.dialect.lock_submissions)
        if all(task.idempotency_key is None for task in tasks):
            # The bulk path: no key to look up, every task is new.
            ids = self._insert_new(conn, tasks, now)
            return list(map(Submitted, ids, itertools.repeat(True, len(ids))))
        # Each slot is either the holder of a key already stored, or (index into
        # `new`, created?) where a repeat of a key within this batch is not created.
        slots: list[Submitted | tuple[int, bool]] = []
        new: list[NewTask] = []
        batch_keys: dict[str, int] = {}
        for task in tasks:
            key = task.idempotency_key
            if key is not None:
                if key in batch_keys:
                    slots.append((batch_keys[key], False))
                    continue
                holder = conn.execute(SQL_FIND_KEY, {"key": key}).scalar()
                if holder is not None:
                    slots.append(Submitted(holder, created=False))
                    continue
                batch_keys[key] = len(new)
            slots.append((len(new), True))
            new.append(task)
        ids = self._insert_new(conn, new, now) if new else []
        return [
            slot if isinstance(slot, Submitted) else Submitted(ids[slot[0]], created=slot[1])
            for slot in slots
        ]

    def _insert_new(self, conn: Connection, new: Sequence[NewTask], now: datetime) -> list[int]:
        """Insert tasks known to be new, with fresh ids; one executemany for them all."""
        end = conn.execute(SQL_ALLOCATE, {"n": len(new)}).scalar_one()
        ids = range(end - len(new) + 1, end + 1)
        stamp = self._t(now)
        # A batch usually shares one due time: each distinct one is converted once.
        due = {when: self._t(when) for when in {task.due_at for task in new}}
        to_json = dump  # a local, for the loop below
        rows = [
            (
                task_id,
                task_id,
                task.name,
                task.args_json if task.args_json is not None else to_json(task.args),
                due[task.due_at],
                task.max_attempts,
                task.idempotency_key,
                stamp,
                stamp,
            )
            for task_id, task in zip(ids, new, strict=True)
        ]
        # Straight to the driver's executemany: this is the bulk-submit hot path.
        self._many(conn, self.dialect.insert_task, rows)
        self._wake_others(conn)
        return list(ids)

    def _claim(
        self,
        conn: Connection,
        *,
        owner: str,
        limit: int,
        now: datetime,
        lease: timedelta,
        names: Collection[str] | None,
        process_names: Collection[str] = (),
    ) -> list[Any]:
        """Claim in ``conn``'s transaction; the rows for :meth:`_claims`, to be made
        into claims after it commits."""
        stamp = self._t(now)
        params: dict[str, Any] = {
            "owner": owner,
            "lease_expires_at": self._t(now + lease),
            "now": stamp,
            "limit": limit,
        }
        sql = self.dialect.claim
        if names is not None:
            ordered = sorted(names)
            sql = self.dialect.claim_for(len(ordered))
            params.update((f"n{i}", name) for i, name in enumerate(ordered))
        # id, seq, name, args, attempts, max_attempts, fence, due_at, idempotency_key
        rows = self._rows(conn, sql, params)
        if not rows:
            return []
        in_process = [r[0] for r in rows if r[2] in process_names]
        if in_process:
            conn.execute(SQL_IN_PROCESS, {"ids": in_process})
        if not self.dialect.writes_history:
            detail = f"claimed by {owner}"
            self._many(
                conn,
                self.dialect.insert_events,
                [(r[0], stamp, "RUNNING", r[4], detail) for r in rows],
            )
        return rows

    @staticmethod
    def _claims(rows: list[Any], owner: str, now: datetime, lease: timedelta) -> list[Claim]:
        """Claims from the rows :meth:`_claim` returned, in (due_at, seq) order."""
        rows.sort(key=lambda r: (r[7], r[1]))  # times compare as stored
        expires = now + lease
        due: dict[Any, datetime] = {}  # tasks submitted together share a due time
        claims = []
        for task_id, seq, name, args, attempts, max_attempts, fence, due_at, key in rows:
            when = due.get(due_at)
            if when is None:
                when = due[due_at] = from_db_time(due_at)
            claims.append(
                Claim(
                    task_id=task_id,
                    name=name,
                    args={} if args == "{}" else json.loads(args),
                    attempt=attempts,
                    max_attempts=max_attempts,
                    owner=owner,
                    fence=fence,
                    lease_expires_at=expires,
                    due_at=when,
                    seq=seq,
                    idempotency_key=effective_key(task_id, key),
                )
            )
        return claims

    def _record_outcomes(
        self, conn: Connection, outcomes: Sequence[Outcome], now: datetime, plan: group_commit.Plan
    ) -> list[OutcomeResult]:
        """Outcomes in the order of ``plan`` (made before the transaction began)."""
        results: list[OutcomeResult] = [None] * len(outcomes)
        for step in plan:
            if isinstance(step, int):
                results[step] = self._apply(conn, outcomes[step], now)
                continue
            for index, state in zip(
                step.indexes, self._complete_many(conn, step, now), strict=True
            ):
                results[index] = state
        return results

    def _apply(self, conn: Connection, outcome: Outcome, now: datetime) -> OutcomeResult:
        if outcome.error is not None:
            return self._fail(conn, outcome, now)
        if outcome.cancelled:
            try:
                return self._acknowledge(conn, outcome.claim, now)
            except InvalidTransitionError as e:
                return e
        if not (outcome.effects or outcome.children):
            return self._complete(conn, outcome, now)
        savepoint = conn.begin_nested()
        try:
            state = self._complete(conn, outcome, now)
        except Exception as e:  # an effect raised: undo this outcome alone
            savepoint.rollback()
            return e
        savepoint.commit()
        return state

    def _complete(self, conn: Connection, outcome: Outcome, now: datetime) -> TaskState | None:
        claim = outcome.claim
        result_json = dump(outcome.result)
        params = self._claim_params(claim, now)
        row = conn.execute(SQL_COMPLETE, {**params, "result": result_json}).first()
        if row is None:
            return None
        conn.execute(
            SQL_RECORD_KEY,
            {
                "key": effective_key(claim.task_id, row.idempotency_key),
                "task_id": claim.task_id,
                "now": params["now"],
                "result": result_json,
            },
        )
        if outcome.children:
            self._insert(conn, outcome.children, now)
        for effect in outcome.effects:
            effect(conn)
        self._event(conn, claim.task_id, now, TaskState.SUCCEEDED, row.attempts, None)
        return TaskState.SUCCEEDED

    def _complete_many(
        self, conn: Connection, run: group_commit.SuccessRun, now: datetime
    ) -> list[TaskState | None]:
        """Plain successes of distinct tasks in three statements in all: their new states."""
        stamp = self._t(now)
        # id, attempts, idempotency_key, result
        rows = {
            r[0]: r
            for r in self._rows(
                conn, self.dialect.complete_many, {"batch": run.batch, "now": stamp}
            )
        }
        if rows and not self.dialect.writes_history:
            done = [rows[task_id] for task_id in run.task_ids if task_id in rows]
            self._many(
                conn,
                self.dialect.record_keys,
                [(effective_key(r[0], r[2]), r[0], stamp, r[3]) for r in done],
            )
            self._many(
                conn,
                self.dialect.insert_events,
                [(r[0], stamp, "SUCCEEDED", r[1], None) for r in done],
            )
        return [TaskState.SUCCEEDED if task_id in rows else None for task_id in run.task_ids]

    def _fail(self, conn: Connection, outcome: Outcome, now: datetime) -> TaskState | None:
        assert outcome.error is not None
        params = {
            **self._claim_params(outcome.claim, now),
            "give_up": 1 if outcome.retry_at is None else 0,
            "retry_at": None if outcome.retry_at is None else self._t(outcome.retry_at),
            "error": error_json(outcome.error),
        }
        row = conn.execute(SQL_FAIL, params).first()
        if row is None:
            return None
        state = TaskState(row.state)
        self._event(conn, outcome.claim.task_id, now, state, row.attempts, outcome.error.message)
        return state

    def _acknowledge(
        self,
        conn: Connection,
        claim: Claim,
        now: datetime,
        detail: str = "cancellation acknowledged",
    ) -> TaskState | None:
        params = self._claim_params(claim, now)
        row = conn.execute(SQL_ACK_CANCEL, params).first()
        if row is None:
            if conn.execute(SQL_IS_VALID, params).first() is not None:
                raise InvalidTransitionError(
                    f"task {claim.task_id} cannot acknowledge a cancellation nobody requested"
                )
            return None
        self._event(conn, claim.task_id, now, TaskState.CANCELLED, row.attempts, detail)
        return TaskState.CANCELLED

    def _event(  # noqa: PLR0917 - one history line's fields, always given in this order
        self,
        conn: Connection,
        task_id: int,
        at: datetime,
        state: TaskState,
        attempt: int,
        detail: str | None,
    ) -> None:
        """Append one line to the task's history, in the transaction that made the change."""
        conn.execute(
            SQL_INSERT_EVENT,
            {
                "task_id": task_id,
                "at": self._t(at),
                "state": state.value,
                "attempt": attempt,
                "detail": detail,
            },
        )

    def _claim_params(self, claim: Claim, now: datetime) -> dict[str, Any]:
        return {
            "id": claim.task_id,
            "owner": claim.owner,
            "fence": claim.fence,
            "now": self._t(now),
        }


def _running_cancel(environment: str | None) -> CancelOutcome:
    return CancelOutcome.ENFORCED if environment == Environment.PROCESS else CancelOutcome.REQUESTED


def _moving(destination: int, state: TaskState | None) -> str:
    """The hand-over line of a task moving to ``destination`` (its prefix, without ``state``)."""
    head = f"moving to database {destination} "
    return head if state is None else f"{head}(was {state.value})"
