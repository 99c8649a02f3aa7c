"""The workers table with real worker processes: an idle worker stays seen, a worker
killed with SIGKILL is shown as gone once its lease passes unseen, and one that exits
cleanly (a signal, the end of a burst) removes its row; ``durablesched metrics --serve``
shows the live one over HTTP."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durablesched import Scheduler, WorkerInfo

from .conftest import DEADLINE, ROOT, Workers, wait_for

pytestmark = pytest.mark.processes

LEASE = 1.0


def _row(scheduler: Scheduler, pid: int) -> WorkerInfo | None:
    rows = [w for w in scheduler.workers(include_gone=True) if w.pid == pid]
    return rows[0] if rows else None


def test_a_killed_worker_is_shown_gone_within_its_lease_and_a_live_one_stays(
    db: str, workers: Workers, scheduler: Scheduler
) -> None:
    proc = workers.start("--queue", "mail=2", "--queue", "default=1", lease=LEASE)
    wait_for(lambda: _row(scheduler, proc.pid) is not None, "the worker to register")
    first = _row(scheduler, proc.pid)
    assert first is not None
    assert (first.queues, first.concurrency, first.lease.total_seconds()) == (
        {"mail": 2, "default": 1},
        3,
        LEASE,
    )
    # Idle, it heartbeats all the same: seen again later than a lease after it started.
    wait_for(
        lambda: (
            (row := _row(scheduler, proc.pid)) is not None
            and row.last_seen > first.last_seen + first.lease
        ),
        "an idle heartbeat",
    )
    assert [w.id for w in scheduler.workers()] == [first.id]

    proc.send_signal(signal.SIGKILL)
    assert proc.wait(DEADLINE) == -signal.SIGKILL
    killed = _row(scheduler, proc.pid)
    assert killed is not None
    # Gone as soon as its lease passes unseen (bounded poll: nothing moves it now).
    wait_for(lambda: not killed.alive(datetime.now(UTC)), "the lease to pass")
    assert scheduler.workers() == []
    assert _row(scheduler, proc.pid) == killed  # the row stays, never seen again
    listed = subprocess.run(
        [sys.executable, "-m", "durablesched", "workers", "--all", "--json", "--db", db],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=True,
    )
    assert [(w["id"], w["pid"], w["state"]) for w in json.loads(listed.stdout)] == [
        (killed.id, proc.pid, "gone")
    ]


def test_a_worker_exiting_cleanly_removes_its_row(
    db: str, workers: Workers, scheduler: Scheduler
) -> None:
    proc = workers.start(lease=LEASE)
    workers.wait_started(proc)
    wait_for(lambda: _row(scheduler, proc.pid) is not None, "the worker to register")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 0
    assert scheduler.workers(include_gone=True) == []

    burst = workers.start("--burst", "--burst-wait", "0", lease=LEASE)
    assert burst.wait(DEADLINE) == 0
    assert scheduler.workers(include_gone=True) == []


def test_metrics_served_over_http_show_the_live_worker(
    db: str, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    proc = workers.start(lease=LEASE)
    wait_for(lambda: _row(scheduler, proc.pid) is not None, "the worker to register")
    with socket.socket() as probe:  # a free port (another process could take it: rare)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = (tmp_path / "metrics.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "durablesched", "metrics", "--db", db, "--serve", str(port)],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: "serving metrics at" in (tmp_path / "metrics.log").read_text(), "serving")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            body = r.read().decode()
        assert "durablesched_workers_alive 1.0" in body.splitlines()
        server.send_signal(signal.SIGTERM)
        assert server.wait(DEADLINE) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(DEADLINE)
        out.close()
