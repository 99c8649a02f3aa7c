"""PostgreSQL: the engine, the store on it, LISTEN/NOTIFY wake-ups and the server's clock.

The statements are in :mod:`durablesched.store.sql.store`, shared with SQLite. Needs
psycopg 3 (``pip install 'durablesched[postgres]'``).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, create_engine, event, text

from durablesched.clock import ServerClock
from durablesched.errors import ConfigurationError, StoreError
from durablesched.store.durability import Durability
from durablesched.store.durability import durability as check_durability
from durablesched.store.protocol import OnChange
from durablesched.store.sql.store import CHANNEL, POSTGRES, SQLStore, from_db_time, translated
from durablesched.store.sql.urls import postgres_url

log = logging.getLogger("durablesched.store.sql.postgres")

#: synchronous_commit per durability mode: "normal" may lose the last commits
#: if the server crashes, never corrupts (docs/scaling.md).
SYNCHRONOUS_COMMIT: dict[str, str] = {"full": "on", "normal": "off"}
SQL_SERVER_TIME = text("SELECT clock_timestamp()")


def create_postgres_engine(
    db: str, *, durability: Durability = "full", pool_size: int = 8
) -> Engine:
    """An engine whose connections read JSONB as text and commit as ``durability`` says."""
    synchronous_commit = SYNCHRONOUS_COMMIT[check_durability(durability)]
    try:
        import psycopg  # noqa: F401, PLC0415 - optional dependency, checked here for a clear error
    except ImportError:
        raise ConfigurationError(
            "PostgreSQL needs psycopg 3: pip install 'durablesched[postgres]'"
        ) from None
    from psycopg.types.string import TextLoader  # noqa: PLC0415 - optional dependency

    engine = create_engine(postgres_url(db), pool_size=pool_size, max_overflow=64)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # JSON columns come back as the text SQLite gives, parsed in one place.
        dbapi_connection.adapters.register_loader("jsonb", TextLoader)
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        dbapi_connection.execute(f"SET synchronous_commit = {synchronous_commit}")
        dbapi_connection.autocommit = autocommit

    return engine


class PostgresStore(SQLStore):
    """A :class:`~durablesched.store.Store` in a PostgreSQL database, for workers on many hosts.

    ``db`` is a ``postgresql://`` or ``postgresql+psycopg://`` URL. The schema
    is created or checked as for SQLite. Claims use ``FOR UPDATE SKIP LOCKED``;
    a submit wakes idle workers with NOTIFY when it commits. Lease times are
    judged by the server's clock (:meth:`server_clock`), so hosts whose clocks
    disagree still agree on expiry.
    """

    def __init__(
        self,
        db: str,
        *,
        durability: Durability = "full",
        migrate: bool = False,
        pool_size: int = 8,
    ) -> None:
        engine = create_postgres_engine(db, durability=durability, pool_size=pool_size)
        self.durability = durability
        super().__init__(engine, POSTGRES, migrate=migrate)

    def server_time(self) -> datetime:
        """The server's clock, now."""
        with self._read("reading the server's clock") as conn:
            return from_db_time(conn.execute(SQL_SERVER_TIME).scalar_one())

    def server_clock(self) -> ServerClock:
        """A clock that follows the server's, for every worker and submitter on any host."""
        return ServerClock(self.server_time)

    def watch_changes(self, poll_interval: float = 0.01) -> NotifyWatcher:
        return NotifyWatcher(self.engine)


class NotifyWatcher:
    """LISTENs for submissions (NOTIFY is delivered when the submitter commits).

    It also wakes the worker every :attr:`SAFETY_POLL` seconds whatever it
    hears, so a lost notification (a dropped connection) delays work by at most
    that. A broken connection is reopened; it never stops the worker.
    """

    #: Seconds between wake-ups when nothing is heard.
    SAFETY_POLL = 1.0
    #: How often the listening thread checks that it should stop.
    _TICK = 0.2

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = self._listen()

    def _listen(self) -> Any:
        import psycopg  # noqa: PLC0415 - optional dependency, present if we got here

        with translated("listening for submissions"):
            raw = self._engine.raw_connection()
        conn = raw.driver_connection
        assert conn is not None
        raw.detach()  # ours alone, for as long as we listen
        try:
            conn.rollback()
            conn.autocommit = True
            conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as e:
            conn.close()
            raise StoreError(f"listening for submissions failed: {e}") from e
        return conn

    def start(self, on_change: OnChange) -> None:
        self._thread = threading.Thread(
            target=self._watch, args=(on_change,), name="durablesched-listen", daemon=True
        )
        self._thread.start()

    def nudge(self) -> None:
        """Nothing to end: only submissions and cancels notify, never a worker's own
        group commits, so this watcher never keeps quiet."""

    def _watch(self, on_change: OnChange) -> None:
        next_poll = time.monotonic() + self.SAFETY_POLL
        while not self._closed.is_set():
            heard = False
            try:
                if self._conn is None:
                    self._conn = self._listen()
                    heard = True  # we may have missed some while away
                for _ in self._conn.notifies(timeout=self._TICK, stop_after=1):
                    heard = True
            except Exception as e:  # the connection broke: reopen it
                if self._closed.is_set():
                    return
                log.warning("lost the LISTEN connection, reopening: %s", e)
                self._drop()
                self._closed.wait(self._TICK)
                heard = True
            if time.monotonic() >= next_poll:
                heard = True
            if heard and not self._closed.is_set():
                next_poll = time.monotonic() + self.SAFETY_POLL
                on_change(None)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as e:  # already broken: nothing more to release
                log.debug("closing a broken LISTEN connection: %s", e)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._TICK * 10)
        self._drop()
