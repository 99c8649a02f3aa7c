"""PostgreSQL: a child's end wakes (locks) its parent in the child's own outcome
transaction; rows must still be locked in one global order, or two workers' group
commits deadlock. Two stores (two processes' worth of connections) in two threads,
each held inside its transaction by an effect until the other is inside too."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Connection

from durablesched import TaskState
from durablesched.records import Claim, NewTask, Outcome
from durablesched.store.sql.postgres import PostgresStore

from ..conftest import T0, at
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
