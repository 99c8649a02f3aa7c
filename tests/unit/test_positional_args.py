"""Positional arguments beside keyword ones: checked at submit, stored as JSON (under
``"*args"``), and passed in order by the worker, wherever the attempt runs."""

from __future__ import annotations

from typing import Any

import pytest

from durablesched import (
    InvalidTaskArgumentsError,
    InvalidTaskError,
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0


def _scheduler(environment: str = "thread") -> Scheduler:
    registry = TaskRegistry()

    @registry.task("join", environment=environment)
    def join(a: str, b: str, /, *rest: str, sep: str = "-") -> str:
        return sep.join([a, b, *rest])

    @registry.task("with_ctx", pass_context=True, environment=environment)
    def with_ctx(ctx: TaskContext, n: int, m: int = 0) -> list[int]:
        return [ctx.attempt, n, m]

    @registry.task("async_add", environment=environment)
    async def async_add(a: int, b: int) -> int:
        return a + b

    @registry.task("parent", pass_context=True)
    def parent(ctx: TaskContext) -> None:
        ctx.submit("join", {"sep": "+"}, positional=["x", "y"])

    return Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))


@pytest.mark.parametrize("environment", ["thread", "process"])
def test_the_worker_passes_them_in_order_before_the_keywords(environment: str) -> None:
    scheduler = _scheduler(environment)
    ids = [
        scheduler.submit("join", {"sep": "/"}, positional=("a", "b", "c")),
        scheduler.submit("join", positional=["a", "b"]),
        scheduler.submit("with_ctx", {"m": 2}, positional=[7]),
        scheduler.submit("async_add", positional=[40, 2]),
    ]
    assert Worker(scheduler, owner="w").run_due() == 4
    assert [scheduler.get(i).result for i in ids] == ["a/b/c", "a-b", [1, 7, 2], 42]


def test_they_are_stored_as_json_under_a_key_no_keyword_can_have() -> None:
    scheduler = _scheduler()
    task_id = scheduler.submit("join", {"sep": "/"}, positional=("a", "b"))
    assert scheduler.get(task_id).args == {"*args": ["a", "b"], "sep": "/"}
    plain = scheduler.submit("with_ctx", {"n": 1}, positional=[])
    assert scheduler.get(plain).args == {"n": 1}  # none: nothing stored for them


def test_a_child_takes_them_too() -> None:
    scheduler = _scheduler()
    scheduler.submit("parent")
    assert Worker(scheduler, owner="w").run_due() == 2  # the parent, then its child
    (child,) = scheduler.list_tasks(name="join")
    assert child.args == {"*args": ["x", "y"], "sep": "+"} and child.result == "x+y"


@pytest.mark.parametrize(
    ("name", "args", "positional", "message"),
    [
        ("join", None, ["only one"], "do not fit its function"),
        ("with_ctx", {"n": 1}, [1], "multiple values for argument 'n'"),
        ("join", None, "ab", "positional arguments must be a list or tuple, got str"),
        ("join", None, {"a": 1}, "positional arguments must be a list or tuple, got dict"),
        ("join", None, {"a", "b"}, "positional arguments must be a list or tuple, got set"),
        ("join", None, ["a", object()], "must be JSON-serialisable"),
        ("join", None, ["a", float("nan")], "must be JSON-serialisable"),
    ],
)
def test_what_cannot_be_stored_or_called_is_refused_at_submit(
    name: str, args: dict[str, Any] | None, positional: Any, message: str
) -> None:
    scheduler = _scheduler()
    with pytest.raises(InvalidTaskError, match=message):
        scheduler.submit(name, args, positional=positional)
    assert scheduler.list_tasks() == []


@pytest.mark.parametrize(
    ("args", "positional"),
    [({"when": object()}, None), (None, ["a", {1, 2}]), (None, "ab"), ([("a", 1)], None)],
)
def test_arguments_json_cannot_hold_are_a_type_error_too(args: Any, positional: Any) -> None:
    """As ``json.dumps`` (and Django's task API) raise: a TypeError, and still a
    durablesched InvalidTaskError (a ValueError) for code that catches that."""
    scheduler = _scheduler()
    with pytest.raises(InvalidTaskArgumentsError) as raised:
        scheduler.submit("join", args, positional=positional)
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, InvalidTaskError)
    assert scheduler.list_tasks() == []


def test_stored_ones_the_function_cannot_take_fail_once() -> None:
    scheduler = _scheduler()
    # Submitted by a program without the registry (one with it refuses at submit).
    task_id = Scheduler(scheduler.store, clock=scheduler.clock).submit(
        "with_ctx", positional=[1, 2, 3]
    )
    assert Worker(scheduler, owner="w").run_due() == 1
    record = scheduler.get(task_id)
    assert (record.state, record.attempts) == (TaskState.FAILED, 1)
    assert record.last_error is not None
    assert "cannot take its stored arguments ['3 positional']" in record.last_error.message
