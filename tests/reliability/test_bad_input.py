"""Hypothesis over the submit API and the CLI: every bad input gets our own clear error."""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from durablesched import DurableSchedError, InvalidTaskError, ManualClock, Scheduler, SQLiteStore
from durablesched.cli.main import main
from durablesched.cli.parser import build_parser

from ..conftest import T0, database_image

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


# -- every command, generated argv, hostile values -------------------------------------------------

APP = "tests.unit.cli_app"
#: Values any option may meet: valid ones, and those that once gave tracebacks.
VALUES = [
    "1", "0", "-1", "7", str(2**63), str(2**70), "inf", "nan", "1e300", "0.05",
    "5m", "-5m", "1h30m", "99999999999d", "{}", '{"n": 1}', '{"a": 1, "b": 2}', "null",
    "[1]", "3", '"x"', "[" * 40_000 + "]" * 40_000, '{"a": "\udcff"}', '{"a": "\\ud800"}',
    "\udcff", "x" * 201, "", "k", "ok", "add", "numbered",
    "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00", "2030-01-01T00:00:00+00:00",
    "2030-01-01", "PENDING", "FAILED", "done", "mysql://u:secret@h/db", "sqlite://",
    "full", "fast", "warning", "loud", "thread", APP, f"{APP}:nope", ".x",
]  # fmt: skip
#: Options that take a value, per command ("*": every command).
OPTIONS = {
    "*": ["--db", "--durability"],
    "worker": ["--app", "--concurrency", "--lease", "--grace", "--cancel-grace", "--log-level"],
    "submit": ["--app", "--args", "--delay", "--at", "--max-attempts", "--key"],
    "ls": ["--state", "--name", "--limit"],
    "purge": ["--older-than", "--batch"],
    "move": ["--from", "--to", "--batch"],
    "copy": ["--from", "--to", "--batch"],
    "dashboard": ["--host", "--port", "--token"],
}
#: A value each option takes, drawn as often as all the others together.
GOOD = {
    "--durability": ["full", "normal"], "--app": [APP], "--concurrency": ["2"],
    "--lease": ["5"], "--grace": ["1"], "--cancel-grace": ["1"], "--log-level": ["warning"],
    "--args": ['{"n": 1}', "{}"], "--delay": ["5m"], "--at": ["2030-01-01T00:00:00+00:00"],
    "--max-attempts": ["3"], "--key": ["k"], "--state": ["PENDING", "FAILED"],
    "--name": ["ok"], "--limit": ["3"], "--older-than": ["0s", "7d"], "--batch": ["2"],
    "--host": ["127.0.0.1", "192.0.2.1", "::1"], "--port": ["0", "8787"], "--token": ["t", " "],
}  # fmt: skip
#: What a command takes besides options.
POSITIONALS = {
    "submit": ["ok", "add", "numbered", "x", "", "\udcff", "x" * 201],
    **{c: ["1", "2", "0", str(2**63), str(2**70), "x"] for c in ("show", "cancel", "retry")},
}


@st.composite
def command_lines(draw: st.DrawFn, other_db: str) -> list[str]:
    """A command, its positional, options with values (valid or not), now and then a
    switch or a stray word, in any order."""
    command = draw(st.sampled_from(build_parser().commands))
    flags = OPTIONS["*"] + OPTIONS.get(command, [])
    values = st.sampled_from([*VALUES, other_db])
    words: list[str] = []
    for flag in draw(st.lists(st.sampled_from(flags), max_size=3)):
        good = GOOD.get(flag, [os.environ["DURABLESCHED_DB"], other_db])
        words += [flag, draw(st.one_of(st.sampled_from(good), values))]
    words += draw(st.lists(st.sampled_from(["--json", "--help", "--version"]), max_size=1))
    words += draw(st.lists(st.one_of(values, st.text(max_size=4)), max_size=1))
    if command in POSITIONALS:
        words.append(draw(st.sampled_from(POSITIONALS[command])))
    argv = [command, *draw(st.permutations(words))]
    if command == "worker":
        argv.append("--burst")  # the worker must stop by itself
    return argv


def snapshot(db: Path) -> bytes | None:
    """The database as SQLite reads it, its write-ahead log included (None: absent)."""
    return database_image(db)


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A database file for this test alone, named by DURABLESCHED_DB; nothing else set.

    The test runs in its own folder: a generated ``--db 0`` is a file there.
    """
    for name in list(os.environ):
        if name.startswith("DURABLESCHED_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # --app puts the folder on it
    db = tmp_path / "fuzz.db"
    monkeypatch.setenv("DURABLESCHED_DB", str(db))
    # The dashboard serves until stopped: here it stops at once, once everything its
    # options name was checked, opened and built.
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    levels = {n: logging.getLogger(n).level for n in ("durablesched", "alembic")}
    yield db
    for name, level in levels.items():  # the worker command sets them
        logging.getLogger(name).setLevel(level)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_command_exits_0_1_or_2_and_a_refusal_leaves_the_database_as_it_was(
    cli_env: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    data: st.DataObject,
) -> None:
    argv = data.draw(command_lines(str(tmp_path / "other.db")), label="argv")
    before = snapshot(cli_env), snapshot(tmp_path / "other.db")
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # --help and --version only: usage errors return 2
        code = e.code if isinstance(e.code, int) else 2
        assert code == 0, (argv, e)
    _out, err = capsys.readouterr()
    event(f"{argv[0]}: exit {code}")  # --hypothesis-show-statistics shows the spread
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        lines = [line for line in err.splitlines() if "error" in line]
        assert len(lines) == 1, (argv, err)
        after = snapshot(cli_env), snapshot(tmp_path / "other.db")
        assert after == before, f"{argv} was refused but changed a database"
