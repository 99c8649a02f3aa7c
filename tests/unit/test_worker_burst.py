"""``run(burst=True)``: a burst worker waits for what becomes runnable within ``burst_wait``.

Time comes from a manual clock that the test advances only while the worker
is idle (no task running here, the loop waiting for a time ahead), so nothing
sleeps and no task's timing depends on the test's.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from durablesched import (
    ConfigurationError,
    ManualClock,
    MemoryStore,
    RetryPolicy,
    Scheduler,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import Reclaimed
from durablesched.store.protocol import RetryDelay

from ..conftest import T0, WAIT


class IdleClock(ManualClock):
    """Counts the waits for a time ahead that begin while ``worker`` runs no task."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.idle = threading.Condition()
        self.idle_waits = 0
        self.worker: Worker | None = None

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        if (until is None or until > self.now()) and self.worker and not self.worker.active_count:
            with self.idle:
                self.idle_waits += 1
                self.idle.notify_all()
        return super().wait(event, until, max_wait)


class BurstRun:
    """``worker.run(burst=True, burst_wait=...)`` in a thread; ``drive`` advances the
    clock by ``step`` each time the worker waits idle, until the run returns."""

    def __init__(self, worker: Worker, clock: IdleClock, burst_wait: float) -> None:
        self.clock = clock
        self.done = threading.Event()
        self.raised: list[BaseException] = []
        clock.worker = worker

        def run() -> None:
            try:
                worker.run(burst=True, burst_wait=burst_wait)
            except BaseException as e:
                self.raised.append(e)
            finally:
                self.done.set()
                with clock.idle:
                    clock.idle.notify_all()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def _moved(self) -> bool:
        return self.done.is_set() or self.clock.idle_waits > self.seen

    def drive(self, step: float, most: int = 100) -> timedelta:
        """Advance until the run returns; how far the clock moved."""
        start = self.clock.now()
        self.seen = 0
        for _ in range(most):
            with self.clock.idle:
                assert self.clock.idle.wait_for(self._moved, WAIT), (
                    "the worker neither waited nor returned"
                )
                self.seen = self.clock.idle_waits
            if self.done.is_set():
                self.thread.join(WAIT)
                assert not self.raised, self.raised
                return self.clock.now() - start
            self.clock.advance(step)
        raise AssertionError(f"the burst run did not return within {most} steps")


def failing_once() -> tuple[TaskRegistry, list[int]]:
    """A task that fails its first attempt, retried 2 s later (no jitter)."""
    registry = TaskRegistry()
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")

    registry.register(
        flaky, name="flaky", retry=RetryPolicy(initial=timedelta(seconds=2), jitter=0)
    )
    return registry, calls


@pytest.mark.parametrize(("burst_wait", "final"), [(5, TaskState.SUCCEEDED), (1, None)])
def test_a_burst_waits_for_a_retry_due_within_burst_wait(
    burst_wait: float, final: TaskState | None
) -> None:
    clock = IdleClock(T0)
    registry, calls = failing_once()
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    task_id = scheduler.submit("flaky")
    worker = Worker(scheduler, owner="w")
    moved = BurstRun(worker, clock, burst_wait).drive(step=0.5)
    task = scheduler.get(task_id)
    if final is TaskState.SUCCEEDED:
        assert (task.state, len(calls), task.attempts) == (TaskState.SUCCEEDED, 2, 2)
        assert timedelta(seconds=2) <= moved <= timedelta(seconds=3)
    else:
        # The retry is due 2 s after the failure: later than burst_wait, so it is left.
        assert (task.state, len(calls)) == (TaskState.RETRY_WAIT, 1)
        assert task.due_at == T0 + timedelta(seconds=2)
        assert moved == timedelta(0)


def test_a_burst_reclaims_and_runs_a_task_whose_lease_lapses_within_burst_wait() -> None:
    clock = IdleClock(T0)
    registry = TaskRegistry()
    ran = threading.Event()
    registry.register(
        ran.set, name="job", retry=RetryPolicy(initial=timedelta(seconds=0.5), jitter=0)
    )
    store = MemoryStore()
    scheduler = Scheduler(store, registry=registry, clock=clock)
    task_id = scheduler.submit("job")
    # Claimed by a worker that died: its lease lapses 3 s from now.
    (dead,) = store.claim("dead", 1, T0, timedelta(seconds=3))
    assert dead.task_id == task_id
    worker = Worker(scheduler, owner="w")
    moved = BurstRun(worker, clock, 5).drive(step=0.5)
    assert ran.is_set()
    task = scheduler.get(task_id)
    assert (task.state, task.attempts) == (TaskState.SUCCEEDED, 2)
    assert any("lease of dead expired" in (e.detail or "") for e in scheduler.history(task_id))
    assert timedelta(seconds=3) <= moved <= timedelta(seconds=5)


def test_a_burst_leaves_a_task_whose_lease_lasts_longer_than_burst_wait() -> None:
    clock = IdleClock(T0)
    registry = TaskRegistry()
    registry.register(lambda: None, name="job")
    store = MemoryStore()
    scheduler = Scheduler(store, registry=registry, clock=clock)
    task_id = scheduler.submit("job")
    store.claim("alive", 1, T0, timedelta(seconds=30))
    worker = Worker(scheduler, owner="w")
    assert BurstRun(worker, clock, 5).drive(step=0.5) == timedelta(0)
    assert scheduler.get(task_id).state is TaskState.RUNNING


def test_burst_wait_must_be_finite_and_not_negative() -> None:
    registry = TaskRegistry()
    worker = Worker(Scheduler(MemoryStore(), registry=registry), owner="w")
    for bad in (-1, float("inf"), float("nan"), "5"):
        with pytest.raises(ConfigurationError, match="burst_wait"):
            worker.run(burst=True, burst_wait=bad)  # type: ignore[arg-type]


def test_a_burst_runs_a_reclaimed_task_whose_retry_fell_due_while_the_pass_went_on() -> None:
    """The pass that reclaims claims at its own start time, before the retry is due; if
    the pass then takes longer than the retry delay (a loaded machine), the retry is due
    by the time the loop looks for what comes next. It must count as claimable, not be
    missed as neither due later nor running (CI saw a burst leave it behind)."""
    clock = IdleClock(T0)

    class SlowPassStore(MemoryStore):
        def reclaim_expired(self, now: datetime, retry_delay: RetryDelay) -> list[Reclaimed]:
            reclaimed = super().reclaim_expired(now, retry_delay)
            if reclaimed:
                clock.advance(1.0)  # the rest of the pass outlasts the 0.5 s retry delay
            return reclaimed

    registry = TaskRegistry()
    ran = threading.Event()
    registry.register(
        ran.set, name="job", retry=RetryPolicy(initial=timedelta(seconds=0.5), jitter=0)
    )
    store = SlowPassStore()
    scheduler = Scheduler(store, registry=registry, clock=clock)
    task_id = scheduler.submit("job")
    store.claim("dead", 1, T0, timedelta(seconds=3))
    worker = Worker(scheduler, owner="w")
    BurstRun(worker, clock, 5).drive(step=0.5)
    assert ran.is_set()
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED
