"""Shared helpers: a fixed 'now', percentiles, the worker's command and processes with
their rusage, rates read from a database's tables, interleaved rounds and their ratios."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import Callable
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


def bench_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH, so that a
    child can import ``benchmarks`` (its apps), plus ``extra``.

    Without PYTHONDONTWRITEBYTECODE, which some machines set: a child that compiled
    durablesched's modules from source on every start would time what no installed
    package does (pip compiles what it installs, as it did SQLAlchemy's).
    """
    path = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path, **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def worker_command(
    db: Path | str, *args: str, app: str = "benchmarks.noop_app:registry", durability: str = "full"
) -> list[str]:
    """``durablesched worker`` on ``db`` as this Python runs it: what a user types, exec'd."""
    return [
        sys.executable,
        "-m",
        "durablesched",
        "worker",
        "--db",
        str(db),
        "--app",
        app,
        "--durability",
        durability,
        *args,
    ]


def worker(
    db: Path | str,
    *args: str,
    durability: str = "full",
    stderr: Path | None = None,
    app: str = "benchmarks.noop_app:registry",
    env: dict[str, str] | None = None,
) -> Child:
    """A worker process; its log goes to ``stderr`` if given, else nowhere; ``env`` is
    added to this process's environment."""
    log = None if stderr is None else stderr.open("w")
    proc = subprocess.Popen(  # noqa: S603 - our own command
        [
            sys.executable,
            "-m",
            "benchmarks.launch",
            *worker_command(db, *args, app=app, durability=durability),
        ],
        cwd=ROOT,
        env=bench_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if log is None else log,
        text=True,
    )
    if log is not None:
        log.close()  # the child has its own copy
    return Child(proc)


def succeeded(db: Path) -> int:
    """How many tasks of the SQLite file ``db`` have succeeded."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (n,) = conn.execute("SELECT count(*) FROM tasks WHERE state = 'SUCCEEDED'").fetchone()
    return int(n)


def history_rate(db: Path, n: int) -> float:
    """Tasks/s from the first claim to the last finish as the tables of the SQLite file
    ``db`` record them, once its workers have exited; asserts that all ``n`` succeeded.
    Read from outside: the workers' own start-up and exit are not in it."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (first,) = conn.execute(
            "SELECT min(at) FROM task_events WHERE state = 'RUNNING'"
        ).fetchone()
        last, done = conn.execute(
            "SELECT max(finished_at), count(*) FROM tasks WHERE state = 'SUCCEEDED'"
        ).fetchone()
    assert done == n, f"only {done} of {n} tasks succeeded"
    return n / (from_db_time(last) - from_db_time(first)).total_seconds()


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


def interleaved(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each case's figure once a round, the cases in turn. On a shared machine speed
    drifts by a third within minutes: a slow spell then hits every side of a ratio."""
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            runs[name].append(case())
    return runs


def round_ratios(
    pairs: dict[str, tuple[str, str]], runs: dict[str, list[float]]
) -> dict[str, float]:
    """Target -> the median of the rounds' ratios of its (numerator, denominator)
    figures, for the targets whose two figures both ran (a peer may be missing)."""
    return {
        target: median([a / b for a, b in zip(runs[num], runs[den], strict=True)])
        for target, (num, den) in pairs.items()
        if num in runs and den in runs
    }


def median_rate(rates: list[float]) -> dict[str, float]:
    return {"tasks_per_s": median(rates), "runs": len(rates)}
