"""Typed tasks and handles (issue 30's targets), on SQLite and PostgreSQL.

- ``wakeup``: ``handle.result()`` returning after the task's outcome commits (the worker's
  ``after_commit`` hook stamps the commit), p50 and p99 in ms: target p50 <= 5 ms.
- ``many``: N handles awaited at once in one asyncio process while a worker process
  drains their N tasks: every result arrives; target < 0.05 cores. Two ways, in
  turns: ``asyncio.gather`` of each handle's ``aresult()`` (the figures of ``many``),
  and ``scheduler.agather(*handles)`` (one wait for all: ``many.agather``). As
  measured: a worker process (8 slots) is started and has run one task (so that its
  start-up is not counted, and this process's waiting thread and watcher run, as in a
  server); then, five times over each way (``--drains``), every other time the other
  way first, the N tasks are enqueued in one batch, and the wait is timed from its
  start to the last result: ``cores`` is this
  process's CPU time (every thread: the event loop, the waiting thread, the watcher)
  over that wall time, the drain's (the worker's CPU, in its own process, is not
  counted). ``cores_to_commit`` divides the same CPU by the time to the last task's
  committed end instead (its ``finished_at``), so that results handed over late
  cannot lower the figure by lengthening the wall; ``late_ms`` is how much later the
  last result arrived. Each figure is the median of the drains;
  ``cores_to_commit_range``, ``cpu_us_per_result_range`` and ``wall_s_range`` are
  their lowest and highest. The run also gathers N bare asyncio futures, resolved
  from a thread in batches of 50, in ``asyncio_cpu_s``: what any asyncio code pays to
  gather N futures (``aresult`` hands out a future), and the same with a coroutine
  (so a Task) around each in ``asyncio_tasks_cpu_s``: what gathering N coroutine
  functions' calls costs.
  ``results_per_s_at_5pct`` is the rate of results at which this process would take
  5 % of a core at the median CPU per result (what the target comes to: results come
  in at the worker's pace, and waiting costs a few microseconds each).
- ``idle``: N handles awaited for ``--idle-seconds`` while none of their tasks runs
  (each due in an hour): what waiting costs when nothing finishes, the waiting
  process's CPU over that time (``cores``), per handle and second
  (``cpu_us_per_handle_second``), and the reads made (the waiting thread reads every
  wait again once a second, whatever it hears: ``waiting.FALLBACK``).
- ``enqueue``: ``enqueue`` against ``submit`` per task, single and batch
  (``enqueue_many`` against ``submit_many``): target ratio <= 1.05. The two sides run
  in turns, 21 rounds (one at a time, a round is a hundred turns, each a call of each
  side, every other turn the other side first; in a batch, a round is one turn); the
  ratio is the median of the rounds' ratios (``single_ratio``, ``batch_ratio``), with
  their range (``..._range``). The same of this process's CPU time
  (``single_cpu_ratio``, ``batch_cpu_ratio``) leaves out the disk's and the other
  processes' noise (on SQLite it holds the database's work; on PostgreSQL only the
  client's, so the typed call's few objects weigh more there). A single call's wall
  time is mostly its commit's ``fsync``, which swings by half or more from one call
  to the next on some disks: hence the calls in turns.

    python -m benchmarks.handles [--pg URL] [--tasks N] [--drains N] [--idle-seconds S]
                                 [--out FILE]

Run it on a quiet machine: timings are meaningless while other work runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from durablesched import Scheduler, TaskHandle, TaskRegistry, TaskState, Worker, open_store
from durablesched.records import Outcome

registry = TaskRegistry()


@registry.task("bench.add")
def add(a: int, b: int = 0) -> int:
    return a + b


ROOT = Path(__file__).resolve().parents[1]
#: Drains of ``many`` (each figure their median): one drain's figure swings with the
#: machine by a tenth or more.
DRAINS = 5
#: Seconds of ``idle``: long enough for a few of the waiting thread's rereads.
IDLE_SECONDS = 5.0
#: The target's share of a core, for ``results_per_s_at_5pct``.
TARGET_CORES = 0.05


def wakeup(db: str, rounds: int) -> dict[str, float]:
    """``result()`` latency after the outcome commits, one task at a time."""
    committed: dict[int, float] = {}

    def stamp(outcome: Outcome, _state: TaskState | None, _now: datetime) -> None:
        committed[outcome.claim.task_id] = time.perf_counter()

    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    worker = Worker(scheduler, concurrency=1, after_commit=stamp)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    waits = []
    try:
        for i in range(rounds + 1):
            handle = scheduler.enqueue(add, i, b=1)
            assert handle.result(timeout=30) == i + 1
            returned = time.perf_counter()
            deadline = time.monotonic() + 30
            while handle.id not in committed:  # the hook runs just after the commit
                assert time.monotonic() < deadline
                time.sleep(0.0001)
            if i:  # the first starts the waiting thread and watcher
                waits.append(max(0.0, returned - committed[handle.id]) * 1000)
    finally:
        worker.stop()
        thread.join(30)
        scheduler.close()
        store.close()
    waits.sort()
    return {
        "p50_ms": statistics.median(waits),
        "p99_ms": waits[min(len(waits) - 1, int(len(waits) * 0.99))],
    }


def many(db: str, tasks: int, drains: int = DRAINS) -> dict[str, Any]:
    """``tasks`` handles awaited at once while a worker process drains their tasks,
    ``drains`` times over (one worker, one scheduler, as in a server): each figure is
    the median of the drains, with the range of the main ones (``..._range``)."""
    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    worker = subprocess.Popen(  # noqa: S603 - our own worker, fixed arguments
        [sys.executable, "-m", "durablesched", "worker", "--db", db, "--concurrency", "8",
         "--app", "benchmarks.handles:registry"],
        cwd=ROOT,
    )  # fmt: skip

    async def wait_all(
        handles: list[TaskHandle[int]], together: bool
    ) -> tuple[list[int], float, float, float]:
        began = time.time()
        wall, cpu = time.perf_counter(), time.process_time()
        if together:
            results = await scheduler.agather(*handles, timeout=300)
        else:
            results = await asyncio.gather(*(h.aresult(timeout=300) for h in handles))
        return results, time.perf_counter() - wall, time.process_time() - cpu, began

    def drain(together: bool) -> dict[str, float]:
        handles = scheduler.enqueue_many([add.bind(i) for i in range(tasks)])
        reads = scheduler.waiters.reads
        results, wall, cpu, began = asyncio.run(wait_all(handles, together))
        reads = scheduler.waiters.reads - reads
        assert results == list(range(tasks)), "a result is missing or wrong"
        ended = max(h.record().finished_at or datetime.min for h in handles)
        to_commit = ended.timestamp() - began
        return {
            "wall_s": wall,
            "cpu_s": cpu,
            "cores": cpu / wall,
            "cores_to_commit": cpu / to_commit,
            "late_ms": (wall - to_commit) * 1e3,
            "reads": reads,
            "cpu_us_per_result": cpu / tasks * 1e6,
        }

    each: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    try:
        assert scheduler.enqueue(add, 0).result(timeout=120) == 0  # the worker is up
        for i in range(drains):  # the two ways in turn, every other drain the other first
            for together in (False, True) if i % 2 == 0 else (True, False):
                each[together].append(drain(together))
    finally:
        worker.terminate()
        worker.wait(30)
        scheduler.close()
        store.close()
    figures = summary(each[False])
    figures["agather"] = summary(each[True])
    figures["asyncio_cpu_s"] = asyncio.run(bare_futures(tasks))
    figures["asyncio_tasks_cpu_s"] = asyncio.run(bare_futures(tasks, wrapped=True))
    return figures


def summary(each: list[dict[str, float]]) -> dict[str, Any]:
    """The drains' figures: each the median, the main ones' range too."""
    figures: dict[str, Any] = {key: statistics.median(d[key] for d in each) for key in each[0]}
    for key in ("cores_to_commit", "cpu_us_per_result", "wall_s"):
        figures[f"{key}_range"] = [min(d[key] for d in each), max(d[key] for d in each)]
    figures["drains"] = len(each)
    figures["results_per_s_at_5pct"] = TARGET_CORES / (figures["cpu_us_per_result"] * 1e-6)
    return figures


def idle(db: str, tasks: int, seconds: float = IDLE_SECONDS) -> dict[str, float]:
    """``tasks`` handles awaited for ``seconds`` while none of their tasks runs (each due
    in an hour, no worker): the waiting process's CPU then, the whole of it waiting's.
    The waits are then let go and the tasks cancelled."""
    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    later = add.options(delay=3600)
    try:
        handles = scheduler.enqueue_many([later.bind(i) for i in range(tasks)])

        async def wait() -> float:
            futures = [h.aresult() for h in handles]
            cpu = time.process_time()
            done, _ = await asyncio.wait(futures, timeout=seconds)
            spent = time.process_time() - cpu
            assert not done, "a task due in an hour finished"
            for future in futures:
                future.cancel()
            return spent

        reads = scheduler.waiters.reads
        cpu = asyncio.run(wait())
        reads = scheduler.waiters.reads - reads
        for handle in handles:  # (a database kept between runs keeps none of them)
            handle.cancel()
    finally:
        scheduler.close()
        store.close()
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "cores": cpu / seconds,
        "cpu_us_per_handle_second": cpu / seconds / tasks * 1e6,
        "reads": reads,
    }


async def bare_futures(count: int, batch: int = 50, *, wrapped: bool = False) -> float:
    """CPU seconds to gather ``count`` bare futures resolved from a thread, ``batch`` at
    a time: asyncio's own share of awaiting that many results (``wrapped``: each
    awaited by a coroutine of its own, which gather runs as a Task)."""
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(count)]

    def settle(some: list[asyncio.Future[int]]) -> None:
        for future in some:
            future.set_result(1)

    def resolve() -> None:
        for start in range(0, count, batch):
            loop.call_soon_threadsafe(settle, futures[start : start + batch])
            time.sleep(0.001)

    async def one(future: asyncio.Future[int]) -> int:
        return await future

    cpu = time.process_time()
    thread = threading.Thread(target=resolve)
    gathered = asyncio.gather(*(one(f) for f in futures) if wrapped else futures)
    thread.start()
    await gathered
    thread.join()
    return time.process_time() - cpu


def enqueue_cost(db: str, tasks: int, rounds: int = 21) -> dict[str, Any]:
    """Seconds per task: submit and enqueue one at a time, submit_many and enqueue_many.

    Each pair runs ``rounds`` rounds of calls made in turns, every other turn the other
    side first: one at a time, a round is ``tasks // 10`` such turns (the two sides see
    the same disk from one call to the next: a commit's ``fsync`` swings by half or more
    on some disks); in a batch, a round is one turn (the table grows with every call,
    and the machine drifts: neither side is favoured). A ratio is the median of the
    rounds' ratios (each of the two sides' time in that round), with their range, of the
    wall time and of this process's CPU time; a side's seconds per task the median of
    its rounds."""
    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    figures: dict[str, Any] = {}

    def timed(
        ratio: str, pair: dict[str, Callable[[int], object]], turns: int, per_call: int
    ) -> None:
        (den, run_den), (num, run_num) = pair.items()
        seconds: dict[str, list[float]] = {den: [], num: []}
        cpu: dict[str, list[float]] = {den: [], num: []}
        for i in range(rounds):
            spent = {den: 0.0, num: 0.0}
            spent_cpu = {den: 0.0, num: 0.0}
            for turn in range(turns):
                order = [(den, run_den), (num, run_num)]
                for label, run in order if (i + turn) % 2 == 0 else order[::-1]:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    run(turn)
                    spent[label] += time.perf_counter() - started
                    spent_cpu[label] += time.process_time() - cpu_started
            for label in (den, num):
                seconds[label].append(spent[label])
                cpu[label].append(spent_cpu[label])
        count = turns * per_call
        figures.update({label: statistics.median(s) / count for label, s in seconds.items()})
        for name, taken in ((ratio, seconds), (ratio.replace("_ratio", "_cpu_ratio"), cpu)):
            ratios = [n / d for n, d in zip(taken[num], taken[den], strict=True)]
            figures[name] = statistics.median(ratios)
            figures[f"{name}_range"] = [min(ratios), max(ratios)]

    try:
        timed(
            "single_ratio",
            {
                "submit": lambda i: scheduler.submit("bench.add", {"a": i}),
                "enqueue": lambda i: scheduler.enqueue(add, a=i),
            },
            max(1, tasks // 10),  # one transaction each: fewer
            1,
        )
        timed(
            "batch_ratio",
            {
                "submit_many": lambda _: scheduler.submit_many(
                    "bench.add", [{"a": i} for i in range(tasks)]
                ),
                "enqueue_many": lambda _: scheduler.enqueue_many(
                    [add.bind(a=i) for i in range(tasks)]
                ),
            },
            1,
            tasks,
        )
    finally:
        store.close()
    return figures


def run(
    databases: dict[str, str],
    tasks: int,
    rounds: int,
    drains: int = DRAINS,
    idle_seconds: float = IDLE_SECONDS,
) -> dict[str, Any]:
    for db in databases.values():
        empty(db)
    return {
        name: {
            "wakeup": wakeup(db, rounds),
            "many": many(db, tasks, drains),
            "idle": idle(db, tasks, idle_seconds),
            "enqueue": enqueue_cost(db, tasks),
        }
        for name, db in databases.items()
    }


def empty(db: str) -> None:
    """Refuse a database that holds tasks: a run leaves ``enqueue``'s tens of thousands
    pending, which the next run's workers would have to drain before its own (its
    ``wakeup`` timed out so, and every figure would be of a backlog)."""
    store = open_store(db)
    try:
        if store.list_tasks(limit=1):
            raise SystemExit(
                f"benchmarks.handles needs an empty database: {db} holds tasks "
                "(an earlier run's: make a new database)"
            )
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg", help="a PostgreSQL URL (an empty database: a run leaves tasks) to measure too"
    )
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--drains", type=int, default=DRAINS)
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        databases = {"sqlite": str(Path(tmp) / "handles.db")}
        if args.pg:
            databases["postgres"] = args.pg
        figures = run(databases, args.tasks, args.rounds, args.drains, args.idle_seconds)
    text = json.dumps(figures, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
