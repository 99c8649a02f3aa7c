"""One pass of a worker at a time the test chooses: ``run_once(now)``, with no loop running."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

import pytest

from durablesched import (
    Claim,
    ConfigurationError,
    ManualClock,
    MemoryStore,
    RetryPolicy,
    Scheduler,
    StoreError,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import LeaseStatus

from ..conftest import T0, WAIT, at

NO_JITTER = RetryPolicy(max_attempts=3, initial=timedelta(seconds=5), jitter=0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def scheduler(clock: ManualClock) -> Scheduler:
    registry = TaskRegistry()
    registry.task("job", retry=NO_JITTER)(lambda: None)
    return Scheduler(MemoryStore(), registry=registry, clock=clock)


@pytest.fixture
def worker(scheduler: Scheduler) -> Iterator[Worker]:
    w = Worker(scheduler, concurrency=2, lease=30, owner="w")
    yield w
    assert w.stop(WAIT)


def test_a_pass_claims_what_is_due_at_its_time_and_nothing_later(
    scheduler: Scheduler, clock: ManualClock, worker: Worker
) -> None:
    due = scheduler.submit("job")
    later = scheduler.submit("job", delay=60)  # due at time 70
    assert worker.run_once(clock.now()) == 1
    assert worker.wait_idle(WAIT)
    assert scheduler.get(due).state is TaskState.SUCCEEDED
    assert scheduler.get(later).state is TaskState.PENDING
    clock.set(at(70))
    assert worker.run_once(at(69)) == 0  # the pass's time counts, not the clock's
    assert scheduler.get(later).state is TaskState.PENDING
    assert worker.run_once(at(70)) == 1
    assert worker.wait_idle(WAIT)
    assert scheduler.get(later).state is TaskState.SUCCEEDED


def test_a_pass_past_another_owners_lease_reclaims_it(
    scheduler: Scheduler, clock: ManualClock, worker: Worker
) -> None:
    task_id = scheduler.submit("job")
    (claim,) = scheduler.store.claim("other", 1, clock.now(), timedelta(seconds=30))
    assert claim.task_id == task_id  # its lease expires at time 40
    assert worker.run_once(at(39)) == 0
    assert scheduler.get(task_id).state is TaskState.RUNNING
    assert worker.run_once(at(41)) == 0  # reclaimed, due again 5 s later
    task = scheduler.get(task_id)
    assert (task.state, task.due_at, task.lease_owner) == (TaskState.RETRY_WAIT, at(46), None)
    assert task.last_error is not None and task.last_error.type.endswith("LeaseExpired")
    clock.set(at(46))
    assert worker.run_once(at(46)) == 1
    assert worker.wait_idle(WAIT)
    task = scheduler.get(task_id)
    assert (task.state, task.attempts) == (TaskState.SUCCEEDED, 2)


def test_a_heartbeat_that_failed_is_tried_again_on_the_next_pass(clock: ManualClock) -> None:
    """Not an interval later: while a busy database refuses heartbeats the leases
    run down, and the first pass after it frees must renew them."""
    release = threading.Event()
    registry = TaskRegistry()
    registry.task("hold")(lambda: release.wait(WAIT))
    store = RefusingHeartbeats()
    scheduler = Scheduler(store, registry=registry, clock=clock)
    worker = Worker(scheduler, lease=30, owner="w")  # heartbeats every 10 s
    scheduler.submit("hold")
    try:
        assert worker.run_once(clock.now()) == 1
        assert worker.wait_running(1, WAIT)
        store.refuse = True
        with pytest.raises(StoreError):
            worker.run_once(clock.now() + timedelta(seconds=10))
        store.refuse = False
        worker.run_once(clock.now() + timedelta(seconds=11))
        assert store.renewed == [clock.now() + timedelta(seconds=11)]
    finally:
        release.set()
        assert worker.stop(WAIT)


class RefusingHeartbeats(MemoryStore):
    """Heartbeats fail while ``refuse`` is set; the ones that pass are noted."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = False
        self.renewed: list[datetime] = []

    def heartbeat(
        self, owner: str, claims: Sequence[Claim], now: datetime, lease: timedelta
    ) -> list[LeaseStatus]:
        if self.refuse:
            raise StoreError("renewing leases failed: database is locked")
        self.renewed.append(now)
        return super().heartbeat(owner, claims, now, lease)


def test_a_worker_with_queues_fills_each_queue_s_slots_and_no_more(clock: ManualClock) -> None:
    """A full queue never blocks another's claims; each queue gets its own slots."""
    release = threading.Event()
    registry = TaskRegistry()
    registry.task("hold")(lambda: release.wait(WAIT))
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    busy = [scheduler.submit("hold", queue="busy") for _ in range(3)]
    quiet = scheduler.submit("hold", queue="quiet")
    elsewhere = scheduler.submit("hold", queue="unserved")
    worker = Worker(scheduler, owner="w", queues={"busy": 1, "quiet": 2})
    assert worker.concurrency == 3
    try:
        assert worker.run_once(clock.now()) == 2
        assert worker.wait_running(2, WAIT)
        assert worker.run_once(clock.now()) == 0  # busy is full, quiet has nothing more
        states = {i: scheduler.get(i).state for i in (*busy, quiet, elsewhere)}
        assert states == {
            busy[0]: TaskState.RUNNING,
            busy[1]: TaskState.PENDING,
            busy[2]: TaskState.PENDING,
            quiet: TaskState.RUNNING,
            elsewhere: TaskState.PENDING,
        }
        late = scheduler.submit("hold", queue="quiet")
        assert worker.run_once(clock.now()) == 1  # quiet's second slot
        assert scheduler.get(late).state is TaskState.RUNNING
    finally:
        release.set()
        assert worker.stop(WAIT)


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({}, "queues must map queue names to slots"),
        ({"a b": 1}, "letters, digits"),
        ({"a": 0}, "needs from 1 to 10000 slots"),
        ({"a": True}, "needs from 1 to 10000 slots"),
    ],
)
def test_bad_worker_queues_are_configuration_errors(
    scheduler: Scheduler, queues: dict[str, int], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Worker(scheduler, queues=queues)
