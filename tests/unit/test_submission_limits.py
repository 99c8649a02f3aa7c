"""The submit API at the edges: the limits, Unicode, the calendar, 64-bit ids, and
arguments bound to the registered function. Every refusal is an InvalidTaskError
(a ValueError) naming the argument, and nothing is stored."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from durablesched import (
    ConfigurationError,
    InvalidTaskError,
    ManualClock,
    Scheduler,
    SQLiteStore,
    TaskContext,
    TaskNotFoundError,
    TaskRegistry,
)
from durablesched.submission import (
    MAX_ARGS_BYTES,
    MAX_ARGS_DEPTH,
    MAX_ATTEMPTS,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
)
from durablesched.testing import run_due

from ..conftest import T0


def nested(levels: int) -> dict[str, Any]:
    """Arguments nested ``levels`` deep: the object itself is level 1."""
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return {"a": value}


@pytest.fixture
def registry() -> TaskRegistry:
    tasks = TaskRegistry()
    tasks.register(lambda **_: None, name="any")

    @tasks.task("report", pass_context=True)
    def report(ctx: TaskContext, month: str, *, draft: bool = False) -> str:
        return f"{ctx.task_id}:{month}:{draft}"

    @tasks.task("plain")
    def plain(n: int) -> int:
        return n

    return tasks


@pytest.fixture
def scheduler(tmp_path: Path, registry: TaskRegistry) -> Iterator[Scheduler]:
    # SQLite: the driver is where out-of-range integers and lone surrogates used to blow up.
    store = SQLiteStore(tmp_path / "limits.db")
    yield Scheduler(store, registry=registry, clock=ManualClock(T0))
    store.close()


@pytest.mark.parametrize(
    ("name", "args", "options", "names"),
    [
        ("any", nested(MAX_ARGS_DEPTH + 1), {}, f"nested at most {MAX_ARGS_DEPTH} levels"),
        ("any", nested(40_000), {}, f"nested at most {MAX_ARGS_DEPTH} levels"),
        ("any", {"s": "x" * MAX_ARGS_BYTES}, {}, f"at most {MAX_ARGS_BYTES:,} bytes"),
        ("any", {"s": "é" * (MAX_ARGS_BYTES // 2)}, {}, f"at most {MAX_ARGS_BYTES:,} bytes"),
        ("any", {"s": "a\ud800b"}, {}, "arguments of task 'any' must be valid Unicode"),
        ("any", {}, {"key": "k\udcff"}, "idempotency key must be valid Unicode"),
        ("any", {}, {"key": "k" * (MAX_KEY_LENGTH + 1)}, "idempotency key"),
        ("\ud800", {}, {}, "task name"),
        ("x" * (MAX_NAME_LENGTH + 1), {}, {}, f"longer than {MAX_NAME_LENGTH}"),
        (
            "any",
            {},
            {"max_attempts": 2**70},
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS}",
        ),
        ("any", {}, {"max_attempts": MAX_ATTEMPTS + 1}, "max_attempts"),
        (
            "any",
            {},
            {"at": datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))},
            "at= must fall between years 1 and 9999",
        ),
        (
            "any",
            {},
            {"at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))},
            "at= must fall between years 1 and 9999",
        ),
        ("any", {}, {"delay": timedelta.max}, "delay= is too large"),
        # Rounds to a zero timedelta: the number itself is checked (hypothesis found it).
        ("any", {}, {"delay": -1.4e-295}, "delay= must not be negative"),
    ],
)
def test_over_a_limit_is_an_invalid_task_error_naming_the_argument(
    scheduler: Scheduler, name: str, args: dict[str, Any], options: dict[str, Any], names: str
) -> None:
    with pytest.raises(InvalidTaskError, match=names.replace("(", r"\(")) as raised:
        scheduler.submit(name, args, **options)
    assert isinstance(raised.value, ValueError)
    assert scheduler.list_tasks() == []


def test_at_the_limits_is_accepted(scheduler: Scheduler) -> None:
    task_id = scheduler.submit(
        "any",
        nested(MAX_ARGS_DEPTH),
        max_attempts=MAX_ATTEMPTS,
        key="k" * MAX_KEY_LENGTH,
        at=datetime(9999, 12, 31, tzinfo=UTC),
    )
    big = scheduler.submit("any", {"s": "x" * (MAX_ARGS_BYTES - len('{"s":""}'))})
    assert scheduler.get(task_id).max_attempts == MAX_ATTEMPTS
    assert len(scheduler.get(big).args["s"]) == MAX_ARGS_BYTES - 8


def test_a_structure_that_contains_itself_is_refused(scheduler: Scheduler) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidTaskError, match="refers to itself"):
        scheduler.submit("any", {"loop": loop})


@pytest.mark.parametrize(
    ("name", "args", "problem"),
    [
        ("plain", {}, "missing a required argument: 'n'"),
        ("plain", {"n": 1, "m": 2}, "got an unexpected keyword argument 'm'"),
        ("report", {}, "missing a required argument: 'month'"),
        # The context is the first argument: it cannot also be given by name.
        ("report", {"ctx": 1, "month": "may"}, "multiple values for argument 'ctx'"),
    ],
)
def test_arguments_that_do_not_fit_the_function_are_refused_at_submit(
    scheduler: Scheduler, name: str, args: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidTaskError) as raised:
        scheduler.submit(name, args)
    message = str(raised.value)
    assert message.startswith(f"arguments of task {name!r} do not fit its function ")
    assert message.endswith(problem)
    assert scheduler.list_tasks() == []
    with pytest.raises(InvalidTaskError, match=problem):
        scheduler.submit_many(name, [args])
    assert scheduler.list_tasks() == []


def test_arguments_that_fit_run_as_bound(scheduler: Scheduler) -> None:
    ids = scheduler.submit_many(
        "report", [{"month": "may"}, {"month": "june", "draft": True}, {"month": "july"}]
    )
    run_due(scheduler)
    assert [scheduler.get(i).result for i in ids] == [
        f"{ids[0]}:may:False",
        f"{ids[1]}:june:True",
        f"{ids[2]}:july:False",
    ]


def test_a_bulk_submit_checks_every_set_of_argument_names(scheduler: Scheduler) -> None:
    # The first fits; a later task without arguments does not.
    with pytest.raises(InvalidTaskError, match="missing a required argument: 'n'"):
        scheduler.submit_many("plain", [{"n": 1}, {"n": 2}, {}])
    with pytest.raises(InvalidTaskError, match="unexpected keyword argument 'x'"):
        scheduler.submit_many("plain", [{"n": 1}, {"n": 2, "x": 3}])
    assert scheduler.list_tasks() == []


def test_without_a_registry_nothing_is_bound(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "bare.db")
    try:
        assert Scheduler(store, clock=ManualClock(T0)).submit("plain", {"m": 1}) == 1
    finally:
        store.close()


def test_a_result_with_a_lone_surrogate_is_a_failure_not_a_broken_commit(
    scheduler: Scheduler, registry: TaskRegistry
) -> None:
    registry.register(lambda: "a\ud800", name="bad.result")
    task_id = scheduler.submit("bad.result", max_attempts=1)
    run_due(scheduler)
    task = scheduler.get(task_id)
    assert task.last_error is not None
    assert "must be valid Unicode" in task.last_error.message


@pytest.mark.parametrize("task_id", [2**63, 2**70, -(2**63) - 1])
def test_ids_no_64_bit_column_holds_are_not_found(scheduler: Scheduler, task_id: int) -> None:
    for call in (scheduler.get, scheduler.history, scheduler.cancel):
        with pytest.raises(TaskNotFoundError, match="64-bit"):
            call(task_id)


def test_a_list_limit_past_64_bits_or_a_name_no_task_can_have_is_a_configuration_error(
    scheduler: Scheduler,
) -> None:
    with pytest.raises(ConfigurationError, match="limit must be at most"):
        scheduler.list_tasks(limit=2**70)
    with pytest.raises(ConfigurationError, match="name must be valid Unicode"):
        scheduler.list_tasks(name="x\udcff")
    assert scheduler.list_tasks(limit=2**63 - 1, name="é") == []


def test_docs_api_md_states_the_limits_in_force() -> None:
    from durablesched import submission  # noqa: PLC0415 - the constants under test

    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    for row in (
        f"| task name | {submission.MAX_NAME_LENGTH} characters |",
        f"| idempotency key | {submission.MAX_KEY_LENGTH} characters |",
        f"| argument nesting | {submission.MAX_ARGS_DEPTH} levels (the object itself is level 1) |",
        f"| arguments as UTF-8 JSON | {submission.MAX_ARGS_BYTES:,} bytes (1 MiB) |",
        f"| `max_attempts` | 1 to {submission.MAX_ATTEMPTS:,} (PostgreSQL's `integer`) |",
    ):
        assert row in docs, f"docs/api.md must say: {row}"
