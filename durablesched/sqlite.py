"""The durable backend: one SQLite file through SQLAlchemy Core. All of its SQL is here.

Every write transaction begins IMMEDIATE (no read is ever upgraded into a
write), the journal is WAL, and every outcome write names the claim that made
it in its WHERE clause. Reads run in deferred transactions on the same pool.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from sqlalchemy import Connection, Engine, Row, bindparam, create_engine, event, exc, text
from sqlalchemy.engine import make_url
from sqlalchemy.sql.elements import BindParameter

from .errors import (
    ConfigurationError,
    DurableSchedError,
    InvalidTransitionError,
    SchemaError,
    StoreError,
    TaskNotFoundError,
)
from .inotify import watch_directory
from .migrate import check_schema
from .records import (
    CancelOutcome,
    Claim,
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
from .schema import CLAIMABLE_SQL
from .states import TaskState, check_transition
from .store import Effect, RetryDelay

Durability = Literal["full", "normal"]
#: PRAGMA synchronous per durability mode (see docs/durability.md).
SYNCHRONOUS: dict[str, str] = {"full": "FULL", "normal": "NORMAL"}
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_BUSY, SQLITE_LOCKED = 5, 6
#: Seconds SQLite's own busy handler waits before our retry loop takes over.
LOCK_WAIT = 5.0

# -- the SQL -------------------------------------------------------------------------------------

#: Valid claim: RUNNING, same owner, same fence, lease not yet expired.
VALID = (
    "id = :id AND state = 'RUNNING' AND lease_owner = :owner AND fence = :fence "
    "AND lease_expires_at > :now"
)
TASK_COLUMNS = (
    "id, seq, name, args, state, due_at, attempts, max_attempts, lease_owner, "
    "lease_expires_at, fence, cancel_requested_at, result, last_error, idempotency_key, "
    "created_at, updated_at, finished_at"
)
#: Names bound one parameter each (an expanding IN), compared exactly as stored.
NAMES_FILTER = "AND name IN :names"
_NAMES: BindParameter[list[str]] = bindparam("names", expanding=True)

SQL_ALLOCATE = text(
    "UPDATE durablesched_counters SET value = value + :n WHERE name = 'task_seq' RETURNING value"
)
SQL_FIND_KEY = text(
    "SELECT id FROM tasks WHERE idempotency_key = :key AND "
    "state IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED')"
)
SQL_INSERT_TASK_QMARK = (
    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence, "
    "idempotency_key, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, 'PENDING', ?, 0, ?, 0, ?, ?, ?)"
)
#: The bulk inserts of the group commit, straight to the driver's executemany.
SQL_INSERT_EVENTS_QMARK = (
    "INSERT INTO task_events (task_id, at, state, attempt, detail) VALUES (?, ?, ?, ?, ?)"
)
SQL_RECORD_KEYS_QMARK = (
    "INSERT INTO idempotency_keys (key, task_id, recorded_at, result) VALUES (?, ?, ?, ?)"
)
SQL_INSERT_EVENT = text(
    "INSERT INTO task_events (task_id, at, state, attempt, detail) "
    "VALUES (:task_id, :at, :state, :attempt, :detail)"
)


def _claim_sql(names: bool) -> str:
    return (
        "UPDATE tasks SET state = 'RUNNING', attempts = attempts + 1, fence = fence + 1, "
        "lease_owner = :owner, lease_expires_at = :lease_expires_at, updated_at = :now "
        # INDEXED BY: with statistics (ANALYZE, PRAGMA optimize) SQLite may prefer
        # the (state, name) index and sort; the claim must always walk this one.
        "WHERE id IN (SELECT id FROM tasks INDEXED BY ix_tasks_claimable "
        f"WHERE {CLAIMABLE_SQL} AND due_at <= :now {NAMES_FILTER if names else ''} "
        "ORDER BY due_at, seq LIMIT :limit) "
        "RETURNING id, seq, name, args, attempts, max_attempts, fence, due_at, idempotency_key"
    )


#: The claim: one statement, earliest (due_at, seq) first, via ix_tasks_claimable.
SQL_CLAIM = text(_claim_sql(names=False))
SQL_CLAIM_NAMED = text(_claim_sql(names=True)).bindparams(_NAMES)
SQL_HEARTBEAT = text(
    "UPDATE tasks SET lease_expires_at = :lease_expires_at, updated_at = :now "
    "WHERE id IN (SELECT CAST(key AS INTEGER) FROM json_each(:fences)) "
    "AND fence = json_extract(:fences, '$.\"' || id || '\"') "
    "AND state = 'RUNNING' AND lease_owner = :owner AND lease_expires_at > :now "
    "RETURNING id, fence, lease_expires_at, cancel_requested_at"
)
SQL_COMPLETE = text(
    "UPDATE tasks SET state = 'SUCCEEDED', result = :result, lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = :now, finished_at = :now "
    f"WHERE {VALID} RETURNING attempts, idempotency_key"
)
#: Successes without effects or children, many in one statement. ``:batch`` maps
#: each task id to its claim's owner, fence and result (JSON text).
_BATCH_ITEM = "json_extract(:batch, '$.\"' || id || '\".{field}')"
SQL_COMPLETE_MANY = text(
    "UPDATE tasks SET state = 'SUCCEEDED', "
    f"result = {_BATCH_ITEM.format(field='r')}, lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = :now, finished_at = :now "
    "WHERE id IN (SELECT CAST(key AS INTEGER) FROM json_each(:batch)) AND state = 'RUNNING' "
    f"AND lease_owner = {_BATCH_ITEM.format(field='o')} "
    f"AND fence = {_BATCH_ITEM.format(field='f')} AND lease_expires_at > :now "
    "RETURNING id, attempts, idempotency_key, result"
)
SQL_RECORD_KEY = text(
    "INSERT INTO idempotency_keys (key, task_id, recorded_at, result) "
    "VALUES (:key, :task_id, :now, :result)"
)
_GIVE_UP = "(:retry_at IS NULL OR cancel_requested_at IS NOT NULL)"
SQL_FAIL = text(
    f"UPDATE tasks SET state = CASE WHEN {_GIVE_UP} THEN 'FAILED' ELSE 'RETRY_WAIT' END, "
    f"due_at = CASE WHEN {_GIVE_UP} THEN due_at ELSE :retry_at END, "
    f"finished_at = CASE WHEN {_GIVE_UP} THEN :now ELSE NULL END, "
    "last_error = :error, lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    f"WHERE {VALID} RETURNING state, attempts"
)
SQL_ACK_CANCEL = text(
    "UPDATE tasks SET state = 'CANCELLED', lease_owner = NULL, lease_expires_at = NULL, "
    "updated_at = :now, finished_at = :now "
    f"WHERE {VALID} AND cancel_requested_at IS NOT NULL RETURNING attempts"
)
#: A stopping worker gives a claim back: the attempt does not count.
SQL_RELEASE = text(
    "UPDATE tasks SET state = CASE WHEN cancel_requested_at IS NULL THEN 'PENDING' "
    "ELSE 'CANCELLED' END, "
    "attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END, "
    "finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE :now END, "
    "lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    f"WHERE {VALID} RETURNING state, attempts"
)
SQL_IS_VALID = text(f"SELECT 1 FROM tasks WHERE {VALID}")
SQL_CANCEL_WAITING = text(
    "UPDATE tasks SET state = 'CANCELLED', updated_at = :now, finished_at = :now "
    f"WHERE id = :id AND {CLAIMABLE_SQL} RETURNING attempts"
)
SQL_CANCEL_RUNNING = text(
    "UPDATE tasks SET cancel_requested_at = :now, updated_at = :now "
    "WHERE id = :id AND state = 'RUNNING' AND cancel_requested_at IS NULL RETURNING id"
)
SQL_STATE = text("SELECT state FROM tasks WHERE id = :id")
SQL_ANY_EXPIRED = text(
    "SELECT 1 FROM tasks WHERE state = 'RUNNING' AND lease_expires_at <= :now LIMIT 1"
)
SQL_EXPIRED = text(
    "SELECT id, name, attempts, max_attempts, lease_owner, lease_expires_at, "
    "cancel_requested_at, fence FROM tasks "
    "WHERE state = 'RUNNING' AND lease_expires_at <= :now ORDER BY id"
)
#: The reclaim re-checks state, fence and expiry itself: a completion that
#: landed a moment earlier is never overwritten.
SQL_RECLAIM = text(
    "UPDATE tasks SET state = :state, due_at = coalesce(:due_at, due_at), "
    "finished_at = :finished_at, "
    "last_error = :error, lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    "WHERE id = :id AND state = 'RUNNING' AND fence = :fence AND lease_expires_at <= :now"
)
SQL_NEXT_DUE = text(
    f"SELECT due_at FROM tasks WHERE {CLAIMABLE_SQL} AND due_at > :now ORDER BY due_at, seq LIMIT 1"
)
SQL_NEXT_DUE_NAMED = text(
    "SELECT due_at FROM tasks INDEXED BY ix_tasks_claimable "
    f"WHERE {CLAIMABLE_SQL} AND due_at > :now {NAMES_FILTER} "
    "ORDER BY due_at, seq LIMIT 1"
).bindparams(_NAMES)
SQL_NEXT_EXPIRY = text(
    "SELECT lease_expires_at FROM tasks WHERE state = 'RUNNING' AND lease_expires_at > :now "
    "ORDER BY lease_expires_at LIMIT 1"
)
# -- operator statements (the CLI's retry, stats and purge) ------------------------------------

SQL_REQUEUE = text(
    "UPDATE tasks SET state = 'PENDING', due_at = :now, seq = :seq, attempts = 0, "
    "lease_owner = NULL, lease_expires_at = NULL, cancel_requested_at = NULL, result = NULL, "
    "finished_at = NULL, updated_at = :now "
    "WHERE id = :id AND state IN ('FAILED', 'CANCELLED') RETURNING id"
)
SQL_KEY_HELD_BY_OTHER = text(
    "SELECT other.id FROM tasks AS this JOIN tasks AS other "
    "ON other.idempotency_key = this.idempotency_key AND other.id != this.id "
    "WHERE this.id = :id AND other.state IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED')"
)
SQL_COUNT_BY_STATE = text("SELECT state, count(*) AS n FROM tasks GROUP BY state ORDER BY state")
SQL_OLDEST_OVERDUE = text(
    f"SELECT id, name, due_at FROM tasks WHERE {CLAIMABLE_SQL} AND due_at <= :now "
    "ORDER BY due_at, seq LIMIT 1"
)
SQL_OVERDUE_BY_NAME = text(
    f"SELECT name, count(*) AS n, min(due_at) AS oldest FROM tasks "
    f"WHERE {CLAIMABLE_SQL} AND due_at <= :now GROUP BY name ORDER BY oldest"
)
SQL_RUNNING = text(
    "SELECT id, name, attempts, lease_owner, lease_expires_at, cancel_requested_at "
    "FROM tasks WHERE state = 'RUNNING' ORDER BY lease_expires_at"
)
SQL_RECENT_FAILURES = text(
    "SELECT id, name, attempts, finished_at, last_error FROM tasks "
    "WHERE state = 'FAILED' AND finished_at >= :since ORDER BY finished_at DESC"
)
#: Finished tasks only, oldest first, a bounded batch per transaction.
SQL_PURGE_BATCH = text(
    "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks "
    "WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND finished_at < :before "
    "ORDER BY finished_at LIMIT :batch)"
)

SQL_GET = text(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = :id")
SQL_HISTORY = text(
    "SELECT task_id, at, state, attempt, detail FROM task_events WHERE task_id = :id ORDER BY id"
)


# -- time and JSON as stored ---------------------------------------------------------------------


def to_db_time(when: datetime) -> str:
    """UTC, fixed width, so that text order is time order and a person can read it."""
    return when.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def from_db_time(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _opt_time(value: str | None) -> datetime | None:
    return None if value is None else from_db_time(value)


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _error_json(error: ErrorInfo) -> str:
    return _dump({"type": error.type, "message": error.message, "traceback": error.traceback})


def _error(value: str | None) -> ErrorInfo | None:
    if value is None:
        return None
    data = json.loads(value)
    return ErrorInfo(str(data["type"]), str(data["message"]), str(data["traceback"]))


# -- the engine ----------------------------------------------------------------------------------


def sqlite_url(db: str | os.PathLike[str]) -> str:
    """An SQLAlchemy URL for ``db``, a file path or an ``sqlite://`` URL."""
    raw = os.fspath(db)
    if "://" in raw:
        url = make_url(raw)
        if url.get_backend_name() != "sqlite":
            raise ConfigurationError(
                f"only SQLite databases are supported here, got a {url.get_backend_name()} URL"
            )
        return raw
    return f"sqlite:///{Path(raw).expanduser().resolve()}"


def _prepare_file(url: str, file_mode: int) -> None:
    """Refuse a directory or a non-SQLite file; create a new file with ``file_mode``."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a database file")
    if path.exists():
        if path.stat().st_size:
            with path.open("rb") as fh:
                if fh.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    raise SchemaError(f"{path} is not a SQLite database")
        return
    if not path.parent.is_dir():
        raise StoreError(f"cannot create {path}: the directory {path.parent} does not exist")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, file_mode)
    except FileExistsError:
        return
    except OSError as e:
        raise StoreError(f"cannot create {path}: {e.strerror}") from None
    os.close(fd)
    os.chmod(path, file_mode)  # exactly as asked, whatever the umask


def create_sqlite_engine(
    db: str | os.PathLike[str],
    *,
    durability: Durability = "full",
    busy_timeout: float = 30.0,
    pool_size: int = 8,
    file_mode: int = 0o600,
) -> Engine:
    """An engine with WAL, foreign keys, a busy timeout and IMMEDIATE write transactions.

    Connections from ``engine.execution_options(durablesched_read=True)``
    begin deferred transactions instead, for reads.
    """
    if durability not in SYNCHRONOUS:
        raise ConfigurationError(f"durability must be 'full' or 'normal', got {durability!r}")
    url = sqlite_url(db)
    _prepare_file(url, file_mode)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=64,
        connect_args={"check_same_thread": False, "timeout": busy_timeout},
    )
    synchronous = SYNCHRONOUS[durability]
    timeout_ms = int(busy_timeout * 1000)
    path = _file_path(engine)

    if path is not None:

        @event.listens_for(engine, "do_connect")
        def _open_existing(
            _dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]
        ) -> sqlite3.Connection:
            # mode=rw: a connection opened later, after the file was removed, must
            # fail rather than quietly create a new, empty database in its place.
            uri = f"file:{quote(str(path), safe='/')}?mode=rw"
            connection: sqlite3.Connection = sqlite3.connect(uri, uri=True, **cparams)
            return connection

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # We issue BEGIN ourselves (below), so the driver must not.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {timeout_ms}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if conn.get_execution_options().get("durablesched_read"):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _is_busy(error: exc.DBAPIError) -> bool:
    code = getattr(error.orig, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
    return "database is locked" in str(error.orig)


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Database errors leave as StoreError (or SchemaError) naming what failed."""
    try:
        yield
    except exc.DBAPIError as e:
        message = str(e.orig) if e.orig is not None else str(e)
        if "not a database" in message:
            raise SchemaError(f"{what}: the file is not a SQLite database ({message})") from e
        if "no such table" in message:
            raise SchemaError(f"{what}: the durablesched schema is missing ({message})") from e
        raise StoreError(f"{what} failed: {message}") from e


# -- the store -----------------------------------------------------------------------------------


class SQLiteStore:
    """A :class:`~durablesched.store.Store` in one SQLite file.

    ``db`` is a path or an ``sqlite:///`` URL. A new file is created at the
    current schema; an older schema is upgraded only with ``migrate=True``; a
    newer one is refused with :class:`SchemaError`. A new file is created
    with ``file_mode`` (owner read/write only by default). ``durability="full"``
    (the default) survives power loss; ``"normal"`` survives process crashes
    but may lose the last commits on power loss (docs/durability.md).
    """

    def __init__(
        self,
        db: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        migrate: bool = False,
        busy_timeout: float = 30.0,
        file_mode: int = 0o600,
    ) -> None:
        # SQLite's own busy handler waits up to LOCK_WAIT per try; on top of it we
        # retry with jittered backoff until ``busy_timeout`` has passed in all.
        self.engine = create_sqlite_engine(
            db,
            durability=durability,
            busy_timeout=min(LOCK_WAIT, busy_timeout),
            file_mode=file_mode,
        )
        self._reader = self.engine.execution_options(durablesched_read=True)
        self.durability = durability
        self.busy_timeout = busy_timeout
        #: The opened file's (device, inode): a watcher compares against it later.
        self._identity = _file_identity(_file_path(self.engine))
        self._busy_lock = threading.Lock()
        #: Transactions that found the database busy and were retried.
        self.busy_retries = 0
        try:
            with _translated(f"opening {self.engine.url.database}"):
                self.schema_revision = check_schema(self.engine, migrate=migrate)
        except BaseException:
            self.engine.dispose()
            raise

    # -- transactions ---------------------------------------------------------------------------

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        """One IMMEDIATE transaction: committed if the body returns, rolled back if it raises."""
        with _translated(what):
            conn = self._begin(self.engine)
            try:
                yield conn
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                conn.close()

    @contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        with _translated(what):
            conn = self._begin(self._reader)
            try:
                yield conn
            finally:
                conn.rollback()
                conn.close()

    def _begin(self, engine: Engine) -> Connection:
        """A connection in a new transaction; a busy database is retried, never surfaced early.

        Only BEGIN can find the database busy (writes take the lock up front),
        so retrying it repeats no work.
        """
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.002
        while True:
            conn = engine.connect()
            try:
                conn.begin()
                return conn
            except exc.OperationalError as e:
                conn.close()
                if not _is_busy(e) or time.monotonic() + delay > deadline:
                    raise
            with self._busy_lock:
                self.busy_retries += 1
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.25)

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
            with _translated("submitting tasks"):
                return self._insert(connection, tasks, now)
        with self._write("submitting tasks") as conn:
            return self._insert(conn, tasks, now)

    def get(self, task_id: int) -> TaskRecord | None:
        with self._read(f"reading task {task_id}") as conn:
            row = conn.execute(SQL_GET, {"id": task_id}).first()
        return None if row is None else _record(row)

    def history(self, task_id: int) -> list[TaskEvent]:
        with self._read(f"reading the history of task {task_id}") as conn:
            created = conn.execute(
                text("SELECT created_at FROM tasks WHERE id = :id"), {"id": task_id}
            ).scalar()
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
        clauses = []
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            clauses.append("state = :state")
            params["state"] = TaskState(state).value
        if name is not None:
            clauses.append("name = :name")
            params["name"] = name
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = text(f"SELECT {TASK_COLUMNS} FROM tasks {where} ORDER BY due_at, seq LIMIT :limit")
        with self._read("listing tasks") as conn:
            return [_record(r) for r in conn.execute(sql, params)]

    def claim(
        self,
        owner: str,
        limit: int,
        now: datetime,
        lease: timedelta,
        names: Collection[str] | None = None,
    ) -> list[Claim]:
        if limit <= 0:
            return []
        with self._write("claiming tasks") as conn:
            return _claim(conn, owner=owner, limit=limit, now=now, lease=lease, names=names)

    def heartbeat(
        self, owner: str, claims: Sequence[Claim], now: datetime, lease: timedelta
    ) -> list[LeaseStatus]:
        if not claims:
            return []
        params = {
            "fences": _dump({str(c.task_id): c.fence for c in claims if c.owner == owner}),
            "owner": owner,
            "now": to_db_time(now),
            "lease_expires_at": to_db_time(now + lease),
        }
        with self._write("renewing leases") as conn:
            rows = sorted(conn.execute(SQL_HEARTBEAT, params).all(), key=lambda r: int(r.id))
        return [
            LeaseStatus(
                r.id, r.fence, from_db_time(r.lease_expires_at), r.cancel_requested_at is not None
            )
            for r in rows
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
            return self._complete(conn, outcome, to_db_time(now), now) is not None

    def fail(
        self, claim: Claim, error: ErrorInfo, retry_at: datetime | None, now: datetime
    ) -> TaskState | None:
        with self._write(f"recording the failure of task {claim.task_id}") as conn:
            return _fail(conn, Outcome(claim, error=error, retry_at=retry_at), to_db_time(now))

    def acknowledge_cancel(self, claim: Claim, now: datetime) -> bool:
        with self._write(f"cancelling task {claim.task_id}") as conn:
            return _acknowledge(conn, claim, to_db_time(now)) is not None

    def record_and_claim(
        self,
        outcomes: Sequence[Outcome],
        now: datetime,
        *,
        owner: str,
        limit: int,
        lease: timedelta,
        names: Collection[str] | None = None,
    ) -> tuple[list[OutcomeResult], list[Claim]]:
        """Group commit: every outcome, then a claim into the freed slots, in one transaction.

        Each outcome with effects or children runs under a savepoint, so one
        that raises is undone alone and comes back as its exception.
        """
        stamp = to_db_time(now)
        with self._write("recording outcomes and claiming") as conn:
            results = self._record_outcomes(conn, outcomes, stamp, now)
            claims = (
                _claim(conn, owner=owner, limit=limit, now=now, lease=lease, names=names)
                if limit > 0
                else []
            )
        return results, claims

    def _record_outcomes(
        self, conn: Connection, outcomes: Sequence[Outcome], stamp: str, now: datetime
    ) -> list[OutcomeResult]:
        """Outcomes in order; consecutive plain successes of distinct tasks share statements."""
        results: list[OutcomeResult] = [None] * len(outcomes)
        group: dict[int, int] = {}  # task id -> index, for the current run of plain successes

        def flush() -> None:
            indexes = list(group.values())
            for task_id, state in _complete_many(conn, [outcomes[i] for i in indexes], stamp):
                results[group[task_id]] = state
            group.clear()

        for index, outcome in enumerate(outcomes):
            plain = not (outcome.error or outcome.cancelled or outcome.effects or outcome.children)
            if plain and outcome.claim.task_id not in group:
                group[outcome.claim.task_id] = index
                continue
            flush()
            if plain:
                group[outcome.claim.task_id] = index
            else:
                results[index] = self._apply(conn, outcome, stamp, now)
        flush()
        return results

    def _apply(
        self, conn: Connection, outcome: Outcome, stamp: str, now: datetime
    ) -> OutcomeResult:
        if outcome.error is not None:
            return _fail(conn, outcome, stamp)
        if outcome.cancelled:
            try:
                return _acknowledge(conn, outcome.claim, stamp)
            except InvalidTransitionError as e:
                return e
        if not (outcome.effects or outcome.children):
            return self._complete(conn, outcome, stamp, now)
        savepoint = conn.begin_nested()
        try:
            state = self._complete(conn, outcome, stamp, now)
        except Exception as e:  # an effect raised: undo this outcome alone
            savepoint.rollback()
            return e
        savepoint.commit()
        return state

    def _complete(
        self, conn: Connection, outcome: Outcome, stamp: str, now: datetime
    ) -> TaskState | None:
        claim = outcome.claim
        result_json = _dump(outcome.result)
        row = conn.execute(
            SQL_COMPLETE, {**_claim_params(claim, stamp), "result": result_json}
        ).first()
        if row is None:
            return None
        conn.execute(
            SQL_RECORD_KEY,
            {
                "key": effective_key(claim.task_id, row.idempotency_key),
                "task_id": claim.task_id,
                "now": stamp,
                "result": result_json,
            },
        )
        if outcome.children:
            self._insert(conn, outcome.children, now)
        for effect in outcome.effects:
            effect(conn)
        _event(
            conn,
            claim.task_id,
            at=stamp,
            state=TaskState.SUCCEEDED,
            attempt=row.attempts,
            detail=None,
        )
        return TaskState.SUCCEEDED

    def release(self, claims: Sequence[Claim], now: datetime) -> int:
        released = 0
        with self._write("giving back unfinished tasks") as conn:
            for claim in claims:
                params = _claim_params(claim, to_db_time(now))
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
                _event(
                    conn,
                    claim.task_id,
                    at=params["now"],
                    state=state,
                    attempt=row.attempts,
                    detail=detail,
                )
        return released

    def request_cancel(self, task_id: int, now: datetime) -> CancelOutcome:
        params: dict[str, Any] = {"id": task_id, "now": to_db_time(now)}
        with self._write(f"cancelling task {task_id}") as conn:
            row = conn.execute(SQL_CANCEL_WAITING, params).first()
            if row is not None:
                _event(
                    conn,
                    task_id,
                    at=params["now"],
                    state=TaskState.CANCELLED,
                    attempt=row.attempts,
                    detail="cancelled before start",
                )
                return CancelOutcome.CANCELLED
            if conn.execute(SQL_CANCEL_RUNNING, params).first() is not None:
                return CancelOutcome.REQUESTED
            state = conn.execute(SQL_STATE, params).scalar()
            if state is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            # Asked before: the first request's time stands.
            return CancelOutcome.REQUESTED if state == "RUNNING" else CancelOutcome.TOO_LATE

    def reclaim_expired(self, now: datetime, retry_delay: RetryDelay) -> list[Reclaimed]:
        stamp = to_db_time(now)
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
                error = ErrorInfo("durablesched.LeaseExpired", detail, "")
                due_at: str | None = None
                finished_at: str | None = stamp
                if r.cancel_requested_at is not None:
                    state = TaskState.CANCELLED
                elif r.attempts >= r.max_attempts:
                    state = TaskState.FAILED
                else:
                    state = TaskState.RETRY_WAIT
                    due_at = to_db_time(now + retry_delay(r.name, r.attempts))
                    finished_at = None
                updated = conn.execute(
                    SQL_RECLAIM,
                    {
                        "id": r.id,
                        "fence": r.fence,
                        "now": stamp,
                        "state": state.value,
                        "due_at": due_at,
                        "finished_at": finished_at,
                        "error": _error_json(error),
                    },
                ).rowcount
                if updated:
                    _event(conn, r.id, at=stamp, state=state, attempt=r.attempts, detail=detail)
                    reclaimed.append(Reclaimed(r.id, r.name, r.attempts, r.lease_owner, state))
        return reclaimed

    def next_wakeup(self, now: datetime, names: Collection[str] | None = None) -> datetime | None:
        params: dict[str, Any] = {"now": to_db_time(now)}
        due_sql = SQL_NEXT_DUE
        if names is not None:
            due_sql = SQL_NEXT_DUE_NAMED
            params["names"] = sorted(names)
        with self._read("finding the next due time") as conn:
            times = [
                conn.execute(due_sql, params).scalar(),
                conn.execute(SQL_NEXT_EXPIRY, params).scalar(),
            ]
        found = [from_db_time(t) for t in times if t is not None]
        return min(found, default=None)

    # -- operator actions (not part of the Store protocol) ----------------------------------------

    def requeue(self, task_id: int, now: datetime) -> None:
        """FAILED or CANCELLED back to PENDING, due ``now``, with a fresh attempt budget.

        :class:`TaskNotFoundError` for an unknown id; :class:`InvalidTransitionError`
        if the task is in another state or another task now holds its key.
        """
        stamp = to_db_time(now)
        with self._write(f"requeueing task {task_id}") as conn:
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
            _event(conn, task_id, at=stamp, state=TaskState.PENDING, attempt=0, detail="requeued")

    def stats(self, now: datetime) -> dict[str, Any]:
        """Counts per state, the oldest overdue task, running leases, recent failures."""
        params = {"now": to_db_time(now), "since": to_db_time(now - timedelta(hours=1))}
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
                    "error": _error(r.last_error),
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
                    SQL_PURGE_BATCH, {"before": to_db_time(before), "batch": batch}
                ).rowcount
            total += deleted
            if deleted < batch:
                return total

    def watch_changes(self, poll_interval: float = 0.01) -> DataVersionWatcher:
        return DataVersionWatcher(self.engine, poll_interval, self._identity)

    def close(self) -> None:
        self.engine.dispose()

    # -- internals ------------------------------------------------------------------------------

    def _insert(self, conn: Connection, tasks: Sequence[NewTask], now: datetime) -> list[Submitted]:
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
        ids: list[int] = []
        if new:
            end = conn.execute(SQL_ALLOCATE, {"n": len(new)}).scalar_one()
            ids = list(range(end - len(new) + 1, end + 1))
            stamp = to_db_time(now)
            due_text: dict[datetime, str] = {}  # a batch usually shares one due time
            # Straight to the driver's executemany: this is the bulk-submit hot path.
            conn.exec_driver_sql(
                SQL_INSERT_TASK_QMARK,
                [
                    (
                        task_id,
                        task_id,
                        task.name,
                        task.args_json if task.args_json is not None else _dump(task.args),
                        due_text.get(task.due_at)
                        or due_text.setdefault(task.due_at, to_db_time(task.due_at)),
                        task.max_attempts,
                        task.idempotency_key,
                        stamp,
                        stamp,
                    )
                    for task_id, task in zip(ids, new, strict=True)
                ],
            )
        return [
            slot if isinstance(slot, Submitted) else Submitted(ids[slot[0]], created=slot[1])
            for slot in slots
        ]


def _claim(
    conn: Connection,
    *,
    owner: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    names: Collection[str] | None,
) -> list[Claim]:
    stamp = to_db_time(now)
    params: dict[str, Any] = {
        "owner": owner,
        "lease_expires_at": to_db_time(now + lease),
        "now": stamp,
        "limit": limit,
    }
    sql = SQL_CLAIM
    if names is not None:
        sql = SQL_CLAIM_NAMED
        params["names"] = sorted(names)
    rows = conn.execute(sql, params).all()
    if rows:
        detail = f"claimed by {owner}"
        conn.exec_driver_sql(
            SQL_INSERT_EVENTS_QMARK,
            [(r.id, stamp, "RUNNING", r.attempts, detail) for r in rows],
        )
    claims = [
        Claim(
            task_id=r.id,
            name=r.name,
            args={} if r.args == "{}" else json.loads(r.args),
            attempt=r.attempts,
            max_attempts=r.max_attempts,
            owner=owner,
            fence=r.fence,
            lease_expires_at=now + lease,
            due_at=from_db_time(r.due_at),
            seq=r.seq,
            idempotency_key=effective_key(r.id, r.idempotency_key),
        )
        for r in rows
    ]
    claims.sort(key=lambda c: (c.due_at, c.seq))
    return claims


def _complete_many(
    conn: Connection, outcomes: list[Outcome], stamp: str
) -> list[tuple[int, TaskState | None]]:
    """Plain successes of distinct tasks in three statements in all: (task id, new state)."""
    if not outcomes:
        return []
    batch = {
        str(o.claim.task_id): {"o": o.claim.owner, "f": o.claim.fence, "r": _dump(o.result)}
        for o in outcomes
    }
    rows = {r.id: r for r in conn.execute(SQL_COMPLETE_MANY, {"batch": _dump(batch), "now": stamp})}
    done = [rows[o.claim.task_id] for o in outcomes if o.claim.task_id in rows]
    if done:
        conn.exec_driver_sql(
            SQL_RECORD_KEYS_QMARK,
            [(effective_key(r.id, r.idempotency_key), r.id, stamp, r.result) for r in done],
        )
        conn.exec_driver_sql(
            SQL_INSERT_EVENTS_QMARK,
            [(r.id, stamp, "SUCCEEDED", r.attempts, None) for r in done],
        )
    return [
        (o.claim.task_id, TaskState.SUCCEEDED if o.claim.task_id in rows else None)
        for o in outcomes
    ]


def _fail(conn: Connection, outcome: Outcome, stamp: str) -> TaskState | None:
    assert outcome.error is not None
    params = {
        **_claim_params(outcome.claim, stamp),
        "retry_at": None if outcome.retry_at is None else to_db_time(outcome.retry_at),
        "error": _error_json(outcome.error),
    }
    row = conn.execute(SQL_FAIL, params).first()
    if row is None:
        return None
    state = TaskState(row.state)
    _event(
        conn,
        outcome.claim.task_id,
        at=stamp,
        state=state,
        attempt=row.attempts,
        detail=outcome.error.message,
    )
    return state


def _acknowledge(conn: Connection, claim: Claim, stamp: str) -> TaskState | None:
    params = _claim_params(claim, stamp)
    row = conn.execute(SQL_ACK_CANCEL, params).first()
    if row is None:
        if conn.execute(SQL_IS_VALID, params).first() is not None:
            raise InvalidTransitionError(
                f"task {claim.task_id} cannot acknowledge a cancellation nobody requested"
            )
        return None
    _event(
        conn,
        claim.task_id,
        at=stamp,
        state=TaskState.CANCELLED,
        attempt=row.attempts,
        detail="cancellation acknowledged",
    )
    return TaskState.CANCELLED


def _event(
    conn: Connection, task_id: int, *, at: str, state: TaskState, attempt: int, detail: str | None
) -> None:
    """Append one line to the task's history, in the transaction that made the change."""
    conn.execute(
        SQL_INSERT_EVENT,
        {"task_id": task_id, "at": at, "state": state.value, "attempt": attempt, "detail": detail},
    )


def _claim_params(claim: Claim, stamp: str) -> dict[str, Any]:
    return {"id": claim.task_id, "owner": claim.owner, "fence": claim.fence, "now": stamp}


def _record(row: Row[Any]) -> TaskRecord:
    return TaskRecord(
        id=row.id,
        seq=row.seq,
        name=row.name,
        args=json.loads(row.args),
        state=TaskState(row.state),
        due_at=from_db_time(row.due_at),
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        lease_owner=row.lease_owner,
        lease_expires_at=_opt_time(row.lease_expires_at),
        fence=row.fence,
        cancel_requested_at=_opt_time(row.cancel_requested_at),
        result=None if row.result is None else json.loads(row.result),
        last_error=_error(row.last_error),
        idempotency_key=row.idempotency_key,
        created_at=from_db_time(row.created_at),
        updated_at=from_db_time(row.updated_at),
        finished_at=_opt_time(row.finished_at),
    )


class DataVersionWatcher:
    """Notices commits by other connections, on a thread of its own.

    It reads ``PRAGMA data_version`` (which changes when any other connection
    commits, and touches no table) whenever inotify reports a write to the
    database's files, or every ``poll_interval`` seconds where inotify is not
    available. It also checks once a second that the file is still the one
    opened: a file deleted or replaced under us would otherwise go on working,
    silently, on the old inode.
    """

    #: How often (seconds) the watcher checks the file is still the one opened.
    FILE_CHECK_INTERVAL = 1.0

    def __init__(
        self, engine: Engine, poll_interval: float, identity: tuple[int, int] | None
    ) -> None:
        self._conn = engine.raw_connection()
        self._poll_interval = poll_interval
        self._last = self._read()
        self._path = _file_path(engine)
        self._identity = identity
        self._next_file_check = time.monotonic() + self.FILE_CHECK_INTERVAL
        self._inotify = (
            watch_directory(self._path.parent, self._path.name) if self._path is not None else None
        )
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def uses_inotify(self) -> bool:
        return self._inotify is not None

    def start(self, on_change: Callable[[Exception | None], None]) -> None:
        """Call ``on_change(None)`` after each commit seen, ``on_change(error)`` once on failure."""
        self._thread = threading.Thread(
            target=self._watch, args=(on_change,), name="durablesched-watch", daemon=True
        )
        self._thread.start()

    def _watch(self, on_change: Callable[[Exception | None], None]) -> None:
        # A write to the WAL is seen before its commit is visible (the commit waits
        # for its fsync), so a write with no new data_version yet is re-checked
        # soon after, backing off from 1 ms to 64 ms, instead of in a second.
        recheck: float | None = None
        while not self._closed.is_set():
            if self._inotify is not None:
                written = self._inotify.wait(recheck or self.FILE_CHECK_INTERVAL)
            else:
                self._closed.wait(self._poll_interval)
                written = False
            if self._closed.is_set():
                return
            try:
                changed = self.changed()
            except DurableSchedError as e:
                on_change(e)
                return
            if changed:
                recheck = None
                on_change(None)
            elif written:
                recheck = 0.001
            elif recheck is not None:
                recheck = recheck * 2 if recheck < 0.064 else None

    def _check_file(self) -> None:
        if self._path is None or time.monotonic() < self._next_file_check:
            return
        self._next_file_check = time.monotonic() + self.FILE_CHECK_INTERVAL
        if _file_identity(self._path) != self._identity:
            raise StoreError(f"the database file {self._path} was removed or replaced while in use")

    def _read(self) -> int:
        cursor = self._conn.cursor()
        try:
            cursor.execute("PRAGMA data_version")
            row = cursor.fetchone()
        finally:
            cursor.close()
        assert row is not None
        return int(row[0])

    def changed(self) -> bool:
        """True if another connection committed since the last call."""
        with _translated("watching for changes"):
            self._check_file()
            current = self._read()
            seen, self._last = self._last != current, current
            return seen

    def close(self) -> None:
        self._closed.set()
        if self._inotify is not None:
            self._inotify.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.FILE_CHECK_INTERVAL + 1)
        if self._inotify is not None:
            self._inotify.close()
        self._conn.close()


def _file_path(engine: Engine) -> Path | None:
    database = engine.url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        return Path(database)
    return None


def _file_identity(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)
