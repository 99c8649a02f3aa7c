"""Shared helpers: a fixed 'now', timing, percentiles, child processes with their rusage."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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


@dataclass
class Child:
    proc: subprocess.Popen[bytes]

    def wait_rusage(self, timeout: float = 600) -> tuple[int, float, int]:
        """(exit status, cpu seconds, peak RSS in KiB) of the finished child."""
        end = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss
            if time.monotonic() > end:
                self.proc.kill()
                raise TimeoutError("benchmark child did not finish")
            time.sleep(0.01)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(ChildProcessError):
            self.wait_rusage(30)


def worker(db: Path, *args: str, durability: str = "full") -> Child:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(  # noqa: S603 - our own command
        [
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return Child(proc)
