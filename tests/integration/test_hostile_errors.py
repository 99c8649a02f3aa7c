"""A task's exception is recorded whatever it holds; durations past any date are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from durablesched import (
    ConfigurationError,
    ErrorInfo,
    ManualClock,
    MemoryStore,
    RetryPolicy,
    Scheduler,
    SQLiteStore,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.parametrize(
    "exc",
    [ValueError("lone \udc80 surrogate"), UnprintableError(), ValueError("x" * 100_000)],
    ids=["surrogate", "str-raises", "huge"],
)
def test_a_hostile_exception_is_recorded_and_its_task_finishes(
    tmp_path: Path, exc: Exception
) -> None:
    registry = TaskRegistry()

    @registry.task("hostile", retry=RetryPolicy(max_attempts=1))
    def hostile() -> None:
        raise exc

    store = SQLiteStore(tmp_path / "q.db")
    scheduler = Scheduler(store, registry=registry, clock=ManualClock(T0))
    task_id = scheduler.submit("hostile")
    assert Worker(scheduler).run_due() == 1
    task = store.get(task_id)
    assert task is not None and task.state is TaskState.FAILED  # not left RUNNING
    assert task.last_error is not None
    assert task.last_error.type.endswith(type(exc).__qualname__)
    assert len(task.last_error.message) <= ErrorInfo.MAX_TEXT + 100
    task.last_error.message.encode("utf-8")  # storable text: no lone surrogate left
    store.close()


def test_error_text_keeps_what_it_can() -> None:
    info = ErrorInfo.from_exception(ValueError("lone \udc80 surrogate"))
    assert info.message == "lone \\udc80 surrogate"
    assert ErrorInfo.from_exception(UnprintableError()).message == (
        "<str() of the exception raised RuntimeError>"
    )
    cut = ErrorInfo.from_exception(ValueError("x" * (ErrorInfo.MAX_TEXT + 5))).message
    assert cut.endswith("... (5 more characters cut)")


@pytest.mark.parametrize("lease", [float("inf"), float("nan"), 1e300, 10**30])
def test_a_lease_past_any_date_is_a_configuration_error(lease: float) -> None:
    registry = TaskRegistry()
    scheduler = Scheduler(MemoryStore(), registry=registry)
    with pytest.raises(ConfigurationError, match="lease must be a finite duration"):
        Worker(scheduler, lease=lease)


def test_a_timeout_past_any_date_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="timeout must be a finite duration"):
        TaskRegistry().task("t", timeout=float("inf"))(lambda: None)
