"""The command at its edges, run in-process through ``main(argv)``: what a new user and
hostile input meet. Usage errors exit 2 with one line naming the option and the
rule, and leave the database as it was (here: not even created)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from durablesched import CorruptDatabase, Scheduler, SQLiteStore, StoreError, TaskState, Worker
from durablesched.cli.database import display_db
from durablesched.cli.listing import live_first
from durablesched.cli.main import main
from durablesched.clock import SystemClock
from durablesched.store.sql.migrate import head_revision
from durablesched.submission import MAX_ARGS_BYTES, MAX_ARGS_DEPTH
from durablesched.testing import run_due

from .cli_app import registry as app_registry

APP = "tests.unit.cli_app"


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if "error" in line]


Run = Callable[..., Result]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "cli.db"


@pytest.fixture
def run(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Run]:
    """``main(argv)`` with ``--db`` from DURABLESCHED_DB, and nothing else from the environment."""
    for name in list(os.environ):
        if name.startswith("DURABLESCHED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DURABLESCHED_DB", str(db))
    monkeypatch.chdir(db.parent)  # a relative --db is a file there
    monkeypatch.setattr(sys, "path", list(sys.path))  # --app puts the folder on it
    levels = {n: logging.getLogger(n).level for n in ("durablesched", "alembic")}

    def run(*argv: str, env: dict[str, str] | None = None) -> Result:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as e:  # --help and --version
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return Result(code, out, err)

    yield run
    for name, level in levels.items():  # the worker command sets them
        logging.getLogger(name).setLevel(level)


def usage_error(result: Result, names: str) -> None:
    """Exit 2 with exactly one error line, which names ``names``."""
    assert result.code == 2, result
    assert len(result.error_lines) == 1, result.err
    assert names in result.error_lines[0], result.err


# -- item 6: tracebacks become one line naming the option and its rule ---------------------------

DEEP = "[" * 40_000 + "]" * 40_000


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["submit", "x", "--at", "9999-12-31T23:59:59-05:00"], "--at must fall between"),
        (["submit", "x", "--at", "0001-01-01T00:00:00+05:00"], "--at must fall between"),
        (["submit", "x", "--max-attempts", str(2**70)], "--max-attempts must be a whole number"),
        (["ls", "--limit", str(2**70)], "--limit must be a whole number from 1 to"),
        (["show", str(2**70)], "task id must be a whole number from 1 to"),
        (["cancel", str(2**70)], "task id must be a whole number from 1 to"),
        (["retry", str(2**63)], "task id must be a whole number from 1 to"),
        (["worker", "--app", APP, "--lease", "inf"], "--lease must be a number of seconds"),
        (["worker", "--app", APP, "--lease", "1e300"], "--lease must be a number of seconds"),
        (["worker", "--app", APP, "--grace", "nan"], "--grace must be a number of seconds"),
        (["worker", "--app", APP, "--unknown-tasks", "run"], "--unknown-tasks must be skip or"),
        (["submit", "x", "--args", DEEP], f"--args must be nested at most {MAX_ARGS_DEPTH}"),
        (["submit", "x", "--args", "[" * 65 + "]" * 65], "--args must be a JSON object"),
        (
            ["submit", "x", "--args", '{"a":' * 65 + "1" + "}" * 65],
            f"--args for task 'x' must be nested at most {MAX_ARGS_DEPTH}",
        ),
        (
            ["submit", "x", "--args", json.dumps({"s": "x" * MAX_ARGS_BYTES})],
            f"--args for task 'x' must be at most {MAX_ARGS_BYTES:,} bytes",
        ),
        (["submit", "x\udcff"], "task name 'x\\udcff' contains control characters"),
        (["submit", "x", "--key", "k\udcff"], "--key must be valid Unicode"),
        (
            ["submit", "x", "--args", '{"a": "\\ud800"}'],
            "--args for task 'x' must be valid Unicode",
        ),
        (["submit", "x", "--args", '{"a": "\udcff"}'], "--args for task 'x' must be valid Unicode"),
        (["ls", "--name", "\udcff"], "--name '\\udcff' contains control characters"),
        (["submit", "x", "--args", '{"n": ' + "9" * 5000 + "}"], "--args is not valid JSON"),
        (["ls", "--db", "jobs-\udcff.db"], "--db must be valid UTF-8"),
    ],
)
def test_hostile_values_exit_2_with_one_line(
    run: Run, db: Path, argv: list[str], names: str
) -> None:
    usage_error(run(*argv), names)
    assert not db.exists(), "a refused command created the database"


def test_migrate_on_a_truncated_file_is_one_line(run: Run, db: Path) -> None:
    assert run("submit", "x").code == 0
    truncated = db.read_bytes()[:5000]
    db.write_bytes(truncated)
    result = run("migrate")
    assert result.code == 1
    assert db.read_bytes() == truncated
    assert result.err.splitlines() == [
        f"durablesched: CorruptDatabase: opening sqlite:///{db} failed: database disk image is "
        "malformed; the database file is damaged: run `durablesched check`; restore from a backup"
    ]


# -- item 7: arguments checked against the function ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ("{}", "missing a required argument: 'n'"),
        ('{"n": 1, "m": 2}', "got an unexpected keyword argument 'm'"),
        ('{"ctx": 0, "n": 1}', "multiple values for argument 'ctx'"),
    ],
)
def test_submit_with_the_app_binds_the_arguments(
    run: Run, db: Path, args: str, problem: str
) -> None:
    result = run("submit", "numbered", "--app", APP, "--args", args)
    usage_error(
        result, f"--args for task 'numbered' do not fit its function numbered(ctx, n): {problem}"
    )
    assert not db.exists()
    assert run("submit", "numbered", "--app", APP, "--args", '{"n": 1}').out == "1\n"


@pytest.mark.parametrize(
    ("args", "kind"),
    [("null", "null"), ("[1]", "an array"), ("3", "a number"), ('"x"', "a string")],
)
def test_args_must_be_an_object(run: Run, db: Path, args: str, kind: str) -> None:
    usage_error(run("submit", "x", "--args", args), "--args must be a JSON object")
    assert run("submit", "x", "--args", args).err.rstrip().endswith(f"got {kind}")
    assert not db.exists()


# -- item 9: options as the docs say ---------------------------------------------------------------


def test_migrate_honours_json(run: Run) -> None:
    result = run("migrate", "--json")
    assert result.code == 0
    assert json.loads(result.out) == {"revision": head_revision()}


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["show", "42", "--json"], 1, "no task with id 42"),
        (["--json", "ls", "--limit", "0"], 2, "--limit must be a whole number from 1 to"),
        (["ls", "--json", "--frobnicate"], 2, "unrecognized arguments: --frobnicate"),
        (["--json"], 2, "no command given"),
    ],
)
def test_errors_under_json_are_one_json_object(
    run: Run, argv: list[str], code: int, message: str
) -> None:
    assert run("migrate").code == 0  # reading commands open an existing database only
    result = run(*argv)
    assert result.code == code
    (line,) = result.err.splitlines()
    error = json.loads(line)
    assert error["exit_code"] == code and message in error["error"]
    assert run(*argv, env={"DURABLESCHED_JSON": "1"}).err == result.err


def test_errors_without_json_stay_text(run: Run) -> None:
    assert run("migrate").code == 0
    assert run("show", "42").err == "durablesched: no task with id 42\n"


@pytest.mark.parametrize(
    "url",
    [
        "mysql://user:secret@host/db",
        "redis://h:1/0",
        "sqlite://",
        "sqlite:///:memory:",
        "",
        "postgresql://user:secret@host:port/db",
        "postgresql://user:secret@[::1/db",
    ],
)
def test_a_db_that_cannot_be_one_exits_2_saying_what_can(run: Run, url: str) -> None:
    result = run("stats", "--db", url)
    usage_error(result, "--db must")
    assert "secret" not in result.err
    if url.startswith(("mysql", "redis")):
        assert "a SQLite file path, a sqlite:///PATH URL or a postgresql:// URL" in result.err


def test_alembic_lines_show_at_debug_only(
    run: Run, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    worker = ("worker", "--app", APP, "--burst")
    assert run(*worker, "--db", str(tmp_path / "quiet.db"), "--log-level", "warning").code == 0
    assert not [r for r in caplog.records if r.name.startswith("alembic")]
    assert not [r for r in caplog.records if r.levelno < logging.WARNING]
    # At info (the default) a new database's schema is made without a line of Alembic's.
    assert run(*worker, "--db", str(tmp_path / "new.db"), "--log-level", "info").code == 0
    assert not [r for r in caplog.records if r.name.startswith("alembic")]
    assert [r for r in caplog.records if r.name.startswith("durablesched")]
    # At debug the same start shows them: the test can see them.
    assert run(*worker, "--db", str(tmp_path / "loud.db"), "--log-level", "debug").code == 0
    assert [r for r in caplog.records if r.name.startswith("alembic")]


# -- item 10: small stumbles -----------------------------------------------------------------------


def test_version(run: Run) -> None:
    from durablesched.cli.parser import version  # noqa: PLC0415 - the function under test

    result = run("--version")
    assert result.code == 0
    assert result.out == f"durablesched {version()}\n" and version()[0].isdigit()


def test_bare_prints_usage_and_a_hint(run: Run) -> None:
    result = run()
    assert result.code == 2
    assert result.err.startswith("usage: durablesched ")
    assert result.error_lines == [
        "durablesched: error: no command given: 'durablesched --help' says what each command does"
    ]


def test_retry_of_a_pending_task_says_why_in_words(run: Run) -> None:
    assert run("submit", "x").code == 0
    result = run("retry", "1")
    assert result.code == 1
    assert result.err == (
        "durablesched: task 1 is PENDING: only FAILED or CANCELLED tasks can be retried\n"
    )


def test_cancel_of_a_finished_task_says_how_it_ended(run: Run) -> None:
    assert run("submit", "ok").out == "1\n"
    assert run("cancel", "1").out == "task 1: cancelled: it had not started and never will\n"
    again = run("cancel", "1")
    assert (again.code, again.out) == (1, "task 1: already cancelled; nothing changed\n")
    assert run("submit", "ok").out == "2\n"
    assert run("worker", "--app", APP, "--burst").code == 0
    done = run("cancel", "2")
    assert (done.code, done.out) == (
        1,
        "task 2: too late: it had already finished (SUCCEEDED); nothing changed\n",
    )


def test_a_reused_key_says_so_and_shows_the_tasks_state(run: Run) -> None:
    assert run("submit", "x", "--key", "k").out == "1\n"
    again = run("submit", "y", "--key", "k")
    assert again.code == 0 and again.out == "1\n"
    assert again.err == (
        "durablesched: --key 'k' is held by task 1 (PENDING): no new task was submitted\n"
    )
    as_json = json.loads(run("submit", "y", "--key", "k", "--json").out)
    assert (as_json["id"], as_json["state"], as_json["created"]) == (1, "PENDING", False)
    assert json.loads(run("submit", "z", "--json").out)["created"] is True


def test_ls_shows_live_work_first_and_says_how_many_were_left_out(run: Run, db: Path) -> None:
    store = SQLiteStore(db)
    scheduler = Scheduler(store, registry=app_registry)
    try:
        old_done = scheduler.submit("add", {"a": 1, "b": 1})
        # Without the registry, arguments the function cannot take are stored: it fails.
        failed = Scheduler(store).submit("add", {"a": 1}, max_attempts=1)
        run_due(scheduler)  # old_done succeeds, then failed fails for good
        new_done = scheduler.submit("add", {"a": 2, "b": 2})
        run_due(scheduler)
        cancelled = scheduler.submit("add", {"a": 3, "b": 3}, delay=3600)
        scheduler.cancel(cancelled)
        later = scheduler.submit("add", {"a": 4, "b": 4}, delay=7200)
        sooner = scheduler.submit("add", {"a": 5, "b": 5}, delay=60)
        running = scheduler.submit("add", {"a": 6, "b": 6})
        now = SystemClock().now()
        store.claim("someone", 1, now, timedelta(minutes=5), names=["add"])
        assert scheduler.get(running).state is TaskState.RUNNING
        assert scheduler.get(failed).state is TaskState.FAILED
        expected = [running, sooner, later, cancelled, new_done, failed, old_done]
        everything = live_first(store, state=None, name=None, limit=50, now=now)
        assert [t.id for t in everything.tasks] == expected
        assert everything.left_out == 0
        named = live_first(store, state=None, name="add", limit=3, now=now)
        assert [t.id for t in named.tasks] == expected[:3]
        assert named.more_than and named.left_out >= 0
    finally:
        store.close()
    as_json = json.loads(run("ls", "--json").out)
    assert [t["id"] for t in as_json] == expected
    table = run("ls", "--limit", "3").out
    assert [int(line.split()[0]) for line in table.splitlines()[2:5]] == expected[:3]
    assert table.rstrip().endswith(
        "4 more task(s) not shown: raise --limit, or narrow with --state, --name or --queue"
    )
    assert "not shown" not in run("ls").out
    assert [t["id"] for t in json.loads(run("ls", "--state", "SUCCEEDED", "--json").out)] == [
        new_done,
        old_done,
    ]


def test_the_worker_start_line_names_the_database_and_the_app(
    run: Run, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durablesched")
    assert run("worker", "--app", APP, "--burst").code == 0
    (start,) = [r.getMessage() for r in caplog.records if "slots" in r.getMessage()]
    assert f"database {db}, app {APP}, 4 slots" in start


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://ada:s3cr%40t@db.example.com:5432/jobs",
            "postgresql://ada:***@db.example.com:5432/jobs",
        ),
        (
            "postgresql+psycopg://ada:pw@h/db?sslmode=require",
            "postgresql+psycopg://ada:***@h/db?sslmode=require",
        ),
        ("postgresql://ada@h/db", "postgresql://ada@h/db"),
        ("/var/lib/jobs.db", "/var/lib/jobs.db"),
        ("sqlite:////var/lib/jobs.db", "sqlite:////var/lib/jobs.db"),
    ],
)
def test_database_names_never_show_a_password(url: str, shown: str) -> None:
    assert display_db(url) == shown


def test_an_app_with_a_syntax_error_names_the_file_and_line(
    run: Run, db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_cli_app.py").write_text("x = 1\ndef f(:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run("submit", "x", "--app", "broken_cli_app")
    usage_error(
        result, f"--app: cannot import module 'broken_cli_app': {tmp_path}/broken_cli_app.py:2: "
    )
    assert not db.exists()


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (f"{APP}:nope", f"--app: module '{APP}' has no attribute 'nope'"),
        (f"{APP}:add", f"--app: {APP}:add is a Task, not a durablesched TaskRegistry"),
        (".relative", "--app must be MODULE[:ATTR]"),
    ],
)
def test_an_app_attribute_is_named_as_given(run: Run, spec: str, names: str) -> None:
    usage_error(run("submit", "x", "--app", spec), names)


def test_move_names_the_databases_by_path_and_number(run: Run, tmp_path: Path) -> None:
    source, destination = tmp_path / "a.db", tmp_path / "b.db"
    assert run("submit", "x", "--db", str(source)).code == 0
    text = run("move", "--from", str(source), "--to", str(destination)).out
    report = json.loads(run("move", "--from", str(source), "--to", str(destination), "--json").out)
    numbers = report["source"]["instance"], report["destination"]["instance"]
    assert text.startswith(
        f"moved 1 live task(s) from {source} (database {numbers[0]}) "
        f"to {destination} (database {numbers[1]}): 1 moved,"
    )
    assert report["source"]["database"] == str(source)
    usage_error(run("move", "--from", str(source), "--to", "mysql://u:pw@h/db"), "--to must be")


def test_a_database_error_over_several_lines_is_reported_on_one(run: Run, pg_url: str) -> None:
    # A schema that does not exist: PostgreSQL answers with a LINE and a caret.
    missing = pg_url.replace("search_path%3D", "search_path%3Dnever_created_")
    result = run("stats", "--db", missing.replace("postgresql://", "postgresql://u:pw@", 1))
    assert result.code == 1
    assert len(result.err.splitlines()) == 1 and "StoreError" in result.err
    assert "pw" not in result.err


# -- issue 17 items 1 and 2: what a burst leaves, and a worker stopped by its database ------------


def test_a_burst_says_in_one_line_what_it_leaves(db: Path, run: Run) -> None:
    assert run("submit", "ok").code == 0
    assert run("submit", "ok", "--delay", "1h").code == 0
    assert run("submit", "nobody.runs.this").code == 0
    assert run("submit", "add", "--args", '{"a": 1, "b": 2}').code == 0
    store = SQLiteStore(db)
    try:
        assert len(store.claim("other", 1, SystemClock().now(), timedelta(hours=1), ["add"])) == 1
    finally:
        store.close()
    result = run("worker", "--app", APP, "--burst", "--log-level", "warning")
    assert result.code == 0, result.err
    (line,) = result.out.splitlines()
    assert line.startswith("burst done: 1 due later (the first at ")
    assert "; 1 running under another worker's lease (the first expires at " in line
    assert line.endswith("; 1 due now that this worker does not run")
    left = json.loads(run("worker", "--app", APP, "--burst", "--json").out)
    assert (left["due_later"], left["running_elsewhere"], left["due_now_not_run"]) == (1, 1, 1)
    assert left["next_lease_expiry"] is not None and left["next_due_at"] is not None


def test_a_burst_counts_a_paused_queue_s_tasks_as_held_not_due_later(run: Run) -> None:
    assert run("submit", "report", "--app", APP).code == 0  # queue "reports", due now
    assert run("submit", "report", "--app", APP, "--delay", "1h").code == 0
    assert run("submit", "ok", "--delay", "1h").code == 0
    assert run("queue", "pause", "reports").code == 0
    result = run("worker", "--app", APP, "--burst", "--burst-wait", "0", "--log-level", "warning")
    assert result.code == 0, result.err
    (line,) = result.out.splitlines()
    assert line.startswith("burst done: 1 due later (the first at ")
    assert "(the first at -)" not in line
    assert line.endswith("; 2 held in paused queues")


def test_a_burst_that_leaves_nothing_says_so(db: Path, run: Run) -> None:
    assert run("submit", "ok").code == 0
    result = run("worker", "--app", APP, "--burst", "--burst-wait", "0")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["burst done: nothing remains"]


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            StoreError("gave up after 60.0s of store errors ('x' 9 times); the last: x"),
            "durablesched: worker stopped: StoreError: gave up after 60.0s of store errors "
            "('x' 9 times); the last: x",
        ),
        (
            CorruptDatabase("claiming tasks failed: database disk image is malformed"),
            "durablesched: worker stopped: CorruptDatabase: claiming tasks failed: database "
            "disk image is malformed; the database file is damaged: run `durablesched check`; "
            "restore from a backup",
        ),
    ],
)
def test_a_worker_stopped_by_its_database_exits_1_in_one_line(
    db: Path, run: Run, monkeypatch: pytest.MonkeyPatch, error: StoreError, line: str
) -> None:
    def fail(_self: Worker, *_args: object, **_kw: object) -> None:
        raise error

    monkeypatch.setattr(Worker, "run", fail)
    result = run("worker", "--app", APP, "--burst", "--log-level", "warning")
    assert result.code == 1
    assert result.err.splitlines() == [line]
    assert result.out == ""  # no "burst done" line: it did not finish


@pytest.mark.parametrize(
    ("option", "value"),
    [("--burst-wait", "-1"), ("--give-up-after", "soon"), ("--burst-wait", "inf")],
)
def test_burst_wait_and_give_up_after_are_checked(run: Run, option: str, value: str) -> None:
    result = run("worker", "--app", APP, "--burst", option, value)
    assert result.code == 2 and option in result.err
