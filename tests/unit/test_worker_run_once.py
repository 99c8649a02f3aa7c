"""One pass of a worker at a time the test chooses: ``run_once(now)``, with no loop running."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from durablesched import (
    ManualClock,
    MemoryStore,
    RetryPolicy,
    Scheduler,
    TaskRegistry,
    TaskState,
    Worker,
)

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
