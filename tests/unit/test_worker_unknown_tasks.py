"""A task whose name the worker's registry lacks: left alone ("skip", the default), or
claimed and failed at once, not retried ("fail")."""

from __future__ import annotations

import pytest

from durablesched import (
    AttemptOutcome,
    ConfigurationError,
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0


def _scheduler() -> tuple[Scheduler, list[int]]:
    ran: list[int] = []
    registry = TaskRegistry()

    @registry.task("known")
    def known(n: int) -> int:
        ran.append(n)
        return n

    return Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0)), ran


def _submit_unknown(scheduler: Scheduler) -> int:
    # As a program without this worker's registry would (one with it refuses the name).
    return Scheduler(scheduler.store, clock=scheduler.clock).submit(
        "gone.task", {"n": 1}, max_attempts=5
    )


def test_by_default_a_worker_leaves_a_name_it_lacks_for_another_worker() -> None:
    scheduler, ran = _scheduler()
    unknown = _submit_unknown(scheduler)
    known = scheduler.submit("known", {"n": 2})
    assert Worker(scheduler, owner="w").run_due() == 1
    assert scheduler.get(unknown).state is TaskState.PENDING
    assert scheduler.get(known).state is TaskState.SUCCEEDED and ran == [2]


def test_told_to_fail_them_a_worker_fails_the_task_at_once_without_retry() -> None:
    scheduler, ran = _scheduler()
    unknown = _submit_unknown(scheduler)
    known = scheduler.submit("known", {"n": 2})
    assert Worker(scheduler, owner="w", unknown_tasks="fail").run_due() == 2
    record = scheduler.get(unknown)
    assert (record.state, record.attempts) == (TaskState.FAILED, 1)
    assert record.last_error is not None
    assert record.last_error.type == "durablesched.UnknownTaskNameError"
    assert "'gone.task'" in record.last_error.message and "failed without running" in (
        record.last_error.message
    )
    (attempt,) = scheduler.attempts(unknown)
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.FAILED, record.last_error)
    assert scheduler.get(known).state is TaskState.SUCCEEDED and ran == [2]


def test_a_bad_policy_is_refused() -> None:
    scheduler, _ = _scheduler()
    with pytest.raises(ConfigurationError, match="unknown_tasks must be 'skip' or 'fail'"):
        Worker(scheduler, unknown_tasks="explode")
