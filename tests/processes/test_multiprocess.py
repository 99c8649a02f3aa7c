"""Several worker processes on one database: once each, fenced, crash-safe."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from durablesched import Scheduler, TaskState, open_store
from durablesched.store.sql.urls import is_postgres_url

from .conftest import ROOT, Workers, count, query, wait_for

pytestmark = pytest.mark.processes


def count_state(db: str, state: str) -> int:
    return int(query(db, "SELECT count(*) FROM tasks WHERE state = ?", state)[0][0])


def test_three_processes_run_500_tasks_exactly_once(
    db: str, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    ids = scheduler.submit_many("record", [{"n": i} for i in range(500)])
    procs = [workers.start("--burst", concurrency=4, lease=5) for _ in range(3)]
    for proc in procs:
        assert proc.wait(120) == 0
    assert count_state(db, "SUCCEEDED") == 500
    executions = [line.split() for line in (tmp_path / "executions").read_text().splitlines()]
    per_task = Counter(int(e[0]) for e in executions)
    assert sorted(per_task) == sorted(ids)
    assert set(per_task.values()) == {1}, "a task ran twice"
    # One claim per task that ran, never a second live lease: a claim made ahead may
    # have been given back unstarted (its RUNNING line followed by a PENDING one).
    lines = query(db, "SELECT task_id, state FROM task_events ORDER BY id")
    history: dict[int, list[str]] = {}
    for task_id, state in lines:
        history.setdefault(int(task_id), []).append(state)
    for task_id, states in history.items():
        claims = [i for i, s in enumerate(states) if s == "RUNNING"]
        assert claims, task_id
        for i in claims[:-1]:
            assert states[i + 1] == "PENDING", (task_id, states)
        assert states[claims[-1] + 1 :] == ["SUCCEEDED"], (task_id, states)
    assert len(history) == 500
    assert int(query(db, "SELECT count(*) FROM ledger")[0][0]) == 500
    # Work was shared: more than one process ran tasks.
    assert len({e[2] for e in executions}) >= 2


def test_sigkill_after_the_body_commits_the_effect_exactly_once(
    db: str, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    task_id = scheduler.submit("zombie", {"mode": "succeed"})
    victim = workers.start(concurrency=1, lease=1)
    bodies = tmp_path / "bodies"
    wait_for(lambda: bodies.exists() and bodies.read_text().count("\n") >= 1, "the body to run")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    # The body ran; the success (and its effect, and its child) did not commit.
    assert query(db, "SELECT count(*) FROM ledger")[0][0] == 0
    assert scheduler.get(task_id).state is TaskState.RUNNING

    workers.start(concurrency=2, lease=1)
    wait_for(lambda: scheduler.get(task_id).state is TaskState.SUCCEEDED, "recovery")
    task = scheduler.get(task_id)
    assert task.attempts == 2 and task.result["attempt"] == 2
    assert query(db, "SELECT task_id, attempt FROM ledger WHERE task_id = ?", task_id) == [
        (task_id, 2)
    ]
    history = [(e.state, e.attempt) for e in scheduler.history(task_id)]
    assert (TaskState.RETRY_WAIT, 1) in history  # the reclaim counted the lost attempt
    reclaim = next(e for e in scheduler.history(task_id) if e.state is TaskState.RETRY_WAIT)
    assert reclaim.detail is not None and reclaim.detail.startswith("lease of ")
    wait_for(
        lambda: len(scheduler.list_tasks(name="record", state=TaskState.SUCCEEDED)) == 1,
        "the child",
    )
    assert [t.args for t in scheduler.list_tasks(name="record")] == [{"n": -2}]


@pytest.mark.parametrize(
    "case",
    [
        ("succeed", TaskState.SUCCEEDED, "success"),
        ("fail", TaskState.SUCCEEDED, "failure"),
        ("cancel", TaskState.CANCELLED, "cancel acknowledgement"),
    ],
)
def test_sigstop_zombie_cannot_commit_effect_or_outcome(
    db: str,
    workers: Workers,
    scheduler: Scheduler,
    tmp_path: Path,
    case: tuple[str, TaskState, str],
) -> None:
    """Paused past its lease while another worker takes over, the zombie's success,
    failure or cancel acknowledgement, its effect and its child are all refused."""
    mode, rescued, refused = case
    task_id = scheduler.submit("zombie", {"mode": mode})
    zombie = workers.start(concurrency=1, lease=1)
    bodies = tmp_path / "bodies"
    wait_for(lambda: bodies.exists() and bodies.read_text().count("\n") >= 1, "the body to run")
    if mode == "cancel":
        assert scheduler.cancel(task_id) == "REQUESTED"
        wait_for((tmp_path / "saw-cancel").exists, "the zombie to see the request")
    # Paused while it holds no lock: a process stopped inside a write transaction
    # would block every writer, which no queue on SQLite can help.
    wait_for(lambda: _paused_outside_a_write(zombie, db, task_id), "a pause outside a write")
    try:
        rescuer = workers.start(concurrency=1, lease=1)
        wait_for(lambda: scheduler.get(task_id).state is rescued, "the rescue")
    finally:
        (tmp_path / "release").touch()  # lets the zombie's first attempt finish
        zombie.send_signal(signal.SIGCONT)
    wait_for(lambda: f"the {refused} of task {task_id}" in workers.log(0), "the refusal")
    zombie.send_signal(signal.SIGTERM)
    assert zombie.wait(30) == 0
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0

    task = scheduler.get(task_id)
    history = scheduler.history(task_id)
    finals = [
        e
        for e in history
        if e.state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
    ]
    assert len(finals) == 1 and finals[0].state is rescued
    if rescued is TaskState.SUCCEEDED:
        assert (task.attempts, task.result["attempt"]) == (2, 2)
        assert query(db, "SELECT task_id, attempt FROM ledger WHERE task_id = ?", task_id) == [
            (task_id, 2)
        ]
        assert [t.args for t in scheduler.list_tasks(name="record")] == [{"n": -2}]
    else:
        # A requested cancellation is finalised by the reclaim, never retried.
        assert (task.attempts, task.result) == (1, None)
        assert query(db, "SELECT count(*) FROM ledger") == [(0,)]
        assert scheduler.list_tasks(name="record") == []


def _paused_outside_a_write(proc: subprocess.Popen[bytes], db: str, task_id: int) -> bool:
    """SIGSTOP ``proc``; if it was inside a write transaction, SIGCONT it and say False."""
    proc.send_signal(signal.SIGSTOP)
    if _task_row_writable(db, task_id):
        return True
    proc.send_signal(signal.SIGCONT)
    return False


def _task_row_writable(db: str, task_id: int) -> bool:
    if is_postgres_url(db):
        import psycopg  # noqa: PLC0415 - only for PostgreSQL

        with psycopg.connect(db) as pg:
            try:
                pg.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE NOWAIT", (task_id,))
            except psycopg.errors.LockNotAvailable:
                return False
            pg.rollback()
            return True
    lite = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        lite.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return False
    finally:
        lite.close()
    return True


def test_hosts_with_wrong_clocks_agree_on_leases_through_the_server_clock(
    pg_url: str, tmp_path: Path
) -> None:
    """Four workers whose host clocks are off by up to two hours, on PostgreSQL: each
    judges due times and leases by the server's clock, so none reclaims another's live
    lease, the slow one still finds work due, and every task runs once."""
    store = open_store(pg_url)
    ids = Scheduler(store).submit_many("slow", [{"seconds": 0.4} for _ in range(48)])
    store.close()
    env = {**os.environ, "DS_TEST_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.processes.skewed_worker",
                str(skew),
                "worker",
                "--db",
                pg_url,
                "--app",
                "tests.processes.app:registry",
                "--concurrency",
                "4",
                "--lease",
                "5",
                "--burst",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for skew in (-7200, -60, 60, 7200)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert count(pg_url, "state = 'SUCCEEDED'") == len(ids)
    reclaims = query(pg_url, "SELECT count(*) FROM task_events WHERE detail LIKE 'lease of %'")
    assert reclaims == [(0,)], "a worker judged a live lease expired by its own clock"
    assert query(pg_url, "SELECT max(attempts) FROM tasks") == [(1,)]
    owners = query(pg_url, "SELECT count(DISTINCT detail) FROM task_events WHERE state = 'RUNNING'")
    assert owners[0][0] >= 2, "the work was not shared"
