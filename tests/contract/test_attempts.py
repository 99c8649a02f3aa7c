"""Attempts (``Scheduler.attempts``), read from the history every backend writes, and the
error each failed attempt left on its history line."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablesched import (
    AttemptInfo,
    AttemptOutcome,
    ErrorInfo,
    LeaseExpired,
    Scheduler,
    TaskNotFoundError,
    TaskState,
)
from durablesched.records import NewTask

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
BOOM = ErrorInfo("builtins.RuntimeError", "boom", "Traceback (most recent call last): boom")
BANG = ErrorInfo("builtins.ValueError", "bang", "Traceback (most recent call last): bang")


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


def test_each_attempt_has_its_worker_times_outcome_and_error(
    store: BackendStore, scheduler: Scheduler
) -> None:
    (s,) = store.submit([NewTask("t", {}, at(10), 5)], T0)
    (first,) = store.claim("w1", 1, at(10), LEASE)
    assert store.fail(first, BOOM, at(12), at(11)) is TaskState.RETRY_WAIT
    (second,) = store.claim("w2", 1, at(12), LEASE)
    assert store.release([second], at(13)) == 1  # given back: not counted
    (third,) = store.claim("w3", 1, at(14), LEASE)
    assert store.fail(third, BANG, at(16), at(15)) is TaskState.RETRY_WAIT
    (fourth,) = store.claim("w1", 1, at(16), LEASE)
    assert scheduler.attempts(s.task_id)[-1] == AttemptInfo(
        s.task_id, 3, at(16), "w1", None, None, None
    )
    assert store.complete(fourth, "ok", at(17))
    assert scheduler.attempts(s.task_id) == [
        AttemptInfo(s.task_id, 1, at(10), "w1", at(11), AttemptOutcome.FAILED, BOOM),
        AttemptInfo(s.task_id, 2, at(12), "w2", at(13), AttemptOutcome.RELEASED, None),
        AttemptInfo(s.task_id, 2, at(14), "w3", at(15), AttemptOutcome.FAILED, BANG),
        AttemptInfo(s.task_id, 3, at(16), "w1", at(17), AttemptOutcome.SUCCEEDED, None),
    ]


def test_a_final_failure_and_a_lost_lease_carry_their_errors(
    store: BackendStore, scheduler: Scheduler
) -> None:
    (once, lost) = store.submit([NewTask("a", {}, at(10), 1), NewTask("b", {}, at(10), 2)], T0)
    claims = {c.task_id: c for c in store.claim("w", 2, at(10), LEASE)}
    assert store.fail(claims[once.task_id], BOOM, None, at(11)) is TaskState.FAILED
    (failed,) = scheduler.attempts(once.task_id)
    assert (failed.outcome, failed.error, failed.finished_at) == (
        AttemptOutcome.FAILED,
        BOOM,
        at(11),
    )
    store.reclaim_expired(at(50), no_delay)
    (expired,) = scheduler.attempts(lost.task_id)
    assert expired.outcome is AttemptOutcome.FAILED and expired.error is not None
    assert expired.error.type == f"durablesched.{LeaseExpired.__name__}"
    assert "lease of w expired" in expired.error.message
    assert expired.error.message == store.history(lost.task_id)[-1].detail


def test_a_cancelled_attempt_has_no_error(store: BackendStore, scheduler: Scheduler) -> None:
    (s, t) = store.submit([NewTask("a", {}, at(10), 3), NewTask("b", {}, at(10), 3)], T0)
    claims = {c.task_id: c for c in store.claim("w", 2, at(10), LEASE)}
    store.request_cancel(s.task_id, at(11))
    store.request_cancel(t.task_id, at(11))
    assert store.acknowledge_cancel(claims[s.task_id], at(12))
    store.reclaim_expired(at(50), no_delay)  # t's lease lapses after the request
    for task_id in (s.task_id, t.task_id):
        (attempt,) = scheduler.attempts(task_id)
        assert (attempt.outcome, attempt.error) == (AttemptOutcome.CANCELLED, None)


def test_a_task_never_claimed_has_no_attempts_and_an_unknown_one_is_an_error(
    store: BackendStore, scheduler: Scheduler
) -> None:
    (s,) = store.submit([NewTask("t", {}, at(10), 3)], T0)
    assert scheduler.attempts(s.task_id) == []
    with pytest.raises(TaskNotFoundError):
        scheduler.attempts(s.task_id + 1000)
    with pytest.raises(TaskNotFoundError):
        scheduler.attempts(2**70)
