"""PostgreSQL: a child's end wakes (locks) its parent in the child's own outcome
transaction; rows must still be locked in one global order, or two workers' group
commits deadlock. Two stores (two processes' worth of connections) in two threads,
each held inside its transaction by an effect until the other is inside too."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Connection, text

from durablesched import TaskState
from durablesched.records import Claim, NewTask, Outcome, SignalSend
from durablesched.store.sql.postgres import PostgresStore

from ..conftest import T0, WAIT, at
from .gates import Run

LEASE = timedelta(seconds=30)
#: How long each transaction waits, inside, for the other to be inside too: past
#: PostgreSQL's deadlock_timeout (1 s), so a deadlock is found while they wait.
MEET = 2.0


@pytest.fixture
def stores(pg_url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    yield first, second
    first.close()
    second.close()


def _meet(mine: threading.Event, theirs: threading.Event) -> Callable[[Connection], None]:
    """An effect: say this transaction is inside, wait (bounded) for the other."""

    def effect(conn: Connection) -> None:
        mine.set()
        theirs.wait(MEET)  # with the rows locked in order, the other waits outside

    return effect


def test_two_group_commits_each_ending_a_child_of_the_others_workflow_do_not_deadlock(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """Worker A records workflow P2's success and child C1's (of P1); worker B records
    P1's and C2's (of P2). Each locks its own rows in id order (A: P2, C1; B: P1, C2),
    then its child's end wakes the other's workflow: A wants P1, B wants P2. With the
    parents locked late, PostgreSQL finds a deadlock and aborts one commit; locked
    first, in id order with the rest, one waits for the other."""
    a, b = stores
    a.submit([NewTask("wf", {"n": 1}, T0, 3, None), NewTask("wf", {"n": 2}, T0, 3, None)], T0)
    p1, p2 = sorted(a.claim("w", 2, at(11), LEASE, ["wf"]), key=lambda c: c.task_id)
    kids: list[Claim] = []
    for parent in (p1, p2):
        spawned = a.spawn(parent, 0, "spawn:kid", [NewTask("kid", {}, T0, 3, None)], at(11))
        assert spawned is not None
    c1, c2 = sorted(a.claim("w", 2, at(12), LEASE, ["kid"]), key=lambda c: c.task_id)
    assert a.children(p1.task_id) == [c1.task_id] and a.children(p2.task_id) == [c2.task_id]
    kids += [c1, c2]
    a_in, b_in = threading.Event(), threading.Event()
    first = Run(
        lambda: a.record_and_claim(
            [Outcome(p2, result=2), Outcome(c1, result=1, effects=(_meet(a_in, b_in),))],
            at(13),
            owner="w",
            limit=0,
            lease=LEASE,
        )
    )
    second = Run(
        lambda: b.record_and_claim(
            [Outcome(p1, result=1), Outcome(c2, result=2, effects=(_meet(b_in, a_in),))],
            at(13),
            owner="w",
            limit=0,
            lease=LEASE,
        )
    )
    assert first.answer() == ([TaskState.SUCCEEDED] * 2, [])
    assert second.answer() == ([TaskState.SUCCEEDED] * 2, [])
    for claim in (p1, p2, *kids):
        record = a.get(claim.task_id)
        assert record is not None and record.state is TaskState.SUCCEEDED


def _until_waiting(store: PostgresStore, count: int, what: str) -> None:
    """Until ``count`` of this database's backends wait for a row lock (polled every 10 ms,
    at most WAIT seconds)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        with store.engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        if waiting == count:
            return
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def test_a_reclaim_failing_a_child_and_a_group_commit_of_its_parent_do_not_deadlock(
    stores: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """A reclaim fails an expired child C (its last attempt) and wakes its parent P; a
    group commit (the zombie's worker) records P's outcome and C's, locking P then C.
    Made to meet: a third connection holds C; the reclaim waits for C, then the group
    commit takes P and waits for C too; C is let go. The reclaim, given C first, wanted
    P next, held by the group commit, which wanted C: a deadlock, with P locked late.
    Locked first, in id order, the reclaim holds P before the group commit comes."""
    a, b = stores
    holder = PostgresStore(pg_url)
    try:
        a.submit([NewTask("wf", {}, T0, 3, None)], T0)
        (parent,) = a.claim("w", 1, at(11), LEASE * 10, ["wf"])  # its lease outlives the test
        assert a.spawn(parent, 0, "spawn:kid", [NewTask("kid", {}, T0, 1, None)], at(11))
        (child,) = a.claim("w", 1, at(12), LEASE, ["kid"])
        later = at(12) + LEASE + timedelta(seconds=1)
        with holder.engine.begin() as conn:
            conn.execute(
                text("SELECT id FROM tasks WHERE id = :id FOR UPDATE"), {"id": child.task_id}
            )
            reclaim = Run(lambda: a.reclaim_expired(later, lambda _name, _n: timedelta(0)))
            _until_waiting(holder, 1, "the reclaim wait for the child")
            commit = Run(
                lambda: b.record_and_claim(
                    [Outcome(parent, result=1), Outcome(child, result=2)],
                    at(13),
                    owner="w",
                    limit=0,
                    lease=LEASE,
                )
            )
            _until_waiting(holder, 2, "the group commit wait too")
        (reclaimed,) = reclaim.answer()
        assert (reclaimed.task_id, reclaimed.state) == (child.task_id, TaskState.FAILED)
        commit.answer()
    finally:
        holder.close()
    record = a.get(child.task_id)
    assert record is not None and record.state is TaskState.FAILED


def test_a_move_handing_over_a_child_and_a_success_signalling_it_do_not_deadlock(
    stores: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """A move hands over a workflow's PENDING child C (CANCELLED here) and wakes the
    workflow P, RUNNING; P's success signals C (``ctx.signal``), locking P then C.
    Made to meet as the reclaim's test does: a third connection holds C, the hand-over
    waits for it, P's success takes P and waits for C too; C is let go. The hand-over,
    given C first, wanted P next: a deadlock, with P locked late. Locked first, in id
    order, the hand-over holds P before the success comes, which then finds C gone
    (moved) and is refused as a signal to a finished task is."""
    a, b = stores
    holder = PostgresStore(pg_url)
    try:
        a.submit([NewTask("wf", {}, T0, 3, None)], T0)
        (parent,) = a.claim("w", 1, at(11), LEASE * 10, ["wf"])
        assert a.spawn(parent, 0, "spawn:kid", [NewTask("kid", {}, T0, 3, None)], at(11))
        (child,) = a.children(parent.task_id)
        with holder.engine.begin() as conn:
            conn.execute(text("SELECT id FROM tasks WHERE id = :id FOR UPDATE"), {"id": child})
            move = Run(lambda: a.hand_over(7, at(12)))
            _until_waiting(holder, 1, "the hand-over wait for the child")
            success = Run(
                lambda: b.record_and_claim(
                    [Outcome(parent, result=1, signals=(SignalSend(child, "go", None),))],
                    at(13),
                    owner="w",
                    limit=0,
                    lease=LEASE,
                )
            )
            _until_waiting(holder, 2, "the success wait too")
        ((moved, was),) = move.answer()
        assert (moved.id, was) == (child, TaskState.PENDING)
        success.answer()
    finally:
        holder.close()
    record = a.get(child)
    assert record is not None and record.state is TaskState.CANCELLED


def test_a_wait_whose_position_was_taken_while_it_waited_takes_no_signal(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """``receive_signal`` is one statement on PostgreSQL, its snapshot taken before it
    waits for the task's row: a step recorded at the wait's position by the transaction
    it waited for is not seen by its check, but its insert finds it. The signal is then
    left untaken and the wait refused, never taken without its step (lost to every later
    wait). Fails with the signal taken whether or not the step went in, or with such a
    wait answered "no signal" instead of refused."""
    store, _ = stores
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE, ["wf"])
    assert store.record_step(claim, 0, "wait:go", None, at(11))
    store.send_signal(claim.task_id, "go", {"by": "ada"}, at(11))
    got: list[object] = []
    with store.engine.connect() as holder:
        holder.execute(text("UPDATE tasks SET fence = fence WHERE id = :id"), {"id": claim.task_id})
        holder.execute(
            text(
                "INSERT INTO task_steps (task_id, position, name, result, recorded_at, attempt) "
                "VALUES (:id, 1, 'signal:go', NULL, now(), 1)"
            ),
            {"id": claim.task_id},
        )
        taker = threading.Thread(
            target=lambda: got.append(store.receive_signal(claim, 1, "signal:go", "go", at(12)))
        )
        taker.start()
        _until_waiting(store, 1, "the wait queued for the task's row")
        holder.commit()
    taker.join(WAIT)
    assert got == [None]
    (signal,) = store.signals(claim.task_id)
    assert signal.consumed_position is None
