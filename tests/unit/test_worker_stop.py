"""``Worker.stop``'s wait for running tasks: ``timeout=None`` waits as long as they take.

A worker run in a thread of the caller's own (``worker.run``, not ``start``) has no loop
thread to join: ``stop`` waits on its slots directly, and an infinite timeout there is a
lock's wait with no bound (a lock refuses ``math.inf``: ``OverflowError``). Waits are on
events, bounded by WAIT: nothing sleeps."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest

from durablesched import MemoryStore, Scheduler, TaskRegistry, Worker

from ..conftest import WAIT


@pytest.mark.parametrize("timeout", [None, 1e12], ids=["none", "centuries"])
def test_stop_with_no_timeout_or_one_of_centuries_waits_for_the_running_task(
    timeout: float | None,
) -> None:
    """No timeout, or one longer than a thread's wait takes (``threading.TIMEOUT_MAX``)."""
    registry = TaskRegistry()
    started, release = threading.Event(), threading.Event()

    @registry.task("slow")
    def slow() -> int:
        started.set()
        release.wait(WAIT)
        return 1

    scheduler = Scheduler(MemoryStore(), registry=registry)
    worker = Worker(scheduler, concurrency=2)
    loop = threading.Thread(target=worker.run, daemon=True)
    loop.start()
    handle = scheduler.enqueue(slow)
    assert started.wait(WAIT)
    stopping = in_thread(lambda: worker.stop(timeout=timeout))
    # The stop waits on the running task (its slot still held), with no timeout.
    assert not worker.wait_idle(0)
    release.set()
    assert finished(stopping) is True
    assert handle.result(timeout=WAIT) == 1
    loop.join(WAIT)


def test_an_infinite_wait_for_slots_is_a_wait_with_no_bound() -> None:
    """``wait_idle`` and ``wait_running`` take ``math.inf`` (as ``stop`` passes it), each
    asked while what it waits for has not happened yet."""
    registry = TaskRegistry()
    started, release = threading.Semaphore(0), threading.Event()

    @registry.task("slow")
    def slow() -> None:
        started.release()
        release.wait(WAIT)

    scheduler = Scheduler(MemoryStore(), registry=registry)
    worker = Worker(scheduler, concurrency=2)
    loop = threading.Thread(target=worker.run, daemon=True)
    loop.start()
    scheduler.enqueue(slow)
    assert started.acquire(timeout=WAIT)
    running = in_thread(lambda: worker.wait_running(2, math.inf))  # one runs: waits
    scheduler.enqueue(slow)
    assert started.acquire(timeout=WAIT)
    assert finished(running) is True
    idle = in_thread(lambda: worker.wait_idle(math.inf))  # two run: waits
    release.set()
    assert finished(idle) is True
    assert worker.stop(WAIT)
    loop.join(WAIT)


def in_thread(wait: Callable[[], bool]) -> tuple[threading.Thread, list[bool | BaseException]]:
    """``wait()`` called in a thread of its own: its result, or what it raised."""
    outcome: list[bool | BaseException] = []

    def call() -> None:
        try:
            outcome.append(wait())
        except BaseException as e:  # what the test reports: the wait's own failure
            outcome.append(e)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, outcome


def finished(call: tuple[threading.Thread, list[bool | BaseException]]) -> bool | BaseException:
    thread, outcome = call
    thread.join(WAIT)
    assert outcome, "still waiting"
    return outcome[0]
