"""On PostgreSQL, a submit inside a transaction that stays open (``submit(connection=)``,
a Django ``atomic()`` block) holds up no other submit: task ids come from a sequence,
not a row locked until the submitter commits (docs/scaling.md, "Submitting from open
transactions"). The one wait left is on purpose: a submit with the idempotency key
another open transaction just used waits for that transaction to end, then answers
with its task (committed) or stores its own (rolled back).

No test sleeps for its timing: the transaction held open stays open until the others
have finished (or a bounded wait gives up), and "is waiting" is read from the server
(``pg_blocking_pids``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from durablesched import InvalidTransitionError, TaskState
from durablesched.records import ErrorInfo, NewTask, Outcome, Submitted
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLiteStore
from durablesched.store.sql.submitting import record_submissions
from tests.conftest import T0, WAIT, _libpq

#: Enqueuers running while one transaction that enqueued stays open, and how many each.
ENQUEUERS = 4
EACH = 50


def _task(key: str | None = None, queue: str = "default", i: int = 0) -> NewTask:
    return NewTask("job", {"i": i}, T0, 1, key, queue=queue)


@pytest.fixture
def pg(pg_url: str) -> Iterator[tuple[str, PostgresStore]]:
    store = PostgresStore(pg_url)
    try:
        yield pg_url, store
    finally:
        store.close()


def _connect(url: str) -> Any:
    """A psycopg connection, not in autocommit mode: its first statement begins a
    transaction that lasts until commit or rollback, as Django's inside atomic()."""
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it

    return psycopg.connect(_libpq(url))


class Worker(threading.Thread):
    """Runs ``body`` once; keeps what it returned or raised, and when it finished."""

    def __init__(self, body: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.body = body
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.result = self.body()
        except BaseException as e:
            self.error = e
        finally:
            self.done.set()

    def outcome(self, timeout: float = WAIT) -> Any:
        assert self.done.wait(timeout), "still waiting: held up by the open transaction"
        if self.error is not None:
            raise self.error
        return self.result


def _wait_until_blocked(store: PostgresStore, pid: int) -> None:
    """Until the server says backend ``pid`` waits for another's lock (bounded)."""
    deadline = time.monotonic() + WAIT
    with store.engine.connect() as conn:
        while True:
            blockers = conn.exec_driver_sql(f"SELECT pg_blocking_pids({int(pid)})").scalar()
            conn.rollback()
            if blockers:
                return
            assert time.monotonic() < deadline, f"backend {pid} never waited for a lock"
            time.sleep(0.01)  # polling the server's view, not timing the test


def test_an_open_transaction_that_enqueued_holds_up_no_other_enqueue(
    pg: tuple[str, PostgresStore],
) -> None:
    url, store = pg
    held = _connect(url)
    stores = [PostgresStore(url) for _ in range(ENQUEUERS)]
    workers: list[Worker] = []
    try:
        (mine,) = store.submit([_task()], T0, connection=held)
        latencies: list[float] = []
        lock = threading.Lock()

        def enqueue(other: PostgresStore) -> list[int]:
            ids = []
            for i in range(EACH):
                started = time.monotonic()
                (s,) = other.submit([_task(i=i)], T0)  # its own transaction, committed
                with lock:
                    latencies.append(time.monotonic() - started)
                ids.append(s.task_id)
            return ids

        workers.extend(Worker(functools.partial(enqueue, s)) for s in stores)
        for w in workers:
            w.start()
        theirs = [i for w in workers for i in w.outcome()]
        # All of them committed while `held` is still open, each well under a second.
        assert len(theirs) == ENQUEUERS * EACH
        assert max(latencies) < 1.0, f"slowest enqueue took {max(latencies):.3f}s"
        assert store.get(mine.task_id) is None  # not committed yet: invisible
        held.commit()
        assert store.get(mine.task_id) is not None
        assert len(set(theirs) | {mine.task_id}) == ENQUEUERS * EACH + 1
    finally:
        held.rollback()
        held.close()
        for w in workers:  # held up (before the fix): they go on once `held` is gone
            w.done.wait(WAIT)
        for s in stores:
            s.close()


def test_a_borrowed_connection_enqueues_while_another_is_open(
    pg: tuple[str, PostgresStore],
) -> None:
    """The same through two callers' own transactions: the second commits first."""
    url, store = pg
    first, second = _connect(url), _connect(url)
    try:
        (a,) = store.submit([_task()], T0, connection=first)
        done = Worker(lambda: (store.submit([_task()], T0, connection=second), second.commit()))
        done.start()
        ((b,), _) = done.outcome()
        first.commit()
        assert {a.task_id, b.task_id} == {
            t.id for t in (store.get(a.task_id), store.get(b.task_id)) if t is not None
        }
    finally:
        for conn in (first, second):
            conn.rollback()
            conn.close()


def test_opposite_orders_of_enqueue_and_application_rows_do_not_deadlock(
    pg: tuple[str, PostgresStore],
) -> None:
    """T1 enqueues then updates an order; T2 updates that order then enqueues. With a
    lock shared by every submit this was a deadlock; now T2 goes on, commits, and T1's
    update waits for it as any two writers of one row do."""
    url, store = pg
    with store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id int PRIMARY KEY, n int NOT NULL)")
        conn.exec_driver_sql("INSERT INTO orders VALUES (1, 0)")
    t1, t2 = _connect(url), _connect(url)
    order_taken, go = threading.Event(), threading.Event()

    def second() -> Submitted:
        t2.execute("UPDATE orders SET n = n + 1 WHERE id = 1")
        order_taken.set()
        assert go.wait(WAIT)
        (s,) = store.submit([_task()], T0, connection=t2)
        t2.commit()
        return s

    try:
        (first_task,) = store.submit([_task()], T0, connection=t1)
        other = Worker(second)
        other.start()
        assert order_taken.wait(WAIT)
        update = Worker(lambda: (t1.execute("UPDATE orders SET n = n + 1 WHERE id = 1"), 0))
        update.start()
        _wait_until_blocked(store, t1.info.backend_pid)  # T1 waits for T2's row lock
        go.set()
        second_task = other.outcome()
        update.outcome()
        t1.commit()
        for s in (first_task, second_task):
            assert store.get(s.task_id) is not None
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT n FROM orders").scalar() == 2
    finally:
        for conn in (t1, t2):
            conn.rollback()
            conn.close()


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_the_same_key_in_two_open_transactions_waits_then_dedupes(
    pg: tuple[str, PostgresStore], ending: str
) -> None:
    """The second submit of a key waits for the open transaction that used it: its task
    if that commits (created False), a task of its own if that rolls back."""
    url, store = pg
    t1, t2 = _connect(url), _connect(url)
    try:
        (first,) = store.submit([_task("k")], T0, connection=t1)
        second = Worker(lambda: store.submit([_task("k")], T0, connection=t2))
        second.start()
        _wait_until_blocked(store, t2.info.backend_pid)
        getattr(t1, ending)()
        (got,) = second.outcome()
        t2.commit()
        if ending == "commit":
            assert (got.task_id, got.created) == (first.task_id, False)
        else:
            assert got.created
            task = store.get(got.task_id)
            assert task is not None and task.idempotency_key == "k"
    finally:
        for conn in (t1, t2):
            conn.rollback()
            conn.close()


def test_different_keys_in_two_open_transactions_do_not_wait(
    pg: tuple[str, PostgresStore],
) -> None:
    url, store = pg
    t1, t2 = _connect(url), _connect(url)
    try:
        store.submit([_task("a")], T0, connection=t1)
        second = Worker(lambda: store.submit([_task("b")], T0, connection=t2))
        second.start()
        (got,) = second.outcome()
        assert got.created
    finally:
        for conn in (t1, t2):
            conn.rollback()
            conn.close()


def test_batches_sharing_keys_in_any_order_do_not_deadlock(
    pg: tuple[str, PostgresStore],
) -> None:
    """T1 holds k1; T2's batch [k2, k1] must wait on k1 before it takes k2 (keys go in
    sorted order), so T1 can still take k2; T2 then answers both with T1's tasks."""
    url, store = pg
    t1, t2 = _connect(url), _connect(url)
    try:
        (k1,) = store.submit([_task("k1")], T0, connection=t1)
        batch = Worker(lambda: store.submit([_task("k2"), _task("k1")], T0, connection=t2))
        batch.start()
        _wait_until_blocked(store, t2.info.backend_pid)
        late = Worker(lambda: store.submit([_task("k2")], T0, connection=t1))
        late.start()
        (k2,) = late.outcome()
        t1.commit()
        got = batch.outcome()
        t2.commit()
        assert [(s.task_id, s.created) for s in got] == [(k2.task_id, False), (k1.task_id, False)]
    finally:
        for conn in (t1, t2):
            conn.rollback()
            conn.close()


def test_a_new_queue_in_two_open_transactions_does_not_wait(
    pg: tuple[str, PostgresStore],
) -> None:
    """A new queue's row is made apart from the caller's transaction: made in it, the
    row would hold up every other submit to that queue until the caller commits."""
    url, store = pg
    t1, t2 = _connect(url), _connect(url)
    try:
        store.submit([_task(queue="fresh")], T0, connection=t1)
        second = Worker(lambda: store.submit([_task(queue="fresh")], T0, connection=t2))
        second.start()
        second.outcome()
        t1.rollback()
        t2.rollback()
        assert "fresh" in {q["name"] for q in store.queue_info(T0)}  # an empty queue, harmless
    finally:
        for conn in (t1, t2):
            conn.rollback()
            conn.close()


def test_a_requeue_that_meets_a_new_holder_of_its_key_is_refused(
    pg: tuple[str, PostgresStore],
) -> None:
    """Requeueing a failed task while an open transaction submits its key: the requeue
    waits for that transaction, then says the key is taken (not a database error)."""
    url, store = pg
    (old,) = store.submit([_task("k")], T0)
    (claim,) = store.claim("w", 1, T0, timedelta(minutes=1))
    store.fail(claim, ErrorInfo("E", "boom", ""), None, T0)
    t1 = _connect(url)
    try:
        (new,) = store.submit([_task("k")], T0, connection=t1)
        requeue = Worker(lambda: store.requeue(old.task_id, T0))
        requeue.start()
        _wait_until_someone_blocked(store)  # past its look-up, at the unique index
        t1.commit()
        with pytest.raises(InvalidTransitionError, match="idempotency key is now held"):
            requeue.outcome()
        states = {t.id: t.state for t in map(store.get, (old.task_id, new.task_id)) if t}
        assert states == {old.task_id: TaskState.FAILED, new.task_id: TaskState.PENDING}
    finally:
        t1.rollback()
        t1.close()


def _wait_until_someone_blocked(store: PostgresStore) -> None:
    """Until some backend of this database waits for another's lock (bounded)."""
    deadline = time.monotonic() + WAIT
    with store.engine.connect() as conn:
        while True:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND cardinality(pg_blocking_pids(pid)) > 0"
            ).scalar()
            conn.rollback()
            if waiting:
                return
            assert time.monotonic() < deadline, "nobody waited for a lock"
            time.sleep(0.01)  # polling the server's view, not timing the test


def test_a_moved_task_meeting_a_new_holder_of_its_key_becomes_that_task(
    pg: tuple[str, PostgresStore], tmp_path: Path
) -> None:
    """`durablesched move` receives a task whose key an open transaction here has just
    submitted: the receiver waits for it, then records the arrival as that task."""
    url, store = pg
    source = SQLiteStore(tmp_path / "source.db")
    t1 = _connect(url)
    try:
        source.submit([_task("k")], T0)
        moved = source.hand_over(store.instance(), T0)
        (mine,) = store.submit([_task("k")], T0, connection=t1)
        arrival = Worker(lambda: store.receive(source.instance(), moved, T0))
        arrival.start()
        _wait_until_someone_blocked(store)  # past its look-up, at the unique index
        t1.commit()
        assert arrival.outcome() == [(mine.task_id, "key")]
        again = store.receive(source.instance(), moved, T0)
        assert again == [(mine.task_id, "already")]
    finally:
        t1.rollback()
        t1.close()
        source.close()


def test_submission_lines_go_to_exactly_the_tasks_stored(pg: tuple[str, PostgresStore]) -> None:
    """Ids taken together need not be contiguous on PostgreSQL (other sessions take from
    the sequence too): the submission lines name the stored ids, not the range between
    the first and the last, which may hold a task another transaction committed."""
    _url, store = pg
    ids = [s.task_id for s in store.submit([_task(i=i) for i in range(3)], T0)]
    with store.engine.begin() as conn:
        record_submissions(store, conn, [ids[0], ids[2]])  # as if ids[1] were another's
    lines = {i: len(store.history(i)) for i in ids}
    assert lines == {ids[0]: 2, ids[1]: 1, ids[2]: 2}


def test_receivers_of_one_source_take_turns(
    pg: tuple[str, PostgresStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two receivers of the same moved task: the second waits for the first (a lock per
    source database), then finds the task already arrived; never a second copy, never a
    database error."""
    url, store = pg
    source = SQLiteStore(tmp_path / "source.db")
    other = PostgresStore(url)
    inside, leave = threading.Event(), threading.Event()
    real_wake = PostgresStore._wake_others

    def wake_then_wait(self: PostgresStore, conn: Any) -> None:
        real_wake(self, conn)
        if self is store:  # the first receiver stops just before its commit
            inside.set()
            assert leave.wait(WAIT)

    monkeypatch.setattr(PostgresStore, "_wake_others", wake_then_wait)
    try:
        source.submit([_task()], T0)
        moved = source.hand_over(store.instance(), T0)
        first = Worker(lambda: store.receive(source.instance(), moved, T0))
        first.start()
        assert inside.wait(WAIT)
        second = Worker(lambda: other.receive(source.instance(), moved, T0))
        second.start()
        _wait_until_someone_blocked(store)
        leave.set()
        ((task_id, how),) = first.outcome()
        assert how == "copied"
        assert second.outcome() == [(task_id, "already")]
    finally:
        leave.set()
        other.close()
        source.close()


def test_an_outcome_undone_by_its_effect_takes_no_task_ids(
    pg: tuple[str, PostgresStore],
) -> None:
    """A success whose effect raises is undone with its children; the children must not
    have taken ids first (a sequence never gives them back): the next task's id is the
    next one."""
    _url, store = pg
    (parent,) = store.submit([_task()], T0)
    (claim,) = store.claim("w", 1, T0, timedelta(seconds=30))

    def raises(_conn: object) -> None:
        raise RuntimeError("the effect failed")

    outcome = Outcome(claim, result=1, children=(_task(), _task()), effects=(raises,))
    results, _ = store.record_and_claim(
        [outcome], T0, owner="w", limit=0, lease=timedelta(seconds=30)
    )
    assert isinstance(results[0], RuntimeError)
    (after,) = store.submit([_task()], T0)
    assert after.task_id == parent.task_id + 1
