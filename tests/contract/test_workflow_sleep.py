"""Durable sleep on every backend (docs/workflows.md): ``ctx.sleep_until`` /
``ctx.sleep_for`` record the wake time as a step, end the attempt uncounted
(``Store.suspend``: PENDING due at the wake time, lease and slot given up), and the
attempt claimed at the wake time replays past the sleep. Timing under a manual clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablesched import (
    InvalidTaskError,
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import NewTask
from durablesched.testing import run_until_complete

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
DAYS = timedelta(days=3)


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


def test_suspend_ends_the_attempt_uncounted_and_due_at_the_wake_time(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    wake = at(11) + DAYS
    assert store.suspend(claim, wake, at(12), detail="sleeping") is TaskState.PENDING
    record = store.get(claim.task_id)
    assert record is not None
    assert (record.state, record.due_at, record.attempts, record.lease_owner) == (
        TaskState.PENDING,
        wake,
        0,
        None,
    )
    assert store.history(claim.task_id)[-1].detail == "sleeping"
    assert store.claim("w", 1, wake - timedelta(seconds=1), LEASE) == []
    (again,) = store.claim("w", 1, wake, LEASE)
    assert again.attempt == 1
    assert store.suspend(claim, wake, wake, detail="zombie") is None  # the old claim's fence


def test_suspend_by_a_lost_claim_writes_nothing(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    before = store.history(claim.task_id)
    assert store.suspend(claim, at(100), at(41), detail="late") is None  # lease expired
    assert store.history(claim.task_id) == before


def test_suspending_a_task_asked_to_stop_cancels_it(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    store.request_cancel(claim.task_id, at(12))
    assert store.suspend(claim, at(100), at(13), detail="sleeping") is TaskState.CANCELLED
    record = store.get(claim.task_id)
    assert record is not None and record.state is TaskState.CANCELLED


def test_a_workflow_sleeps_three_days_holding_nothing_and_goes_on_past_the_sleep(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    calls: list[str] = []

    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> str:
        ctx.step("before", lambda: calls.append("before"))
        ctx.sleep_for(DAYS)
        ctx.step("after", lambda: calls.append("after"))
        return "done"

    task_id = scheduler.submit("wf")
    worker = Worker(scheduler, owner="w")
    assert worker.run_due() == 1
    record = scheduler.get(task_id)
    wake = T0 + DAYS
    assert (record.state, record.due_at, record.attempts) == (TaskState.PENDING, wake, 0)
    assert "sleeping until" in (scheduler.store.history(task_id)[-1].detail or "")
    assert worker.active_count == 0  # no slot held
    clock.set(wake - timedelta(seconds=1))
    assert worker.run_due() == 0  # not a second early
    clock.set(wake)
    assert worker.run_due() == 1
    record = scheduler.get(task_id)
    assert (record.state, record.attempts, record.result) == (TaskState.SUCCEEDED, 1, "done")
    assert calls == ["before", "after"]
    assert [s.name for s in scheduler.store.steps(task_id)] == ["before", "sleep", "after"]


def test_a_replay_keeps_the_wake_time_first_set(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    """A retry of a workflow that crashed after its sleep was recorded sleeps only to the
    recorded time, not a fresh ``now() + delay``."""
    crashes = [1]

    @registry.task("wf", pass_context=True, retry=RetryPolicy(initial=timedelta(0), jitter=0))
    def wf(ctx: TaskContext) -> None:
        ctx.sleep_for(timedelta(hours=1))
        if crashes:
            crashes.pop()
            raise RuntimeError("crash after the sleep")

    task_id = scheduler.submit("wf")
    run_until_complete(scheduler, clock)
    record = scheduler.get(task_id)
    assert (record.state, record.attempts) == (TaskState.SUCCEEDED, 2)
    assert clock.now() == T0 + timedelta(hours=1)  # slept once, to the recorded time


def test_a_wake_time_already_past_goes_on_at_once(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> int:
        ctx.sleep_until(T0 - timedelta(seconds=1))
        ctx.sleep_for(timedelta(0))
        return 1

    task_id = scheduler.submit("wf")
    assert Worker(scheduler, owner="w").run_due() == 1
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED


def test_the_in_attempt_sleep_refuses_a_timedelta_and_names_the_durable_ones(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("wf", pass_context=True, retry=RetryPolicy(max_attempts=1))
    def wf(ctx: TaskContext) -> None:
        ctx.sleep(timedelta(days=1))  # type: ignore[arg-type]

    task_id = scheduler.submit("wf")
    Worker(scheduler, owner="w").run_due()
    record = scheduler.get(task_id)
    assert record.state is TaskState.FAILED and record.last_error is not None
    assert "sleep_for" in record.last_error.message


def test_a_naive_wake_time_is_refused(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, store: BackendStore
) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    with pytest.raises(InvalidTaskError, match="timezone-aware"):
        TaskContext(claim, scheduler).sleep_until(T0.replace(tzinfo=None))
