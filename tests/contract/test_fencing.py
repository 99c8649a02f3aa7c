"""Fencing by the claim's fence alone: the same owner, reclaimed and claiming the task
again, holds an older claim that must record nothing.

The stale-claim tests in ``test_store.py`` use a different owner for the new claim,
so the owner condition alone refuses the old claim there. Here owner and lease
agree (the new claim's lease is valid at the time of the write): only the fence
tells the two attempts apart, on every path an outcome is written by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest

from durablesched import ErrorInfo, Outcome, TaskState
from durablesched.records import Claim, NewTask

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.RuntimeError", "boom", "Traceback ...")


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


def reclaimed_by_the_same_owner(store: BackendStore) -> tuple[Claim, Claim]:
    """Task "t" claimed by w (fence 1), its lease lost and reclaimed, then claimed by w
    again (fence 2): the old claim and the new one, same owner, same task."""
    store.submit([NewTask("t", {}, at(10), 5, None)], T0)
    (old,) = store.claim("w", 1, at(10), LEASE)
    assert [r.state for r in store.reclaim_expired(at(40), no_delay)] == [TaskState.RETRY_WAIT]
    (new,) = store.claim("w", 1, at(41), LEASE)
    assert (old.owner, old.task_id, old.fence) == (new.owner, new.task_id, new.fence - 1)
    return old, new


def the_task(store: BackendStore, new: Claim) -> tuple[TaskState, str | None, int, object]:
    task = store.get(new.task_id)
    assert task is not None
    return task.state, task.lease_owner, task.fence, task.result


RUNNING_UNDER_NEW = (TaskState.RUNNING, "w", 2, None)


def test_the_same_owner_cannot_complete_with_an_older_fence(store: BackendStore) -> None:
    old, new = reclaimed_by_the_same_owner(store)
    assert store.complete(old, "stale", at(42)) is False
    assert the_task(store, new) == RUNNING_UNDER_NEW
    assert store.complete(new, "fresh", at(43))
    assert the_task(store, new) == (TaskState.SUCCEEDED, None, 2, "fresh")


def test_the_same_owner_cannot_fail_with_an_older_fence(store: BackendStore) -> None:
    old, new = reclaimed_by_the_same_owner(store)
    assert store.fail(old, ERR, None, at(42)) is None
    assert store.fail(old, ERR, at(50), at(42)) is None
    assert the_task(store, new) == RUNNING_UNDER_NEW
    assert [e.state for e in store.history(new.task_id)][-1] is TaskState.RUNNING


def test_the_same_owner_cannot_acknowledge_a_cancel_with_an_older_fence(
    store: BackendStore,
) -> None:
    old, new = reclaimed_by_the_same_owner(store)
    store.request_cancel(new.task_id, at(42))
    assert store.acknowledge_cancel(old, at(42)) is False
    assert the_task(store, new) == RUNNING_UNDER_NEW
    assert store.acknowledge_cancel(new, at(43))


def test_the_same_owner_cannot_release_with_an_older_fence(store: BackendStore) -> None:
    old, new = reclaimed_by_the_same_owner(store)
    assert store.release([old], at(42)) == 0
    assert the_task(store, new) == RUNNING_UNDER_NEW
    task = store.get(new.task_id)
    assert task is not None and task.attempts == 2  # the release did not give one back


def test_the_same_owner_cannot_renew_or_check_an_older_fence(store: BackendStore) -> None:
    old, new = reclaimed_by_the_same_owner(store)
    assert store.heartbeat("w", [old], at(42), LEASE) == []
    assert store.check_leases("w", [old], at(42)) == []
    task = store.get(new.task_id)
    assert task is not None and task.lease_expires_at == at(41) + LEASE
    # Given both, the current claim is renewed, once.
    assert [(s.task_id, s.fence) for s in store.heartbeat("w", [old, new], at(42), LEASE)] == [
        (new.task_id, 2)
    ]


@pytest.mark.parametrize(
    "outcome",
    [
        pytest.param(lambda c: Outcome(c, result="stale"), id="plain-success"),
        pytest.param(
            lambda c: Outcome(c, result="stale", children=(NewTask("child", {}, at(0), 1, None),)),
            id="success-with-children",
        ),
        pytest.param(lambda c: Outcome(c, error=ERR), id="failure"),
        pytest.param(lambda c: Outcome(c, error=ERR, retry_at=at(50)), id="retry"),
        pytest.param(lambda c: Outcome(c, cancelled=True), id="cancel"),
    ],
)
def test_a_group_commit_refuses_an_older_fence_of_the_same_owner(
    store: BackendStore, outcome: Callable[[Claim], Outcome]
) -> None:
    old, new = reclaimed_by_the_same_owner(store)
    store.request_cancel(new.task_id, at(41.5))  # so that a cancel would be accepted
    results, claims = store.record_and_claim(
        [outcome(old)], at(42), owner="w", limit=0, lease=LEASE
    )
    assert (results, claims) == ([None], [])
    assert the_task(store, new) == RUNNING_UNDER_NEW
    assert store.list_tasks(name="child") == []


def test_a_group_commit_of_many_successes_refuses_only_the_older_fence(
    store: BackendStore,
) -> None:
    # SQLite and PostgreSQL record runs of plain successes in one statement: the
    # fence is checked per task there too.
    old, new = reclaimed_by_the_same_owner(store)
    store.submit([NewTask("u", {}, at(10), 5, None)], at(41))
    (other,) = store.claim("w", 1, at(41), LEASE)
    results, _ = store.record_and_claim(
        [Outcome(old, result="stale"), Outcome(other, result="ok")],
        at(42),
        owner="w",
        limit=0,
        lease=LEASE,
    )
    assert results == [None, TaskState.SUCCEEDED]
    assert the_task(store, new) == RUNNING_UNDER_NEW
    # And the current claim, in a batch of its own, still succeeds.
    results, _ = store.record_and_claim(
        [Outcome(new, result="fresh")], at(43), owner="w", limit=0, lease=LEASE
    )
    assert results == [TaskState.SUCCEEDED]


def test_a_claim_naming_another_owner_is_refused_even_with_the_current_fence(
    store: BackendStore,
) -> None:
    # The owner is checked beside the fence: a claim altered (or built) to name
    # another worker records nothing, though its task and fence are the current ones.
    store.submit([NewTask("t", {}, at(10), 5, None)], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    forged = replace(claim, owner="intruder")
    assert store.complete(forged, "forged", at(11)) is False
    assert store.fail(forged, ERR, None, at(11)) is None
    assert store.release([forged], at(11)) == 0
    assert store.heartbeat("intruder", [forged], at(11), LEASE) == []
    assert store.check_leases("intruder", [forged], at(11)) == []
    results, _ = store.record_and_claim(
        [Outcome(forged, result="forged")], at(11), owner="intruder", limit=0, lease=LEASE
    )
    assert results == [None]
    assert the_task(store, claim) == (TaskState.RUNNING, "w", 1, None)
    assert store.complete(claim, "real", at(12))
