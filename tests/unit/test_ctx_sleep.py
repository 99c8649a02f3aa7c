"""``ctx.sleep()``: a loop's wait that raises once the attempt should stop, and what the
worker makes of each: WorkerStopping gives the claim back at once (not counted),
TaskCancelled ends the task CANCELLED, TaskTimeout is a failure."""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta

import pytest

from durablesched import (
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskCancelled,
    TaskContext,
    TaskRegistry,
    TaskState,
    TaskTimeout,
    Worker,
    WorkerStopping,
)
from durablesched.context import _EVENT_LOCK, AttemptSignals
from durablesched.records import Claim

from ..conftest import T0, WAIT


def _looping() -> tuple[Scheduler, Worker, list[int], threading.Event]:
    steps: list[int] = []
    started = threading.Event()
    registry = TaskRegistry()

    @registry.task("loop", pass_context=True)
    def loop(ctx: TaskContext) -> int:
        for step in range(5):
            steps.append(step)
            started.set()
            ctx.sleep(30)  # raises on shutdown: no step runs after it
        return len(steps)

    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))
    return scheduler, Worker(scheduler, owner="w"), steps, started


def test_a_loop_in_ctx_sleep_stops_at_shutdown_and_its_claim_goes_back_uncounted() -> None:
    scheduler, worker, steps, started = _looping()
    task_id = scheduler.submit("loop")
    assert worker.run_once() == 1
    assert started.wait(WAIT)
    began = time.monotonic()
    assert worker.shutdown(600) == 1  # given back by the task itself, not after 600 s
    assert time.monotonic() - began < WAIT
    assert steps == [0]  # the loop did not race through its other steps
    record = scheduler.get(task_id)
    assert (record.state, record.attempts, record.lease_owner) == (TaskState.PENDING, 0, None)
    assert record.last_error is None  # not a failure


def test_a_cancel_request_wakes_ctx_sleep_and_ends_the_task_cancelled() -> None:
    scheduler, worker, steps, started = _looping()
    task_id = scheduler.submit("loop")
    assert worker.run_once() == 1
    assert started.wait(WAIT)
    scheduler.cancel(task_id)
    assert worker.wait_idle(WAIT)
    assert steps == [0]
    assert scheduler.get(task_id).state is TaskState.CANCELLED
    assert worker.stop(WAIT)


def _context() -> tuple[TaskContext, AttemptSignals]:
    claim = Claim(1, "t", {}, 1, 5, "w", 1, T0 + timedelta(seconds=30), T0, 1, "key-1")
    signals = AttemptSignals()
    scheduler = Scheduler(MemoryStore(), clock=ManualClock(T0))
    return TaskContext(claim, scheduler, signals), signals


def test_ctx_sleep_returns_when_its_time_is_up_and_raises_on_each_signal() -> None:
    ctx, signals = _context()
    ctx.sleep(0)  # nothing to wait for, nothing to raise
    ctx.sleep(-1)
    ctx.deadline = time.monotonic() - 1  # the task's timeout has passed
    with pytest.raises(TaskTimeout):
        ctx.sleep(30)
    ctx, signals = _context()
    signals.request_shutdown()
    with pytest.raises(WorkerStopping, match="given back"):
        ctx.sleep(30)
    signals.request_cancel()  # a cancel wins over the shutdown: it is recorded
    with pytest.raises(TaskCancelled):
        ctx.sleep(30)
    ctx, signals = _context()
    signals.mark_lease_lost()
    with pytest.raises(TaskCancelled):
        ctx.sleep(30)


def test_ctx_sleep_wakes_at_the_task_s_deadline_not_at_the_end_of_its_sleep() -> None:
    ctx, _signals = _context()
    ctx.deadline = time.monotonic() + 0.01
    began = time.monotonic()
    with pytest.raises(TaskTimeout):
        ctx.sleep(600)
    assert time.monotonic() - began < WAIT


def test_worker_stopping_raised_outside_a_shutdown_is_an_ordinary_failure() -> None:
    registry = TaskRegistry()

    @registry.task("confused")
    def confused() -> None:
        raise WorkerStopping("raised by hand")

    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))
    task_id = scheduler.submit("confused")
    assert Worker(scheduler, owner="w").run_due() == 1
    record = scheduler.get(task_id)
    assert record.state is TaskState.RETRY_WAIT and record.attempts == 1


class TellingCondition(threading.Condition):
    """The attempt's condition, telling the test the timeout of each wait as it begins
    (the lock held: a signal sent after it is heard)."""

    def __init__(self) -> None:
        super().__init__(_EVENT_LOCK)
        self.timeouts: list[float | None] = []
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self.waiting.set()
        return super().wait(timeout)


@pytest.mark.parametrize("how", ["wait", "sleep"])
def test_a_wait_with_no_bound_waits_until_the_attempt_should_stop(how: str) -> None:
    """``ctx.wait(math.inf)`` and ``ctx.sleep(math.inf)`` wait, as ``ctx.wait(None)`` does,
    until a signal comes (an infinite timeout once raised ``OverflowError`` at once: a
    lock's wait refuses one longer than ``threading.TIMEOUT_MAX``)."""
    ctx, signals = _context()
    changed = signals._changed = TellingCondition()
    outcome: list[object] = []

    def wait() -> None:
        try:
            if how == "wait":
                outcome.append(ctx.wait(math.inf))
            else:
                ctx.sleep(math.inf)
        except Exception as e:  # what it raised is the test's answer
            outcome.append(e)

    thread = threading.Thread(target=wait)
    thread.start()
    assert changed.waiting.wait(WAIT)
    signals.request_cancel()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert [type(o) for o in outcome] == [bool if how == "wait" else TaskCancelled]
    assert all(t is not None and t <= threading.TIMEOUT_MAX for t in changed.timeouts)
