"""The store contract, called directly: ordering, claims, leases, fencing, reclaim."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablesched import (
    CancelOutcome,
    ErrorInfo,
    InvalidTransitionError,
    ManualClock,
    TaskEvent,
    TaskNotFoundError,
    TaskState,
)
from durablesched.records import NewTask

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.RuntimeError", "boom", "Traceback ...")


def new(name: str = "t", due: float = 10, *, key: str | None = None, attempts: int = 3) -> NewTask:
    return NewTask(name, {"n": name}, at(due), attempts, key)


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(seconds=5)


def test_claim_order_is_due_time_then_submission(store: BackendStore) -> None:
    ids = [s.task_id for s in store.submit([new("late", 12), new("a", 11), new("b", 11)], T0)]
    claims = store.claim("w", 10, at(20), LEASE)
    assert [c.task_id for c in claims] == [ids[1], ids[2], ids[0]]


def test_equal_due_times_run_in_submission_order(store: BackendStore) -> None:
    ids = [s.task_id for s in store.submit([new(f"t{i}", 12) for i in range(20)], T0)]
    got: list[int] = []
    while claims := store.claim("w", 3, at(12), LEASE):
        got.extend(c.task_id for c in claims)
    assert got == ids


def test_nothing_is_claimed_before_its_due_time(store: BackendStore) -> None:
    (s,) = store.submit([new("t", 12)], T0)
    assert store.claim("w", 1, at(11.999), LEASE) == []
    assert [c.task_id for c in store.claim("w", 1, at(12), LEASE)] == [s.task_id]


def test_claim_sets_running_with_lease_and_new_fence(store: BackendStore) -> None:
    (s,) = store.submit([new("t", 10)], T0)
    (claim,) = store.claim("w1", 5, at(10), LEASE)
    task = store.get(s.task_id)
    assert task is not None
    assert task.state is TaskState.RUNNING
    assert (task.lease_owner, task.lease_expires_at) == ("w1", at(10) + LEASE)
    assert (claim.attempt, claim.fence, task.attempts, task.fence) == (1, 1, 1, 1)
    assert claim.args == {"n": "t"}


def test_a_claim_carries_its_tasks_priority_submission_time_and_its_own_time(
    store: BackendStore,
) -> None:
    (s,) = store.submit([NewTask("t", {}, at(10), 3, None, queue="q", priority=7)], at(3))
    (claim,) = store.claim("w1", 5, at(12), LEASE)
    assert (claim.queue, claim.priority, claim.created_at, claim.claimed_at) == (
        "q",
        7,
        at(3),
        at(12),
    )
    task = store.get(s.task_id)
    assert task is not None
    assert claim.created_at == task.created_at
    # The claim's time is its history line's: the attempt's start.
    (line,) = [e for e in store.history(s.task_id) if e.state is TaskState.RUNNING]
    assert line.at == claim.claimed_at
    # A second claim (after a failure) carries its own time.
    assert store.fail(claim, ERR, at(13), at(12.5))
    (again,) = store.claim("w2", 5, at(13.25), LEASE)
    assert (again.fence, again.created_at, again.claimed_at) == (2, at(3), at(13.25))


def test_claim_respects_limit_and_names(store: BackendStore) -> None:
    store.submit([new("a", 10), new("b", 10), new("a", 10), new("a", 10)], T0)
    claims = store.claim("w", 2, at(10), LEASE, names={"a"})
    assert [c.name for c in claims] == ["a", "a"]
    assert [c.name for c in store.claim("w", 5, at(10), LEASE, names={"a"})] == ["a"]
    assert [c.name for c in store.claim("w", 5, at(10), LEASE)] == ["b"]


def test_complete_records_result_and_history(store: BackendStore) -> None:
    (s,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.complete(claim, {"ok": [1, 2]}, at(11))
    task = store.get(s.task_id)
    assert task is not None
    assert (task.state, task.result, task.finished_at) == (
        TaskState.SUCCEEDED,
        {"ok": [1, 2]},
        at(11),
    )
    assert [e.state for e in store.history(s.task_id)] == [
        TaskState.PENDING,
        TaskState.RUNNING,
        TaskState.SUCCEEDED,
    ]


def test_history_starts_with_the_submission_of_every_task(store: BackendStore) -> None:
    # The bulk path (no keys), the keyed path (a repeat of a key is not a new task)
    # and children stored with a success each write one submission line per task.
    bulk = store.submit([new("a"), new("b")], T0)
    keyed = store.submit([new("k", key="x"), new("k", key="x"), new("c")], at(11))
    assert [s.created for s in keyed] == [True, False, True]
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.complete(claim, None, at(12), children=[new("child")])
    (child,) = store.list_tasks(name="child")
    expected = {s.task_id: T0 for s in bulk} | {keyed[0].task_id: at(11), keyed[2].task_id: at(11)}
    expected[child.id] = at(12)
    for task_id, submitted_at in expected.items():
        first, *rest = store.history(task_id)
        assert first == TaskEvent(task_id, submitted_at, TaskState.PENDING, 0, "submitted")
        assert all(e.detail != "submitted" for e in rest)
    assert [e.state for e in store.history(claim.task_id)] == [
        TaskState.PENDING,
        TaskState.RUNNING,
        TaskState.SUCCEEDED,
    ]
    assert store.history(999) == []


def test_outcome_with_a_stale_claim_changes_nothing(store: BackendStore) -> None:
    (s,) = store.submit([new("t", attempts=3)], T0)
    (old,) = store.claim("w1", 1, at(10), LEASE)
    reclaimed = store.reclaim_expired(at(10) + LEASE, no_delay)
    assert [(r.task_id, r.state, r.owner) for r in reclaimed] == [
        (s.task_id, TaskState.RETRY_WAIT, "w1")
    ]
    (new_claim,) = store.claim("w2", 1, at(100), LEASE)
    assert new_claim.fence == old.fence + 1
    # The zombie's every write is refused and leaves the row alone.
    assert store.complete(old, "zombie", at(101)) is False
    assert store.fail(old, ERR, None, at(101)) is None
    assert store.heartbeat("w1", [old], at(101), LEASE) == []
    assert store.acknowledge_cancel(old, at(101)) is False
    task = store.get(s.task_id)
    assert task is not None
    assert (task.state, task.lease_owner, task.fence) == (TaskState.RUNNING, "w2", 2)
    assert store.complete(new_claim, "real", at(102))
    task = store.get(s.task_id)
    assert task is not None and task.result == "real"


def test_an_expired_lease_is_not_valid_even_before_reclaim(store: BackendStore) -> None:
    store.submit([new("t")], T0)
    (claim,) = store.claim("w1", 1, at(10), LEASE)
    assert store.complete(claim, None, at(10) + LEASE) is False


def test_heartbeat_extends_valid_leases_in_one_call(store: BackendStore) -> None:
    store.submit([new("a"), new("b")], T0)
    claims = store.claim("w", 2, at(10), LEASE)
    renewed = store.heartbeat("w", claims, at(25), LEASE)
    assert sorted((s.task_id, s.lease_expires_at) for s in renewed) == sorted(
        (c.task_id, at(25) + LEASE) for c in claims
    )
    # Past the first lease, the heartbeat kept them alive: nothing to reclaim.
    assert store.reclaim_expired(at(10) + LEASE, no_delay) == []
    assert all(store.complete(c, None, at(41)) for c in claims)


def test_heartbeat_of_another_owner_is_refused(store: BackendStore) -> None:
    store.submit([new("a")], T0)
    claims = store.claim("w", 1, at(10), LEASE)
    assert store.heartbeat("intruder", claims, at(11), LEASE) == []


def test_check_leases_answers_like_a_heartbeat_without_renewing(store: BackendStore) -> None:
    a, b, c = store.submit([new("a"), new("b"), new("c")], T0)
    claims = store.claim("w", 3, at(10), LEASE)
    by_id = {claim.task_id: claim for claim in claims}
    assert store.request_cancel(b.task_id, at(11)) is CancelOutcome.REQUESTED
    assert store.complete(by_id[c.task_id], None, at(11))
    statuses = store.check_leases("w", claims, at(12))
    # The finished task is gone from the answer, as it would be from a heartbeat's.
    assert [(s.task_id, s.fence, s.lease_expires_at, s.cancel_requested) for s in statuses] == [
        (a.task_id, 1, at(10) + LEASE, False),
        (b.task_id, 1, at(10) + LEASE, True),
    ]
    # Nothing was renewed: the leases still end where the claim put them.
    assert store.check_leases("w", claims, at(10) + LEASE) == []
    assert store.check_leases("intruder", claims, at(12)) == []
    reclaimed = store.reclaim_expired(at(10) + LEASE, no_delay)
    assert sorted(r.task_id for r in reclaimed) == [a.task_id, b.task_id]
    (again,) = store.claim("w", 1, at(100), LEASE)
    # A claim from before the reclaim (an older fence) is no longer valid.
    assert store.check_leases("w", [by_id[again.task_id]], at(101)) == []
    assert [s.fence for s in store.check_leases("w", [again], at(101))] == [2]


def test_explicit_failure_schedules_a_later_retry(store: BackendStore) -> None:
    (s,) = store.submit([new("t", attempts=3)], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.fail(claim, ERR, at(15), at(11)) is TaskState.RETRY_WAIT
    task = store.get(s.task_id)
    assert task is not None
    assert (task.state, task.due_at, task.last_error) == (TaskState.RETRY_WAIT, at(15), ERR)
    assert store.claim("w", 1, at(14), LEASE) == []
    (again,) = store.claim("w", 1, at(15), LEASE)
    assert (again.attempt, again.fence) == (2, 2)


def test_failure_without_retry_is_final_and_keeps_the_error(store: BackendStore) -> None:
    (s,) = store.submit([new("t", attempts=1)], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.fail(claim, ERR, None, at(11)) is TaskState.FAILED
    task = store.get(s.task_id)
    assert task is not None
    assert (task.state, task.last_error, task.finished_at) == (TaskState.FAILED, ERR, at(11))


def test_cancel_pending_task_never_starts(store: BackendStore) -> None:
    (a, b) = store.submit([new("a", 12), new("b", 12)], T0)
    assert store.request_cancel(a.task_id, at(11)) is CancelOutcome.CANCELLED
    claims = store.claim("w", 5, at(20), LEASE)
    assert [c.task_id for c in claims] == [b.task_id]
    task = store.get(a.task_id)
    assert task is not None and task.state is TaskState.CANCELLED


def test_cancel_retry_wait_task(store: BackendStore) -> None:
    (s,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    store.fail(claim, ERR, at(12), at(11))
    assert store.request_cancel(s.task_id, at(11)) is CancelOutcome.CANCELLED
    assert store.claim("w", 1, at(13), LEASE) == []


def test_cancel_running_is_a_request_then_acknowledged(store: BackendStore) -> None:
    (s,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.request_cancel(s.task_id, at(11)) is CancelOutcome.REQUESTED
    (status,) = store.heartbeat("w", [claim], at(12), LEASE)
    assert status.cancel_requested
    assert store.acknowledge_cancel(claim, at(13))
    task = store.get(s.task_id)
    assert task is not None and task.state is TaskState.CANCELLED
    assert store.request_cancel(s.task_id, at(14)) is CancelOutcome.TOO_LATE


def test_acknowledging_an_unrequested_cancellation_is_refused(store: BackendStore) -> None:
    store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    with pytest.raises(InvalidTransitionError):
        store.acknowledge_cancel(claim, at(11))


def test_requested_cancellation_is_never_retried(store: BackendStore) -> None:
    (s,) = store.submit([new("t", attempts=5)], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    store.request_cancel(s.task_id, at(11))
    assert store.fail(claim, ERR, at(20), at(12)) is TaskState.FAILED


def test_cancelled_running_task_that_finishes_anyway_succeeds(store: BackendStore) -> None:
    (s,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    store.request_cancel(s.task_id, at(11))
    assert store.complete(claim, 1, at(12))
    task = store.get(s.task_id)
    assert task is not None and task.state is TaskState.SUCCEEDED


def test_cancel_unknown_id_raises(store: BackendStore) -> None:
    with pytest.raises(TaskNotFoundError):
        store.request_cancel(12345, T0)


def test_reclaim_exhausted_fails_and_requested_cancels(store: BackendStore) -> None:
    (last, cancelled) = store.submit([new("a", attempts=1), new("b", attempts=5)], T0)
    store.claim("w", 2, at(10), LEASE)
    store.request_cancel(cancelled.task_id, at(11))
    reclaimed = {r.task_id: r.state for r in store.reclaim_expired(at(100), no_delay)}
    assert reclaimed == {last.task_id: TaskState.FAILED, cancelled.task_id: TaskState.CANCELLED}
    task = store.get(last.task_id)
    assert task is not None and task.last_error is not None
    assert "lease" in task.last_error.message and task.attempts == 1


def test_reclaim_counts_the_lost_attempt_and_waits_for_the_delay(store: BackendStore) -> None:
    (s,) = store.submit([new("t", attempts=3)], T0)
    store.claim("w", 1, at(10), LEASE)
    store.reclaim_expired(at(40), no_delay)
    task = store.get(s.task_id)
    assert task is not None
    assert (task.state, task.attempts, task.due_at) == (TaskState.RETRY_WAIT, 1, at(45))
    assert store.reclaim_expired(at(40), no_delay) == []


def test_reclaim_never_overwrites_a_completion(store: BackendStore) -> None:
    (s,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    assert store.complete(claim, "done", at(39))
    assert store.reclaim_expired(at(41), no_delay) == []
    task = store.get(s.task_id)
    assert task is not None and task.state is TaskState.SUCCEEDED


def test_next_wakeup_is_next_due_time_or_lease_expiry(store: BackendStore) -> None:
    assert store.next_wakeup(T0) is None
    store.submit([new("a", 12), new("b", 20)], T0)
    assert store.next_wakeup(at(10)) == at(12)
    store.claim("w", 1, at(12), LEASE)
    assert store.next_wakeup(at(12)) == at(20)
    assert store.next_wakeup(at(20)) == at(12) + LEASE


def test_idempotent_submit_returns_the_live_task(store: BackendStore) -> None:
    (first,) = store.submit([new("t", key="k1")], T0)
    (second,) = store.submit([new("t", key="k1")], T0)
    assert first.created and not second.created
    assert second.task_id == first.task_id
    assert len(store.list_tasks()) == 1


def test_key_is_freed_by_failure_but_held_by_success(store: BackendStore) -> None:
    (a,) = store.submit([new("t", key="k", attempts=1)], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    store.fail(claim, ERR, None, at(11))
    (b,) = store.submit([new("t", key="k")], at(12))
    assert b.created and b.task_id != a.task_id
    (claim,) = store.claim("w", 1, at(12), LEASE)
    store.complete(claim, "once", at(13))
    (c,) = store.submit([new("t", key="k")], at(14))
    assert (c.task_id, c.created) == (b.task_id, False)


def test_list_tasks_filters(store: BackendStore) -> None:
    store.submit([new("a", 11), new("b", 12), new("a", 13)], T0)
    store.claim("w", 1, at(11), LEASE)
    assert [t.name for t in store.list_tasks(state=TaskState.PENDING)] == ["b", "a"]
    assert [t.due_at for t in store.list_tasks(name="a")] == [at(11), at(13)]
    assert len(store.list_tasks(limit=1)) == 1


def test_illegal_transition_is_refused_loudly(store: BackendStore, clock: ManualClock) -> None:
    (s,) = store.submit([new("t")], T0)
    (claim,) = store.claim("w", 1, at(10), LEASE)
    store.complete(claim, None, at(11))
    # A finished task can neither be retried by a stale fail nor re-cancelled.
    assert store.fail(claim, ERR, at(20), at(12)) is None
    assert store.request_cancel(s.task_id, at(12)) is CancelOutcome.TOO_LATE


def test_a_repeated_cancel_request_keeps_the_first_requests_time(store: BackendStore) -> None:
    (s,) = store.submit([new("t")], T0)
    store.claim("w", 1, at(10), LEASE)
    assert store.request_cancel(s.task_id, at(11)) is CancelOutcome.REQUESTED
    assert store.request_cancel(s.task_id, at(12)) is CancelOutcome.REQUESTED
    task = store.get(s.task_id)
    assert task is not None
    assert (task.cancel_requested_at, task.updated_at) == (at(11), at(11))
