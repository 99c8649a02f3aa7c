"""Database effects commit with success, exactly once; transactional enqueue."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Connection, text

from durablesched import (
    ManualClock,
    RetryPolicy,
    Scheduler,
    SQLiteStore,
    StoreError,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import NewTask
from durablesched.testing import run_due, run_until_complete

from ..conftest import T0, WAIT

NO_JITTER = RetryPolicy(max_attempts=3, initial=timedelta(seconds=5), jitter=0)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "fx.db")
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE ledger (task_id INTEGER, note TEXT, UNIQUE (task_id))"))
    yield store
    pool = store.engine.pool
    store.close()
    assert pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.fixture
def sched(sqlite_store: SQLiteStore, registry: TaskRegistry, clock: ManualClock) -> Scheduler:
    return Scheduler(sqlite_store, registry=registry, clock=clock)


def ledger(store: SQLiteStore) -> list[tuple[int, str]]:
    with store.engine.connect() as conn:
        rows = [(r[0], r[1]) for r in conn.execute(text("SELECT task_id, note FROM ledger"))]
        conn.rollback()
    return rows


def write_ledger(task_id: int, note: str) -> Callable[[Connection], None]:
    def effect(conn: Connection) -> None:
        conn.execute(
            text("INSERT INTO ledger (task_id, note) VALUES (:t, :n)"), {"t": task_id, "n": note}
        )

    return effect


def test_effect_commits_with_success_and_key_is_recorded(
    sched: Scheduler, sqlite_store: SQLiteStore, registry: TaskRegistry
) -> None:
    @registry.task("pay", pass_context=True)
    def pay(ctx: TaskContext, amount: int) -> dict[str, int]:
        ctx.on_success(write_ledger(ctx.task_id, f"paid {amount}"))
        return {"amount": amount}

    task_id = sched.submit("pay", {"amount": 5}, key="invoice-1")
    run_due(sched)
    assert ledger(sqlite_store) == [(task_id, "paid 5")]
    with sqlite_store.engine.connect() as conn:
        keys = conn.execute(text("SELECT key, task_id, result FROM idempotency_keys")).all()
        conn.rollback()
    assert [tuple(k) for k in keys] == [("invoice-1", task_id, '{"amount":5}')]
    assert sched.get(task_id).result == {"amount": 5}


def test_effect_of_a_lost_lease_never_happens(
    sched: Scheduler, sqlite_store: SQLiteStore, registry: TaskRegistry, clock: ManualClock
) -> None:
    """The zombie's effect and success roll back together; the rescuer's commit once."""
    release = threading.Event()

    @registry.task("pay", pass_context=True, retry=NO_JITTER)
    def pay(ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            assert release.wait(WAIT)
        ctx.on_success(write_ledger(ctx.task_id, f"attempt {ctx.attempt}"))
        ctx.submit("child", {"by": ctx.attempt})
        return ctx.attempt

    @registry.task("child")
    def child(by: int) -> None:
        return None

    task_id = sched.submit("pay")
    zombie = Worker(sched, concurrency=1, lease=30, owner="zombie")
    try:
        zombie.run_once()
        assert zombie.wait_running(1, WAIT)
        clock.advance(31)
        rescuer = Worker(sched, concurrency=1, lease=30, owner="rescuer")
        assert rescuer.reclaim() == 1
        clock.advance(5)
        assert rescuer.run_due() == 2  # the task, then the child its success created
        release.set()
        assert zombie.wait_idle(WAIT)
    finally:
        zombie.stop()
        if zombie._pool is not None:
            zombie._pool.shutdown(wait=True)
    assert ledger(sqlite_store) == [(task_id, "attempt 2")]
    assert [t.args for t in sched.list_tasks(name="child")] == [{"by": 2}]
    task = sched.get(task_id)
    assert (task.state, task.result, task.attempts) == (TaskState.SUCCEEDED, 2, 2)


def test_an_effect_that_raises_undoes_the_success(
    sched: Scheduler, sqlite_store: SQLiteStore, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("pay", pass_context=True, retry=NO_JITTER)
    def pay(ctx: TaskContext) -> int:
        ctx.submit("child")
        if ctx.attempt == 1:
            # A duplicate row: the UNIQUE constraint makes the second insert fail.
            ctx.on_success(write_ledger(ctx.task_id, "first"))
            ctx.on_success(write_ledger(ctx.task_id, "duplicate"))
        return ctx.attempt

    @registry.task("child")
    def child() -> None:
        return None

    task_id = sched.submit("pay")
    run_due(sched)
    task = sched.get(task_id)
    assert task.state is TaskState.RETRY_WAIT
    assert task.last_error is not None and "UNIQUE" in task.last_error.message
    assert ledger(sqlite_store) == []
    assert sched.list_tasks(name="child") == []
    with sqlite_store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM idempotency_keys")).scalar() == 0
        conn.rollback()
    run_until_complete(sched, clock)
    assert sched.get(task_id).state is TaskState.SUCCEEDED
    assert len(sched.list_tasks(name="child")) == 1


def test_transactional_enqueue_exists_only_if_the_transaction_commits(
    sched: Scheduler, sqlite_store: SQLiteStore, registry: TaskRegistry
) -> None:
    registry.register(lambda order: None, name="ship")
    with sqlite_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO ledger (task_id, note) VALUES (0, 'order 1')"))
        committed = sched.submit("ship", {"order": 1}, connection=conn)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), sqlite_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO ledger (task_id, note) VALUES (1, 'order 2')"))
        sched.submit("ship", {"order": 2}, connection=conn)
        raise Abort
    assert [t.id for t in sched.list_tasks()] == [committed]
    assert ledger(sqlite_store) == [(0, "order 1")]


def test_tasks_survive_reopening_the_file(tmp_path: Path, registry: TaskRegistry) -> None:
    clock = ManualClock(T0)
    path = tmp_path / "durable.db"
    first = Scheduler(SQLiteStore(path), registry=registry, clock=clock)
    registry.register(lambda n: n * 2, name="double")
    ids = first.submit_many("double", [{"n": i} for i in range(3)])
    first.store.close()
    second = Scheduler(SQLiteStore(path), registry=registry, clock=clock)
    assert run_due(second) == 3
    assert [second.get(i).result for i in ids] == [0, 2, 4]
    second.store.close()


def test_a_write_waiting_behind_a_long_effect_fails_clearly_after_busy_timeout(
    tmp_path: Path,
) -> None:
    """A process's writers queue on one kept connection: a writer stuck behind an
    effect that holds it gets a StoreError naming the wait, not a hang."""
    store = SQLiteStore(tmp_path / "held.db", busy_timeout=0.3)
    ((task_id, _, _),) = store.submit([NewTask("slow", {}, T0, 1)], T0)
    (claim,) = store.claim("w", 1, T0, timedelta(seconds=30))
    inside, release = threading.Event(), threading.Event()

    def holds(_conn: Connection) -> None:
        inside.set()
        assert release.wait(WAIT)

    holder = threading.Thread(
        target=store.complete, args=(claim, None, T0), kwargs={"effects": [holds]}
    )
    holder.start()
    try:
        assert inside.wait(WAIT)
        with pytest.raises(StoreError, match="submitting tasks failed: another thread held"):
            store.submit([NewTask("later", {}, T0, 1)], T0)
    finally:
        release.set()
        holder.join(WAIT)
    assert (record := store.get(task_id)) is not None
    assert record.state is TaskState.SUCCEEDED
    assert [t.name for t in store.list_tasks()] == ["slow"]  # nothing half-stored
    store.close()


def test_an_effect_that_submits_on_its_own_connection_is_refused_not_deadlocked(
    tmp_path: Path,
) -> None:
    """A write begun inside another on the same thread cannot take the kept
    connection: it gets its own, finds the file locked by the outer one, and
    fails with a StoreError after busy_timeout; the outer success then fails too
    (its effect raised), and the task is retried, nothing half-done."""
    store = SQLiteStore(tmp_path / "nested.db", busy_timeout=0.3)
    ((task_id, _, _),) = store.submit([NewTask("outer", {}, T0, 2)], T0)
    (claim,) = store.claim("w", 1, T0, timedelta(seconds=30))

    def submits_alone(_conn: Connection) -> None:
        store.submit([NewTask("inner", {}, T0, 1)], T0)

    with pytest.raises(StoreError, match="submitting tasks failed"):
        store.complete(claim, None, T0, effects=[submits_alone])
    assert (record := store.get(task_id)) is not None
    assert record.state is TaskState.RUNNING
    assert [t.name for t in store.list_tasks()] == ["outer"]
    store.close()
