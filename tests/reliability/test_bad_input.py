"""Hypothesis over the submit API and the CLI: every bad input gets our own clear error."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durablesched import DurableSchedError, InvalidTaskError, ManualClock, Scheduler, SQLiteStore
from durablesched.cli.main import main

from ..conftest import T0

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))
weird = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=3),
    st.sets(st.integers(), max_size=2),
    st.builds(object),
    st.complex_numbers(),
    st.dates(),
)
args_strategy = st.one_of(
    st.dictionaries(st.text(max_size=6), st.one_of(json_leaf, weird), max_size=3),
    st.dictionaries(st.integers(), json_leaf, max_size=2),
    st.lists(json_leaf, max_size=2),
    st.text(max_size=4),
    st.none(),
)
when_strategy = st.one_of(
    st.none(),
    st.datetimes(),  # naive
    st.datetimes(timezones=st.just(UTC)),
    st.text(max_size=4),
)
delay_strategy = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10, 10),
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=2)),
    st.text(max_size=3),
    st.booleans(),
)
attempts_strategy = st.one_of(
    st.none(), st.integers(-3, 5), st.floats(), st.text(max_size=2), st.booleans()
)
key_strategy = st.one_of(
    st.none(), st.text(max_size=3), st.text(min_size=201, max_size=205), st.integers()
)
name_strategy = st.one_of(st.sampled_from(["ok", "ok", "", " ", "no-such"]), st.text(max_size=8))


@pytest.fixture(scope="module")
def scheduler() -> Iterator[Scheduler]:
    from durablesched import TaskRegistry  # noqa: PLC0415 - kept local to this fixture

    registry = TaskRegistry()
    registry.register(lambda **_: None, name="ok")
    folder = Path(tempfile.mkdtemp())
    store = SQLiteStore(folder / "bad.db")
    yield Scheduler(store, registry=registry, clock=ManualClock(T0))
    store.close()
    shutil.rmtree(folder)


def count(scheduler: Scheduler) -> int:
    return len(scheduler.list_tasks(limit=100_000))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=name_strategy,
    args=args_strategy,
    options=st.fixed_dictionaries(
        {
            "at": when_strategy,
            "delay": delay_strategy,
            "max_attempts": attempts_strategy,
            "key": key_strategy,
        }
    ),
)
def test_submit_accepts_or_refuses_with_a_clear_error(
    scheduler: Scheduler, name: Any, args: Any, options: dict[str, Any]
) -> None:
    before = count(scheduler)
    delay = options["delay"]
    try:
        task_id = scheduler.submit(name, args, **options)
    except InvalidTaskError as e:
        assert str(e), "an error without a message"
        assert count(scheduler) == before, "a refused submit stored something"
        return
    task = scheduler.get(task_id)
    # Accepted: it must be a valid task, stored as given.
    assert task.name == name == "ok"
    assert isinstance(task.args, dict)
    assert task.max_attempts >= 1
    assert task.due_at.tzinfo is not None
    if isinstance(delay, float):
        assert math.isfinite(delay) and delay >= 0


cli_tokens = st.sampled_from(
    [
        "submit",
        "ls",
        "show",
        "cancel",
        "retry",
        "stats",
        "purge",
        "ok",
        "1",
        "0",
        "-1",
        "x",
        "{}",
        '{"a": 1}',
        "[1]",
        "{",
        "nan",
        "--args",
        "--delay",
        "--at",
        "--max-attempts",
        "--key",
        "--state",
        "--name",
        "--limit",
        "--older-than",
        "--json",
        "--batch",
        "5m",
        "1h30m",
        "PENDING",
        "done",
        "2030-01-01T00:00:00+00:00",
        "99999999999d",
        "800000d",
        "1e300",
        "2030-01-01",
        "--durability",
        "full",
        "fast",
    ]
)


@pytest.fixture(scope="module")
def cli_db() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp())
    yield folder / "cli.db"
    shutil.rmtree(folder)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(argv=st.lists(cli_tokens, min_size=1, max_size=6))
def test_cli_exits_0_1_or_2_and_never_with_a_traceback(
    cli_db: Path,
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLESCHED_DB", str(cli_db))
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code if isinstance(e.code, int) else 2
    except DurableSchedError as e:  # pragma: no cover - main() must not let these out
        raise AssertionError(f"{argv}: escaped {e!r}") from e
    _out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        assert len([line for line in err.splitlines() if "error" in line]) == 1, (argv, err)
