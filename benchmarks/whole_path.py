"""Issue 22's figures: the whole path as a user meets it, measured from outside.

Every worker here is the ``durablesched worker`` command exec'd as a user types it,
huey's its own consumer, and the baselines are measured in the same run:

- the user's path: no-op tasks through the CLI in burst mode, start-up and exit
  included, against huey's consumer, from just before exec;
- CPU-bound tasks (``benchmarks.cpu_work``): a plain loop, our workers in one and two
  processes, huey's consumer with one and two processes;
- start-up: exec to the first claim, against ``python -c "import sqlalchemy"``.

Each function measures both sides of its ratios in interleaved rounds (or pairs) and
returns the medians of its figures and the medians of the rounds' ratios.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durablesched import Scheduler, SQLiteStore
from durablesched.store.sql.codec import from_db_time

from . import ours, peers
from .common import (
    ROOT,
    bench_env,
    fresh,
    interleaved,
    median,
    median_rate,
    round_ratios,
    succeeded,
    worker_command,
)
from .cpu_work import VARIABLE, calibrate

#: Figure name -> its value; target key -> the median of the rounds' ratios.
Figures = dict[str, Any]
Ratios = dict[str, float]


def user_path(path: Path, n: int, rounds: int, *, huey: bool) -> tuple[Figures, Ratios]:
    """Target 5: ``n`` no-op tasks/s through ``durablesched worker --burst`` (8 slots)
    from just before exec to its exit, against huey's consumer (8 threads) from just
    before exec until its queue is empty; ``rounds`` interleaved rounds."""
    cases: dict[str, Callable[[], float]] = {"path_cli_burst_8slots": lambda: cli_burst(path, n)}
    if huey:
        huey_path = path.with_name(f"{path.name}.huey")
        cases["path_huey_8threads"] = lambda: huey_burst(huey_path, n)
    runs = interleaved(cases, rounds)
    ratios = round_ratios({"W5": ("path_cli_burst_8slots", "path_huey_8threads")}, runs)
    return {name: median_rate(rates) for name, rates in runs.items()}, ratios


def cli_burst(path: Path, n: int, slots: int = 8) -> float:
    """Tasks/s of one burst worker over ``n`` no-op tasks: wall time from exec to exit."""
    store = SQLiteStore(fresh(path))
    Scheduler(store).submit_many("noop", [{} for _ in range(n)])
    store.close()
    argv = ["--burst", "--burst-wait", "0", "--concurrency", str(slots), "--log-level", "warning"]
    start = time.perf_counter()
    _run(worker_command(path, *argv, app="benchmarks.noop_app"))
    wall = time.perf_counter() - start
    assert succeeded(path) == n, f"only {succeeded(path)} of {n} tasks succeeded"
    return n / wall


def huey_burst(path: Path, n: int, threads: int = 8) -> float:
    """huey's side of :func:`cli_burst`: from exec of its consumer to an empty queue.

    huey has no burst mode: its consumer is stopped once its queue is seen empty, so
    its exit and its last tasks' run are not in its time (they are in ours)."""
    run = peers.huey_drain(path, n, workers=threads)
    return n / (run.last - run.started)


def cpu_bound(path: Path, n: int, rounds: int, *, huey: bool) -> tuple[Figures, Ratios]:
    """Target 2: ``n`` tasks of about 1 ms of pure Python each, in ``rounds``
    interleaved rounds: a plain loop in a child process (timed inside it), our workers
    (rates from the table), huey's consumer with process workers (rates from its
    pending count). The loop length is calibrated here once and given to every side."""
    loops = calibrate()
    env = {VARIABLE: str(loops)}
    huey_path = path.with_name(f"{path.name}.huey")

    def ours_cpu(processes: int, slots: int) -> float:
        rate = ours.end_to_end(
            path, n, slots, processes, "full", task="cpu", app="benchmarks.cpu_app", env=env
        )
        return rate["tasks_per_s"]

    def huey_cpu(processes: int) -> float:
        run = peers.huey_drain(
            huey_path,
            n,
            workers=processes,
            kind="process",
            app="benchmarks.huey_cpu_app",
            task="cpu",
            env=env,
        )
        return run.drain_rate(n)

    cases: dict[str, Callable[[], float]] = {
        "cpu_plain_loop": lambda: plain_loop(n, env),
        "cpu_ours_1proc_1slot": lambda: ours_cpu(1, 1),
        "cpu_ours_1proc_2slots": lambda: ours_cpu(1, 2),
        "cpu_ours_2proc_1slot": lambda: ours_cpu(2, 1),
    }
    if huey:
        cases["cpu_huey_1proc"] = lambda: huey_cpu(1)
        cases["cpu_huey_2proc"] = lambda: huey_cpu(2)
    runs = interleaved(cases, rounds)
    # Ours in one process against huey's: the better of 1 and 2 slots, by their medians.
    one_process = {1: "cpu_ours_1proc_1slot", 2: "cpu_ours_1proc_2slots"}
    slots = max(one_process, key=lambda s: median(runs[one_process[s]]))
    runs["cpu_ours_1proc_best"] = runs[one_process[slots]]
    ratios = round_ratios(
        {
            "W2a": ("cpu_ours_1proc_1slot", "cpu_plain_loop"),
            "W2b": ("cpu_ours_2proc_1slot", "cpu_ours_1proc_1slot"),
            "W2c_1proc": ("cpu_ours_1proc_best", "cpu_huey_1proc"),
            "W2c_2proc": ("cpu_ours_2proc_1slot", "cpu_huey_2proc"),
        },
        runs,
    )
    figures: Figures = {
        "cpu_task": {"loops": loops, "ms_in_plain_loop": 1e3 / median(runs["cpu_plain_loop"])}
    }
    figures |= {name: median_rate(rates) for name, rates in runs.items()}
    figures["cpu_ours_1proc_best"]["slots"] = slots
    return figures, ratios


def plain_loop(n: int, env: dict[str, str]) -> float:
    """Tasks/s of the work called ``n`` times in a loop in a child process, timed inside."""
    out = _run([sys.executable, "-m", "benchmarks.cpu_work", str(n)], env)
    return n / float(json.loads(out)["seconds"])


def startup(path: Path, pairs: int) -> tuple[Figures, Ratios]:
    """Target 4: exec to first claim of a burst worker on an up-to-date file holding
    one pending no-op task (and its exec to exit), against exec to exit of
    ``python -c "import sqlalchemy"``, in ``pairs`` pairs after one warm-up pair (so
    that neither side pays for compiling its modules' bytecode)."""
    claims: list[float] = []
    exits: list[float] = []
    imports: list[float] = []
    for i in range(pairs + 1):
        claim, exit_ = first_claim(path)
        imported = import_sqlalchemy()
        if i:
            claims.append(claim)
            exits.append(exit_)
            imports.append(imported)
    figures = {
        "startup_worker": {
            "first_claim_ms": median(claims) * 1e3,
            "exit_ms": median(exits) * 1e3,
            "pairs": pairs,
        },
        "startup_import_sqlalchemy": {"exit_ms": median(imports) * 1e3, "pairs": pairs},
    }
    ratios = {"W4": median([c / i for c, i in zip(claims, imports, strict=True)])}
    return figures, ratios


def first_claim(path: Path) -> tuple[float, float]:
    """Seconds from just before exec of a burst worker to its claim of the one pending
    task (the RUNNING line's time in the task's history), and to its exit."""
    store = SQLiteStore(fresh(path))  # created at head: the worker migrates nothing
    task_id = Scheduler(store).submit("noop")
    store.close()
    argv = ["--burst", "--burst-wait", "0"]
    start, started = time.time(), time.perf_counter()
    _run(worker_command(path, *argv, app="benchmarks.noop_app"))
    exited = time.perf_counter() - started
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (at,) = conn.execute(
            "SELECT at FROM task_events WHERE task_id = ? AND state = 'RUNNING'", (task_id,)
        ).fetchone()
    return from_db_time(at).timestamp() - start, exited


def import_sqlalchemy() -> float:
    """Seconds from just before exec of ``python -c "import sqlalchemy"`` to its exit."""
    start = time.perf_counter()
    _run([sys.executable, "-c", "import sqlalchemy"])
    return time.perf_counter() - start


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Exec ``argv`` from the repository with it on PYTHONPATH; its stdout, once it
    exited 0 (its stderr in the error otherwise)."""
    proc = subprocess.run(  # noqa: S603 - our own commands
        argv,
        cwd=ROOT,
        env=bench_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    command = " ".join(argv[1:4])
    assert proc.returncode == 0, f"{command} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout
