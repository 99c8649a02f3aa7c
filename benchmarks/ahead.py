"""Issue 29: claim ahead (the default) against claims only into free slots (``--ahead 0``).

    python -m benchmarks.ahead            # the full run: several minutes, a quiet machine
    python -m benchmarks.ahead --smoke    # tiny sizes: the harness still works
    python -m benchmarks.ahead --only latency --rounds 5   # one part, sides in turn

Every worker is the ``durablesched worker`` command as a user types it, run with
``--ahead 0`` and with the default (``--ahead 8 --ahead-window 0.05``) in
interleaved rounds of the same run, huey's consumer beside them where issue 22's
table compares with it (if huey is installed):

- W5, the user's path: no-op tasks, 8 slots, exec to exit, against huey's 8 threads;
- W2, CPU-bound tasks of about 1 ms: a plain loop, 1 process with 1 and 2 slots,
  2 processes of 1 slot, huey's consumer with 1 and 2 processes;
- long tasks: 2 workers x 4 slots, 16 tasks of 2 s submitted at once: the makespan
  (target <= 4.5 s: no task waits behind another while a slot is free anywhere);
- mixed: 1,000 tasks of 5 ms then 8 of 2 s on 2 workers x 4 slots: how long after
  the last short task ended the last long one started (target <= 100 ms), and the
  makespan;
- latency: submit-to-start of one task at a time on an idle worker, p50 (target:
  within 10 % of ``--ahead 0``), the sides in turn for ``--rounds`` rounds: the
  ratio is the median of the rounds' ratios (``--only latency``: this part alone).

Prints one JSON object: each figure per side, and the ratios of the rounds' medians.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durablesched import Scheduler, SQLiteStore
from durablesched.store.sql.codec import from_db_time

from . import ours, peers
from .common import ROOT, bench_env, fresh, interleaved, median, round_ratios, worker_command
from .cpu_work import VARIABLE, calibrate
from .whole_path import huey_burst, plain_loop

#: The two sides: the worker's options for each.
SIDES = {"ahead0": ("--ahead", "0"), "default": ("--ahead", "8")}


class Sizes:
    def __init__(
        self,
        *,
        smoke: bool,
        rounds: int | None = None,
        noop: int | None = None,
        cpu: int | None = None,
        samples: int | None = None,
    ) -> None:
        self.noop = noop or (300 if smoke else 30_000)
        self.cpu = cpu or (60 if smoke else 5_000)
        self.rounds = rounds or (1 if smoke else 3)
        self.long_tasks, self.long_seconds = (16, 0.2) if smoke else (16, 2.0)
        self.short_tasks = 50 if smoke else 1_000
        self.samples = samples or (3 if smoke else 50)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument("--no-huey", action="store_true", help="leave huey out")
    parser.add_argument(
        "--rounds", type=int, help="interleaved rounds (more, shorter ones on a busy machine)"
    )
    parser.add_argument("--noop", type=int, help="no-op tasks per W5 run (30,000)")
    parser.add_argument("--cpu", type=int, help="CPU-bound tasks per W2 run (5,000)")
    parser.add_argument("--samples", type=int, help="tasks per latency run (50)")
    parser.add_argument(
        "--throughput-only", action="store_true", help="leave out long, mixed and latency"
    )
    parser.add_argument(
        "--only",
        choices=["latency"],
        help="this part alone: its sides in turn, --rounds times (3), one worker each",
    )
    args = parser.parse_args(argv)
    size = Sizes(
        smoke=args.smoke, rounds=args.rounds, noop=args.noop, cpu=args.cpu, samples=args.samples
    )
    huey = not args.no_huey and importlib.util.find_spec("huey") is not None
    tmp = Path(tempfile.mkdtemp(prefix="durablesched-ahead-"))
    result: dict[str, Any] = {"huey": huey, "smoke": args.smoke}
    if args.only == "latency":
        print(json.dumps(result | latency_rounds(tmp, size), indent=2))
        return 0
    runs = interleaved(_throughput_cases(tmp, size, huey=huey), size.rounds)
    result["figures"] = {name: median(rates) for name, rates in runs.items()}
    result["ratios"] = round_ratios(
        {
            "W5_default_over_huey": ("noop_8slots_default", "noop_huey_8threads"),
            "W5_ahead0_over_huey": ("noop_8slots_ahead0", "noop_huey_8threads"),
            "W5_default_over_ahead0": ("noop_8slots_default", "noop_8slots_ahead0"),
            "W2a_default_1slot_over_loop": ("cpu_1proc_1slot_default", "cpu_plain_loop"),
            "W2a_ahead0_1slot_over_loop": ("cpu_1proc_1slot_ahead0", "cpu_plain_loop"),
            "W2b_default_2proc_over_1proc": ("cpu_2proc_1slot_default", "cpu_1proc_1slot_default"),
            "W2b_ahead0_2proc_over_1proc": ("cpu_2proc_1slot_ahead0", "cpu_1proc_1slot_ahead0"),
            "W2c_default_1proc_over_huey": ("cpu_1proc_2slots_default", "cpu_huey_1proc"),
            "W2c_ahead0_1proc_over_huey": ("cpu_1proc_2slots_ahead0", "cpu_huey_1proc"),
            "W2c_default_2proc_over_huey": ("cpu_2proc_1slot_default", "cpu_huey_2proc"),
            "W2c_ahead0_2proc_over_huey": ("cpu_2proc_1slot_ahead0", "cpu_huey_2proc"),
        },
        runs,
    )
    if args.throughput_only:
        print(json.dumps(result, indent=2))
        return 0
    for side, options in SIDES.items():
        result[f"long_{side}"] = long_tasks(tmp / f"long-{side}.db", size, options)
        result[f"mixed_{side}"] = mixed(tmp / f"mixed-{side}.db", size, options)
    # In turn, round by round: one run per side minutes apart compared the machine's
    # moments (the disk's fsync, the change watcher's 1 ms steps), not the sides.
    rounds = latency_rounds(tmp, size)
    result["latency"] = rounds
    ratio = rounds["latency_p50_default_over_ahead0"]
    result["ratios"]["latency_p50_default_over_ahead0"] = ratio
    print(json.dumps(result, indent=2))
    return 0


def _throughput_cases(tmp: Path, size: Sizes, *, huey: bool) -> dict[str, Callable[[], float]]:
    loops = calibrate()
    cpu_env = {VARIABLE: str(loops)}
    cases: dict[str, Callable[[], float]] = {}
    for side, options in SIDES.items():
        ahead = dict(zip(options[::2], options[1::2], strict=True))
        env = {"DURABLESCHED_AHEAD": ahead.get("--ahead", "8")}
        path = tmp / f"noop-{side}.db"
        cases[f"noop_8slots_{side}"] = functools.partial(noop_burst, path, size.noop, options)
        for processes, slots in ((1, 1), (1, 2), (2, 1)):
            name = f"cpu_{processes}proc_{slots}slot{'s' if slots > 1 else ''}_{side}"
            cases[name] = _cpu_case(tmp / f"{name}.db", size.cpu, processes, slots, cpu_env | env)
    cases["cpu_plain_loop"] = lambda: plain_loop(size.cpu, cpu_env)
    if huey:
        cases["noop_huey_8threads"] = lambda: huey_burst(tmp / "noop.huey", size.noop)

        def huey_cpu(processes: int) -> float:
            return peers.huey_drain(
                tmp / "cpu.huey",
                size.cpu,
                workers=processes,
                kind="process",
                app="benchmarks.huey_cpu_app",
                task="cpu",
                env=cpu_env,
            ).drain_rate(size.cpu)

        cases["cpu_huey_1proc"] = lambda: huey_cpu(1)
        cases["cpu_huey_2proc"] = lambda: huey_cpu(2)
    return cases


def _cpu_case(
    path: Path, n: int, processes: int, slots: int, env: dict[str, str]
) -> Callable[[], float]:
    def case() -> float:
        rate = ours.end_to_end(
            path, n, slots, processes, "full", task="cpu", app="benchmarks.cpu_app", env=env
        )
        return rate["tasks_per_s"]

    return case


def noop_burst(path: Path, n: int, options: tuple[str, ...], slots: int = 8) -> float:
    """Tasks/s of one burst worker over ``n`` no-op tasks: exec to exit (issue 22's W5)."""
    store = SQLiteStore(fresh(path))
    Scheduler(store).submit_many("noop", [{} for _ in range(n)])
    store.close()
    argv = ["--burst", "--burst-wait", "0", "--concurrency", str(slots), "--log-level", "warning"]
    start = time.perf_counter()
    _wait_all([_start(path, [*argv, *options], app="benchmarks.noop_app")])
    return n / (time.perf_counter() - start)


def long_tasks(path: Path, size: Sizes, options: tuple[str, ...]) -> dict[str, float]:
    """2 workers x 4 slots over tasks of ``long_seconds`` submitted at once: the makespan
    from the first start to the last finish, and the ideal (two waves)."""
    store = SQLiteStore(fresh(path))
    Scheduler(store).submit_many(
        "sleep", [{"seconds": size.long_seconds} for _ in range(size.long_tasks)]
    )
    store.close()
    _run_until_done(path, options, size.long_tasks)
    rows = _rows(path, "SELECT started_at, finished_at FROM tasks")
    first = min(from_db_time(r[0]) for r in rows)
    last = max(from_db_time(r[1]) for r in rows)
    return {
        "makespan_s": (last - first).total_seconds(),
        "ideal_s": size.long_seconds * -(-size.long_tasks // 8),
    }


def mixed(path: Path, size: Sizes, options: tuple[str, ...]) -> dict[str, float]:
    """Short tasks (5 ms), then 8 long ones, on 2 workers x 4 slots: how late the last
    long task started after the last short one ended, and the makespan."""
    store = SQLiteStore(fresh(path))
    scheduler = Scheduler(store)
    scheduler.submit_many("sleep", [{"seconds": 0.005} for _ in range(size.short_tasks)])
    scheduler.submit_many("sleep", [{"seconds": size.long_seconds} for _ in range(8)])
    store.close()
    _run_until_done(path, options, size.short_tasks + 8)
    rows = _rows(path, "SELECT args, started_at, finished_at FROM tasks")
    short = [r for r in rows if json.loads(r[0])["seconds"] < size.long_seconds]
    long = [r for r in rows if json.loads(r[0])["seconds"] == size.long_seconds]
    short_end = max(from_db_time(r[2]) for r in short)
    long_start = max(from_db_time(r[1]) for r in long)
    first = min(from_db_time(r[1]) for r in rows)
    last = max(from_db_time(r[2]) for r in rows)
    return {
        "last_long_start_after_short_end_ms": (long_start - short_end).total_seconds() * 1e3,
        "makespan_s": (last - first).total_seconds(),
    }


def latency(path: Path, samples: int, options: tuple[str, ...]) -> dict[str, float]:
    """Submit one no-op task at a time to an idle worker (8 slots) and read, once it
    succeeded, how long after its submission it started (the table's times)."""
    fresh(path)
    store = SQLiteStore(path)
    scheduler = Scheduler(store)
    worker = _start(path, ["--concurrency", "8", "--log-level", "warning", *options])
    waits = []
    try:
        for _ in range(samples):
            time.sleep(0.05)  # the worker idle again (a benchmark, not a test)
            task_id = scheduler.submit("noop", {})
            scheduler.handle(task_id).result(timeout=30)
            task = scheduler.get(task_id)
            assert task is not None and task.started_at is not None
            waits.append((task.started_at - task.created_at).total_seconds() * 1e3)
    finally:
        worker.terminate()
        _wait_all([worker])
        # The handles' finish watcher too: left running, it watched this directory on
        # and woke at each write of the next run's database (the other side's), in the
        # process that submits it (3 to 13 % on its p50, measured in turn).
        scheduler.close()
        store.close()
    return {"p50_ms": statistics.median(waits), "max_ms": max(waits), "samples": len(waits)}


def latency_rounds(tmp: Path, size: Sizes) -> dict[str, Any]:
    """The latency part: each side's worker in turn, ``size.rounds`` times (every other
    round the other side first, so that a drift of the machine favours neither); each
    round's p50 per side, their medians, and the median of the rounds' ratios (each
    ratio of two runs taken one after the other)."""
    rounds: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(size.rounds):
        order = list(SIDES.items())
        for side, options in order if i % 2 == 0 else order[::-1]:
            figure = latency(tmp / f"latency-{side}-{i}.db", size.samples, options)
            rounds[side].append(figure["p50_ms"])
    ratios = [d / a for d, a in zip(rounds["default"], rounds["ahead0"], strict=True)]
    return {
        "latency_p50_ms_rounds": rounds,
        "latency_p50_ms": {side: statistics.median(p50s) for side, p50s in rounds.items()},
        "latency_p50_default_over_ahead0": statistics.median(ratios),
        "ratios_per_round": ratios,
    }


def _run_until_done(path: Path, options: tuple[str, ...], total: int) -> None:
    """2 workers of 4 slots, started together and left running (not in burst mode: a
    worker idle at the start must stay to take what the other gives back), stopped once
    every task succeeded."""
    argv = ["--concurrency", "4", "--log-level", "warning", *options]
    workers = [_start(path, argv, app="benchmarks.sleep_app") for _ in range(2)]
    try:
        while _succeeded(path) < total:
            time.sleep(0.05)  # polled from outside: a benchmark, not a test
    finally:
        for worker in workers:
            worker.terminate()
        _wait_all(workers)


def _succeeded(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (n,) = conn.execute("SELECT count(*) FROM tasks WHERE state = 'SUCCEEDED'").fetchone()
    return int(n)


def _start(
    path: Path, argv: list[str], app: str = "benchmarks.noop_app"
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - our own command
        worker_command(path, *argv, app=app),
        cwd=ROOT,
        env=bench_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"a worker exited {proc.returncode}: {err[-2000:]!r}"


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(sql).fetchall()
    assert rows and all(None not in r for r in rows), "a task did not finish"
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
