"""A task that raises SystemExit or KeyboardInterrupt (``sys.exit()`` in a task, say): the
attempt fails and is retried per the task's policy; the worker carries on."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest

from durablesched import (
    AttemptOutcome,
    ManualClock,
    MemoryStore,
    RetryPolicy,
    Scheduler,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0

RETRY = RetryPolicy(max_attempts=2, initial=timedelta(seconds=1), jitter=0)


def _scheduler(environment: str) -> Scheduler:
    registry = TaskRegistry()

    @registry.task("exits", retry=RETRY, environment=environment)
    def exits(code: int) -> None:
        sys.exit(code)

    @registry.task("interrupted", retry=RETRY, environment=environment)
    def interrupted() -> None:
        raise KeyboardInterrupt

    @registry.task("async_exits", retry=RETRY, environment=environment)
    async def async_exits() -> None:
        raise SystemExit(4)

    @registry.task("async_ok", environment=environment)
    async def async_ok() -> str:
        return "still running"

    @registry.task("ok", environment=environment)
    def ok() -> str:
        return "fine"

    return Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))


@pytest.mark.parametrize("environment", ["thread", "process"])
@pytest.mark.parametrize(
    ("name", "args", "error"),
    [
        ("exits", {"code": 3}, "builtins.SystemExit"),
        ("interrupted", {}, "builtins.KeyboardInterrupt"),
        ("async_exits", {}, "builtins.SystemExit"),
    ],
)
def test_the_attempt_fails_is_retried_and_the_worker_goes_on(
    environment: str, name: str, args: dict[str, int], error: str
) -> None:
    scheduler = _scheduler(environment)
    assert isinstance(scheduler.clock, ManualClock)
    task_id = scheduler.submit(name, args)
    worker = Worker(scheduler, owner="w")
    assert worker.run_due() == 1
    record = scheduler.get(task_id)
    assert record.state is TaskState.RETRY_WAIT
    assert record.last_error is not None and record.last_error.type == error
    scheduler.clock.advance(timedelta(seconds=2))
    assert worker.run_due() == 1
    assert scheduler.get(task_id).state is TaskState.FAILED
    assert [(a.outcome, a.error and a.error.type) for a in scheduler.attempts(task_id)] == [
        (AttemptOutcome.FAILED, error)
    ] * 2
    # The same worker still runs tasks, async ones included (its event loop lives).
    later = [scheduler.submit("ok"), scheduler.submit("async_ok")]
    assert worker.run_due() == 2
    assert [scheduler.get(i).result for i in later] == ["fine", "still running"]
