"""Issue 29: where a worker's microseconds per task go on the 1-slot path (W2a).

    python -m benchmarks.ahead_profile              # 2,000 CPU-bound tasks of ~1 ms
    python -m benchmarks.ahead_profile --noop       # no-op tasks: the worker's own cost
    python -m benchmarks.ahead_profile --cprofile   # also cProfile's top functions per side
    python -m benchmarks.ahead_profile --smoke      # tiny: the harness still works

No ``perf``: the worker runs in this process (as the CLI runs it: ``--burst``, the
CLI's thread switch interval, a file at ``durability="full"``) with ``ahead=0`` and
``ahead=8``, its methods wrapped in counters (``time.perf_counter_ns`` for the wall,
``time.thread_time_ns`` for the thread's CPU, both summed per phase and per thread,
each phase's own time only: what a phase nested in it took is its own row). A
thread's residual row (its wall not in any phase) is where it waited: for a task
thread, for its next task; for the committer, for outcomes; for the loop, asleep.

The table prints microseconds per task. Reading it: with one slot, a task's cost is
the task thread's wall per task; the task function's wall over the plain loop's
time per call is what other threads (the committer, the loop) took from it while
it ran (they hold the interpreter), and the rest of the task thread's rows are the
worker's path around the call. The instrumentation's own cost is given: the same
run without counters comes first, in tasks/s.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import pstats
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from durablesched import Scheduler, SQLiteStore, TaskRegistry, Worker
from durablesched.cli.worker import SWITCH_INTERVAL
from durablesched.store.sql import group_commit as sql_group_commit
from durablesched.store.sql import store as sql_store
from durablesched.store.sql.store import SQLStore
from durablesched.worker.attempt import AttemptRunner
from durablesched.worker.commit import GroupCommit
from durablesched.worker.committer import Committer
from durablesched.worker.leases import Leases
from durablesched.worker.slots import Slots
from durablesched.worker.threads import TaskThreads

from .common import fresh
from .cpu_work import calibrate, spin

#: (phase, owning class, method) wrapped in counters; the phase names are the table's.
PHASES: list[tuple[str, Any, str]] = [
    ("claim statement (loop)", SQLStore, "claim"),
    ("loop pass (rest)", Worker, "run_once"),
    ("heartbeat / reclaim", Leases, "run_once"),
    ("launch: hand claims to threads", Worker, "_launch"),
    ("context build (prepare)", AttemptRunner, "prepare"),
    # Calls per task: how often a claim went to a task thread through the queue (the
    # first, and each time the thread had found no claim ahead waiting: a dry spell).
    ("hop: a claim queued to a task thread", TaskThreads, "submit"),
    ("attempt start/end (execute_one)", Worker, "_execute_one"),
    ("attempt wrapper (args, outcome)", AttemptRunner, "run"),
    ("hand-over of the outcome", GroupCommit, "hand_over"),
    ("take the next claim ahead", Worker, "_next_waiting"),
    ("group commit: drain", GroupCommit, "drain"),
    ("group commit: gather (commit_delay)", GroupCommit, "_gather"),
    ("group commit: after the store", GroupCommit, "_record"),
    ("record_and_claim statements", SQLStore, "record_and_claim"),
    ("slots add/remove", Slots, "remove"),
    ("slots add/remove", Slots, "add"),
    ("store: starts of claims ahead", sql_store, "record_starts"),
    ("store: outcomes", sql_group_commit, "record_outcomes"),
    ("store: totals, finished", SQLStore, "_add_totals"),
    ("store: totals, finished", SQLStore, "_tell_finished"),
    ("store: claim (select, update, history)", sql_store, "claim_with_ahead"),
    ("store: claims from rows", sql_store, "claims_from_rows"),
]
#: The phase of the task's own function (wrapped in the registry below).
FUNCTION = "task function"
COMMIT = "COMMIT (fsync)"
#: The driver's own calls (SQLite's work, and taking the interpreter back after it).
DRIVER = "driver: sqlite3 execute"
RESIDUAL = "waiting (residual)"


class _Thread:
    """One thread's counters (no lock: only that thread writes them)."""

    __slots__ = ("calls", "cpu", "role", "stack", "wall")

    def __init__(self) -> None:
        self.role = role()
        #: [wall start, cpu start, wall of nested phases, cpu of nested phases]
        self.stack: list[list[int]] = []
        self.wall: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)


class Counters:
    """Per thread role and phase: calls, wall ns, CPU ns (each phase's own time).

    Each thread counts in its own dicts, summed when read. A phase costs about two
    clock reads and two reads of the thread's CPU clock (a system call each): a few
    microseconds, most of it counted in the phase that encloses it.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._threads: list[_Thread] = []
        self._lock = threading.Lock()

    def _mine(self) -> _Thread:
        mine: _Thread | None = getattr(self._local, "counts", None)
        if mine is None:
            mine = self._local.counts = _Thread()
            with self._lock:
                self._threads.append(mine)
        return mine

    def _sum(self, attr: str) -> dict[tuple[str, str], int]:
        total: dict[tuple[str, str], int] = defaultdict(int)
        for thread in self._threads:
            for name, value in getattr(thread, attr).items():
                total[thread.role, name] += value
        return total

    @property
    def wall(self) -> dict[tuple[str, str], int]:
        return self._sum("wall")

    @property
    def cpu(self) -> dict[tuple[str, str], int]:
        return self._sum("cpu")

    @property
    def calls(self) -> dict[tuple[str, str], int]:
        return self._sum("calls")

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its time counted as phase ``name``."""
        mine = self._mine()
        frame = _open(mine)
        try:
            return fn(*args, **kwargs)
        finally:
            _close(mine, frame, name)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The body counted as phase ``name`` (as :meth:`call` counts a call)."""
        mine = self._mine()
        frame = _open(mine)
        try:
            yield
        finally:
            _close(mine, frame, name)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        call = self.call

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            return call(name, fn, *args, **kwargs)

        return timed


def _open(mine: _Thread) -> list[int]:
    """A phase begun on this thread: its start times, and the time of phases nested in it."""
    frame = [time.perf_counter_ns(), time.thread_time_ns(), 0, 0]
    mine.stack.append(frame)
    return frame


def _close(mine: _Thread, frame: list[int], name: str) -> None:
    """A phase ended: its own time (less its nested phases') counted, and its whole time
    taken from the phase around it."""
    wall = time.perf_counter_ns() - frame[0]
    cpu = time.thread_time_ns() - frame[1]
    stack = mine.stack
    stack.pop()
    if stack:
        stack[-1][2] += wall
        stack[-1][3] += cpu
    mine.wall[name] += wall - frame[2]
    mine.cpu[name] += cpu - frame[3]
    mine.calls[name] += 1


def role() -> str:
    name = threading.current_thread().name
    if name.startswith("durablesched-task"):
        return "task"
    if name.startswith("durablesched-commit"):
        return "committer"
    if threading.current_thread() is threading.main_thread():
        return "loop"
    return "other"


@contextlib.contextmanager
def instrumented(
    counters: Counters | None, profiles: list[cProfile.Profile] | None
) -> Iterator[None]:
    """The worker's classes wrapped in ``counters`` (and each worker thread in a cProfile
    profile of its own, if ``profiles`` is a list), restored after."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(cls: Any, attr: str, value: Any) -> None:
        saved.append((cls, attr, vars(cls).get(attr)))
        setattr(cls, attr, value)

    if counters is not None:
        for name, cls, attr in PHASES:
            # A method of a base class is wrapped here and removed again after.
            patch(cls, attr, counters.wrap(name, vars(cls).get(attr, getattr(cls, attr))))

    def whole_thread(cls: type, attr: str) -> None:
        inner = cls.__dict__[attr]

        @functools.wraps(inner)
        def thread(*args: Any, **kwargs: Any) -> Any:
            profile = None
            if profiles is not None:
                profile = cProfile.Profile()
                profiles.append(profile)
                profile.enable()
            try:
                if counters is None:
                    return inner(*args, **kwargs)
                with counters.phase(RESIDUAL):
                    return inner(*args, **kwargs)
            finally:
                if profile is not None:
                    profile.disable()

        patch(cls, attr, thread)

    whole_thread(TaskThreads, "_loop")
    whole_thread(Committer, "_run")
    try:
        yield
    finally:
        for cls, attr, value in reversed(saved):
            if value is None:
                delattr(cls, attr)
            else:
                setattr(cls, attr, value)


def registry_for(counters: Counters | None, loops: int) -> TaskRegistry:
    registry = TaskRegistry()
    if counters is None:

        @registry.task("work")
        def work() -> None:
            spin(loops)

    else:

        @registry.task("work")
        def work() -> None:
            with counters.phase(FUNCTION):
                spin(loops)

    return registry


def one_run(
    path: Path,
    n: int,
    loops: int,
    ahead: int,
    *,
    counters: Counters | None = None,
    profiles: list[cProfile.Profile] | None = None,
    commit_delay: float = 0.002,
) -> float:
    """Seconds one burst worker of 1 slot takes over ``n`` tasks (exec not counted)."""
    store = SQLiteStore(fresh(path), durability="full")
    scheduler = Scheduler(store, registry=registry_for(counters, loops))
    scheduler.submit_many("work", [{} for _ in range(n)])
    if counters is not None:
        dialect = store.engine.dialect
        commit = dialect.do_commit

        def do_commit(connection: Any) -> None:
            with counters.phase(COMMIT):
                commit(connection)

        setattr(dialect, "do_commit", do_commit)  # noqa: B010 - an instance attribute
        for attr in ("do_execute", "do_executemany", "do_execute_no_params"):
            setattr(dialect, attr, counters.wrap(DRIVER, getattr(dialect, attr)))
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, SWITCH_INTERVAL))
    try:
        with instrumented(counters, profiles):
            worker = Worker(scheduler, concurrency=1, ahead=ahead, commit_delay=commit_delay)
            profile = None
            if profiles is not None:
                profile = cProfile.Profile()
                profiles.append(profile)
                profile.enable()
            started = time.perf_counter()
            if counters is None:
                worker.run(burst=True, burst_wait=0)
            else:
                with counters.phase(RESIDUAL):
                    worker.run(burst=True, burst_wait=0)
            elapsed = time.perf_counter() - started
            if profile is not None:
                profile.disable()
            worker.stop(timeout=10)  # its task threads end: their residual is counted
    finally:
        sys.setswitchinterval(previous)
        store.close()
    return elapsed


def phase_cost(calls: int = 20_000) -> float:
    """Microseconds one counted call of nothing takes: the counters' own cost."""
    nothing = Counters().wrap("nothing", lambda: None)
    started = time.perf_counter()
    for _ in range(calls):
        nothing()
    return (time.perf_counter() - started) * 1e6 / calls


def plain(n: int, loops: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        spin(loops)
    return time.perf_counter() - started


ROLES = ("task", "committer", "loop", "other")


def table(sides: dict[str, tuple[Counters, float]], n: int) -> str:
    """Rows: (thread, phase); columns: wall and CPU µs per task for each side."""
    keys: set[tuple[str, str]] = set()
    for counters, _ in sides.values():
        keys |= set(counters.wall)
    order = [name for name, _, _ in PHASES] + [FUNCTION, DRIVER, COMMIT, RESIDUAL]
    rows = sorted(keys, key=lambda k: (ROLES.index(k[0]), order.index(k[1])))
    head = "| thread | phase |" + "".join(f" {s} wall | CPU | calls |" for s in sides)
    lines = [head, "|" + " --- |" * (2 + 3 * len(sides))]
    for key in rows:
        cells = []
        for counters, _ in sides.values():
            cells.append(f"{counters.wall.get(key, 0) / 1e3 / n:,.1f}")
            cells.append(f"{counters.cpu.get(key, 0) / 1e3 / n:,.1f}")
            cells.append(f"{counters.calls.get(key, 0) / n:.2f}")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    for thread in ROLES:
        if not any(k[0] == thread for k in keys):
            continue
        cells = []
        for counters, _ in sides.values():
            wall = sum(v for k, v in counters.wall.items() if k[0] == thread)
            cpu = sum(v for k, v in counters.cpu.items() if k[0] == thread)
            cells += [f"{wall / 1e3 / n:,.1f}", f"{cpu / 1e3 / n:,.1f}", ""]
        lines.append(f"| {thread} | **all** | " + " | ".join(cells) + " |")
    cells = []
    for counters, _ in sides.values():
        cpu = sum(counters.cpu.values())
        cells += ["", f"{cpu / 1e3 / n:,.1f}", ""]
    lines.append("| (all) | **CPU of every thread** | " + " | ".join(cells) + " |")
    cells = []
    for _, elapsed in sides.values():
        cells += [f"{elapsed * 1e6 / n:,.1f}", "", ""]
    lines.append("| (run) | **wall per task** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=2_000, help="tasks per run (2,000)")
    parser.add_argument("--noop", action="store_true", help="no-op tasks (no CPU work)")
    parser.add_argument("--cprofile", action="store_true", help="cProfile's top functions too")
    parser.add_argument("--top", type=int, default=25, help="cProfile rows per side")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument("--aheads", default="0,8", help="the sides' ahead values (0,8)")
    parser.add_argument(
        "--commit-delay", type=float, default=0.002, help="the worker's commit_delay (0.002)"
    )
    parser.add_argument("--no-counted", action="store_true", help="the uncounted rates only")
    parser.add_argument(
        "--loops", type=int, help="the CPU-bound work's length (default: calibrated to ~1 ms)"
    )
    args = parser.parse_args(argv)
    n = 50 if args.smoke else args.tasks
    loops = 0 if args.noop else args.loops or calibrate()
    aheads = [int(a) for a in args.aheads.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="durablesched-ahead-profile-"))
    alone = plain(n, loops) if loops else 0.0
    print(f"# {n} tasks, {'no-op' if args.noop else f'CPU-bound ({loops} loops)'}, 1 slot")
    if loops:
        print(f"plain loop: {alone * 1e6 / n:,.1f} us per call, {n / alone:,.0f}/s")
    plain_rate = n / alone if alone else None
    for ahead in aheads:  # without counters first: the undistorted figure
        elapsed = one_run(tmp / "bare.db", n, loops, ahead, commit_delay=args.commit_delay)
        ratio = f", {n / elapsed / plain_rate:.2f}x the plain loop" if plain_rate else ""
        print(f"ahead={ahead} uncounted: {n / elapsed:,.0f} tasks/s{ratio}")
    if args.no_counted:
        return 0
    print(f"each counted phase costs ~{phase_cost():.1f} us (mostly in the phase around it)")
    sides: dict[str, tuple[Counters, float]] = {}
    for ahead in aheads:
        counters = Counters()
        elapsed = one_run(
            tmp / "counted.db", n, loops, ahead, counters=counters, commit_delay=args.commit_delay
        )
        sides[f"ahead={ahead}"] = (counters, elapsed)
        print(f"ahead={ahead} counted: {n / elapsed:,.0f} tasks/s")
    print()
    print(
        "µs per task (wall: the phase's own time on its thread; CPU: that thread's CPU"
        " in it; calls: per task)"
    )
    print(table(sides, n))
    if args.cprofile:
        for ahead in aheads:
            profiles: list[cProfile.Profile] = []
            one_run(
                tmp / "profiled.db",
                n,
                loops,
                ahead,
                profiles=profiles,
                commit_delay=args.commit_delay,
            )
            stats = pstats.Stats(profiles[0], stream=io.StringIO())
            for profile in profiles[1:]:
                stats.add(profile)
            out = io.StringIO()
            stats.stream = out  # type: ignore[attr-defined]
            stats.sort_stats("tottime").print_stats(args.top)
            print(f"\n## cProfile, ahead={ahead}, every thread, by own time ({n} tasks)")
            print(out.getvalue().split("\n", 6)[-1] if out.getvalue() else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
