"""Several worker processes on one file: once each, fenced, crash-safe."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from durablesched import Scheduler, TaskState

from .conftest import Workers, wait_for

pytestmark = pytest.mark.processes


def query(db: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(sql, params).fetchall()


def count_state(db: Path, state: str) -> int:
    return int(query(db, "SELECT count(*) FROM tasks WHERE state = ?", state)[0][0])


def test_three_processes_run_500_tasks_exactly_once(
    db: Path, workers: Workers, scheduler: Scheduler, tmp_path: Path
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
    # One claim per task, never a second live lease.
    claims = query(
        db, "SELECT task_id, count(*) FROM task_events WHERE state = 'RUNNING' GROUP BY task_id"
    )
    assert {c[1] for c in claims} == {1}
    assert len(claims) == 500
    assert int(query(db, "SELECT count(*) FROM ledger")[0][0]) == 500
    # Work was shared: more than one process ran tasks.
    assert len({e[2] for e in executions}) >= 2


def test_sigkill_after_the_body_commits_the_effect_exactly_once(
    db: Path, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    task_id = scheduler.submit("hang_once")
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


def test_sigstop_zombie_cannot_commit_effect_or_outcome(
    db: Path, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    task_id = scheduler.submit("hang_once")
    zombie = workers.start(concurrency=1, lease=1)
    bodies = tmp_path / "bodies"
    wait_for(lambda: bodies.exists() and bodies.read_text().count("\n") >= 1, "the body to run")
    zombie.send_signal(signal.SIGSTOP)
    try:
        rescuer = workers.start(concurrency=1, lease=1)
        wait_for(lambda: scheduler.get(task_id).state is TaskState.SUCCEEDED, "the rescue")
        assert scheduler.get(task_id).result["attempt"] == 2
    finally:
        (tmp_path / "release").touch()  # lets the zombie's first attempt finish
        zombie.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "discarded" in workers.log(0) or "lease lost" in workers.log(0),
        "the zombie to notice",
    )
    # Give the zombie its chance to write: stop it gracefully and wait for it to exit.
    zombie.send_signal(signal.SIGTERM)
    assert zombie.wait(30) == 0
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    task = scheduler.get(task_id)
    assert (task.state, task.attempts, task.result["attempt"]) == (TaskState.SUCCEEDED, 2, 2)
    assert query(db, "SELECT task_id, attempt FROM ledger WHERE task_id = ?", task_id) == [
        (task_id, 2)
    ]
    successes = [e for e in scheduler.history(task_id) if e.state is TaskState.SUCCEEDED]
    assert len(successes) == 1
    assert [t.args for t in scheduler.list_tasks(name="record")] == [{"n": -2}]
    assert os.path.exists(tmp_path / "release")
