"""Fixtures shared by every layer: a manual clock, a registry, and a store per backend."""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import pytest
from sqlalchemy import Connection

from durablesched import (
    Claim,
    ErrorInfo,
    ManualClock,
    MemoryStore,
    Scheduler,
    Store,
    TaskRegistry,
    TaskState,
)
from durablesched.records import NewTask, SignalSend
from durablesched.store.protocol import Console, Effect
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLiteStore
from durablesched.store.sql.store import SQLStore

#: "Time 10" of the worked example.
T0 = datetime(2030, 1, 1, 0, 0, 10, tzinfo=UTC)
#: Every bounded wait in the tests, in seconds.
WAIT = 10.0

BACKENDS = ["memory", "sqlite", "postgres"]
SQL_BACKENDS = ["sqlite", "postgres"]
# A test of what only a database has (purge, views, effects) runs on the SQL backends only:
sql_backends_only = pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
#: The PostgreSQL server the tests use; each test gets a schema of its own in it.
PG_URL = os.environ.get("DURABLESCHED_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


class RecordingEvent(threading.Event):
    """An event telling the test each timeout it is waited on with (the waiting thread's
    wake-up, a thread's wait on a handle)."""

    def __init__(self) -> None:
        super().__init__()
        #: Each wait's timeout (``math.inf``: none).
        self.timeouts: list[float] = []
        self.slept = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self.slept:
            self.timeouts.append(math.inf if timeout is None else timeout)
            self.slept.notify_all()
        return super().wait(timeout)


def database_image(path: Path) -> bytes | None:
    """A SQLite file's content as SQLite reads it, WAL included (None: no such file).

    Tests compare images to show that a refused command changed nothing. They never read
    the file with ``open()``: closing that descriptor would drop every lock this process's
    SQLite connections hold on it (docs/durability.md, "Only SQLite opens the file").
    """
    if not path.exists():
        return None
    uri = f"file:{quote(str(path), safe='/')}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as connection:
        return connection.serialize()


def at(seconds: float) -> datetime:
    """The worked example's time ``seconds`` as a datetime."""
    return T0 + timedelta(seconds=seconds - 10)


_pg_reason: list[str | None] = []


def _pg_unreachable() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None if they can (asked once)."""
    if not _pg_reason:
        import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

        try:
            psycopg.connect(_libpq(PG_URL), connect_timeout=3).close()
            _pg_reason.append(None)
        except psycopg.Error as e:
            _pg_reason.append(str(e).strip().splitlines()[0])
    return _pg_reason[0]


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def require_postgres() -> None:
    """Fail in CI, skip elsewhere, with one line saying how to enable the tests."""
    reason = _pg_unreachable()
    if reason is None:
        return
    message = (
        f"PostgreSQL tests need a server at {PG_URL} ({reason}); start one there "
        "or point DURABLESCHED_TEST_PG at one"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def pg_schema_url(schema: str) -> str:
    """PG_URL with ``schema`` first on the search path: a database of its own, in effect."""
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty schema for one test, dropped afterwards."""
    require_postgres()
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield pg_schema_url(schema)
    finally:
        with psycopg.connect(_libpq(PG_URL), autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


class BackendStore(Store, Console, Protocol):
    """The Store and Console protocols plus the lone-outcome calls every backend has for
    tools and tests (the worker records through ``record_and_claim``)."""

    def complete(
        self,
        claim: Claim,
        result: Any,
        now: datetime,
        *,
        children: Sequence[NewTask] = (),
        effects: Sequence[Effect] = (),
        signals: Sequence[SignalSend] = (),
    ) -> bool: ...

    def fail(
        self, claim: Claim, error: ErrorInfo, retry_at: datetime | None, now: datetime
    ) -> TaskState | None: ...


def make_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> BackendStore:
    if backend == "memory":
        return MemoryStore(compact_min=8)
    if backend == "sqlite":
        return SQLiteStore(tmp_path / "tasks.db")
    if backend == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"))
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BackendStore]:
    s = make_store(backend, tmp_path, request)
    yield s
    pool = s.engine.pool if isinstance(s, SQLStore) else None
    s.close()
    if pool is not None:
        # A connection-leak check for free: every store call returns its connection
        # (the one kept open for writes goes back on close).
        assert pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def registry() -> TaskRegistry:
    return TaskRegistry()


@pytest.fixture
def scheduler(store: Store, registry: TaskRegistry, clock: ManualClock) -> Scheduler:
    return Scheduler(store, registry=registry, clock=clock)


def schema_diff(conn: Connection) -> list[Any]:
    """Alembic's comparison of the migrated database on ``conn`` with the metadata,
    leaving out on SQLite the indexes only PostgreSQL has (migration 0021)."""
    from alembic.autogenerate import compare_metadata  # noqa: PLC0415 - schema tests only
    from alembic.migration import MigrationContext  # noqa: PLC0415

    from durablesched.store.sql.schema import POSTGRES_ONLY_INDEXES, metadata  # noqa: PLC0415

    postgres = conn.dialect.name == "postgresql"
    context = MigrationContext.configure(
        conn,
        opts={
            "include_object": lambda obj, name, kind, *_: (
                postgres or kind != "index" or name not in POSTGRES_ONLY_INDEXES
            )
        },
    )
    return list(compare_metadata(context, metadata))
