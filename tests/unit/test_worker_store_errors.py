"""A worker rides out passing store errors, and gives up loudly on lasting ones.

Time comes from a manual clock: a backoff is a wait on it, advanced by the test
once the worker waits, so nothing here sleeps.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta

import pytest

from durablesched import (
    Claim,
    ConfigurationError,
    CorruptDatabase,
    ManualClock,
    MemoryStore,
    Scheduler,
    StoreError,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import Outcome, OutcomeResult
from durablesched.worker.trouble import FIRST_BACKOFF, MAX_BACKOFF

from ..conftest import T0, WAIT

DISK_FULL = "claiming tasks failed: database or disk is full"
#: An error for each failure, given how many came before it.
Errors = Callable[[int], StoreError]


def disk_full(_n: int) -> StoreError:
    return StoreError(DISK_FULL)


class FlakyStore(MemoryStore):
    """Claims fail ``failures`` times (or forever with None), then work.

    ``errors`` makes each failure's error; ``record_failures`` do the same for the
    group commit (``record_and_claim``).
    """

    def __init__(
        self,
        failures: int | None,
        errors: Errors = disk_full,
        *,
        record_failures: int = 0,
    ) -> None:
        super().__init__()
        self.failures = failures
        self.errors = errors
        self.calls = 0
        self.record_failures = record_failures
        self.failed = threading.Semaphore(0)

    def claim(
        self,
        owner: str,
        limit: int,
        now: datetime,
        lease: timedelta,
        names: Collection[str] | None = None,
        *,
        process_names: Collection[str] = (),
        queues: Mapping[str, int] | None = None,
        ahead: int = 0,
    ) -> list[Claim]:
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            error = self.errors(self.calls)
            self.calls += 1
            self.failed.release()
            raise error
        return super().claim(
            owner, limit, now, lease, names, process_names=process_names, queues=queues, ahead=ahead
        )

    def record_and_claim(
        self,
        outcomes: Sequence[Outcome],
        now: datetime,
        *,
        owner: str,
        limit: int,
        lease: timedelta,
        names: Collection[str] | None = None,
        process_names: Collection[str] = (),
        queues: Mapping[str, int] | None = None,
        ahead: int = 0,
        started: Sequence[Claim] = (),
    ) -> tuple[list[OutcomeResult], list[Claim]]:
        if self.record_failures:
            self.record_failures -= 1
            error = self.errors(self.calls)
            self.calls += 1
            self.failed.release()
            raise error
        return super().record_and_claim(
            outcomes,
            now,
            owner=owner,
            limit=limit,
            lease=lease,
            names=names,
            process_names=process_names,
            queues=queues,
            ahead=ahead,
            started=started,
        )


class BackoffClock(ManualClock):
    """Says when a waiter starts a wait whose deadline lies ahead (a worker backing
    off), and how long that wait is.

    Advancing the clock before the worker has set its deadline from ``now`` would
    leave it waiting for a time that never comes; the test advances only after.
    """

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.waiting = threading.Semaphore(0)
        self.waits: list[float] = []

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        now = self.now()
        if until is not None and until > now:
            self.waits.append((until - now).total_seconds())
            self.waiting.release()
        return super().wait(event, until, max_wait)


class Run:
    """``worker.run()`` in a thread, keeping what it raised."""

    def __init__(self, worker: Worker) -> None:
        self.raised: list[BaseException] = []
        self.thread = threading.Thread(target=self._run)
        self.worker = worker
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as e:
            self.raised.append(e)

    def ended(self) -> BaseException:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the worker never stopped"
        assert len(self.raised) == 1
        return self.raised[0]


class Setup:
    """A worker over ``store`` with a manual clock, and one task function, ``job``,
    which sets ``ran``."""

    def __init__(self, store: FlakyStore, **options: object) -> None:
        self.clock = BackoffClock(T0)
        self.ran = threading.Event()
        registry = TaskRegistry()
        registry.register(self.ran.set, name="job")
        self.scheduler = Scheduler(store, registry=registry, clock=self.clock)
        self.worker = Worker(self.scheduler, owner="w", **options)  # type: ignore[arg-type]

    def run_job(self) -> int:
        """Submit a ``job``; its id."""
        return self.scheduler.submit("job")

    def succeeded(self, task_id: int) -> bool:
        """Once ``job`` ran and its outcome was recorded: did it succeed?"""
        assert self.ran.wait(WAIT) and self.worker.wait_idle(WAIT)
        return self.scheduler.get(task_id).state is TaskState.SUCCEEDED


def back_off_once(store: FlakyStore, clock: BackoffClock) -> float:
    """Wait for the next failure and the backoff after it; advance past it. Its length."""
    assert store.failed.acquire(timeout=WAIT), "no store call failed"
    assert clock.waiting.acquire(timeout=WAIT), "the worker never backed off"
    delay = clock.waits[-1]
    clock.advance(delay)
    return delay


def test_passing_store_errors_are_retried_with_backoff() -> None:
    store = FlakyStore(failures=2)
    setup = Setup(store)
    task_id = setup.run_job()
    setup.worker.start()
    try:
        for _ in range(2):
            back_off_once(store, setup.clock)
        assert setup.succeeded(task_id)
    finally:
        assert setup.worker.stop(WAIT)


def test_backoff_delays_grow_are_capped_and_jittered() -> None:
    store = FlakyStore(failures=None)
    setup = Setup(store, rng=random.Random(7), give_up_after=3600)
    clock, worker = setup.clock, setup.worker
    run = Run(worker)
    delays = [back_off_once(store, clock) for _ in range(14)]
    worker.request_stop()
    run.thread.join(WAIT)
    assert not run.thread.is_alive() and not run.raised  # a stop cuts a backoff short
    steps = [min(FIRST_BACKOFF * 2**n, MAX_BACKOFF) for n in range(len(delays))]
    for delay, step in zip(delays, steps, strict=True):
        assert step / 2 <= delay <= step  # jittered within half of the step
    below_cap = [d for d, s in zip(delays, steps, strict=True) if s < MAX_BACKOFF]
    assert below_cap == sorted(below_cap) and len(below_cap) == 6  # grows until capped
    assert max(delays) <= MAX_BACKOFF and delays[-1] >= MAX_BACKOFF / 2  # capped, reached
    assert len({round(d / s, 6) for d, s in zip(delays, steps, strict=True)}) > 1  # jitter
    # Another worker's generator spreads its retries differently.
    other = FlakyStore(failures=None)
    setup2 = Setup(other, rng=random.Random(8), give_up_after=3600)
    run2 = Run(setup2.worker)
    others = [back_off_once(other, setup2.clock) for _ in range(4)]
    setup2.worker.request_stop()
    run2.thread.join(WAIT)
    assert others != delays[:4]


def test_a_repeated_error_is_logged_once_and_summed_up_when_it_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="durablesched.worker")

    def errors(n: int) -> StoreError:
        return StoreError(DISK_FULL if n < 5 else "claiming tasks failed: disk I/O error")

    store = FlakyStore(failures=7, errors=errors)
    setup = Setup(store)
    task_id = setup.run_job()
    setup.worker.start()
    try:
        for _ in range(7):
            back_off_once(store, setup.clock)
        assert setup.succeeded(task_id)
    finally:
        assert setup.worker.stop(WAIT)
    lines = [r.getMessage() for r in caplog.records if "store" in r.getMessage()]
    assert lines == [
        f"store error: {DISK_FULL} (retrying with backoff; giving up after 60s)",
        f"store error: claiming tasks failed: disk I/O error (after '{DISK_FULL}' 5 times)",
        lines[2],
    ], lines
    assert lines[2].startswith("store working again after ")
    assert lines[2].endswith(
        f"of errors ('{DISK_FULL}' 5 times, 'claiming tasks failed: disk I/O error' 2 times)"
    )


def test_the_worker_gives_up_after_give_up_after_seconds_of_its_clock() -> None:
    store = FlakyStore(failures=None)
    setup = Setup(store, give_up_after=10)
    clock = setup.clock
    run = Run(setup.worker)
    deadline = T0 + timedelta(seconds=10)
    tries = 0
    while clock.now() < deadline:  # the last wait ends on the deadline
        back_off_once(store, clock)
        tries += 1
    assert 5 < tries < 15
    assert store.failed.acquire(timeout=WAIT)  # the try at the deadline fails: it gives up
    error = run.ended()
    assert isinstance(error, StoreError)
    assert str(error).startswith("gave up after 10.0s of store errors (")
    assert str(error).endswith(f"; the last: {DISK_FULL}")
    assert clock.now() == T0 + timedelta(seconds=10)


def test_give_up_after_must_be_finite_and_not_negative() -> None:
    for bad in (-1, float("inf"), float("nan"), "60"):
        with pytest.raises(ConfigurationError, match="give_up_after"):
            Setup(FlakyStore(failures=0), give_up_after=bad)


def test_a_corrupt_database_stops_the_worker_at_the_first_error() -> None:
    store = FlakyStore(failures=None, errors=lambda _n: CorruptDatabase("claiming tasks failed: x"))
    setup = Setup(store)
    error = Run(setup.worker).ended()
    assert isinstance(error, CorruptDatabase)
    assert store.calls == 1
    assert setup.clock.waits == []  # no backoff


def test_group_commit_errors_are_backed_off_from_like_the_loops_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore(failures=0, record_failures=3)
    # Every wait the test advances through counts towards giving up (the heartbeat's
    # among them, on a loaded machine): far off, so that only the backoff is tested.
    setup = Setup(store, give_up_after=3600.0)
    task_id = setup.run_job()
    setup.worker.start()
    try:
        # The first failure may be the task thread's (no backoff there) or the loop's:
        # advance through whatever waits come until the outcome is recorded.
        for _ in range(20):
            if setup.scheduler.get(task_id).state is TaskState.SUCCEEDED:
                break
            assert setup.clock.waiting.acquire(timeout=WAIT), "the worker never waited"
            setup.clock.advance(setup.clock.waits[-1])
        assert setup.succeeded(task_id)
        assert store.record_failures == 0
    finally:
        assert setup.worker.stop(WAIT)
    logged = [r.getMessage() for r in caplog.records if "store error" in r.getMessage()]
    assert len(logged) == 1, logged  # once, not once per retry
    assert len(setup.clock.waits) >= 2


def test_a_corrupt_database_met_by_the_group_commit_stops_the_worker() -> None:
    store = FlakyStore(
        failures=0,
        errors=lambda _n: CorruptDatabase("recording outcomes failed: file is not a database"),
        record_failures=1000,
    )
    setup = Setup(store)
    setup.run_job()
    assert isinstance(Run(setup.worker).ended(), CorruptDatabase)


def test_max_store_failures_is_deprecated_but_still_counts() -> None:
    store = FlakyStore(failures=None)
    with pytest.warns(DeprecationWarning, match="give_up_after"):
        setup = Setup(store, max_store_failures=3)
    assert setup.worker.max_store_failures == 3
    run = Run(setup.worker)
    for _ in range(3):
        back_off_once(store, setup.clock)
    assert store.failed.acquire(timeout=WAIT)  # the fourth failure: no backoff, it gives up
    error = run.ended()
    assert isinstance(error, StoreError) and DISK_FULL in str(error)
