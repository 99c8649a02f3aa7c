"""Operator actions on the SQLite store: upgrade, requeue, stats, purge, views."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command

from durablesched import (
    ErrorInfo,
    InvalidTransitionError,
    QueueLimits,
    SchemaError,
    SQLiteStore,
    TaskNotFoundError,
    TaskState,
)
from durablesched.records import NewTask
from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config, head_revision
from durablesched.store.sql.sqlite import create_sqlite_engine

from ..conftest import T0, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "tb")


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


def test_an_older_schema_is_upgraded_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = create_sqlite_engine(path)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0001")
    engine.dispose()
    with pytest.raises(SchemaError, match="durablesched migrate"):
        SQLiteStore(path)
    store = SQLiteStore(path, migrate=True)
    store.close()
    assert store.schema_revision == head_revision() == HEAD_REVISION


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "ops.db")


def test_requeue_failed_and_cancelled_but_nothing_else(store: SQLiteStore) -> None:
    failed, cancelled, pending = (
        s.task_id
        for s in store.submit(
            [
                NewTask("a", {}, T0, 1, "k"),
                NewTask("b", {}, at(20), 1),
                NewTask("c", {}, at(20), 1),
            ],
            T0,
        )
    )
    (claim,) = store.claim("w", 1, T0, LEASE)
    store.fail(claim, ERR, None, at(11))
    store.request_cancel(cancelled, at(11))
    store.requeue(failed, at(12))
    task = store.get(failed)
    assert task is not None
    assert (task.state, task.due_at, task.attempts, task.last_error) == (
        TaskState.PENDING,
        at(12),
        0,
        ERR,
    )
    assert task.seq > pending  # it goes behind what was submitted meanwhile
    store.requeue(cancelled, at(12))
    with pytest.raises(InvalidTransitionError):
        store.requeue(pending, at(12))
    with pytest.raises(TaskNotFoundError):
        store.requeue(999, at(12))
    store.close()


def test_requeue_refuses_when_the_key_was_taken_meanwhile(store: SQLiteStore) -> None:
    (first,) = store.submit([NewTask("a", {}, T0, 1, "order-1")], T0)
    (claim,) = store.claim("w", 1, T0, LEASE)
    store.fail(claim, ERR, None, at(11))
    (second,) = store.submit([NewTask("a", {}, T0, 1, "order-1")], at(12))
    assert second.created
    with pytest.raises(InvalidTransitionError, match=f"held by task {second.task_id}"):
        store.requeue(first.task_id, at(13))
    store.close()


def test_stats_counts_overdue_running_and_recent_failures(store: SQLiteStore) -> None:
    store.submit(
        [NewTask("run", {}, T0, 1), NewTask("fail", {}, T0, 1), NewTask("wait", {}, at(11), 1)],
        T0,
    )
    claims = store.claim("w", 2, T0, LEASE)
    store.fail(claims[1], ERR, None, at(12))
    stats = store.stats(at(15))
    assert stats["counts"]["RUNNING"] == 1 and stats["counts"]["FAILED"] == 1
    oldest = stats["oldest_overdue"]
    assert oldest is not None  # typed: QueueStats says it may be
    assert oldest["name"] == "wait"
    assert oldest["lag_seconds"] == 4.0
    assert [r["lease_owner"] for r in stats["running"]] == ["w"]
    assert [f["error"] for f in stats["failures_last_hour"]] == [ERR]
    assert store.stats(at(15) + timedelta(hours=2))["failures_last_hour"] == []
    store.close()


def test_stats_leaves_a_paused_queue_s_tasks_out_of_overdue(store: SQLiteStore) -> None:
    store.submit([NewTask("held", {}, T0, 1, queue="reports"), NewTask("late", {}, at(11), 1)], T0)
    store.put_queue(QueueLimits("reports", paused=True), T0)
    stats = store.stats(at(15))
    oldest = stats["oldest_overdue"]
    assert oldest is not None and oldest["name"] == "late"
    assert [o["name"] for o in stats["overdue_by_name"]] == ["late"]
    assert stats["counts"]["PENDING"] == 2  # still counted, only not late
    store.put_queue(QueueLimits("reports"), T0)
    assert [o["name"] for o in store.stats(at(15))["overdue_by_name"]] == ["held", "late"]
    store.close()


def test_purge_deletes_old_finished_tasks_in_batches_and_never_a_live_one(
    store: SQLiteStore,
) -> None:
    store.submit([NewTask("done", {}, T0, 1) for _ in range(25)], T0)
    live = [s.task_id for s in store.submit([NewTask("live", {}, at(11), 3) for _ in range(3)], T0)]
    for claim in store.claim("w", 25, T0, LEASE):
        store.complete(claim, None, T0)
    running = store.claim("w", 1, at(11), LEASE)
    store.fail(store.claim("w", 1, at(11), LEASE)[0], ERR, at(50), at(11))
    assert store.purge(at(10), batch=10) == 0  # finished exactly at 10: not older
    assert store.purge(at(11), batch=10) == 25
    left = {t.id: t.state for t in store.list_tasks()}
    assert sorted(left) == live
    assert TaskState.RUNNING in left.values() and TaskState.RETRY_WAIT in left.values()
    assert running
    with sqlite3.connect(store.engine.url.database or "") as conn:
        assert conn.execute("SELECT count(*) FROM idempotency_keys").fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM task_events WHERE task_id NOT IN (SELECT id FROM tasks)"
        ).fetchone() == (0,)
    store.close()


def test_views_show_the_queue(store: SQLiteStore) -> None:
    # The views use the database's own clock, the real one: use a real past time.
    past = datetime(2020, 1, 1, tzinfo=UTC)
    store.submit([NewTask("a", {}, past, 1), NewTask("b", {}, past, 1)], past)
    claims = store.claim("w", 1, past, LEASE)
    store.fail(claims[0], ERR, None, past)
    path = store.engine.url.database or ""
    store.close()
    with sqlite3.connect(path) as conn:
        summary = dict(conn.execute("SELECT state, tasks FROM queue_summary").fetchall())
        failed = conn.execute("SELECT name, error_type, error_message FROM tasks_failed").fetchall()
        due = conn.execute("SELECT name, lag_seconds > 0 FROM tasks_due").fetchall()
        running = conn.execute("SELECT count(*) FROM tasks_running").fetchone()
    assert summary == {"FAILED": 1, "PENDING": 1}
    assert failed == [("a", "builtins.ValueError", "bad")]
    assert due == [("b", 1)]
    assert running == (0,)
