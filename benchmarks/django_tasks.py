"""Django's task API on durablesched against django-tasks-db, on one SQLite file each
(WAL, ``synchronous=FULL`` on both), same machine, same run (issue 20's targets).

For each system: a fresh database, ``migrate``, N no-op tasks enqueued through
``Task.enqueue()`` (each its own commit, as a view would), then drained by
worker processes in burst/batch mode. Drain throughput is N over the time from
the first task's start to the last one's finish, read from each system's own
rows (worker start-up is left out, for both); the wall time to drain, start-up
included, is shown beside it. Plain durablesched (its own worker, no Django)
drains the same N at 8 slots, for the wrapper's cost.

Run it where Django 6 and django-tasks-db are installed (Python 3.12 or newer:
``.venv-django/bin/pip install -e '.[django,bench]'``)::

    .venv-django/bin/python -m benchmarks.django_tasks [--tasks 5000] [--out FILE.md]

Not part of ./scripts/bench: it takes minutes, and needs the Django virtualenv.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from durablesched import Scheduler, SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = "benchmarks.django_project.settings"
#: Every process the benchmark starts must finish within this (seconds).
LIMIT = 1800


@dataclass(frozen=True)
class Drain:
    """How one configuration drained the queue."""

    label: str
    tasks: int
    seconds: float  # first start to last finish, from the rows
    wall: float  # workers started to all exited

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds


def _env(db: Path, backend: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "BENCH_DB": str(db),
        "BENCH_BACKEND": backend,
        "PYTHONPATH": str(ROOT),
    }


def _run(args: Sequence[str], env: dict[str, str]) -> str:
    done = subprocess.run(  # noqa: S603 - our own commands
        [sys.executable, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _fresh(directory: Path, name: str, backend: str) -> tuple[Path, dict[str, str]]:
    db = directory / f"{name}.db"
    env = _env(db, backend)
    _run(["-m", "django", "migrate", "-v", "0"], env)
    return db, env


def _enqueue(env: dict[str, str], count: int) -> float:
    """Tasks enqueued per second through Task.enqueue()."""
    seconds = float(_run(["-m", "benchmarks.django_project.enqueue", str(count)], env))
    return (count - 1) / seconds


def _workers(commands: list[list[str]], env: dict[str, str]) -> float:
    """Start every worker at once; the wall time until all have exited."""
    started = time.perf_counter()
    processes = [
        subprocess.Popen(  # noqa: S603 - our own commands
            [sys.executable, *c],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in commands
    ]
    for process in processes:
        _, err = process.communicate(timeout=LIMIT)
        if process.returncode != 0:
            raise RuntimeError(f"a worker failed:\n{err}")
    return time.perf_counter() - started


def _span(db: Path, query: str) -> tuple[int, float]:
    """(tasks done, seconds from the first start to the last finish) by ``query``."""
    with sqlite3.connect(db) as conn:
        done, first, last = conn.execute(query).fetchone()
    conn.close()
    return done, (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()


OURS_SPAN = (
    "SELECT (SELECT count(*) FROM tasks WHERE state = 'SUCCEEDED'), "
    "(SELECT min(at) FROM task_events WHERE state = 'RUNNING'), "
    "(SELECT max(finished_at) FROM tasks)"
)
THEIRS_SPAN = (
    "SELECT count(*), min(started_at), max(finished_at) "
    "FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'"
)


def ours(directory: Path, count: int, processes: int, slots: int) -> tuple[float, Drain]:
    db, env = _fresh(directory, f"ours-{processes}x{slots}", "durablesched")
    enqueue = _enqueue(env, count)
    command = ["-m", "django", "durablesched_worker", "--burst", "--burst-wait", "0",
               "--concurrency", str(slots)]  # fmt: skip
    wall = _workers([command] * processes, env)
    done, seconds = _span(db, OURS_SPAN)
    assert done == count, f"durablesched ran {done} of {count}"
    label = f"durablesched, {processes} worker{'s' if processes > 1 else ''} x {slots} slots"
    return enqueue, Drain(label, count, seconds, wall)


def theirs(directory: Path, count: int, processes: int) -> tuple[float, Drain]:
    db, env = _fresh(directory, f"theirs-{processes}", "db")
    enqueue = _enqueue(env, count)
    command = ["-m", "django", "db_worker", "--batch", "--no-startup-delay", "--interval", "0"]
    wall = _workers([command] * processes, env)
    done, seconds = _span(db, THEIRS_SPAN)
    assert done == count, f"django-tasks-db ran {done} of {count}"
    label = f"django-tasks-db db_worker x {processes}"
    return enqueue, Drain(label, count, seconds, wall)


def plain(directory: Path, count: int, slots: int) -> Drain:
    """durablesched without Django: submitted in one batch, drained by its own worker."""
    db = directory / "plain.db"
    store = SQLiteStore(db)
    try:
        Scheduler(store).submit_many("noop", [{}] * count)
    finally:
        store.close()
    command = ["-m", "durablesched", "worker", "--db", str(db), "--app", "benchmarks.noop_app",
               "--burst", "--burst-wait", "0", "--concurrency", str(slots),
               "--log-level", "warning"]  # fmt: skip
    wall = _workers([command], {**os.environ, "PYTHONPATH": str(ROOT)})
    done, seconds = _span(db, OURS_SPAN)
    assert done == count, f"plain durablesched ran {done} of {count}"
    return Drain(f"plain durablesched (no Django), 1 worker x {slots} slots", count, seconds, wall)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    n = args.tasks
    with tempfile.TemporaryDirectory(prefix="durablesched-django-bench-") as tmp:
        directory = Path(tmp)
        enqueues: dict[str, float] = {}
        drains: list[Drain] = []
        for processes in (1, 2, 4):
            rate, drain = theirs(directory, n, processes)
            enqueues.setdefault("django-tasks-db", rate)
            drains.append(drain)
        for processes, slots in ((1, 1), (1, 8), (2, 8)):
            rate, drain = ours(directory, n, processes, slots)
            enqueues.setdefault("durablesched", rate)
            drains.append(drain)
        base = plain(directory, n, 8)
    report = _report(n, enqueues, drains, base)
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


def _report(n: int, enqueues: dict[str, float], drains: list[Drain], base: Drain) -> str:
    theirs_one = drains[0]
    theirs_best = max(drains[:3], key=lambda d: d.rate)
    ours_one = drains[3]
    ours_best = max(drains[3:], key=lambda d: d.rate)
    ours_eight = drains[4]
    lines = [
        f"# Django tasks: durablesched against django-tasks-db ({n:,} no-op tasks, SQLite FULL)",
        "",
        "| enqueue through `Task.enqueue()` | tasks/s |",
        "| --- | ---: |",
        *(f"| {name} | {rate:,.0f} |" for name, rate in enqueues.items()),
        "",
        "| drain | tasks/s (first start to last finish) | wall s (start-up included) |",
        "| --- | ---: | ---: |",
        *(f"| {d.label} | {d.rate:,.0f} | {d.wall:.1f} |" for d in [*drains, base]),
        "",
        "| target (issue 20) | measured | met |",
        "| --- | ---: | --- |",
        _target("one task at a time: at least 4x db_worker", ours_one.rate / theirs_one.rate, 4),
        _target("best against best: at least 10x", ours_best.rate / theirs_best.rate, 10),
        _target(
            "enqueue at least as fast",
            enqueues["durablesched"] / enqueues["django-tasks-db"],
            1,
        ),
        _target(
            "the Django wrapper at 8 slots: at least 0.75x plain", ours_eight.rate / base.rate, 0.75
        ),
    ]
    return "\n".join(lines) + "\n"


def _target(what: str, ratio: float, needed: float) -> str:
    return f"| {what} | {ratio:.2f}x | {'yes' if ratio >= needed else 'no'} |"


if __name__ == "__main__":
    raise SystemExit(main())
