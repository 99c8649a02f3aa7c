"""A worker's row in the workers table: registered as its loop starts, marked seen by
heartbeats even while idle, removed when it stops cleanly (a stop, a burst's end, a
shutdown after tasks ran).

Time comes from a manual clock advanced only while the worker waits idle: nothing
sleeps.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import datetime, timedelta

from durablesched import ManualClock, MemoryStore, Scheduler, TaskRegistry, Worker, WorkerInfo
from durablesched.worker.presence import durablesched_version

from ..conftest import T0, WAIT


class IdleClock(ManualClock):
    """Counts the waits for a time ahead (the worker idle, its pass done)."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.idle = threading.Condition()
        self.idle_waits = 0
        #: The idle waits step_until has acted on.
        self.consumed = 0
        #: The worker waits, and step_until knows: the clock may move.
        self.parked = False

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        if until is None or until > self.now():
            with self.idle:
                self.idle_waits += 1
                self.idle.notify_all()
        return super().wait(event, until, max_wait)

    def step_until(self, when: datetime, step: float = 1.0) -> None:
        """Advance by ``step`` at each idle wait until ``when``; return at the idle wait
        that follows (the worker's pass at ``when`` done)."""
        while True:
            if not self.parked:
                with self.idle:
                    assert self.idle.wait_for(lambda: self.idle_waits > self.consumed, WAIT), (
                        "the worker did not wait"
                    )
                    self.consumed = self.idle_waits
                self.parked = True
            if self.now() >= when:
                return
            self.parked = False
            self.advance(min(timedelta(seconds=step), when - self.now()))


def _worker(**options: object) -> tuple[Scheduler, Worker, IdleClock]:
    registry = TaskRegistry()
    registry.register(lambda: None, name="noop")
    clock = IdleClock(T0)
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    return scheduler, Worker(scheduler, **options), clock  # type: ignore[arg-type]


def test_a_running_worker_is_listed_and_an_idle_one_stays_alive() -> None:
    scheduler, worker, clock = _worker(lease=30, queues={"mail": 2, "default": 1}, owner="w-1")
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        clock.step_until(T0)
        assert scheduler.workers() == [
            WorkerInfo(
                id="w-1",
                host=socket.gethostname(),
                pid=os.getpid(),
                queues={"mail": 2, "default": 1},
                concurrency=3,
                version=durablesched_version(),
                started_at=T0,
                last_seen=T0,
                lease=timedelta(seconds=30),
            )
        ]
        # Idle, it heartbeats every third of its lease all the same: never gone.
        clock.step_until(T0 + timedelta(seconds=95))
        (seen,) = scheduler.workers()
        assert seen.last_seen == T0 + timedelta(seconds=90)
        assert seen.alive(clock.now())
    finally:
        stop.set()
        worker.request_stop()
        thread.join(WAIT)
    # A clean stop removes the row.
    assert scheduler.workers(include_gone=True) == []


def test_a_worker_that_stops_seeing_the_store_is_listed_as_gone() -> None:
    scheduler, worker, clock = _worker(lease=30, owner="w-2")
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    clock.step_until(T0)
    stop.set()
    worker.request_stop()  # wakes the loop
    thread.join(WAIT)
    assert scheduler.workers() == []
    # Registered by hand as it was, and never seen again: gone after its lease.
    scheduler.store.register_worker(worker._presence.info(T0), T0)
    clock.advance(30)
    assert [w.id for w in scheduler.workers()] == ["w-2"]
    clock.advance(timedelta(microseconds=1))
    assert scheduler.workers() == []
    assert [(w.id, w.state(clock.now())) for w in scheduler.workers(include_gone=True)] == [
        ("w-2", "gone")
    ]


def test_a_burst_registers_and_removes_its_row_when_done() -> None:
    scheduler, worker, _clock = _worker(owner="w-3")
    seen: list[list[str]] = []
    store = scheduler.store
    real = store.claim

    def claim(*args: object, **kwargs: object) -> object:
        seen.append([w.id for w in store.list_workers(T0)])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    store.claim = claim  # type: ignore[method-assign,assignment]
    scheduler.submit("noop")
    worker.run(burst=True, burst_wait=0)
    assert seen and all(ids == ["w-3"] for ids in seen)
    assert store.list_workers(T0) == []


def test_stop_removes_the_row_once_running_tasks_end() -> None:
    scheduler, worker, clock = _worker(owner="w-4")
    release = threading.Event()
    started = threading.Event()

    def slow() -> None:
        started.set()
        release.wait(WAIT)

    assert scheduler.registry is not None
    scheduler.registry.register(slow, name="slow")
    scheduler.submit("slow")
    worker.start()
    assert started.wait(WAIT)
    worker.request_stop()
    # The loop has stopped, the task runs on: the worker is still listed.
    assert worker._thread is not None
    worker._thread.join(WAIT)
    assert [w.id for w in scheduler.workers()] == ["w-4"]
    release.set()
    assert worker.stop(WAIT)
    assert scheduler.workers(include_gone=True) == []
    assert clock.now() == T0
