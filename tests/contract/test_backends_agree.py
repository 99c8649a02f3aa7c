"""Regressions for disagreements between backends the differential test found
(tests/reliability/test_differential.py): each is the smallest case, on every backend."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from durablesched import InvalidTransitionError, TaskState
from durablesched.records import TASK_KEY_PREFIX, NewTask, Outcome
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, BackendStore, at, make_store

LEASE = timedelta(seconds=30)


def new(name: str = "t", due: float = 10, *, key: str | None = None) -> NewTask:
    return NewTask(name, {}, at(due), 1, key)


def test_no_names_claim_nothing_and_wait_for_no_due_time(store: BackendStore) -> None:
    store.submit([new("a", 10), new("a", 20)], T0)
    assert store.claim("w", 5, at(10), LEASE, names=frozenset()) == []
    results, claims = store.record_and_claim([], at(10), owner="w", limit=5, lease=LEASE, names=())
    assert (results, claims) == ([], [])
    assert store.next_wakeup(at(10), names=frozenset()) is None


def test_next_wakeup_with_names_waits_for_those_names_alone(store: BackendStore) -> None:
    store.submit([new("a", 12), new("b", 20)], T0)
    assert store.next_wakeup(at(10), names={"b"}) == at(20)
    assert store.next_wakeup(at(10), names={"zz"}) is None


def test_heartbeat_renews_the_current_claim_beside_a_stale_or_repeated_one(
    store: BackendStore,
) -> None:
    store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    stale = replace(claim, fence=claim.fence + 1)
    for claims in ([claim, stale], [stale, claim], [claim, claim]):
        (status,) = store.heartbeat("w", claims, at(11), LEASE)
        assert (status.task_id, status.fence) == (claim.task_id, claim.fence)
        assert store.check_leases("w", claims, at(11)) == [status]


def test_a_submit_key_spelling_a_generated_key_does_not_block_a_success(
    store: BackendStore,
) -> None:
    (first,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.complete(claim, "first", at(11))
    key = f"{TASK_KEY_PREFIX}{first.task_id}"
    store.submit([new("t", key=key), new("t", key=key + "0")], T0)
    second, third = store.claim("w", 2, at(11), LEASE)
    assert store.complete(second, "second", at(12))  # alone
    results, _ = store.record_and_claim(  # in a group commit
        [Outcome(third, result="third")], at(12), owner="w", limit=0, lease=LEASE
    )
    assert results == [TaskState.SUCCEEDED]


def test_a_group_commit_of_a_success_whose_key_spells_a_recorded_key_succeeds(
    store: BackendStore,
) -> None:
    # The same through a group commit's run of plain successes (one statement for the
    # run, its keys recorded together): the key recorded first stays, nothing fails.
    (first,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    results, _ = store.record_and_claim(
        [Outcome(claim, result="first")], at(11), owner="w", limit=0, lease=LEASE
    )
    assert results == [TaskState.SUCCEEDED]
    store.submit([new("t", key=f"{TASK_KEY_PREFIX}{first.task_id}")], at(11))
    (second,) = store.claim("w", 1, at(11), LEASE)
    results, _ = store.record_and_claim(
        [Outcome(second, result="second")], at(12), owner="w", limit=0, lease=LEASE
    )
    assert results == [TaskState.SUCCEEDED]


@pytest.mark.parametrize("sql_backend", ["sqlite", "postgres"])
def test_requeue_refuses_a_running_task(
    sql_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An operator action of the SQL backends (the in-memory one has no requeue)."""
    store = make_store(sql_backend, tmp_path, request)
    assert isinstance(store, SQLStore)
    (s,) = store.submit([new("t")], T0)
    store.claim("w", 1, at(10), LEASE)
    history = store.history(s.task_id)
    with pytest.raises(InvalidTransitionError):
        store.requeue(s.task_id, at(11))
    assert store.history(s.task_id) == history
    task = store.get(s.task_id)
    assert task is not None and task.state is TaskState.RUNNING
    store.close()


def test_a_claim_behind_a_later_claim_takes_nothing_not_yet_due_at_its_time(
    store: BackendStore,
) -> None:
    # A worker that read its clock (10 s) and then waited while another claimed at
    # 20 s: the later claim made the task due at 15 s ready, but it is not due at 10 s.
    (s,) = store.submit([new("x", 15)], T0)
    assert store.claim("w2", 1, at(20), LEASE, names={"other"}) == []
    assert store.claim("w1", 1, at(10), LEASE) == []
    assert [c.task_id for c in store.claim("w1", 1, at(15), LEASE)] == [s.task_id]


def test_next_wakeup_sees_a_task_a_later_claim_made_ready(store: BackendStore) -> None:
    # The same ordering for the wake-up: at 12 s the task due at 15 s is still to come,
    # although a claim at 20 s (for another name) already looked at it.
    store.submit([new("x", 15)], T0)
    assert store.claim("w2", 1, at(20), LEASE, names={"other"}) == []
    assert store.next_wakeup(at(12)) == at(15)
    assert store.next_wakeup(at(12), names={"x"}) == at(15)
    assert store.next_wakeup(at(12), queues={"default"}) == at(15)
    assert store.next_wakeup(at(12), names={"y"}) is None
    assert store.next_wakeup(at(15)) is None
