"""Contention: many processes submitting and claiming on one file at once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import DEADLINE, ROOT, Workers, count, query, wait_for

pytestmark = pytest.mark.processes

SUBMITTERS, CLAIMERS = 8, 4
SECONDS = 2.0


def test_eight_submitters_and_four_workers_lose_nothing_and_never_see_locked(
    db: str, workers: Workers, tmp_path: Path
) -> None:
    started = time.monotonic()
    claimers = [workers.start(concurrency=2, lease=5) for _ in range(CLAIMERS)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    submitters = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.processes.submitter", str(db), str(SECONDS)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(SUBMITTERS)
    ]
    ids: list[int] = []
    submit_retries = 0
    for submitter in submitters:
        out, err = submitter.communicate(timeout=DEADLINE + SECONDS)
        assert submitter.returncode == 0, err
        assert "locked" not in err
        report = json.loads(out)
        ids.extend(report["ids"])
        submit_retries += report["busy_retries"]
    assert len(ids) == len(set(ids))

    def done() -> int:
        return count(db, "state = 'SUCCEEDED'")

    wait_for(lambda: done() == len(ids), f"all {len(ids)} tasks to succeed", timeout=120)
    wall = time.monotonic() - started
    for proc in claimers:
        proc.send_signal(signal.SIGTERM)
    worker_retries = 0
    for index, proc in enumerate(claimers):
        assert proc.wait(DEADLINE) == 0
        log = workers.log(index)
        assert "locked" not in log and "Traceback" not in log, log
        worker_retries += int(re.findall(r"busy database: (\d+)", log)[-1])
    stored = {r[0] for r in query(db, "SELECT id FROM tasks")}
    [(executions,)] = query(db, "SELECT count(*) FROM ledger")
    assert stored == set(ids)
    assert executions == len(ids)
    print(
        f"\ncontention: {SUBMITTERS} submitters and {CLAIMERS} workers, {len(ids)} tasks, "
        f"busy retries: {submit_retries} submitting, {worker_retries} claiming, {wall:.1f}s"
    )
