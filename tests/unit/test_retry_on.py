"""Which failures are retried at all: ``retry_on`` / ``dont_retry_on`` (on the policy and
the task), ``NoRetry`` raised by a task, and a return value JSON cannot store, in the
thread and the process environments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durablesched import (
    ConfigurationError,
    ManualClock,
    MemoryStore,
    NoRetry,
    RetryPolicy,
    Scheduler,
    TaskRegistry,
    TaskState,
    TaskTimeout,
    Worker,
)

from ..conftest import T0

RETRY = RetryPolicy(max_attempts=3, initial=timedelta(seconds=1), jitter=0)


class Transient(Exception):
    pass


class Flaky(Transient):
    pass


def test_the_policy_retries_what_retry_on_names_and_not_what_dont_retry_on_does() -> None:
    assert RetryPolicy().retries(ValueError()) and RetryPolicy().retries(TaskTimeout())
    only = RetryPolicy(retry_on=(Transient, OSError))
    assert only.retries(Flaky()) and only.retries(ConnectionError())
    assert not only.retries(ValueError())
    never = RetryPolicy(retry_on=Transient, dont_retry_on=Flaky)  # one class, not a tuple
    assert never.retries(Transient()) and not never.retries(Flaky())  # dont_retry_on wins
    assert never.retry_on == (Transient,) and never.dont_retry_on == (Flaky,)
    assert not RetryPolicy(retry_on=Exception).retries(NoRetry("bad input"))


@pytest.mark.parametrize(
    "kwargs",
    [{"retry_on": "ValueError"}, {"dont_retry_on": (ValueError, 3)}, {"retry_on": int}],
)
def test_anything_but_exception_classes_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="must be an exception class"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="task 't'"):
        TaskRegistry().register(lambda: None, name="t", **kwargs)  # type: ignore[arg-type]


def _scheduler(environment: str) -> Scheduler:
    registry = TaskRegistry(default_retry=RETRY)

    @registry.task("transient_only", retry_on=Transient, environment=environment)
    def transient_only(kind: str) -> None:
        raise Flaky("try again") if kind == "flaky" else ValueError("a bug")

    @registry.task("not_flaky", dont_retry_on=(Flaky,), environment=environment)
    def not_flaky() -> None:
        raise Flaky("no point")

    @registry.task("gives_up", environment=environment)
    def gives_up() -> None:
        try:
            int("x")
        except ValueError as e:
            raise NoRetry("the input can never be parsed") from e

    @registry.task("returns_a_datetime", environment=environment)
    def returns_a_datetime() -> datetime:
        return datetime(2030, 1, 1, tzinfo=UTC)

    return Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))


@pytest.mark.parametrize("environment", ["thread", "process"])
@pytest.mark.parametrize(
    ("name", "args", "state", "error"),
    [
        ("transient_only", {"kind": "flaky"}, TaskState.RETRY_WAIT, "Flaky"),
        ("transient_only", {"kind": "bug"}, TaskState.FAILED, "builtins.ValueError"),
        ("not_flaky", {}, TaskState.FAILED, "Flaky"),
        ("gives_up", {}, TaskState.FAILED, "durablesched.errors.NoRetry"),
        ("returns_a_datetime", {}, TaskState.FAILED, "durablesched.errors.InvalidTaskError"),
    ],
)
def test_a_failure_the_policy_does_not_retry_fails_at_its_first_attempt(
    environment: str, name: str, args: dict[str, str], state: TaskState, error: str
) -> None:
    scheduler = _scheduler(environment)
    task_id = scheduler.submit(name, args)
    assert Worker(scheduler, owner="w").run_due() == 1
    record = scheduler.get(task_id)
    assert (record.state, record.attempts) == (state, 1)
    assert record.last_error is not None and record.last_error.type.endswith(error)


@pytest.mark.parametrize("environment", ["thread", "process"])
def test_no_retry_keeps_its_cause_and_an_unstorable_result_says_why(environment: str) -> None:
    scheduler = _scheduler(environment)
    gave_up, returned = scheduler.submit("gives_up"), scheduler.submit("returns_a_datetime")
    Worker(scheduler, owner="w").run_due()
    error = scheduler.get(gave_up).last_error
    assert error is not None and error.message == "the input can never be parsed"
    assert "invalid literal for int()" in error.traceback  # the cause, chained
    error = scheduler.get(returned).last_error
    assert error is not None and "must be JSON-serialisable" in error.message
    assert "not retried" in error.message
