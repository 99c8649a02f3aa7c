"""``durablesched schedule``, in-process: managing schedules, and bad input refused in one
line with the database left byte for byte as it was."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durablesched import ManualClock, Scheduler, SQLiteStore, TaskRegistry, Worker

from ..conftest import database_image
from .test_cli_edges import APP, Run, db, run

__all__ = ["db", "run"]  # the fixtures, used by name

ADD = ("schedule", "add", "nightly", "--app", APP, "--task", "add", "--args", '{"a": 1, "b": 2}')


def test_add_ls_pause_resume_run_now_remove(run: Run, db: Path) -> None:
    added = run(*ADD, "--cron", "30 2 * * *", "--timezone", "Europe/Berlin")
    assert added.code == 0, added.err
    assert added.out.startswith("schedule nightly: added; next fire ")
    assert run(*ADD, "--cron", "30 2 * * *", "--timezone", "Europe/Berlin").code == 0  # same
    listed = run("schedule", "ls")
    header, _, row = listed.out.splitlines()
    assert header.split() == [
        "name", "task", "when", "timezone", "status", "next", "fire", "last", "fire", "last",
        "task",
    ]  # fmt: skip
    assert row.split()[:6] == ["nightly", "add", "30", "2", "*", "*"]
    assert "Europe/Berlin" in row and "active" in row
    paused = run("schedule", "pause", "nightly")
    assert (paused.code, paused.out) == (
        0,
        "schedule nightly: paused, no fire until it is resumed\n",
    )  # as ls shows it: no next fire time
    assert run("schedule", "ls").out.splitlines()[2].split()[9] == "-"
    now = run("schedule", "run-now", "nightly", "--json")
    task_id = json.loads(now.out)["task_id"]
    (info,) = json.loads(run("schedule", "ls", "--json").out)
    assert (info["status"], info["last_task_id"], info["last_task_state"]) == (
        "paused",
        task_id,
        "PENDING",
    )
    assert info["cron"] == "30 2 * * *" and info["args"] == {"a": 1, "b": 2}
    resumed = run("schedule", "resume", "nightly")
    assert resumed.code == 0 and resumed.out.startswith("schedule nightly: active, next fire ")
    assert (
        run("schedule", "remove", "nightly").out == "schedule nightly: removed (its tasks stay)\n"
    )
    assert json.loads(run("schedule", "ls", "--json").out) == []
    gone = run("schedule", "pause", "nightly")
    assert (gone.code, gone.err) == (1, "durablesched: no schedule named 'nightly'\n")


BAD = [
    (("--cron", "0 7 * *"), "must have 5 fields"),
    (("--cron", "0 7 * * * * *"), "must have 5 fields"),
    (("--cron", "99 * * * *"), "is not valid: Bad minute"),
    (("--cron", "0 7 * * *", "--timezone", "Mars/Base"), "unknown time zone 'Mars/Base'"),
    (("--every", "0s"), "every must be from 1s"),
    (("--every", "-5"), "--every must be a non-negative duration"),
    (("--every", "5m", "--cron", "* * * * *"), "needs either --cron or --every"),
    ((), "needs either --cron or --every"),
    (
        ("--every", "5m", "--timezone", "Europe/Berlin"),
        "--every is elapsed time, the same in every time zone: drop --timezone Europe/Berlin",
    ),
    (("--every", "5m", "--misfire", "never"), "misfire must be"),
    (("--every", "5m", "--overlap", "sometimes"), "overlap must be"),
    (("--every", "5m", "--priority", "1000"), "priority must be"),
    (("--every", "5m", "--queue", "a queue"), "queue must be"),
    (("--every", "5m", "--args", '{"c": 3}'), "args do not fit"),
    (("--every", "5m", "--task", "nope"), "no task is registered under the name 'nope'"),
    (("--every", "5m", "--max-catch-up", "0"), "--max-catch-up must be a whole number"),
]


@pytest.mark.parametrize(("options", "words"), BAD, ids=[w for _, w in BAD])
def test_bad_input_exits_2_in_one_line_and_changes_nothing(
    run: Run, db: Path, options: tuple[str, ...], words: str
) -> None:
    assert run(*ADD, "--every", "1h").code == 0
    before = database_image(db)
    task = () if "--task" in options else ("--task", "add")
    args = () if "--args" in options else ("--args", '{"a": 1, "b": 2}')
    result = run("schedule", "add", "other", "--app", APP, *task, *args, *options)
    assert result.code == 2, result
    assert len(result.err.splitlines()) == 1 and words in result.err, result.err
    assert database_image(db) == before


def test_a_name_taken_with_other_settings_exits_2_and_changes_nothing(run: Run, db: Path) -> None:
    assert run(*ADD, "--every", "1h").code == 0
    before = database_image(db)
    result = run(*ADD, "--every", "2h")
    assert result.code == 2
    assert "'nightly' exists with other settings" in result.err
    assert database_image(db) == before


def test_add_needs_an_app_and_ls_no_name(run: Run) -> None:
    assert "needs --app" in run("schedule", "add", "x", "--every", "5m").err
    assert run("schedule", "ls", "x").err.endswith("schedule ls takes no name\n")
    assert "needs the schedule's name" in run("schedule", "pause").err


def test_ls_says_a_schedule_was_removed_from_code(run: Run, db: Path) -> None:
    registry = TaskRegistry()
    registry.task("t")(lambda: None)
    registry.schedule("t", name="old", every=60)
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store = SQLiteStore(db)
    Worker(Scheduler(store, registry=registry, clock=clock)).run_once()
    deployed = TaskRegistry()
    deployed.task("t")(lambda: None)
    Worker(Scheduler(store, registry=deployed, clock=clock)).run_once()
    store.close()
    (row,) = run("schedule", "ls").out.splitlines()[2:]
    assert "removed from code" in row
