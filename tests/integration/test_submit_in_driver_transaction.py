"""``submit(connection=)`` with the driver's own connection (sqlite3, psycopg), as Django
holds one: the tasks exist if and only if the caller's transaction commits."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durablesched import (
    InvalidTaskError,
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskNotFoundError,
    TaskState,
    UnsupportedOperationError,
)
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLiteStore
from durablesched.store.sql.store import SQLStore
from tests.conftest import T0, WAIT, _libpq


class Database:
    """A store and a way to open the driver's own connection to the same database."""

    def __init__(self, store: SQLStore, connect: Any) -> None:
        self.store = store
        self.connect = connect
        self.scheduler = Scheduler(store, clock=ManualClock(T0))

    def begin(self) -> Any:
        """A driver connection in an open transaction, as Django's is inside atomic()."""
        conn = self.connect()
        if isinstance(conn, sqlite3.Connection):
            conn.execute("BEGIN")
        else:
            conn.execute("SELECT 1")  # psycopg: the first statement begins the transaction
        return conn


def _open(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if kind == "sqlite":
        path = tmp_path / "tasks.db"
        store: SQLStore = SQLiteStore(path)

        def connect() -> sqlite3.Connection:
            # Django's way: autocommit at the driver, BEGIN issued by atomic().
            return sqlite3.connect(path, isolation_level=None, timeout=WAIT)

        return Database(store, connect)
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    url = request.getfixturevalue("pg_url")
    return Database(PostgresStore(url), lambda: psycopg.connect(_libpq(url)))


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    database = _open(request.param, request, tmp_path)
    yield database
    database.store.close()


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    database = _open("postgres", request, tmp_path)
    yield database
    database.store.close()


def _count_tasks(db: Database) -> int:
    return len(db.scheduler.list_tasks())


def test_a_task_submitted_in_a_committed_transaction_exists(db: Database) -> None:
    conn = db.begin()
    try:
        task_id = db.scheduler.submit(
            "send", {"to": "a@example.com"}, connection=conn, queue="mail", priority=5
        )
        # Not yet visible to the store's own connections: the transaction is open.
        with pytest.raises(TaskNotFoundError):
            db.scheduler.get(task_id)
        conn.commit()
    finally:
        conn.close()
    task = db.scheduler.get(task_id)
    assert (task.name, task.args, task.state) == ("send", {"to": "a@example.com"}, "PENDING")
    assert (task.queue, task.priority) == ("mail", 5)
    assert [e.state for e in db.scheduler.history(task_id)] == [TaskState.PENDING]


def test_a_rolled_back_transaction_leaves_no_task(db: Database) -> None:
    conn = db.begin()
    try:
        ids = [db.scheduler.submit("send", {"n": n}, connection=conn) for n in range(3)]
        conn.rollback()
    finally:
        conn.close()
    for task_id in ids:
        with pytest.raises(TaskNotFoundError):
            db.scheduler.get(task_id)
    assert _count_tasks(db) == 0
    # The store goes on as before: the ids rolled back with the tasks.
    assert db.scheduler.submit("send") >= 1
    assert _count_tasks(db) == 1


def test_the_callers_own_rows_and_the_task_commit_together(db: Database) -> None:
    setup = db.connect()
    setup.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
    setup.commit()
    setup.close()
    for outcome in ("rollback", "commit"):
        conn = db.begin()
        try:
            conn.execute("INSERT INTO orders (id) VALUES (1)")
            task_id = db.scheduler.submit("ship", {"order": 1}, connection=conn)
            getattr(conn, outcome)()
        finally:
            conn.close()
    check = db.connect()
    try:
        orders = check.execute("SELECT count(*) FROM orders").fetchone()[0]
    finally:
        check.close()
    assert orders == 1
    assert [t.id for t in db.scheduler.list_tasks()] == [task_id]


def test_an_idempotency_key_is_honoured_in_the_callers_transaction(db: Database) -> None:
    first = db.scheduler.submit("send", key="order-1")
    conn = db.begin()
    try:
        again = db.scheduler.submit("send", key="order-1", connection=conn)
        fresh = db.scheduler.submit("send", key="order-2", connection=conn)
        repeated = db.scheduler.submit("send", key="order-2", connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert again == first
    assert repeated == fresh != first
    assert _count_tasks(db) == 2


def test_a_connection_outside_a_transaction_is_refused(db: Database) -> None:
    conn = db.connect()
    if not isinstance(conn, sqlite3.Connection):
        conn.autocommit = True
    try:
        with pytest.raises(InvalidTaskError, match="not in a transaction"):
            db.scheduler.submit("send", connection=conn)
    finally:
        conn.close()
    assert _count_tasks(db) == 0


def test_something_else_than_the_stores_driver_connection_is_refused(db: Database) -> None:
    other = sqlite3.connect(":memory:")
    wrong: object = other if db.store.dialect.name != "sqlite" else object()
    try:
        with pytest.raises(InvalidTaskError, match="connection= must be"):
            db.scheduler.submit("send", connection=wrong)  # type: ignore[arg-type]
    finally:
        other.close()


def test_a_failed_postgres_transaction_is_refused(pg: Database) -> None:
    db = pg
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    conn = db.begin()
    try:
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT no_such_column FROM tasks")
        with pytest.raises(InvalidTaskError, match="roll it back first"):
            db.scheduler.submit("send", connection=conn)
    finally:
        conn.close()


def test_a_postgres_submit_wakes_workers_when_the_callers_transaction_commits(
    pg: Database,
) -> None:
    db = pg
    assert isinstance(db.store, PostgresStore)
    watcher = db.store.watch_changes(safety_poll=None)
    woke = threading.Event()
    watcher.start(lambda error: woke.set() if error is None else None)
    conn = db.begin()
    try:
        db.scheduler.submit("send", connection=conn)
        assert not woke.is_set()
        conn.commit()
        assert woke.wait(WAIT)
    finally:
        conn.close()
        watcher.close()


def test_the_memory_store_has_no_transaction_to_submit_in() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(UnsupportedOperationError):
            Scheduler(MemoryStore()).submit("send", connection=conn)
    finally:
        conn.close()
