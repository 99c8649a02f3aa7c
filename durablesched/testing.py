"""Helpers for testing code that uses durablesched, without sleeping.

clock = ManualClock()
scheduler = Scheduler(MemoryStore(), registry=tasks, clock=clock)
scheduler.submit("email", {"to": "a@example.com"}, delay=60)
run_until_complete(scheduler, clock)   # advances the clock as far as needed
run_schedules_until(scheduler, clock, until)  # and through every fire time up to ``until``
"""

from __future__ import annotations

from datetime import datetime

from durablesched.clock import ManualClock as ManualClock
from durablesched.errors import DurableSchedError
from durablesched.scheduler import Scheduler
from durablesched.worker.loop import Worker
from durablesched.workflows.steps import FOREVER

__all__ = ["ManualClock", "run_due", "run_schedules_until", "run_until_complete"]


def run_due(scheduler: Scheduler, *, owner: str = "durablesched-testing") -> int:
    """Run every task due at the clock's current time, in this thread; returns how many ran."""
    return Worker(scheduler, owner=owner).run_due()


def run_until_complete(
    scheduler: Scheduler,
    clock: ManualClock,
    *,
    until: datetime | None = None,
    max_runs: int = 10_000,
    owner: str = "durablesched-testing",
) -> int:
    """Run due tasks, advance ``clock`` to the next due time (or lease expiry), repeat.

    Stops when nothing is left to run, or before moving past ``until``; a workflow
    that waits with no timeout (for a signal, for children: due at the far end of
    time) is left waiting, as nothing but what it waits for would bring it back.
    Returns how many attempts ran. Raises if more than ``max_runs`` attempts
    ran, which usually means tasks keep submitting tasks.
    """
    worker = Worker(scheduler, owner=owner)
    ran = 0
    while True:
        ran += worker.run_due()
        if ran > max_runs:
            raise DurableSchedError(f"more than {max_runs} task attempts ran; giving up")
        nxt = scheduler.store.next_wakeup(clock.now())
        if nxt is None or nxt >= FOREVER or (until is not None and nxt > until):
            return ran
        clock.set(nxt)


def run_schedules_until(
    scheduler: Scheduler,
    clock: ManualClock,
    until: datetime,
    *,
    max_runs: int = 100_000,
    owner: str = "durablesched-testing",
) -> int:
    """Move ``clock`` through every fire time (and due task) up to ``until``, firing the
    registry's schedules and running what became due at each; returns attempts run.

    The schedules are synced first, as a worker's start does. A month of
    every-minute fires takes seconds of test time, and no sleep.
    """
    worker = Worker(scheduler, owner=owner)
    store = scheduler.store
    ran = 0
    while True:
        ran += worker.run_due()
        if ran > max_runs:
            raise DurableSchedError(f"more than {max_runs} task attempts ran; giving up")
        now = clock.now()
        times = [t for t in (store.next_fire_time(), store.next_wakeup(now)) if t is not None]
        nxt = min(times, default=None)
        if nxt is None or nxt > until:
            if now < until:
                clock.set(until)
                ran += worker.run_due()
            return ran
        clock.set(nxt)
