"""PostgreSQL specifics: migrations equal the metadata, the claim's plan and locking,
the server's clock, NOTIFY wake-ups and clear errors for what PostgreSQL cannot store."""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from sqlalchemy import text
from sqlalchemy.engine import make_url

from durablesched import ManualClock, Scheduler, StoreError
from durablesched.clock import ServerClock
from durablesched.readable import readable
from durablesched.records import ErrorInfo, NewTask
from durablesched.store.protocol import ChangeWatcher
from durablesched.store.sql import postgres
from durablesched.store.sql.migrate import head_revision, upgrade
from durablesched.store.sql.postgres import POSTGRES, PostgresStore, create_postgres_engine
from durablesched.store.sql.urls import postgres_url
from durablesched.workflows.steps import FOREVER

from ..conftest import PG_URL, T0, WAIT, at, require_postgres, schema_diff


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A database of its own, dropped afterwards: NOTIFY reaches every listener in a
    database, whatever its schema, so a schema of its own would hear other tests."""
    require_postgres()
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    name = f"t_{uuid.uuid4().hex[:16]}"
    admin_url = PG_URL.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_migrations_on_an_empty_schema_match_the_metadata(pg_url: str) -> None:
    engine = create_postgres_engine(pg_url)
    try:
        assert upgrade(engine) == head_revision()
        with engine.connect() as conn:
            diff = schema_diff(conn)
            types: dict[str, str] = dict(
                conn.execute(
                    text(
                        "SELECT column_name, data_type FROM information_schema.columns "
                        "WHERE table_schema = current_schema() AND table_name = 'tasks'"
                    )
                ).all()
            )
            views = set(
                conn.execute(
                    text(
                        "SELECT table_name FROM information_schema.views "
                        "WHERE table_schema = current_schema()"
                    )
                ).scalars()
            )
            conn.rollback()
        assert diff == []
        assert types["due_at"] == "timestamp with time zone"
        assert types["args"] == "jsonb"
        assert types["id"] == "bigint"
        assert views == {
            "durablesched_attempts",
            "queue_summary",
            "queue_states",
            "tasks_due",
            "tasks_running",
            "queue_limit_keys",
            "tasks_failed",
            "workers",
            "workflow_signals",
            "workflow_steps",
        }
    finally:
        engine.dispose()


def test_the_views_answer_on_postgres(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    past = datetime.now(UTC) - timedelta(minutes=1)
    store.submit([NewTask("a", {}, past, 1), NewTask("b", {}, past, 1)], past)
    [claim] = store.claim("w", 1, past, timedelta(hours=1))
    store.fail(claim, ErrorInfo.from_exception(ValueError("boom")), None, past)
    with store.engine.connect() as conn:
        due = conn.execute(text("SELECT name, lag_seconds FROM tasks_due")).all()
        failed = conn.execute(text("SELECT error_type, error_message FROM tasks_failed")).all()
        summary: dict[str, int] = dict(
            conn.execute(text("SELECT state, tasks FROM queue_summary")).all()
        )
        conn.rollback()
    store.close()
    assert [r.name for r in due] == ["b"] and due[0].lag_seconds >= 59
    assert failed == [("builtins.ValueError", "boom")]
    assert summary == {"PENDING": 1, "FAILED": 1}


def test_claim_plan_walks_the_partial_index(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.submit([NewTask(f"t{i % 3}", {}, at(10 + i % 50), 3) for i in range(3000)], T0)
    for claim in store.claim("w", 1500, at(60), timedelta(seconds=30)):
        store.complete(claim, None, at(60))
    with store.engine.connect() as conn:
        conn.execute(text("ANALYZE tasks"))
        plan = conn.exec_driver_sql(
            "EXPLAIN " + POSTGRES.claim_for(2, 2, most=8),
            {"owner": "w", "lease_expires_at": at(100), "now": at(30), "limit": 8, "started": None}
            | {"n0": "t1", "n1": "t2", "q0": "default", "q1": "reports", "l0": 8, "l1": 8},
        ).scalars()
        joined = "\n".join(plan)
        conn.rollback()
    store.close()
    assert "ix_tasks_queue_claimable" in joined, joined
    assert "Seq Scan on tasks" not in joined, joined


def test_concurrent_claimers_skip_each_others_rows_and_never_share_one(pg_url: str) -> None:
    store = PostgresStore(pg_url, pool_size=8)
    store.submit([NewTask("t", {}, at(10), 1) for _ in range(400)], T0)
    taken: list[list[int]] = [[] for _ in range(6)]
    start = threading.Barrier(6)

    def claimer(i: int) -> None:
        start.wait(WAIT)
        while claims := store.claim(f"w{i}", 7, at(10), timedelta(seconds=30)):
            assert len(claims) <= 7
            taken[i].extend(c.task_id for c in claims)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
    store.close()
    everything = [task_id for ids in taken for task_id in ids]
    assert sorted(everything) == list(range(1, 401))  # each claimed once, none left
    assert sum(1 for ids in taken if ids) >= 2  # they really ran side by side


def test_the_server_clock_judges_leases_whatever_this_host_says(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        # This host's clock is an hour fast; the scheduler's clock still follows the server.
        with freeze_time(datetime.now(UTC) + timedelta(hours=1), tick=True):
            clock = Scheduler(store).clock
            assert isinstance(clock, ServerClock)
            assert abs((clock.now() - store.server_time()).total_seconds()) < 1
            assert datetime.now(UTC) - clock.now() > timedelta(minutes=59)
            assert abs(clock.offset + timedelta(hours=1)) < timedelta(seconds=1)
    finally:
        store.close()


def test_the_server_clock_is_read_once_per_resync(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    calls = 0

    def read() -> datetime:
        nonlocal calls
        calls += 1
        return store.server_time()

    clock = ServerClock(read, resync=3600)
    first, second = clock.now(), clock.now()
    store.close()
    assert calls == 1 and first <= second


def test_a_failed_clock_reading_keeps_the_last_offset() -> None:
    base = datetime(2030, 1, 1, tzinfo=UTC)
    answers: list[datetime | Exception] = [base, RuntimeError("server gone")]

    def read() -> datetime:
        answer = answers.pop(0) if answers else base
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = ServerClock(read, resync=0)
    second = clock.now()  # the reading fails: the old offset stands
    assert base <= second < base + timedelta(seconds=WAIT)


@contextmanager
def listening(pg_database: str) -> Iterator[tuple[PostgresStore, ChangeWatcher, threading.Event]]:
    """A watcher with no safety poll (only a NOTIFY, or a reconnection, wakes it), and
    another store whose commits set ``woke`` through it; all closed after."""
    store = PostgresStore(pg_database)
    other = PostgresStore(pg_database)
    watcher = store.watch_changes(safety_poll=None)
    woke = threading.Event()
    watcher.start(lambda error: woke.set() if error is None else None)
    try:
        yield other, watcher, woke
    finally:
        watcher.close()
        other.close()
        store.close()


def test_a_submit_wakes_a_listening_watcher_on_commit(pg_database: str) -> None:
    # Only the NOTIFY sent by the submit can wake it (the test fails with the NOTIFY
    # left out of the submitting transaction).
    with listening(pg_database) as (other, _, woke):
        with other.engine.begin() as conn:
            Scheduler(other, clock=ManualClock(T0)).submit("t", connection=conn)
            # Not yet: NOTIFY is delivered when the transaction commits.
            assert not woke.is_set()
        assert woke.wait(WAIT)


def test_a_listening_watcher_sleeps_on_its_socket_until_a_notify(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between notifications the listening thread sleeps in one ``poll`` on its
    connection's socket and the stop pipe, with no timeout when it has no safety poll
    (psycopg's ``notifies(timeout=...)`` woke ten times a second to poll: 0.4 % of a
    core for an idle worker); a NOTIFY ends that sleep, and so does ``close``."""
    timeouts: list[float] = []
    slept = threading.Condition()

    def spy(fds: list[int], timeout: float) -> set[int]:
        with slept:
            timeouts.append(timeout)
            slept.notify_all()
        return readable(fds, timeout)

    monkeypatch.setattr(postgres, "readable", spy)
    with listening(pg_database) as (other, watcher, woke):
        with slept:
            assert slept.wait_for(lambda: timeouts, WAIT)
        Scheduler(other, clock=ManualClock(T0)).submit("t")
        assert woke.wait(WAIT)
        with slept:
            assert slept.wait_for(lambda: len(timeouts) >= 2, WAIT)  # asleep again
        assert set(timeouts) == {math.inf}
        assert isinstance(watcher, postgres.NotifyWatcher)
        thread = watcher._thread
        watcher.close()  # the sleep ends at once: the thread is gone when close returns
        assert thread is not None and not thread.is_alive()


def test_a_listening_watcher_whose_connection_is_cut_listens_again(pg_database: str) -> None:
    """A restarted server (or a proxy) ends the LISTEN connection: the watcher says it
    may have missed something, opens a new one, and hears the next submit. Fails with
    the reopening left out (the worker would hear nothing until its safety poll)."""
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    store = PostgresStore(pg_database)
    other = PostgresStore(pg_database)
    watcher = store.watch_changes(safety_poll=None)
    missed, heard = threading.Semaphore(0), threading.Event()

    def deliver(payloads: list[str] | None) -> None:
        if payloads is None:
            missed.release()
        else:
            heard.set()

    watcher.start_payloads(deliver)
    try:
        with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as admin:
            (cut,) = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
            ).fetchall()
        assert cut == (True,)
        assert missed.acquire(timeout=WAIT)  # it noticed the cut
        assert missed.acquire(timeout=WAIT)  # and listens again
        Scheduler(other, clock=ManualClock(T0)).submit("t")
        assert heard.wait(WAIT)
    finally:
        watcher.close()
        other.close()
        store.close()


def test_a_signal_that_wakes_a_waiting_workflow_wakes_a_listening_watcher(
    pg_database: str,
) -> None:
    """The signal's one statement (``DELIVER_SIGNAL``) makes the workflow due and tells
    idle workers on commit: fails with the NOTIFY left out of it (a worker elsewhere
    would claim the workflow only at its safety poll)."""
    store = PostgresStore(pg_database)
    other = PostgresStore(pg_database)
    now = datetime.now(UTC)
    (sub,) = store.submit([NewTask("flow", {}, now, 3, None)], now)
    (claim,) = store.claim("w", 1, now, timedelta(seconds=30))
    store.suspend(claim, FOREVER, now, detail="waiting for signal 'go'", signal="go")
    watcher = store.watch_changes(safety_poll=None)  # listening from here on
    woke = threading.Event()
    watcher.start(lambda error: woke.set() if error is None else None)
    try:
        Scheduler(other).signal(sub.task_id, "go", {"by": "ada"})
        assert woke.wait(WAIT)
        task = store.get(sub.task_id)
        assert task is not None and task.due_at <= datetime.now(UTC)
    finally:
        watcher.close()
        other.close()
        store.close()


def test_a_workers_listening_watcher_heeds_no_busy_answer(pg_database: str) -> None:
    """A full worker answers True (busy); its PostgreSQL watcher still tells every
    submission at once, unnudged: only the finish watcher's consumer batches."""
    store = PostgresStore(pg_database)
    other = PostgresStore(pg_database)
    watcher = store.watch_changes(safety_poll=None)
    watcher.QUIET = 2 * WAIT  # a quiet it kept would outlast the wait below
    heard = threading.Semaphore(0)

    def busy(error: Exception | None) -> bool:
        heard.release()
        return True

    watcher.start(busy)
    try:
        scheduler = Scheduler(other, clock=ManualClock(T0))
        scheduler.submit("t")
        assert heard.acquire(timeout=WAIT)
        scheduler.submit("t")  # never nudged: heard all the same
        assert heard.acquire(timeout=WAIT)
    finally:
        watcher.close()
        other.close()
        store.close()


def test_nul_in_arguments_is_refused_with_a_clear_error(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.submit([NewTask("ok", {"x": 1}, T0, 1)], T0)
    with pytest.raises(StoreError, match="NUL"):
        Scheduler(store, clock=ManualClock(T0)).submit("t", {"s": "a\x00b"})
    assert [t.name for t in store.list_tasks()] == ["ok"]  # nothing stored was harmed
    store.close()


def test_urls_name_the_psycopg_driver() -> None:
    assert postgres_url("postgresql://u@h/db").startswith("postgresql+psycopg://")
    assert postgres_url("postgres://u@h/db").startswith("postgresql+psycopg://")
    with pytest.raises(Exception, match="psycopg 3"):
        postgres_url("postgresql+asyncpg://u@h/db")
