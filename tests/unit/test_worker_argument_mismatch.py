"""Stored arguments that do not fit the task's function: FAILED once, never retried."""

from __future__ import annotations

from typing import Any

import pytest

from durablesched import (
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0


def _scheduler() -> tuple[Scheduler, list[str]]:
    calls: list[str] = []
    registry = TaskRegistry()

    @registry.task("plain")
    def plain(to: str, subject: str = "") -> None:
        calls.append(to)

    @registry.task("with_ctx", pass_context=True)
    def with_ctx(ctx: TaskContext, to: str) -> None:
        calls.append(to)

    @registry.task("open")
    def open_(to: str, **rest: Any) -> None:
        calls.append(to)

    @registry.task("positional")
    def positional(to: str, /) -> None:  # only bind can tell
        calls.append(to)

    return Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0)), calls


@pytest.mark.parametrize(
    ("name", "args", "mismatch"),
    [
        ("plain", {"to": "a", "cc": "b"}, "unexpected keyword argument 'cc'"),
        ("plain", {"subject": "s"}, "missing a required argument: 'to'"),
        ("with_ctx", {"ctx": "x", "to": "a"}, "multiple values for argument 'ctx'"),
        ("open", {}, "missing a required argument: 'to'"),
        ("positional", {"to": "a"}, "'to' parameter is positional only"),
    ],
)
def test_a_task_whose_arguments_do_not_fit_fails_after_exactly_one_attempt(
    name: str, args: dict[str, str], mismatch: str
) -> None:
    scheduler, calls = _scheduler()
    # Submitted as a process without the registry would (the API with one refuses at submit).
    task_id = Scheduler(scheduler.store, clock=scheduler.clock).submit(name, args)
    worker = Worker(scheduler, owner="w")
    assert worker.run_due() == 1
    record = scheduler.get(task_id)
    assert record.state is TaskState.FAILED
    assert record.attempts == 1
    assert record.last_error is not None
    assert record.last_error.type.endswith("TypeError")
    assert f"task {name!r} cannot take its stored arguments" in record.last_error.message
    assert mismatch in record.last_error.message
    assert calls == []  # the function never ran


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("plain", {"to": "a"}),
        ("plain", {"to": "a", "subject": "s"}),
        ("with_ctx", {"to": "a"}),
        ("open", {"to": "a", "anything": 1}),
    ],
)
def test_arguments_that_fit_run(name: str, args: dict[str, object]) -> None:
    scheduler, calls = _scheduler()
    task_id = scheduler.submit(name, args)
    assert Worker(scheduler, owner="w").run_due() == 1
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED
    assert calls == ["a"]
