"""Shared helpers: a fixed 'now', timing, percentiles, child processes with their rusage."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from durablesched.store.sql.codec import from_db_time, to_db_time
from durablesched.store.sql.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2020, 1, 1, tzinfo=UTC)  # in the past: every task is due at once


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fresh(path: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


class Child:
    """A worker process started through benchmarks.launch, which reports its rusage."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.pid = int(json.loads(proc.stdout.readline())["pid"])

    def wait_rusage(self, timeout: float = 600) -> tuple[int, float, int]:
        """(exit status, cpu seconds, peak RSS in KiB) of the finished worker."""
        out, _ = self.proc.communicate(timeout=timeout)
        report = json.loads(out.strip().splitlines()[-1])
        return int(report["status"]), float(report["cpu"]), int(report["maxrss_kib"])

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            self.wait_rusage(30)


def worker(
    db: Path | str, *args: str, durability: str = "full", stderr: Path | None = None
) -> Child:
    """A worker process; its log goes to ``stderr`` if given, else nowhere."""
    log = None if stderr is None else stderr.open("w")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(  # noqa: S603 - our own command
        [
            sys.executable,
            "-m",
            "benchmarks.launch",
            sys.executable,
            "-m",
            "durablesched",
            "worker",
            "--db",
            str(db),
            "--app",
            "benchmarks.noop_app:registry",
            "--durability",
            durability,
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if log is None else log,
        text=True,
    )
    if log is not None:
        log.close()  # the child has its own copy
    return Child(proc)


def run_rate_since(store: SQLiteStore, started: datetime, n: int) -> float:
    """Tasks/s of the ``n`` tasks a worker ran since ``started``, from the first claim to
    the last finish as ``store``'s tables record them; closes ``store``. Read through the
    store's own connections: a second way into the file from this process is what
    SQLite's POSIX locks cannot tell apart."""
    with store.engine.connect() as conn:
        first = conn.exec_driver_sql(
            "SELECT min(at) FROM task_events WHERE state = 'RUNNING' AND at > ?",
            (to_db_time(started),),
        ).scalar_one()
        last, done = conn.exec_driver_sql(
            "SELECT max(finished_at), count(*) FROM tasks WHERE state = 'SUCCEEDED' "
            "AND finished_at > ?",
            (to_db_time(started),),
        ).one()
        conn.rollback()
    store.close()
    assert done == n, f"{done} of {n}"
    return n / (from_db_time(last) - from_db_time(first)).total_seconds()
