"""A SQL store's way into its database: transactions, busy retries, the driver-level path.

:class:`Transactions` is the base of :class:`~durablesched.store.sql.store.SQLStore`.
Its underscore methods are the package's own: the store's modules
(``submitting``, ``claiming``, ``outcomes``, ``group_commit``,
``operator_actions``, ``moving``) write through them; users never call them.
Every write transaction goes through :meth:`Transactions._write`, so a
subclass that overrides it sees them all.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, TextClause, exc

from durablesched.errors import StoreError
from durablesched.records import ErrorInfo
from durablesched.states import TaskState
from durablesched.store.sql.codec import error_json, from_db_time
from durablesched.store.sql.dialect import SQLDialect
from durablesched.store.sql.statements import (
    SQL_EXTEND_LEASE,
    SQL_INSERT_EVENT,
    SQL_LEASES_VALID_SINCE,
)
from durablesched.store.sql.translate import is_busy, translated

log = logging.getLogger("durablesched.store")

#: The longest list of finished task ids one notification carries, in characters
#: (PostgreSQL's limit is 8,000 bytes a payload); past it, one saying "some".
FINISHED_PAYLOAD = 7_000


class Executor(Protocol):
    """What the submit path uses of a connection: an SQLAlchemy ``Connection`` is one, and
    so is a caller's driver connection wrapped by :mod:`.borrowed`."""

    @property
    def connection(self) -> Any:
        """The driver-level connection, whose ``cursor()`` the hot-path statements use."""
        ...

    def execute(self, statement: TextClause, parameters: dict[str, Any], /) -> Any: ...


class Transactions:
    """Write transactions on one kept connection, reads on the pool, busy databases retried."""

    #: A write that waited longer than this (seconds) for a lock logs a warning naming it.
    SLOW_LOCK = 1.0
    #: Seconds after such a wait (or a write that gave up on the lock) during which
    #: this process reclaims no lease: while the lock was held, live workers could
    #: not renew theirs either, and they must get their turn first (docs/leases.md).
    RECLAIM_SETTLE = 5.0

    def __init__(self, engine: Engine, dialect: SQLDialect, *, busy_timeout: float) -> None:
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
        #: The driver connection kept for lone reads (``_lone_rows``), opened on first use.
        self._lone: Any = None
        self._lone_lock = threading.Lock()
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        #: Transactions that found the database busy and were retried.
        self.busy_retries = 0
        #: When (on ``_monotonic``) a write last waited long for a lock, or gave up on it.
        self.lock_blocked_at: float | None = None
        self._monotonic: Callable[[], float] = time.monotonic  # tests move it by hand
        #: Now, in the time of the leases (the workers' clocks): tests set their own.
        self._wall: Callable[[], datetime] = lambda: datetime.now(UTC)

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
            waited = 0.0
            if not nested:
                started = self._monotonic()
                if not self._kept_lock.acquire(timeout=self.busy_timeout):
                    self.lock_blocked_at = self._monotonic()
                    raise StoreError(
                        f"{what} failed: another thread held the database for "
                        f"{self.busy_timeout:g}s (database is locked)"
                    )
                waited += self._slow_lock(
                    what, started, "this process's write connection (another thread was writing)"
                )
                self._kept_owner = threading.get_ident()
            try:
                started = self._monotonic()
                try:
                    conn = self._begin(self.engine, None if nested else self._kept)
                except exc.OperationalError as e:
                    if is_busy(e):
                        self.lock_blocked_at = self._monotonic()
                    raise
                waited += self._slow_lock(
                    what, started, "the database's write lock (another connection held it)"
                )
                if not nested:
                    self._kept = conn
                try:
                    yield conn
                    if waited > self.SLOW_LOCK:
                        self._extend_leases(conn, waited)
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

    def _slow_lock(self, what: str, started: float, lock: str) -> float:
        """Seconds waited since ``started`` for ``lock``, logged if long: writers
        queueing for seconds is contention the operator should hear of."""
        waited = self._monotonic() - started
        if waited > self.SLOW_LOCK:
            self.lock_blocked_at = self._monotonic()
            log.warning("%s waited %.1fs for %s", what, waited, lock)
        return waited

    def _extend_leases(self, conn: Connection, waited: float) -> None:
        """Give back to every lease still valid when this write began waiting the time
        it waited: no worker could renew one while the lock was held (a ``sqlite3``
        shell in ``BEGIN IMMEDIATE``, a stopped process), and a live worker's task
        must not be reclaimed and run twice for it. Done in the waiting write's own
        transaction, before any other writer (a reclaimer) can judge the leases."""
        step = timedelta(seconds=waited)
        since = self._t(self._wall() - step)
        rows = conn.execute(SQL_LEASES_VALID_SINCE, {"since": since}).all()
        for r in rows:
            conn.execute(
                SQL_EXTEND_LEASE,
                {
                    "id": r.id,
                    "fence": r.fence,
                    "lease_expires_at": self._t(from_db_time(r.lease_expires_at) + step),
                },
            )
        if rows:
            log.warning(
                "the write lock was held %.1fs: %s running leases extended by as much",
                waited,
                len(rows),
            )

    def lock_settling(self) -> bool:
        """True while a long wait for the write lock is recent (see RECLAIM_SETTLE)."""
        blocked = self.lock_blocked_at
        return blocked is not None and self._monotonic() - blocked < self.RECLAIM_SETTLE

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

    def _close_transactions(self) -> None:
        """Close the kept connections and the engine's pool."""
        with self._kept_lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None
        with self._lone_lock:
            lone, self._lone = self._lone, None
        if lone is not None:
            _close_quietly(lone)
        self.engine.dispose()

    # -- lone reads: one statement, on a connection kept for them ---------------------------------

    def _lone_rows(self, sql: str, params: dict[str, Any]) -> list[Any]:
        """One read statement (as the driver takes it) on a connection kept for such
        reads, in autocommit: no pool checkout, no BEGIN, no ROLLBACK, which cost more
        than the statement for a read made many times a second (what waiting handles
        read). A kept connection that fails is replaced and the read made once more on
        the new one (the database restarted); a second failure is raised."""
        with self._lone_lock:
            for again in (True, False):
                if self._lone is None:
                    self._lone = self._open_lone()
                conn, cursor = self._lone, None
                try:
                    cursor = conn.cursor()
                    cursor.execute(sql, params)
                    return list(cursor.fetchall())
                except self._driver_error as e:
                    self._lone = None
                    _close_quietly(conn)
                    if not again:
                        raise exc.DBAPIError.instance(sql, params, e, self._driver_error) from e
                    log.info("a kept read connection failed, reading on a new one: %s", e)
                finally:
                    if cursor is not None:
                        _close_quietly(cursor)
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_lone(self) -> Any:
        raw = self.engine.raw_connection()
        driver = raw.driver_connection
        raw.detach()  # ours alone, until it fails or the store closes
        self.dialect.autocommit(driver)
        return driver

    # -- the hot path: straight to the driver ----------------------------------------------------

    def _rows(
        self, conn: Executor, sql: str, params: dict[str, Any] | tuple[Any, ...]
    ) -> list[Any]:
        """A hot-path statement (from the dialect) straight through the driver: its rows
        (``params`` by name, or by position for a ``%s`` statement)."""
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        except self._driver_error as e:
            raise exc.DBAPIError.instance(sql, params, e, self._driver_error) from e
        finally:
            cursor.close()

    def _many(
        self, conn: Executor, sql: str, rows: Sequence[tuple[Any, ...] | dict[str, Any]]
    ) -> None:
        """A driver-level statement once per row (history lines, keys, bulk inserts, a group
        commit's starts and totals): by position, or by name."""
        cursor = conn.connection.cursor()
        try:
            cursor.executemany(sql, rows)
        except self._driver_error as e:
            raise exc.DBAPIError.instance(sql, rows, e, self._driver_error) from e
        finally:
            cursor.close()

    # -- what every change writes besides itself -------------------------------------------------

    def _wake_others(self, conn: Executor) -> None:
        """Tell idle workers elsewhere, on commit, that there is work (where needed)."""
        if self.dialect.notify is not None:
            conn.execute(self.dialect.notify, {})

    def _lock_tasks(self, conn: Executor, ids: Iterable[int], ending: Iterable[int]) -> None:
        """PostgreSQL: lock the rows of the tasks ``ids`` and of the parents of ``ending``
        (whose end :meth:`_tell_finished` wakes them), all in id order, before writing any:
        rows locked in one global order never deadlock (a parent's id is lower than its
        children's, so waking it after a child's row was taken would go against it)."""
        sql = self.dialect.lock_tasks
        if sql is None:
            return
        wanted = sorted(set(ids))
        if wanted:
            ids_of = self.dialect.ids
            self._rows(conn, sql, {"ids": ids_of(wanted), "children": ids_of(sorted(set(ending)))})

    def _tell_finished(self, conn: Executor, task_ids: Iterable[int], now: datetime) -> None:
        """Wake the suspended workflows whose spawned children these are, and tell waiting
        handles elsewhere, on commit, that these tasks finished (where the database must
        be told: SQLite's watchers see every commit)."""
        ids = list(task_ids)
        if not ids:
            return
        # The ids as one parameter, however many (a reclaim may end any number).
        params = {"ids": self.dialect.ids(ids), "now": self._t(now)}
        sql = self.dialect.notify_finished
        if sql is None:
            self._rows(conn, self.dialect.wake_parents, params)
            return
        payload = ",".join(map(str, ids))
        if len(payload) > FINISHED_PAYLOAD:
            payload = ""  # too many to name: the listeners read every task they wait on
        both = self.dialect.wake_parents_and_notify
        if both is not None:
            self._rows(conn, both, {**params, "payload": payload})
            return
        self._rows(conn, self.dialect.wake_parents, params)
        self._rows(conn, sql, {"ids": payload})

    def _event(  # noqa: PLR0917 - one history line's fields, always given in this order
        self,
        conn: Connection,
        task_id: int,
        at: datetime,
        state: TaskState,
        attempt: int,
        detail: str | None,
        error: ErrorInfo | None = None,
    ) -> None:
        """Append one line to the task's history, in the transaction that made the change
        (with ``error`` on the line that ends a failed attempt)."""
        conn.execute(
            SQL_INSERT_EVENT,
            {
                "task_id": task_id,
                "at": self._t(at),
                "state": state.value,
                "attempt": attempt,
                "detail": detail,
                "error": None if error is None else error_json(error),
            },
        )


def _close_quietly(closable: Any) -> None:
    """Close a cursor or connection that may be broken already."""
    try:
        closable.close()
    except Exception as e:  # broken: nothing more to release
        log.debug("closing a broken cursor or connection: %s", e)
