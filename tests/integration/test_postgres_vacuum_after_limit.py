"""On PostgreSQL a change of a queue's limit per key that rewrote many tasks vacuums the
tasks table once it has committed (``postgres.vacuum_after_limit_rewrite``).

The change moves every keyed task but its key's head out of the claim's index
(``key_waiting``), and each moved task's old version stays in the index until a vacuum:
a busy key's backlog at its front, stepped over by every claim of the queue (1.2 ms a
claim at 100,000, docs/queues.md), and autovacuum waits for a fifth of the table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy.exc
from sqlalchemy import text

from durablesched import QueueLimits
from durablesched.records import NewTask
from durablesched.store.sql import postgres
from durablesched.store.sql.postgres import PostgresStore

from ..conftest import T0, at

TASKS = 12
LEASE = timedelta(seconds=30)


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    """``TASKS`` due tasks of one limit key in queue q, which has no limit per key yet."""
    store = PostgresStore(pg_url)
    store.submit([NewTask("t", {}, at(1), 3, None, None, "q", 0, "k") for _ in range(TASKS)], T0)
    yield store
    store.close()


def vacuums(store: PostgresStore) -> tuple[int, int]:
    """How many times the tasks table was vacuumed and analyzed by hand."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables "
                "WHERE relname = 'tasks' AND schemaname = current_schema()"
            )
        ).one()
    return int(row[0]), int(row[1])


def test_a_change_that_rewrote_many_tasks_vacuums_the_table(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Set, every task is rewritten (waiting, then its head not); off, all but the head.
    monkeypatch.setattr(postgres, "VACUUM_AFTER", TASKS - 1)
    assert vacuums(store) == (0, 0)
    store.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
    assert vacuums(store) == (1, 1)
    store.put_queue(QueueLimits("q", concurrency_per_key=1), T0)  # no change: no rewrite
    assert vacuums(store) == (1, 1)
    store.put_queue(QueueLimits("q"), T0)  # off: the waiting tasks come back
    assert vacuums(store) == (2, 2)
    assert len(store.claim("w", TASKS, at(2), LEASE)) == TASKS  # none waits any more


def test_a_change_that_rewrote_fewer_leaves_the_table_to_autovacuum(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "VACUUM_AFTER", TASKS + 1)  # one more than it rewrites
    store.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
    assert vacuums(store) == (0, 0)


def test_a_vacuum_that_cannot_have_the_table_leaves_the_change_standing(
    store: PostgresStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another vacuum under way (its lock, held here) past the lock timeout: the change
    has committed and stands, the vacuum is left to autovacuum with a warning, and the
    connection that waited is not reused with its lock timeout."""
    monkeypatch.setattr(postgres, "VACUUM_AFTER", 1)
    monkeypatch.setattr(postgres, "VACUUM_LOCK_TIMEOUT", "50ms")
    with store.engine.connect() as other:
        other.execute(text("LOCK TABLE tasks IN SHARE UPDATE EXCLUSIVE MODE"))
        with caplog.at_level(logging.WARNING, logger="durablesched.postgres"):
            store.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
        other.rollback()
    assert "vacuuming tasks after a change of limit per key that rewrote" in caplog.text
    assert vacuums(store) == (0, 0)
    assert [q.concurrency_per_key for q in store.queue_limits() if q.name == "q"] == [1]
    # No connection of the pool kept the 50 ms timeout (the one that waited was dropped).
    pooled = store.engine.pool.checkedin()  # type: ignore[attr-defined]
    conns = [store.engine.connect() for _ in range(pooled)]
    try:
        assert [c.execute(text("SHOW lock_timeout")).scalar_one() for c in conns] == ["0"] * pooled
    finally:
        for conn in conns:
            conn.close()


def test_no_connection_for_the_vacuum_is_a_warning_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool spent when the change has committed: the caller is not told the change
    failed."""

    class Spent:
        def connect(self) -> None:
            raise sqlalchemy.exc.TimeoutError("QueuePool limit of size 8 overflow 64 reached")

    with caplog.at_level(logging.WARNING, logger="durablesched.postgres"):
        postgres.vacuum_after_limit_rewrite(Spent(), postgres.VACUUM_AFTER)  # type: ignore[arg-type]
    assert "QueuePool limit" in caplog.text
