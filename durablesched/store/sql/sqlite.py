"""SQLite: its statements, its engine (WAL, IMMEDIATE writes, pragmas), the store, the watcher.

Everything that is SQLite's alone is here: the claim (walking the claimable
index), the heartbeat and group commit over ``json_each``, the :data:`SQLITE`
dialect that hands them to the store, and the ``data_version`` watcher (with
inotify, :mod:`.inotify`). The statements both databases share are in
:mod:`.statements`. Every write transaction begins IMMEDIATE (no read is ever
upgraded into a write); reads run in deferred transactions on the same pool.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, TextClause, create_engine, event, exc, text
from sqlalchemy.engine import make_url

from durablesched.errors import (
    DatabaseNotFoundError,
    DurableSchedError,
    SchemaError,
    StoreError,
)
from durablesched.records import Finding, Finished
from durablesched.states import TERMINAL
from durablesched.store.durability import Durability
from durablesched.store.durability import durability as check_durability
from durablesched.store.protocol import Awaited, OnChange, OnFinished, Outcomes, quiet_for
from durablesched.store.sql.codec import decode_all, error_from_json, new_tuple, to_db_time
from durablesched.store.sql.dialect import SQLDialect, names_in
from durablesched.store.sql.inotify import watch_directory
from durablesched.store.sql.predicates import CLAIMABLE_SQL, STATE_CREATED_SQL, TERMINAL_SQL
from durablesched.store.sql.statements import (
    CLAIM_RETURNING,
    INSERT_EVENTS,
    INSERT_TASK,
    NAMES,
    NAMES_FILTER,
    QUEUES,
    QUEUES_FILTER,
    RECORD_KEYS,
    SUBMITTED_EVENTS,
    sql_live_queue_counts,
    wake_parents,
)
from durablesched.store.sql.store import SQLStore
from durablesched.store.sql.translate import translated
from durablesched.store.sql.urls import sqlite_url

__all__ = ["SQLITE", "DataVersionWatcher", "SQLiteStore", "create_sqlite_engine"]

log = logging.getLogger("durablesched.store")

# -- the statements that are SQLite's own -------------------------------------------------------


def _claim(arms: int, names: int) -> str:
    """The claim from ``arms`` queues, best (priority desc, due_at, seq) first."""

    # A skip scan of each queue's claimable rows, a priority at a time: ``prios`` walks the
    # priorities present, highest first (a seek each), and for each the rows of that priority
    # due now are read in (due_at, seq) order, up to the first not yet due. One walk of the
    # whole index would read every row due later (sleeping workflows, delayed tasks, retry
    # waits) of a priority before it could reach the next one, whenever the queue has fewer
    # due rows than asked for. CROSS JOIN keeps ``prios`` the outer loop: the rows come out
    # in (priority desc, due_at, seq) order, with no sort, and the LIMIT stops the walk.
    # INDEXED BY: with statistics (ANALYZE, PRAGMA optimize) SQLite may prefer another index
    # and sort; the claim must always walk this one, a queue at a time.
    def arm(k: int) -> str:
        queue = f"queue = :q{k} AND key_waiting = 0 AND {CLAIMABLE_SQL}"
        index = "tasks INDEXED BY ix_tasks_queue_claimable"
        return (
            "WITH RECURSIVE prios(p) AS ("
            f"SELECT (SELECT priority FROM {index} WHERE {queue} ORDER BY priority DESC LIMIT 1) "
            f"UNION ALL SELECT (SELECT priority FROM {index} WHERE {queue} AND priority < p "
            "ORDER BY priority DESC LIMIT 1) FROM prios WHERE p IS NOT NULL) "
            f"SELECT id, priority, due_at, seq FROM prios CROSS JOIN {index} "
            f"WHERE {queue} AND priority = p AND due_at <= :now {names_in(names)} LIMIT :l{k}"
        )

    if arms == 1:
        picked = arm(0).replace(
            "SELECT id, priority, due_at, seq FROM prios", "SELECT id FROM prios", 1
        )
    else:
        union = " UNION ALL ".join(f"SELECT * FROM ({arm(k)})" for k in range(arms))
        picked = f"SELECT id FROM ({union}) ORDER BY priority DESC, due_at, seq LIMIT :limit"
    return (
        "UPDATE tasks SET state = 'RUNNING', attempts = attempts + 1, fence = fence + 1, "
        "lease_owner = :owner, lease_expires_at = :lease_expires_at, updated_at = :now, "
        "started_at = :started, environment = NULL "
        f"WHERE id IN ({picked}) RETURNING {CLAIM_RETURNING}"
    )


def _next_due(names: bool, queues: bool) -> TextClause:
    """The earliest due time after ``:now``, on the (due_at, seq) index."""
    sql = text(
        "SELECT due_at FROM tasks INDEXED BY ix_tasks_claimable "
        f"WHERE {CLAIMABLE_SQL} AND due_at > :now {NAMES_FILTER if names else ''} "
        f"{QUEUES_FILTER if queues else ''} ORDER BY due_at, seq LIMIT 1"
    )
    return sql.bindparams(*([NAMES] if names else []), *([QUEUES] if queues else []))


#: A task with a limit key, inserted through the view whose trigger keeps its key's head
#: (migration 0017: SQLite has no INSERT trigger on tasks, which would cost every
#: insert a statement journal) ...
INSERT_KEYED_ROW = INSERT_TASK.replace("INTO tasks", "INTO durablesched_new_keyed_tasks", 1)
#: ... or, inserted otherwise (a debounced one), touched: setting its state to itself
#: fires the UPDATE trigger, which keeps the head.
TOUCH_NEW_KEY = "UPDATE tasks SET state = state WHERE id = ?"

#: Every claim still held, extended in one statement. ``:fences`` is a JSON
#: object {task id: fence}.
HEARTBEAT = (
    "UPDATE tasks SET lease_expires_at = :lease_expires_at, updated_at = :now "
    "WHERE id IN (SELECT CAST(key AS INTEGER) FROM json_each(:fences)) "
    "AND fence = json_extract(:fences, '$.\"' || id || '\"') "
    "AND state = 'RUNNING' AND lease_owner = :owner AND lease_expires_at > :now "
    "RETURNING id, fence, lease_expires_at, cancel_requested_at"
)
#: One field of a task's entry in ``:batch``.
_ITEM = "json_extract(:batch, '$.\"' || id || '\".{field}')"
#: Successes without effects or children, many in one statement. ``:batch`` maps
#: each task id to its claim's owner, fence and result (JSON text); the keys and
#: history lines follow as two executemany calls.
COMPLETE_MANY = (
    "UPDATE tasks SET state = 'SUCCEEDED', "
    f"result = {_ITEM.format(field='r')}, lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = :now, finished_at = :now "
    "WHERE id IN (SELECT CAST(key AS INTEGER) FROM json_each(:batch)) AND state = 'RUNNING' "
    f"AND lease_owner = {_ITEM.format(field='o')} "
    f"AND fence = {_ITEM.format(field='f')} AND lease_expires_at > :now "
    "RETURNING id, attempts, idempotency_key, result"
)

#: Microseconds between two stored times (``YYYY-MM-DD HH:MM:SS.ffffff``): whole seconds
#: from ``strftime('%s')``, the digits after the point as they are (julianday's
#: floating point would put a run of exactly 1 s on either side of a 1 s bound).
ELAPSED_US = (
    "((CAST(strftime('%s', {end}) AS INTEGER) - CAST(strftime('%s', {start}) AS INTEGER)) "
    "* 1000000 + CAST(substr({end}, 21, 6) AS INTEGER) - CAST(substr({start}, 21, 6) AS INTEGER))"
)

#: Attempts that ended per minute of the window (``Console.minute_counts``): the minute is
#: the stored time's first 16 characters, ``YYYY-MM-DD HH:MM``; ix_task_events_at finds
#: the window's lines.
MINUTE_COUNTS = text(
    "SELECT substr(at, 1, 16) AS minute, "
    "sum(CASE WHEN state = 'SUCCEEDED' THEN 1 ELSE 0 END) AS succeeded, "
    "sum(CASE WHEN state = 'SUCCEEDED' THEN 0 ELSE 1 END) AS failed "
    "FROM task_events INDEXED BY ix_task_events_at WHERE at > :since AND at <= :now "
    "AND state IN ('SUCCEEDED', 'RETRY_WAIT', 'FAILED') GROUP BY minute ORDER BY minute"
)

#: The task list's index for each state that has one: SQLite's planner would walk the
#: list's whole order instead (and read a million rows for a state that has none). A
#: partial index serves a query whose WHERE holds the index's own term: said here.
FIND_HINTS = {
    "RUNNING": ("INDEXED BY ix_tasks_running_lease", ""),
    **{
        state: ("INDEXED BY ix_tasks_state_created", STATE_CREATED_SQL)
        for state in ("PENDING", "RETRY_WAIT", "FAILED", "CANCELLED")
    },
}


def integrity(conn: Connection) -> list[Finding]:
    """``PRAGMA integrity_check``: SQLite reads every page and index of the file."""
    rows = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA integrity_check").all()]
    if rows == ["ok"]:
        return []
    return [
        Finding(
            "integrity",
            f"integrity_check found {len(rows)} problem{'s' if len(rows) != 1 else ''}, "
            f"the first: {rows[0]}",
            "stop the workers and restore the file from a backup, or recover what can be "
            "read with `sqlite3 FILE .recover | sqlite3 NEW.db`",
        )
    ]


def borrowed_problem(connection: sqlite3.Connection) -> str | None:
    """A caller's ``sqlite3`` connection takes a submit only inside a transaction: outside
    one, each statement would commit on its own and a failure would leave half a batch."""
    if connection.in_transaction:
        return None
    return "the sqlite3 connection is not in a transaction (run BEGIN on it first)"


#: ``Store.finished``'s read (``SQLDialect.finished_outcomes``): the ids as a JSON array,
#: one statement however many (an ``IN`` list is prepared again for each length).
FINISHED_OUTCOMES = (
    "SELECT j.value AS id, t.name, t.state, t.attempts, t.result, t.last_error, "
    "t.finished_at FROM json_each(:ids) AS j "
    "LEFT JOIN tasks AS t ON t.id = j.value "
    f"WHERE t.id IS NULL OR t.{TERMINAL_SQL}"
)


def json_ids(ids: list[int]) -> str:
    return json.dumps(ids)


#: SQLite as the store sees it: ``?`` placeholders for executemany, times as text.
SQLITE = SQLDialect(
    name="sqlite",
    claim=_claim,
    heartbeat=HEARTBEAT,
    complete_many=COMPLETE_MANY,
    next_due=functools.cache(_next_due),
    insert_task=INSERT_TASK.format(p="?"),
    submitted_events=SUBMITTED_EVENTS,
    insert_events=INSERT_EVENTS.format(p="?"),
    record_keys=RECORD_KEYS.format(p="?"),
    time=to_db_time,
    integrity=integrity,
    elapsed_us=ELAPSED_US,
    minute_counts=MINUTE_COUNTS,
    live_queue_counts=sql_live_queue_counts("INDEXED BY ix_tasks_state_name"),
    finished_outcomes=FINISHED_OUTCOMES,
    ids=json_ids,
    wake_parents=wake_parents("child_id IN (SELECT value FROM json_each(:ids))"),
    find_hints=FIND_HINTS,
    borrowed_problem=borrowed_problem,
    insert_keyed_row=INSERT_KEYED_ROW.format(p="?"),
    touch_new_key=TOUCH_NEW_KEY,
)

# -- the engine ----------------------------------------------------------------------------------

#: PRAGMA synchronous per durability mode (see docs/durability.md).
SYNCHRONOUS: dict[str, str] = {"full": "FULL", "normal": "NORMAL"}
#: Seconds SQLite's own busy handler waits before our retry loop takes over.
LOCK_WAIT = 5.0
#: Bytes of WAL a checkpoint leaves on disk (``PRAGMA journal_size_limit``), and the
#: size past which a writer truncates it (docs/durability.md, "A long reader").
WAL_LIMIT = 64 * 2**20


def _check_header(path: Path) -> None:
    """Refuse a file that is not SQLite's, asking SQLite itself.

    Never with ``open()``: POSIX drops every lock a process holds on a file when the
    process closes *any* descriptor of it, including the locks of connections this
    library did not open (Django's, the caller's own ``sqlite3``). Another process could
    then take EXCLUSIVE and, as the last connection, delete the WAL under them: their
    later commits go to a deleted file. SQLite keeps a closed descriptor open while
    another connection of the process holds a lock on the same file, so a connection
    of its own is the one safe way to look.
    """
    uri = f"file:{quote(str(path), safe='/')}?mode=ro"
    try:
        probe = sqlite3.connect(uri, uri=True, timeout=LOCK_WAIT)
    except sqlite3.Error:
        return  # cannot even open it: the engine's own connection says why
    try:
        probe.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as e:
        if getattr(e, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_NOTADB:
            raise SchemaError(f"{path} is not a SQLite database") from None
        # Busy, locked or unreadable: not this check's question.
    finally:
        probe.close()


def _prepare_file(url: str, file_mode: int, *, create: bool = True) -> None:
    """Refuse a directory or a non-SQLite file; create a new file with ``file_mode``
    (a missing one is :class:`DatabaseNotFoundError` unless ``create``)."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as e:  # a name too long, a path through a file, no permission
        raise StoreError(f"cannot open {database!r}: {e.strerror}") from None
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a database file")
    if path.exists():
        _check_header(path)
        return
    if not create:
        raise DatabaseNotFoundError(f"no such database: {path}")
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
    wal_limit: int = WAL_LIMIT,
    create: bool = True,
    readonly: bool = False,
) -> Engine:
    """An engine with WAL, foreign keys, a busy timeout and IMMEDIATE write transactions.

    ``wal_limit`` is the connections' ``journal_size_limit``: the WAL a
    checkpoint leaves behind is cut to it. Without ``create`` a missing file
    is :class:`DatabaseNotFoundError`. ``readonly`` opens the file with
    ``mode=ro`` (nothing can be written, nothing is created: see
    :func:`_read_only`), changes no setting of the file and begins every
    transaction deferred.

    Connections from ``engine.execution_options(durablesched_read=True)``
    begin deferred transactions instead, for reads.
    """
    synchronous = SYNCHRONOUS[check_durability(durability)]
    url = sqlite_url(db)
    _prepare_file(url, file_mode, create=create and not readonly)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=64,
        connect_args={"check_same_thread": False, "timeout": busy_timeout},
    )
    timeout_ms = int(busy_timeout * 1000)
    path = _file_path(engine)

    if path is not None:

        @event.listens_for(engine, "do_connect")
        def _open_existing(
            _dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]
        ) -> sqlite3.Connection:
            if readonly:
                return _read_only(path, cparams)
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
            if not readonly:  # a reader changes nothing of the file, not even its journal
                cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute(f"PRAGMA journal_size_limit = {int(wal_limit)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        read = readonly or conn.get_execution_options().get("durablesched_read")
        begin = "BEGIN" if read else "BEGIN IMMEDIATE"
        # Straight to the driver: SQLAlchemy's execute path costs more than the BEGIN,
        # and every group commit begins one (docs/performance.md). A busy database
        # still leaves as SQLAlchemy's OperationalError, which ``_begin`` retries.
        cursor = conn.connection.cursor()
        try:
            cursor.execute(begin)
        except sqlite3.Error as e:
            raise exc.DBAPIError.instance(begin, (), e, sqlite3.Error) from e
        finally:
            cursor.close()

    return engine


def _read_only(path: Path, cparams: dict[str, Any]) -> sqlite3.Connection:
    """A connection that can neither write nor create anything, even in a directory
    the user cannot write to.

    ``mode=ro`` reads a WAL database through its ``-shm`` index, which SQLite
    creates when the last connection to the file closed and removed it; in a
    directory we cannot write to it cannot (SQLITE_READONLY_DIRECTORY). If no
    ``-wal`` file exists either, every commit is in the main file, and it is
    read with ``immutable=1``: without locks, as of that moment. If a ``-wal``
    exists without a ``-shm`` we could read, what it holds cannot be read:
    refused, saying so.
    """
    base = f"file:{quote(str(path), safe='/')}?mode=ro"
    connection: sqlite3.Connection = sqlite3.connect(base, uri=True, **cparams)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return connection
    except sqlite3.OperationalError as e:
        connection.close()
        code = getattr(e, "sqlite_errorcode", 0) & 0xFF
        if code not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
            raise
        if Path(f"{path}-wal").exists():
            raise StoreError(
                f"cannot read {path}: its WAL ({path}-wal) holds commits that can only be "
                f"read through {path}-shm, which is missing or unreadable and cannot be "
                f"created in {path.parent} (not writable by this user): run as the "
                "database's owner, or while one of its workers is running"
            ) from None
    immutable: sqlite3.Connection = sqlite3.connect(f"{base}&immutable=1", uri=True, **cparams)
    return immutable


class SQLiteStore(SQLStore):
    """A :class:`~durablesched.store.Store` in one SQLite file.

    ``db`` is a path or an ``sqlite:///`` URL. A new file is created at the
    current schema; an older schema is upgraded only with ``migrate=True``; a
    newer one is refused with :class:`SchemaError`. A new file is created
    with ``file_mode`` (owner read/write only by default). ``durability="full"``
    (the default) survives power loss; ``"normal"`` survives process crashes
    but may lose the last commits on power loss (docs/durability.md).

    ``create=False`` creates nothing: a missing file is
    :class:`DatabaseNotFoundError`, a file without the schema
    :class:`SchemaMissingError`. ``readonly=True`` (which implies it) opens the
    file read-only, for reading tools (``durablesched ls``): writes fail, and it
    works in a directory the user cannot write to (see :func:`_read_only`).
    """

    def __init__(
        self,
        db: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        migrate: bool = False,
        busy_timeout: float = 30.0,
        file_mode: int = 0o600,
        wal_limit: int = WAL_LIMIT,
        create: bool = True,
        readonly: bool = False,
        verify_schema: bool = True,
    ) -> None:
        # SQLite's own busy handler waits up to LOCK_WAIT per try; on top of it we
        # retry with jittered backoff until ``busy_timeout`` has passed in all.
        engine = create_sqlite_engine(
            db,
            durability=durability,
            busy_timeout=min(LOCK_WAIT, busy_timeout),
            file_mode=file_mode,
            wal_limit=wal_limit,
            create=create,
            readonly=readonly,
        )
        self.readonly = readonly
        self.durability = durability
        #: The opened file's (device, inode): a watcher compares against it later.
        self._identity = _file_identity(_file_path(engine))
        path = _file_path(engine)
        self._wal = WalLimit(engine, None if path is None else Path(f"{path}-wal"), wal_limit)
        super().__init__(
            engine,
            SQLITE,
            migrate=migrate and not readonly,
            busy_timeout=busy_timeout,
            create=create and not readonly,
            verify_schema=verify_schema,
        )

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        with super()._write(what) as conn:
            yield conn
        self._wal.after_commit()

    def truncate_wal(self) -> bool:
        """Checkpoint and cut the WAL to nothing now, without waiting for readers; False
        (and nothing lost) if a reader still holds a snapshot in it."""
        return self._wal.truncate()

    def watch_changes(self, poll_interval: float = 0.01) -> DataVersionWatcher:
        return DataVersionWatcher(self.engine, poll_interval, self._identity)

    def watch_finished(self) -> FinishedLines:
        """Commits seen as the change watcher sees them (inotify, or a poll), and after
        each the history's new finishing lines: which tasks finished, read by what was
        written, not by who waits."""
        return FinishedLines(self.engine, self._identity)


#: The history's newest line and its task (where ``FinishedLines`` begins).
NEWEST_LINE = "SELECT id, task_id FROM task_events ORDER BY id DESC LIMIT 1"
#: The history's lines since line ``?`` (one statement, so one snapshot): the newest
#: line and its task (kind 0), line ``?`` itself and its task if it is still there (1),
#: and the tasks that finished on the lines after it (2 and more, the task's id second),
#: through the primary key.
LOOK = (
    "SELECT 0, id, task_id FROM "
    "(SELECT id, task_id FROM task_events ORDER BY id DESC LIMIT 1) "
    "UNION ALL SELECT 1, id, task_id FROM task_events WHERE id = ? "
    f"UNION ALL SELECT 2, task_id, NULL FROM task_events WHERE id > ? AND {TERMINAL_SQL}"
)
#: The function :data:`LOOK_OUTCOMES` asks whether a task is waited on (in this process).
AWAITED_FUNCTION = "durablesched_awaited"
#: The kind of :data:`LOOK_OUTCOMES`'s row of a finished task, by its state: a number
#: read, where the state's text would be a string made per result.
FINISHED_KINDS = {state: 2 + i for i, state in enumerate(sorted(TERMINAL))}
#: The kind of its row of a task no longer there (deleted since it finished).
GONE_KIND = 2 + len(TERMINAL)
_KIND = " ".join(f"WHEN '{state.value}' THEN {kind}" for state, kind in FINISHED_KINDS.items())
#: :data:`LOOK`, reading as well the outcomes of the tasks that finished and are waited
#: on: ``kind, id, result, name, attempts, last_error`` (the kind says the state:
#: :data:`FINISHED_KINDS`; the task's own row no longer finished, retried since, is left
#: out; ``finished_at``, which no wait's outcome holds, is not read), so that a batch of
#: results costs one statement: the history's lines are the outer loop, a task's row is
#: read only for an awaited task. Six columns, no text but what a result needs: making
#: a row's values was most of the statement's cost.
LOOK_OUTCOMES = (
    "SELECT 0, id, task_id, NULL, NULL, NULL FROM "
    "(SELECT id, task_id FROM task_events ORDER BY id DESC LIMIT 1) "
    "UNION ALL SELECT 1, id, task_id, NULL, NULL, NULL FROM task_events WHERE id = ? "
    f"UNION ALL SELECT CASE t.state {_KIND} ELSE {GONE_KIND} END, e.task_id, t.result, "
    "t.name, t.attempts, t.last_error "
    "FROM task_events AS e LEFT JOIN tasks AS t ON t.id = e.task_id "
    f"WHERE e.id > ? AND e.{TERMINAL_SQL} AND {AWAITED_FUNCTION}(e.task_id) "
    f"AND (t.id IS NULL OR t.{TERMINAL_SQL})"
)
_STATE_OF_KIND = {kind: state for state, kind in FINISHED_KINDS.items()}


def looked_outcomes(rows: list[Any]) -> dict[int, Finished | None]:
    """The rows of finished tasks of a look (:data:`LOOK_OUTCOMES`) as :class:`Finished`
    by id (``finished_at`` None); the results decoded in one ``json.loads``."""
    results = iter(decode_all([r[2] for r in rows if r[2] is not None]))
    found: dict[int, Finished | None] = {}
    states, new, decoded = _STATE_OF_KIND, new_tuple, next
    for kind, task_id, result, name, attempts, error in rows:
        found[task_id] = (
            None
            if kind == GONE_KIND
            else new(
                Finished,
                (
                    task_id,
                    name,
                    states[kind],
                    attempts,
                    None if result is None else decoded(results),
                    None if error is None else error_from_json(error),
                    None,
                ),
            )
        )
    return found


class FinishedLines:
    """SQLite's :class:`~durablesched.store.protocol.FinishWatcher`: the history's lines
    since the last look that finished a task (one range of the primary key: a look
    costs what was written, however many handles wait). One writer at a time makes
    line ids grow in commit order. A line id can be given again once the newest lines
    are deleted (a deleted or purged task's): the look checks that the line it ended
    at is still the one it read (line ids are reused, task ids never are), and if not
    says that any task may have finished (``None``: every waited task is read).

    A look is one statement (:data:`LOOK`), and it is also how a commit is noticed:
    the :class:`DataVersionWatcher` it runs on (inotify, or a poll) makes it whenever
    the database's files are written and ``data_version`` says another connection
    committed since the last look (most writes it hears are of a commit not yet
    visible, or of none: a look at them would read nothing); a commit that wrote no
    history line finished nothing, and is not news here. So a commit that finished
    tasks costs this watcher one read.

    Started with ``awaited``, the look reads as well the outcomes of the awaited tasks
    that finished (:data:`LOOK_OUTCOMES`) and reports those as
    :class:`~durablesched.store.protocol.Outcomes`: the tasks nobody here waits on
    are not reported, and the waiting handles need no read of their own.

    Asked for a batch (``on_finished`` answering True, or a number of seconds), it
    lets the change watcher keep quiet until nudged (or for those seconds): commits
    meanwhile cost this process nothing, and the look after covers them all. If the
    change watcher fails, it says so once (logged) and stops; the waiting handles
    then read at their bounded fallback interval.
    """

    def __init__(
        self, engine: Engine, identity: tuple[int, int] | None, poll_interval: float = 0.01
    ) -> None:
        self._conn = engine.raw_connection()
        #: What the looks since the last report found finished; None: any may have.
        #: (Reading outcomes: they are in :attr:`_outcomes`, and this stays empty.)
        self._found: set[int] | None = set()
        #: ``data_version`` read just before the last look that succeeded (None: look
        #: whatever it says): while it is the same, nothing was committed to look at.
        self._version: int | None = None
        #: Started with ``awaited``: the outcomes the looks since the last report read
        #: (None: not reading outcomes), and the CPU seconds those looks took.
        self._outcomes: Outcomes | None = None
        try:
            #: The newest line at the last look, and its task; (0, None): none. Lines
            #: before the watch began are not news (nor read: the history is long).
            self._last: tuple[int, int | None] = self._newest()
            self._watcher = DataVersionWatcher(
                engine, poll_interval, identity, probe=self._watched_look
            )
        except BaseException:
            self._conn.close()
            raise

    def _newest(self) -> tuple[int, int | None]:
        cursor = self._conn.cursor()
        try:
            cursor.execute(NEWEST_LINE)
            row = cursor.fetchone()
        finally:
            cursor.close()
        return (0, None) if row is None else (int(row[0]), int(row[1]))

    def _look(self) -> bool:
        """Read the lines written since the last look, add the tasks that finished on
        them to those found (with their outcomes, when reading them); True if there were
        any (or lines were deleted)."""
        (last, last_task), found, outcomes = self._last, self._found, self._outcomes
        cpu = time.thread_time()
        cursor = self._conn.cursor()
        try:
            cursor.execute(LOOK if outcomes is None else LOOK_OUTCOMES, (last, last))
            rows = cursor.fetchall()
        finally:
            cursor.close()
        newest: tuple[int, int | None] = (0, None)
        kept = not last  # the line the last look ended at is still there, unchanged
        finished = []  # kind, task, then the outcome's columns when reading them
        for row in rows:
            kind = row[0]
            if kind >= 2:
                finished.append(row)
            elif kind == 0:
                newest = (row[1], row[2])
            else:
                kept = row[2] == last_task
        self._last = newest
        if not kept:
            self._found = None  # lines were deleted: ids after them can be old ones
            return True
        if found is not None and finished:
            if outcomes is None:
                found.update(row[1] for row in finished)
            else:  # found are the outcomes; ``found`` (not None) says none was missed
                outcomes.update(looked_outcomes(finished))
        if outcomes is not None:
            outcomes.cost += time.thread_time() - cpu
        return newest[0] != last

    def _watched_look(self) -> bool:
        """:meth:`_look`, for the change watcher, unless ``data_version`` is what it was
        before the last look (no other connection committed since: False, with no look).
        It is read before the look, so a commit landing during the look is looked at
        again next time. A look that failed says that any task may have finished (the
        waiting handles read them all), and the watch goes on."""
        try:
            version = _pragma_int(self._conn, "PRAGMA data_version")
            if version == self._version:
                return False
            changed = self._look()
            self._version = version  # only now: a failed look is made again
            return changed
        except (sqlite3.Error, DurableSchedError) as e:  # a driver's error: not translated
            log.warning("reading which tasks finished failed: %s", e)
            self._found = None
            return True

    def _take(self) -> Collection[int] | None:
        """What the looks found since the last call: tasks that finished (None: any may
        have), as their :class:`Outcomes` when reading them."""
        found, self._found = self._found, set()
        outcomes = self._outcomes
        if outcomes is None:
            return found
        self._outcomes = Outcomes()
        return None if found is None else outcomes

    def _finished_since(self) -> Collection[int] | None:
        """A look now, and what it and those before found (:meth:`_take`)."""
        with translated("reading which tasks finished"):
            self._look()
        return self._take()

    def _read_outcomes(self, awaited: Awaited) -> None:
        """From now on, each look reads the outcomes of the tasks it sees finish that
        ``awaited`` says are waited on (:data:`LOOK_OUTCOMES`), and only those."""
        driver = self._conn.driver_connection
        assert driver is not None  # a live connection, opened in __init__
        driver.create_function(AWAITED_FUNCTION, 1, awaited)
        self._outcomes = Outcomes()

    def start(self, on_finished: OnFinished, awaited: Awaited | None = None) -> None:
        if awaited is not None:
            self._read_outcomes(awaited)

        def on_change(error: Exception | None) -> bool | float:
            if error is not None:
                log.warning("watching for finished tasks failed: %s", error)
                on_finished(None)
                return False
            finished = self._take()
            if finished is None or finished:
                # A batch asked for: the change watcher keeps quiet until nudged (or for
                # the seconds answered), and the next look then reads every line
                # written meanwhile, in one range.
                return on_finished(finished) or False
            return False

        changed: OnChange = on_change
        self._watcher.start(changed)

    def nudge(self) -> None:
        self._watcher.nudge()

    def close(self) -> None:
        self._watcher.close()
        if self._outcomes is not None:
            # The connection goes back to the pool: not holding the waiting handles
            # (which would live as long as it), the function left one that fails.
            driver = self._conn.driver_connection
            try:
                if driver is not None:
                    driver.create_function(AWAITED_FUNCTION, 1, None)
            except sqlite3.Error as e:  # a broken connection: the pool drops it anyway
                log.debug("removing %s failed: %s", AWAITED_FUNCTION, e)
        self._conn.close()


class WalLimit:
    """Keeps the WAL near its limit: a writer past it truncates it once readers let go.

    SQLite cannot reset the WAL while a reader holds a snapshot in it, so a
    reader left open under load lets it grow without bound; after it ends, the
    WAL would stay at its high-water mark (and reads slow down with its size).
    After a commit, at most every :attr:`CHECK_INTERVAL` seconds, the writer
    looks at the WAL's size (one ``stat``) and, past ``limit``, runs
    ``wal_checkpoint(TRUNCATE)`` with no busy wait: it either empties the WAL
    or finds a reader still in it and leaves the rest for the next look.
    """

    #: Seconds between two looks at the WAL's size (0: after every commit).
    CHECK_INTERVAL = 1.0

    def __init__(self, engine: Engine, wal: Path | None, limit: int) -> None:
        self._engine = engine
        self._path = wal
        self.limit = limit
        self.check_interval = self.CHECK_INTERVAL
        self._next_check = 0.0
        self._busy = threading.Lock()
        #: Whether the last truncation found a reader in the way (warned once per episode).
        self._held = False

    def after_commit(self) -> None:
        if self._path is None:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.check_interval
        try:
            size = self._path.stat().st_size
        except OSError:
            return
        if size > self.limit:
            self.truncate(size)

    def truncate(self, size: int | None = None) -> bool:
        if not self._busy.acquire(blocking=False):
            return False  # another thread is at it
        try:
            raw = self._engine.raw_connection()
            try:
                cursor = raw.cursor()
                try:
                    timeout_ms = _pragma(cursor, "PRAGMA busy_timeout")[0]
                    cursor.execute("PRAGMA busy_timeout = 0")
                    try:
                        busy = _pragma(cursor, "PRAGMA wal_checkpoint(TRUNCATE)")[0]
                    finally:
                        cursor.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
                finally:
                    cursor.close()
            finally:
                raw.close()
        except sqlite3.Error as e:
            log.debug("truncating the WAL failed: %s", e)
            return False
        finally:
            self._busy.release()
        if busy and not self._held and size is not None:
            log.warning(
                "the WAL is %.0f MiB, past its %.0f MiB limit, and cannot be truncated: "
                "a reader holds a snapshot open (docs/durability.md)",
                size / 2**20,
                self.limit / 2**20,
            )
        self._held = bool(busy)
        return not busy


class DataVersionWatcher:
    """Notices commits by other connections, on a thread of its own.

    It reads ``PRAGMA data_version`` (which changes when any other connection
    commits, and touches no table; or asks its ``probe`` instead) whenever inotify
    reports a write to the database's files (once a millisecond while a commit is
    being written), or
    every ``poll_interval`` seconds where inotify is not available; after a
    change reported to a consumer that answers it is busy, not again until
    nudged or :attr:`QUIET` seconds later. It also checks, at those reads and
    at least once a second otherwise, that the file is still the one opened: a
    file deleted or replaced under us would otherwise go on working, silently,
    on the old inode.
    """

    #: How often (seconds) the watcher checks the file is still the one opened.
    FILE_CHECK_INTERVAL = 1.0
    #: How long (seconds) the watcher lets a commit that is being written land
    #: before it looks again, rather than waking for each of its writes.
    SETTLE = 0.001
    #: The longest quiet (seconds) a busy consumer gets after a change (see
    #: ChangeWatcher.start): a busy worker's own commits would wake it otherwise.
    QUIET = 0.25
    #: How long (seconds) after a write to the database's files the watcher keeps
    #: looking for its commit: a commit is visible only after its fsync, which a busy
    #: disk can hold for far longer than the backoff's first 127 ms; the shared-memory
    #: index that then makes it visible is written through a mapping, which inotify
    #: does not report.
    PENDING = 1.0

    def __init__(
        self,
        engine: Engine,
        poll_interval: float,
        identity: tuple[int, int] | None,
        *,
        probe: Callable[[], bool] | None = None,
    ) -> None:
        #: What says whether something changed, instead of ``data_version`` (a
        #: :class:`FinishedLines` look): True when it did.
        self._probe = probe
        #: The connection ``data_version`` is read on; none with a probe.
        self._conn = engine.raw_connection() if probe is None else None
        self._poll_interval = poll_interval
        self._last = 0 if probe is not None else self._read()
        self._path = _file_path(engine)
        self._identity = identity
        self._next_file_check = time.monotonic() + self.FILE_CHECK_INTERVAL
        self._inotify = (
            watch_directory(self._path.parent, self._path.name) if self._path is not None else None
        )
        self._closed = threading.Event()
        self._nudged = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def uses_inotify(self) -> bool:
        return self._inotify is not None

    def start(self, on_change: OnChange) -> None:
        """Call ``on_change(None)`` after each commit seen, ``on_change(error)`` once on failure."""
        self._thread = threading.Thread(
            target=self._watch, args=(on_change,), name="durablesched-watch", daemon=True
        )
        self._thread.start()

    def nudge(self) -> None:
        self._nudged.set()

    def _watch(self, on_change: OnChange) -> None:
        # A write to the WAL is seen before its commit is visible (the commit waits
        # for its fsync), so a write with no new data_version yet is re-checked
        # soon after, backing off from 1 ms to every 64 ms for PENDING seconds.
        recheck: float | None = None
        written_at = 0.0
        while not self._closed.is_set():
            if self._inotify is not None and recheck == self.SETTLE:
                # A commit is being written, a WAL write per page (a dozen for a
                # group commit): let the rest land and take their events at once,
                # instead of waking and reading data_version for each.
                if self._closed.wait(self.SETTLE):
                    return
                written = self._inotify.wait(0)
            elif self._inotify is not None:
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
            if written:
                written_at = time.monotonic()
            if changed:
                # The writes just taken may hold a second commit still waiting for its
                # fsync: go on looking, backing off, until PENDING after the last write.
                pending = time.monotonic() - written_at < self.PENDING
                recheck = 2 * self.SETTLE if pending else None
                # Cleared before asking: a nudge made once the consumer has
                # answered that it is busy ends the quiet at once, and is never lost.
                self._nudged.clear()
                quiet = on_change(None)
                if quiet:
                    self._nudged.wait(quiet_for(quiet, self.QUIET))
            elif written:
                recheck = self.SETTLE
            elif recheck is not None:
                pending = time.monotonic() - written_at < self.PENDING
                recheck = min(recheck * 2, 0.064) if pending else None

    def _check_file(self) -> None:
        if self._path is None or time.monotonic() < self._next_file_check:
            return
        self._next_file_check = time.monotonic() + self.FILE_CHECK_INTERVAL
        if _file_identity(self._path) != self._identity:
            raise StoreError(f"the database file {self._path} was removed or replaced while in use")

    def _read(self) -> int:
        assert self._conn is not None  # without a probe
        try:
            return _pragma_int(self._conn, "PRAGMA data_version")
        except sqlite3.Error as e:
            # The pool's raw connection raises the driver's own errors, which
            # ``translated`` does not know: one escaping would end the watch's
            # thread in silence, and its worker would never hear another commit.
            raise StoreError(f"watching for changes failed: {e}") from e

    def changed(self) -> bool:
        """True if another connection committed since the last call."""
        with translated("watching for changes"):
            self._check_file()
            if self._probe is not None:
                return self._probe()
            current = self._read()
            seen, self._last = self._last != current, current
            return seen

    def close(self) -> None:
        self._closed.set()
        self._nudged.set()
        if self._inotify is not None:
            self._inotify.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.FILE_CHECK_INTERVAL + 1)
        if self._inotify is not None:
            self._inotify.close()
        if self._conn is not None:
            self._conn.close()


def _pragma(cursor: Any, sql: str) -> tuple[Any, ...]:
    cursor.execute(sql)
    row = cursor.fetchone()
    assert row is not None, sql
    return tuple(row)


def _pragma_int(conn: Any, sql: str) -> int:
    """The number a pragma answers, read on a raw connection (its driver's errors)."""
    cursor = conn.cursor()
    try:
        cursor.execute(sql)
        row = cursor.fetchone()
    finally:
        cursor.close()
    assert row is not None, sql
    return int(row[0])


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
