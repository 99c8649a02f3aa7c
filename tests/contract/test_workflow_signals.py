"""Signals on every backend (docs/workflows.md): ``scheduler.signal`` keeps a signal
until a ``ctx.wait_for_signal`` takes it, each signal taken by one wait, a replay
returning the recorded payload; a suspended wait is woken by its signal (no polling) or
its timeout, under a manual clock."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from durablesched import (
    InvalidTaskError,
    InvalidTransitionError,
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskNotFoundError,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import NewTask
from durablesched.testing import run_until_complete
from durablesched.workflows.steps import FOREVER

from ..conftest import T0, WAIT, BackendStore, at

LEASE = timedelta(seconds=30)
NOW_RETRY = RetryPolicy(max_attempts=3, initial=timedelta(0), jitter=0)


# -- the store -----------------------------------------------------------------------------------


def test_a_signal_is_kept_and_each_is_taken_by_one_wait_oldest_first(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    first = store.send_signal(claim.task_id, "approved", {"by": "ada"}, at(12))
    second = store.send_signal(claim.task_id, "approved", {"by": "bob"}, at(13))
    store.send_signal(claim.task_id, "other", 1, at(13))
    assert first < second
    assert store.receive_signal(claim, 0, "signal:approved", "approved", at(14)) == (
        True,
        {"by": "ada"},
    )
    assert store.receive_signal(claim, 1, "signal:approved", "approved", at(14)) == (
        True,
        {"by": "bob"},
    )
    assert store.receive_signal(claim, 2, "signal:approved", "approved", at(14)) == (False, None)
    sent = store.signals(claim.task_id)
    assert [(s.name, s.payload, s.consumed_position) for s in sent] == [
        ("approved", {"by": "ada"}, 0),
        ("approved", {"by": "bob"}, 1),
        ("other", 1, None),
    ]
    assert [(s.position, s.name, s.result) for s in store.steps(claim.task_id)] == [
        (0, "signal:approved", {"payload": {"by": "ada"}}),
        (1, "signal:approved", {"payload": {"by": "bob"}}),
    ]


def test_a_lost_claim_or_a_recorded_position_takes_no_signal(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    store.send_signal(claim.task_id, "go", None, at(12))
    assert store.record_step(claim, 0, "x", 1, at(12))
    assert store.receive_signal(claim, 0, "signal:go", "go", at(13)) is None
    assert store.receive_signal(claim, 1, "signal:go", "go", at(41)) is None  # lease expired
    assert store.signals(claim.task_id)[0].consumed_position is None


def test_a_signal_to_an_unknown_or_finished_task_is_refused(store: BackendStore) -> None:
    with pytest.raises(TaskNotFoundError):
        store.send_signal(10_000, "go", None, at(12))
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.complete(claim, None, at(12))
    with pytest.raises(InvalidTransitionError, match="finished"):
        store.send_signal(claim.task_id, "go", None, at(13))
    assert store.signals(claim.task_id) == []


def test_a_signal_wakes_only_a_workflow_suspended_waiting_for_it(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.suspend(claim, FOREVER, at(12), detail="waiting", signal="go") is (
        TaskState.PENDING
    )
    store.send_signal(claim.task_id, "other", None, at(13))
    record = store.get(claim.task_id)
    assert record is not None and record.due_at == FOREVER
    store.send_signal(claim.task_id, "go", None, at(14))
    record = store.get(claim.task_id)
    assert record is not None and (record.due_at, record.state) == (at(14), TaskState.PENDING)
    (again,) = store.claim("w", 1, at(14), LEASE)
    assert again.attempt == 1


def test_a_signal_sent_while_the_wait_was_suspending_is_not_lost(store: BackendStore) -> None:
    """Sent after the attempt found none and before it suspended: the suspension makes
    the task due at once instead of at its deadline."""
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.receive_signal(claim, 0, "signal:go", "go", at(12)) == (False, None)
    store.send_signal(claim.task_id, "go", "late", at(12))  # RUNNING: nothing to wake
    store.suspend(claim, FOREVER, at(13), detail="waiting", signal="go")
    record = store.get(claim.task_id)
    assert record is not None and record.due_at == at(13)


# -- wait_for_signal on a worker -----------------------------------------------------------------


def test_a_waiting_workflow_holds_no_slot_and_its_signal_resumes_it(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("approve", pass_context=True)
    def approve(ctx: TaskContext) -> object:
        return ctx.wait_for_signal("approved", timeout=timedelta(hours=48))

    task_id = scheduler.submit("approve")
    worker = Worker(scheduler, owner="w")
    assert worker.run_due() == 1
    record = scheduler.get(task_id)
    assert (record.state, record.due_at, record.attempts) == (
        TaskState.PENDING,
        T0 + timedelta(hours=48),
        0,
    )
    assert "waiting for signal 'approved'" in (scheduler.history(task_id)[-1].detail or "")
    assert worker.active_count == 0
    clock.advance(60)
    scheduler.signal(task_id, "approved", {"by": "ada"})
    assert scheduler.get(task_id).due_at == clock.now()  # woken by the signal itself
    assert worker.run_due() == 1
    record = scheduler.get(task_id)
    assert (record.state, record.result, record.attempts) == (
        TaskState.SUCCEEDED,
        {"by": "ada"},
        1,
    )


def test_a_signal_sent_before_the_wait_is_kept_for_it(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> object:
        return ctx.wait_for_signal("go")

    task_id = scheduler.submit("wf")
    scheduler.signal(task_id, "go", [1, 2])
    assert Worker(scheduler, owner="w").run_due() == 1
    assert scheduler.get(task_id).result == [1, 2]


def test_a_replay_returns_the_recorded_payload_and_takes_no_second_signal(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    crashes = [1]

    @registry.task("wf", pass_context=True, retry=NOW_RETRY)
    def wf(ctx: TaskContext) -> object:
        got = ctx.wait_for_signal("go")
        if crashes:
            crashes.pop()
            raise RuntimeError("crash after the wait")
        return got

    task_id = scheduler.submit("wf")
    scheduler.signal(task_id, "go", "first")
    scheduler.signal(task_id, "go", "second")
    run_until_complete(scheduler, clock)
    record = scheduler.get(task_id)
    assert (record.state, record.result, record.attempts) == (TaskState.SUCCEEDED, "first", 2)
    taken = [s.consumed_position for s in scheduler.store.signals(task_id)]
    assert taken == [1, None]  # the second is still there for a later wait


def test_a_wait_times_out_with_none_and_leaves_a_later_signal_alone(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> object:
        return {"got": ctx.wait_for_signal("go", timeout=timedelta(minutes=5))}

    task_id = scheduler.submit("wf")
    worker = Worker(scheduler, owner="w")
    assert worker.run_due() == 1
    clock.advance(timedelta(minutes=5) - timedelta(seconds=1))
    assert worker.run_due() == 0
    clock.advance(1)
    assert worker.run_due() == 1
    assert scheduler.get(task_id).result == {"got": None}
    assert scheduler.store.steps(task_id)[-1].result == {"timeout": True}


def test_signal_refuses_an_empty_name_and_an_unstorable_payload(scheduler: Scheduler) -> None:
    (submitted,) = scheduler.store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    with pytest.raises(InvalidTaskError, match="non-empty"):
        scheduler.signal(submitted.task_id, "", None)
    with pytest.raises(InvalidTaskError):
        scheduler.signal(submitted.task_id, "go", object())
    assert scheduler.store.signals(submitted.task_id) == []


def test_run_until_complete_leaves_a_wait_with_no_timeout_waiting(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    """Due at the far end of time (``FOREVER``), a wait with no timeout is nothing to run:
    ``run_until_complete`` returns with it PENDING, and does not move the clock to 9999
    to resume it over and over (each resumption suspends again, uncounted)."""

    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> object:
        return ctx.wait_for_signal("go")

    task_id = scheduler.submit("wf")
    ran: list[int] = []
    # On a thread with a bounded join: without the guard the clock reaches 9999 and
    # run_due claims the re-suspended task (due "now") again and again, forever.
    runner = threading.Thread(
        target=lambda: ran.append(run_until_complete(scheduler, clock, max_runs=20)),
        daemon=True,
    )
    runner.start()
    runner.join(WAIT)
    assert ran == [1], "run_until_complete did not return"
    record = scheduler.get(task_id)
    assert (record.state, record.due_at, clock.now()) == (TaskState.PENDING, FOREVER, T0)
    scheduler.signal(task_id, "go", "now")
    assert run_until_complete(scheduler, clock, max_runs=20) == 1
    assert scheduler.get(task_id).result == "now"
