"""SQLite: its statements, its engine (WAL, IMMEDIATE writes, pragmas), the store, the watcher.

Everything that is SQLite's alone is here: the claim (walking the claimable
index), the heartbeat and group commit over ``json_each``, the :data:`SQLITE`
dialect that hands them to the store, and the ``data_version`` watcher (with
inotify, :mod:`.inotify`). The statements both databases share are in
:mod:`.statements`. Every write transaction begins IMMEDIATE (no read is ever
upgraded into a write); reads run in deferred transactions on the same pool.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from durablesched.errors import DurableSchedError, SchemaError, StoreError
from durablesched.store.durability import Durability
from durablesched.store.durability import durability as check_durability
from durablesched.store.protocol import OnChange
from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.dialect import SQLDialect
from durablesched.store.sql.inotify import watch_directory
from durablesched.store.sql.schema import CLAIMABLE_SQL
from durablesched.store.sql.statements import (
    CLAIM_RETURNING,
    INSERT_EVENTS,
    INSERT_TASK,
    NAMES,
    NAMES_FILTER,
    NAMES_IN,
    RECORD_KEYS,
)
from durablesched.store.sql.store import SQLStore
from durablesched.store.sql.translate import translated
from durablesched.store.sql.urls import sqlite_url

__all__ = ["SQLITE", "DataVersionWatcher", "SQLiteStore", "create_sqlite_engine"]

# -- the statements that are SQLite's own -------------------------------------------------------


def _claim(names: bool) -> str:
    """The claim as the driver runs it; ``{names}`` is filled with one placeholder per name."""
    return (
        "UPDATE tasks SET state = 'RUNNING', attempts = attempts + 1, fence = fence + 1, "
        "lease_owner = :owner, lease_expires_at = :lease_expires_at, updated_at = :now, "
        "environment = NULL "
        # INDEXED BY: with statistics (ANALYZE, PRAGMA optimize) SQLite may prefer
        # the (state, name) index and sort; the claim must always walk this one.
        "WHERE id IN (SELECT id FROM tasks INDEXED BY ix_tasks_claimable "
        f"WHERE {CLAIMABLE_SQL} AND due_at <= :now {NAMES_IN if names else ''} "
        "ORDER BY due_at, seq LIMIT :limit) "
        f"RETURNING {CLAIM_RETURNING}"
    )


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
#: The earliest due time after ``:now`` among tasks called ``:names``, on the claim's index.
NEXT_DUE_NAMED = (
    "SELECT due_at FROM tasks INDEXED BY ix_tasks_claimable "
    f"WHERE {CLAIMABLE_SQL} AND due_at > :now {NAMES_FILTER} "
    "ORDER BY due_at, seq LIMIT 1"
)

#: SQLite as the store sees it: ``?`` placeholders for executemany, times as text.
SQLITE = SQLDialect(
    name="sqlite",
    claim=_claim(names=False),
    claim_named=_claim(names=True),
    heartbeat=HEARTBEAT,
    complete_many=COMPLETE_MANY,
    next_due_named=text(NEXT_DUE_NAMED).bindparams(NAMES),
    insert_task=INSERT_TASK.format(p="?"),
    insert_events=INSERT_EVENTS.format(p="?"),
    record_keys=RECORD_KEYS.format(p="?"),
    time=to_db_time,
)

# -- the engine ----------------------------------------------------------------------------------

#: PRAGMA synchronous per durability mode (see docs/durability.md).
SYNCHRONOUS: dict[str, str] = {"full": "FULL", "normal": "NORMAL"}
SQLITE_HEADER = b"SQLite format 3\x00"
#: Seconds SQLite's own busy handler waits before our retry loop takes over.
LOCK_WAIT = 5.0


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
    synchronous = SYNCHRONOUS[check_durability(durability)]
    url = sqlite_url(db)
    _prepare_file(url, file_mode)
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


class SQLiteStore(SQLStore):
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
        engine = create_sqlite_engine(
            db,
            durability=durability,
            busy_timeout=min(LOCK_WAIT, busy_timeout),
            file_mode=file_mode,
        )
        self.durability = durability
        #: The opened file's (device, inode): a watcher compares against it later.
        self._identity = _file_identity(_file_path(engine))
        super().__init__(engine, SQLITE, migrate=migrate, busy_timeout=busy_timeout)

    def watch_changes(self, poll_interval: float = 0.01) -> DataVersionWatcher:
        return DataVersionWatcher(self.engine, poll_interval, self._identity)


class DataVersionWatcher:
    """Notices commits by other connections, on a thread of its own.

    It reads ``PRAGMA data_version`` (which changes when any other connection
    commits, and touches no table) whenever inotify reports a write to the
    database's files (once a millisecond while a commit is being written), or
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
        # soon after, backing off from 1 ms to 64 ms, instead of in a second.
        recheck: float | None = None
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
            if changed:
                recheck = None
                # Cleared before asking: a nudge made once the consumer has
                # answered that it is busy ends the quiet at once, and is never lost.
                self._nudged.clear()
                if on_change(None):
                    self._nudged.wait(self.QUIET)
            elif written:
                recheck = self.SETTLE
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
        with translated("watching for changes"):
            self._check_file()
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
