"""Issue 18's figures: claim latency over many queues and priorities, and what queues
and limits cost end to end, each against a baseline measured in the same run."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from pathlib import Path

from durablesched import QueueLimits, Scheduler, SQLiteStore
from durablesched.records import NewTask
from durablesched.store.protocol import DurableStore

from .common import NOW, fresh, history_rate, interleaved, median, percentile, worker

QUEUES = [f"q{i}" for i in range(10)]
LEASE = timedelta(seconds=30)


def _spread(n: int, rng: random.Random) -> Iterator[NewTask]:
    """``n`` due tasks over 10 queues and all 201 priorities."""
    for _ in range(n):
        yield NewTask("noop", {}, NOW, 1, None, "{}", rng.choice(QUEUES), rng.randint(-100, 100))


def _fill(store: DurableStore, n: int) -> None:
    rng = random.Random(n)
    batch: list[NewTask] = []
    for task in _spread(n, rng):
        batch.append(task)
        if len(batch) == 50_000:
            store.submit(batch, NOW)
            batch = []
    if batch:
        store.submit(batch, NOW)


def claim_latency_spread(
    open_store: Callable[[str], AbstractContextManager[DurableStore]],
    sizes: dict[str, int],
    samples: int,
) -> dict[str, dict[str, float]]:
    """Seconds per claim of one task from every queue (a worker serving all ten), per
    number of pending tasks spread over 10 queues and 201 priorities; sampled in turn."""
    with _stores(open_store, sizes) as stores:
        times: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(samples):
            for name, store in stores.items():
                t0 = time.perf_counter()
                claimed = store.claim("bench", 1, NOW, LEASE)
                times[name].append(time.perf_counter() - t0)
                assert len(claimed) == 1
    return {
        name: {"p50_us": median(t) * 1e6, "p99_us": percentile(t, 99) * 1e6}
        for name, t in times.items()
    }


@contextmanager
def _stores(
    open_store: Callable[[str], AbstractContextManager[DurableStore]], sizes: dict[str, int]
) -> Iterator[dict[str, DurableStore]]:
    opened: dict[str, DurableStore] = {}
    contexts = []
    try:
        for name, n in sizes.items():
            context = open_store(name)
            contexts.append(context)
            store = context.__enter__()
            _fill(store, n)
            opened[name] = store
        yield opened
    finally:
        for context in reversed(contexts):
            context.__exit__(None, None, None)


def sqlite_stores(path: Path) -> Callable[[str], AbstractContextManager[DurableStore]]:
    @contextmanager
    def open_one(name: str) -> Iterator[DurableStore]:
        store = SQLiteStore(fresh(path.with_name(f"{path.name}.{name}")))
        try:
            yield store
        finally:
            store.close()

    return open_one


def postgres_stores() -> Callable[[str], AbstractContextManager[DurableStore]]:
    from .pg import schema  # noqa: PLC0415 - PostgreSQL is optional

    @contextmanager
    def open_one(name: str) -> Iterator[DurableStore]:
        from durablesched import PostgresStore  # noqa: PLC0415

        with schema() as url:
            store = PostgresStore(url)
            try:
                yield store
            finally:
                store.close()

    return open_one


def end_to_end_queues(
    path: Path,
    n: int,
    queues: dict[str, int],
    limits: dict[str, int] | None = None,
    *,
    mixed: bool = False,
) -> float:
    """No-op tasks/s through one worker process serving ``queues`` (name -> slots),
    the tasks spread evenly over them; ``limits`` sets queues' concurrency limits.

    The tasks are submitted queue after queue (each queue's backlog in a block of
    rows), or ``mixed``: in turn, as an application whose queues fill at once
    submits them. The layout is what differs: a claim of a few tasks from each
    of four blocks writes four regions of the table's pages, of mixed tasks one.
    """
    store = SQLiteStore(fresh(path))
    scheduler = Scheduler(store)
    names = list(queues)
    if mixed:
        store.submit([NewTask("noop", {}, NOW, 1, None, "{}", names[i % len(names)], 0)
                      for i in range(n)], NOW)  # fmt: skip
    else:
        for i, name in enumerate(names):
            share = n // len(names) + (1 if i < n % len(names) else 0)
            scheduler.submit_many("noop", [{} for _ in range(share)], queue=name)
    for name, concurrency in (limits or {}).items():
        store.put_queue(QueueLimits(name, concurrency=concurrency), NOW)
    store.close()
    argv = ["--burst", "--log-level", "warning"]
    for name, slots in queues.items():
        argv += ["--queue", f"{name}={slots}"]
    child = worker(path, *argv)
    status, _cpu, _rss = child.wait_rusage()
    assert status == 0, f"worker exited {status}"
    return history_rate(path, n)


def queue_rounds(path: Path, n: int, rounds: int) -> dict[str, float]:
    """Medians of interleaved rounds: one queue of 8 slots (the baseline), four queues of
    2 slots each (their tasks submitted in turn, and each queue's in a block), and one
    queue of 4 slots with and without a concurrency limit of 4."""
    four = {f"q{i}": 2 for i in range(4)}
    cases: dict[str, Callable[[], float]] = {
        "one_queue_8": lambda: end_to_end_queues(path, n, {"default": 8}),
        "four_queues_2x4": lambda: end_to_end_queues(path, n, four, mixed=True),
        "four_queues_2x4_blocks": lambda: end_to_end_queues(path, n, four),
        "unlimited_4": lambda: end_to_end_queues(path, n, {"api": 4}),
        "limit_4_of_4": lambda: end_to_end_queues(path, n, {"api": 4}, {"api": 4}),
    }
    runs = interleaved(cases, rounds)
    figures = {name: median(rates) for name, rates in runs.items()}
    figures["four_queues_ratio"] = figures["four_queues_2x4"] / figures["one_queue_8"]
    figures["four_queues_blocks_ratio"] = figures["four_queues_2x4_blocks"] / figures["one_queue_8"]
    figures["limit_ratio"] = figures["limit_4_of_4"] / figures["unlimited_4"]
    return figures
