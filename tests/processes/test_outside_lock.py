"""Issue 17 item 3: a lock held from outside longer than a lease runs no live task twice."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from durablesched import Scheduler

from .conftest import Workers, count, wait_for

pytestmark = pytest.mark.processes

LEASE = 1.5


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_sqlite3_shell_holding_the_lock_past_the_leases_makes_nothing_run_twice(
    db: str, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    ids = [scheduler.submit("until_go") for _ in range(4)]
    for _ in range(2):
        workers.wait_started(workers.start(concurrency=2, lease=LEASE))
    executions = tmp_path / "executions"
    wait_for(
        lambda: executions.exists() and len(executions.read_text().splitlines()) == 4,
        "all four tasks to start",
    )
    shell = sqlite3.connect(db, isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")  # a sqlite3 shell left inside a write transaction
    threading.Event().wait(3 * LEASE)  # the fault itself: held for three leases
    shell.execute("COMMIT")
    shell.close()
    (tmp_path / "go").touch()
    wait_for(lambda: count(db, "state = 'SUCCEEDED'") == 4, "all four to succeed")
    starts = sorted(line.split()[:2] for line in executions.read_text().splitlines())
    assert starts == sorted([str(i), "1"] for i in ids)  # each task started once
