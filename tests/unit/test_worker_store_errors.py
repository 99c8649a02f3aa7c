"""A worker rides out passing store errors, and gives up loudly on lasting ones."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta

from durablesched import (
    Claim,
    ManualClock,
    MemoryStore,
    Scheduler,
    StoreError,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0, WAIT


class FlakyStore(MemoryStore):
    """Claims fail ``failures`` times (or forever with None), then work."""

    def __init__(self, failures: int | None) -> None:
        super().__init__()
        self.failures = failures
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
    ) -> list[Claim]:
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            self.failed.release()
            raise StoreError("claiming tasks failed: database or disk is full")
        return super().claim(
            owner, limit, now, lease, names, process_names=process_names, queues=queues
        )


class BackoffClock(ManualClock):
    """Says when a waiter starts a wait whose deadline lies ahead: a worker backing off.

    Advancing the clock before the worker has set its deadline from ``now`` would
    leave it waiting for a time that never comes; the test advances only after.
    """

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.waiting = threading.Semaphore(0)

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        if until is not None and until > self.now():
            self.waiting.release()
        return super().wait(event, until, max_wait)


def test_passing_store_errors_are_retried_with_backoff() -> None:
    clock = BackoffClock(T0)
    store = FlakyStore(failures=2)
    registry = TaskRegistry()
    ran = threading.Event()
    registry.register(ran.set, name="job")
    scheduler = Scheduler(store, registry=registry, clock=clock)
    task_id = scheduler.submit("job")
    worker = Worker(scheduler, owner="w")
    worker.start()
    try:
        for _ in range(2):
            assert store.failed.acquire(timeout=WAIT)
            assert clock.waiting.acquire(timeout=WAIT), "the worker never backed off"
            clock.advance(5)  # past the backoff
        assert ran.wait(WAIT)
        assert worker.wait_idle(WAIT)
        assert scheduler.get(task_id).state is TaskState.SUCCEEDED
    finally:
        assert worker.stop(WAIT)


def test_lasting_store_errors_end_the_loop_with_the_error() -> None:
    clock = BackoffClock(T0)
    store = FlakyStore(failures=None)
    registry = TaskRegistry()
    registry.register(lambda: None, name="job")
    scheduler = Scheduler(store, registry=registry, clock=clock)
    worker = Worker(scheduler, owner="w", max_store_failures=3)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except StoreError as e:
            raised.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    for _ in range(3):
        assert store.failed.acquire(timeout=WAIT)
        assert clock.waiting.acquire(timeout=WAIT), "the worker never backed off"
        clock.advance(5)
    assert store.failed.acquire(timeout=WAIT)  # the fourth failure: no backoff, it raises
    thread.join(WAIT)
    assert not thread.is_alive()
    assert len(raised) == 1 and "disk is full" in str(raised[0])
