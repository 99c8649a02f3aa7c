"""The real `durablesched` command in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durablesched import SQLiteStore, TaskState
from durablesched.store.opening import open_store
from durablesched.store.sql.migrate import head_revision

from ..processes.conftest import DEADLINE, ROOT, Workers, wait_for

pytestmark = pytest.mark.processes


def cli(
    *args: str, db: Path | str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if db is not None:
        full_env["DURABLESCHED_DB"] = str(db)
    return subprocess.run(
        [sys.executable, "-m", "durablesched", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def attempts_of(db: Path | str, task_id: int) -> int:
    store = open_store(db)
    try:
        task = store.get(task_id)
    finally:
        store.close()
    assert task is not None
    return task.attempts


def state_of(db: Path | str, task_id: int) -> TaskState:
    store = open_store(str(db))
    try:
        task = store.get(task_id)
        assert task is not None
        return task.state
    finally:
        store.close()


def test_migrate_prints_the_revision_and_db_comes_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    result = cli("migrate", db=db)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"schema at revision {head_revision()}"
    assert db.exists()


def test_common_options_go_before_or_after_the_subcommand(tmp_path: Path) -> None:
    before = tmp_path / "before.db"
    after = tmp_path / "after.db"
    assert as_json(cli("--db", str(before), "--json", "submit", "x"))["id"] == 1
    assert as_json(cli("submit", "x", "--db", str(after), "--json"))["id"] == 1
    assert as_json(cli("--db", str(before), "ls", "--json"))[0]["name"] == "x"
    assert before.exists() and after.exists()


def test_help_names_the_environment_variables() -> None:
    out = cli("worker", "--help").stdout
    for env in (
        "DURABLESCHED_DB",
        "DURABLESCHED_APP",
        "DURABLESCHED_CONCURRENCY",
        "DURABLESCHED_LEASE",
    ):
        assert env in out


def test_submit_ls_show_cancel_retry_stats_purge_json(db: str) -> None:
    first = as_json(cli("submit", "record", "--args", '{"n": 1}', "--json", db=db))
    again = as_json(cli("submit", "record", "--args", '{"n": 1}', "--key", "k", "--json", db=db))
    repeat = as_json(cli("submit", "record", "--key", "k", "--json", db=db))
    assert repeat["id"] == again["id"] != first["id"]
    later = as_json(cli("submit", "record", "--delay", "1h", "--json", db=db))
    listed = as_json(cli("ls", "--json", db=db))
    assert [t["id"] for t in listed] == [first["id"], again["id"], later["id"]]
    shown = as_json(cli("show", str(first["id"]), "--json", db=db))
    assert shown["args"] == {"n": 1} and shown["history"][0]["state"] == "PENDING"
    assert as_json(cli("cancel", str(later["id"]), "--json", db=db))["outcome"] == "CANCELLED"
    too_late = cli("cancel", str(later["id"]), db=db)
    assert too_late.returncode == 1 and "already cancelled" in too_late.stdout
    assert as_json(cli("retry", str(later["id"]), "--json", db=db))["state"] == "PENDING"
    stats = as_json(cli("stats", "--json", db=db))
    assert stats["counts"]["PENDING"] == 3
    assert stats["oldest_overdue"]["id"] == first["id"]
    assert as_json(cli("purge", "--older-than", "0s", "--json", db=db)) == {
        "deleted": 0,
        "workers_forgotten": 0,
    }
    table = cli("ls", db=db).stdout
    assert "record" in table and "PENDING" in table


def test_submit_with_the_app_checks_the_name_and_takes_the_tasks_retry_policy(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    app = ("--app", "tests.processes.app")
    unknown = cli("submit", "no.such.task", *app, db=db)
    assert unknown.returncode == 2
    assert "no task is registered under the name 'no.such.task'" in unknown.stderr
    # chaos(ctx, n, fail): with the app, its arguments must fit the function.
    fits = ("--args", '{"n": 1, "fail": false}')
    chaos = as_json(cli("submit", "chaos", *app, *fits, "--json", db=db))["id"]
    told = as_json(cli("submit", "chaos", *app, *fits, "--max-attempts", "2", "--json", db=db))[
        "id"
    ]
    # The variable the worker reads does the same for submit.
    by_env = cli("submit", "no.such.task", db=db, env={"DURABLESCHED_APP": "tests.processes.app"})
    assert by_env.returncode == 2 and "no.such.task" in by_env.stderr
    bare = as_json(cli("submit", "no.such.task", "--json", db=db))["id"]
    attempts = {
        task_id: as_json(cli("show", str(task_id), "--json", db=db))["max_attempts"]
        for task_id in (chaos, told, bare)
    }
    # chaos is registered with max_attempts=8; without the app a task gets 5.
    assert attempts == {chaos: 8, told: 2, bare: 5}
    assert [t["name"] for t in as_json(cli("ls", "--json", db=db))] == [
        "chaos",
        "chaos",
        "no.such.task",
    ]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["worker", "--app", "tests.processes.app", "--concurrency", "0"], "--concurrency"),
        (["submit", "x", "--app", "no_such_module_anywhere"], "--app"),
        (["worker", "--burst"], "--app is required"),
        (["worker", "--app", "tests.processes.app", "--lease", "soon"], "--lease"),
        (["submit", "x", "--delay", "forever"], "--delay"),
        (["submit", "x", "--args", "{nope"], "--args"),
        (["submit", "x", "--at", "2030-01-01T00:00:00"], "--at"),
        (["submit", "x", "--max-attempts", "0"], "--max-attempts"),
        (["ls", "--state", "DONE"], "--state"),
        (["show", "abc"], "task id"),
        (["purge", "--older-than", "-5m"], "--older-than"),
        (["frobnicate"], "invalid choice"),
        (["worker", "--app", "tests.processes.app", "--log-level", "loud"], "--log-level"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_them(
    tmp_path: Path, args: list[str], names: str
) -> None:
    result = cli(*args, db=tmp_path / "bad.db")
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and names in lines[0], result.stderr


def test_not_found_exits_1(tmp_path: Path) -> None:
    db = tmp_path / "nf.db"
    assert cli("migrate", db=db).returncode == 0  # reading commands create no database
    for args in (["show", "42"], ["cancel", "42"], ["retry", "42"]):
        result = cli(*args, db=db)
        assert result.returncode == 1 and "no task with id 42" in result.stderr


def test_worker_with_a_missing_module_exits_with_a_clear_error(tmp_path: Path) -> None:
    result = cli("worker", "--app", "no_such_module_anywhere", "--burst", db=tmp_path / "m.db")
    assert result.returncode == 2
    assert "cannot import module 'no_such_module_anywhere'" in result.stderr


def test_burst_drains_the_queue_and_exits_0(tmp_path: Path) -> None:
    db = tmp_path / "burst.db"
    ids = [
        as_json(cli("submit", "slow", "--args", '{"seconds": 0}', "--json", db=db))["id"]
        for _ in range(3)
    ]
    # --db before the subcommand; the worker still logs its task lines at INFO.
    result = cli(
        "--db",
        str(db),
        "worker",
        "--app",
        "tests.processes.app:registry",
        "--burst",
        "--concurrency",
        "2",
        env={"DS_TEST_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert all(state_of(db, i) is TaskState.SUCCEEDED for i in ids)
    for word in ("start: task", "success: task"):
        assert word in result.stderr


def test_log_level_warning_keeps_only_trouble(tmp_path: Path) -> None:
    db = tmp_path / "quiet.db"
    ok = as_json(cli("submit", "slow", "--args", '{"seconds": 0}', "--json", db=db))["id"]
    bad = as_json(
        cli("submit", "slow", "--args", '{"seconds": "x"}', "--max-attempts", "1", "--json", db=db)
    )["id"]
    result = cli(
        "worker",
        "--app",
        "tests.processes.app:registry",
        "--burst",
        env={"DS_TEST_DIR": str(tmp_path), "DURABLESCHED_LOG_LEVEL": "warning"},
        db=db,
    )
    assert result.returncode == 0, result.stderr
    assert state_of(db, ok) is TaskState.SUCCEEDED and state_of(db, bad) is TaskState.FAILED
    assert "start: task" not in result.stderr and "success: task" not in result.stderr
    assert f"failure: task {bad}" in result.stderr


def test_a_row_with_an_unregistered_name_never_runs_and_imports_nothing(tmp_path: Path) -> None:
    db = tmp_path / "evil.db"
    evil = as_json(cli("submit", "tests.acceptance.evil", "--json", db=db))["id"]
    also = as_json(cli("submit", "tests.acceptance.evil:anything", "--json", db=db))["id"]
    result = cli(
        "worker",
        "--app",
        "tests.processes.app:registry",
        "--burst",
        db=db,
        env={"DS_TEST_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert state_of(db, evil) is TaskState.PENDING
    assert state_of(db, also) is TaskState.PENDING
    assert not (tmp_path / "evil-imported").exists()
    stats = as_json(cli("stats", "--json", db=db))
    assert {o["name"] for o in stats["overdue_by_name"]} == {
        "tests.acceptance.evil",
        "tests.acceptance.evil:anything",
    }


def test_sigterm_gives_back_a_running_task_and_loses_nothing(
    tmp_path: Path, db: str, workers: Workers
) -> None:
    slow = as_json(cli("submit", "slow", "--args", '{"seconds": 60}', "--json", db=db))["id"]
    quick = as_json(cli("submit", "record", "--args", '{"n": 1}', "--json", db=db))["id"]
    proc = workers.start("--grace", "0.5", concurrency=2, lease=5)
    wait_for(lambda: state_of(db, slow) is TaskState.RUNNING, "the slow task to start")
    wait_for(lambda: state_of(db, quick) is TaskState.SUCCEEDED, "the quick task")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 0
    store = open_store(db)
    try:
        task = store.get(slow)
        assert task is not None
        assert (task.state, task.attempts, task.lease_owner) == (TaskState.PENDING, 0, None)
        assert store.list_tasks(state=TaskState.RUNNING) == []
    finally:
        store.close()
    assert "gave back 1 unfinished task" in workers.log(0)


def test_cancel_of_a_task_in_a_process_is_enforced_through_the_command(
    tmp_path: Path, db: str, workers: Workers
) -> None:
    task_id = as_json(cli("submit", "slow", "--args", '{"seconds": 60}', "--json", db=db))["id"]
    # A long lease: heartbeats every 20 s. The cancel must not wait for one: the
    # worker hears of the other process's commit and checks its leases early.
    workers.start("--environment", "process", "--cancel-grace", "0.5", concurrency=1, lease=60)
    wait_for(lambda: state_of(db, task_id) is TaskState.RUNNING, "the task to start")
    result = cli("cancel", str(task_id), db=db)
    assert result.returncode == 0 and "enforced" in result.stdout, result.stdout
    wait_for(
        lambda: state_of(db, task_id) is TaskState.CANCELLED, "the enforced cancel", timeout=10
    )
    shown = as_json(cli("show", str(task_id), "--json", db=db))
    assert shown["environment"] == "process"


def test_sigterm_lets_a_task_finish_within_the_grace_period(
    tmp_path: Path, db: str, workers: Workers
) -> None:
    task_id = as_json(cli("submit", "slow", "--args", '{"seconds": 1}', "--json", db=db))["id"]
    proc = workers.start("--grace", "20", concurrency=1, lease=5)
    wait_for(lambda: state_of(db, task_id) is TaskState.RUNNING, "the task to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 0
    assert state_of(db, task_id) is TaskState.SUCCEEDED


def test_an_idle_worker_picks_up_a_task_from_another_process(
    tmp_path: Path, db: str, workers: Workers
) -> None:
    workers.start(concurrency=1, lease=5)
    wait_for(lambda: "worker " in workers.log(0), "the worker to start")
    task_id = as_json(cli("submit", "record", "--args", '{"n": 7}', "--json", db=db))["id"]
    wait_for(lambda: state_of(db, task_id) is TaskState.SUCCEEDED, "pickup", timeout=10)


def test_a_second_signal_exits_at_once_and_the_lease_is_reclaimed_later(
    tmp_path: Path, db: str, workers: Workers
) -> None:
    slow = as_json(cli("submit", "slow", "--args", '{"seconds": 60}', "--json", db=db))["id"]
    proc = workers.start("--grace", "60", concurrency=1, lease=1)
    wait_for(lambda: state_of(db, slow) is TaskState.RUNNING, "the slow task to start")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "no new claims" in workers.log(0), "the first signal to be handled")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 128 + signal.SIGTERM
    assert state_of(db, slow) is TaskState.RUNNING  # not given back: the lease will lapse
    rescuer = workers.start("--burst", "--grace", "1", concurrency=1, lease=1)
    # Reclaimed (RETRY_WAIT for a moment), then run again by the rescuer: a burst
    # runs what a lapsed lease gives back (issue 17 item 1).
    wait_for(lambda: attempts_of(db, slow) >= 2, "the reclaim and a second attempt")
    assert "lost its lease -> RETRY_WAIT" in workers.log(1)
    rescuer.send_signal(signal.SIGTERM)
    rescuer.wait(DEADLINE)


def test_a_worker_whose_database_file_is_removed_exits_non_zero(tmp_path: Path) -> None:
    db = tmp_path / "removed.db"
    SQLiteStore(db).close()
    workers = Workers(str(db), tmp_path)
    try:
        proc = workers.start(concurrency=1, lease=5)
        wait_for(lambda: "worker " in workers.log(0), "the worker to start")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        assert proc.wait(DEADLINE) == 1
        assert "was removed or replaced while in use" in workers.log(0)
        assert not db.exists(), "a new, empty database was created in the removed one's place"
    finally:
        workers.stop_all()


def test_copy_moves_live_tasks_to_postgres_and_back_once(tmp_path: Path, pg_url: str) -> None:
    lite = tmp_path / "lite.db"
    ids = [
        as_json(cli("submit", "record", "--args", f'{{"n": {n}}}', "--json", db=lite))["id"]
        for n in range(3)
    ]
    there = as_json(cli("copy", "--from", str(lite), "--to", pg_url, "--json"))
    assert there["copied"] == 3 and sorted(map(int, there["mapping"])) == ids
    assert as_json(cli("copy", "--from", str(lite), "--to", pg_url, "--json"))["copied"] == 0
    assert all(state_of(lite, i) is TaskState.CANCELLED for i in ids)
    back = as_json(cli("copy", "--from", pg_url, "--to", str(tmp_path / "new.db"), "--json"))
    assert back["copied"] == 3
    listed = as_json(cli("ls", "--json", db=tmp_path / "new.db"))
    assert sorted(t["args"]["n"] for t in listed) == [0, 1, 2]
    missing = cli("copy", "--from", str(lite))
    assert missing.returncode == 2 and "--to" in missing.stderr


def test_move_moves_live_tasks_once_and_says_so(tmp_path: Path) -> None:
    source, destination = tmp_path / "source.db", tmp_path / "destination.db"
    ids = [as_json(cli("submit", "record", "--json", db=source))["id"] for _ in range(3)]
    result = cli("move", "--from", str(source), "--to", str(destination))
    assert result.returncode == 0, result.stderr
    again = as_json(cli("move", "--from", str(source), "--to", str(destination), "--json"))
    # The databases by the names given, and by the numbers their history lines use.
    numbers = again["source"]["instance"], again["destination"]["instance"]
    assert result.stdout.strip() == (
        f"moved 3 live task(s) from {source} (database {numbers[0]}) to {destination} "
        f"(database {numbers[1]}): 3 moved, 0 moved by an earlier run, "
        "0 already present by idempotency key"
    )
    assert "deprecated" not in result.stderr
    assert all(state_of(source, i) is TaskState.CANCELLED for i in ids)
    # The same keys as copy's, so that a script only changes the command's name.
    assert again == {
        "copied": 0,
        "already_copied": 0,
        "deduplicated_by_key": 0,
        "mapping": {},
        "source": {"database": str(source), "instance": numbers[0]},
        "destination": {"database": str(destination), "instance": numbers[1]},
    }
    assert len(as_json(cli("ls", "--json", db=destination))) == 3
    same = cli("move", "--from", str(source), "--to", str(source))
    assert same.returncode == 1 and "the same database" in same.stderr


def test_copy_still_moves_and_warns_once_that_it_is_deprecated(tmp_path: Path) -> None:
    source, destination = tmp_path / "source.db", tmp_path / "destination.db"
    task_id = as_json(cli("submit", "record", "--json", db=source))["id"]
    result = cli("copy", "--from", str(source), "--to", str(destination), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["copied"] == 1
    assert result.stderr.splitlines() == [
        "durablesched: 'copy' is deprecated, use 'move' (it moves the tasks); 'copy' goes in 0.3"
    ]
    assert state_of(source, task_id) is TaskState.CANCELLED
    text = cli("copy", "--from", str(source), "--to", str(destination)).stdout
    assert text.strip().startswith(f"moved 0 live task(s) from {source} (database ")
    assert text.strip().endswith(
        ": 0 copied, 0 copied by an earlier run, 0 already present by idempotency key"
    )


@pytest.mark.parametrize("command", ["move", "copy"])
def test_move_and_copy_help_show_from_and_to_as_required(tmp_path: Path, command: str) -> None:
    result = cli(command, "--help")
    assert result.returncode == 0
    usage = " ".join(result.stdout.split("\n\n")[0].split())
    assert "--from SOURCE --to TO" in usage and "[--from" not in usage
    required = result.stdout.split("required arguments:")[1]
    assert "--from SOURCE" in required and "--to TO" in required
    missing = cli(command, "--from", str(tmp_path / "a.db"))
    assert missing.returncode == 2
    assert "required: --to" in missing.stderr


def test_version_bare_and_a_foreign_database_url_in_a_real_process(tmp_path: Path) -> None:
    from durablesched.cli.parser import version  # noqa: PLC0415 - the function under test

    shown = cli("--version")
    assert shown.returncode == 0 and shown.stdout == f"durablesched {version()}\n"
    bare = cli()
    assert bare.returncode == 2 and bare.stderr.startswith("usage: durablesched ")
    assert bare.stderr.rstrip().endswith("'durablesched --help' says what each command does")
    mysql = cli("stats", "--db", "mysql://user:secret@host/db")
    assert mysql.returncode == 2 and len(mysql.stderr.splitlines()) == 1
    assert "postgresql://" in mysql.stderr and "secret" not in mysql.stderr


def test_log_level_warning_keeps_alembic_quiet_on_a_new_database(tmp_path: Path) -> None:
    migrated = cli("migrate", db=tmp_path / "migrated.db")
    assert migrated.returncode == 0 and migrated.stderr == ""
    quiet = cli(
        "worker",
        "--app",
        "tests.processes.app:registry",
        "--burst",
        "--log-level",
        "warning",
        db=tmp_path / "new.db",
        env={"DS_TEST_DIR": str(tmp_path)},
    )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = cli(
        "worker",
        "--app",
        "tests.processes.app:registry",
        "--burst",
        "--log-level",
        "debug",
        db=tmp_path / "other.db",
        env={"DS_TEST_DIR": str(tmp_path)},
    )
    assert "alembic" in loud.stderr  # at debug they show: the quiet run would show them
    assert f"database {tmp_path / 'other.db'}, app tests.processes.app:registry" in loud.stderr
