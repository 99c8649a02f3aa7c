"""The waiting thread that every handle of a scheduler shares (durablesched/waiting.py):
results that stream in are read in batches, the fallback read covers every wait
whatever the watcher says, and a coroutine's deadline holds after the scheduler closes.

Against a store and a watcher made here, driven by the test: no database, no sleeps
(waits are on events, bounded by WAIT)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Collection

import pytest

from durablesched.records import Finished
from durablesched.states import TaskState
from durablesched.store.protocol import OnFinished
from durablesched.waiting import Waiter, Waiters

WAIT = 10.0  # seconds: the bound on every wait below; none should take near it


class Watcher:
    """A finish watcher the test drives: ``report`` is what the store's would tell."""

    def __init__(self) -> None:
        self.on_finished: OnFinished | None = None
        self.nudges: list[float] = []
        self.nudged = threading.Event()
        self.changed = threading.Condition()
        self.closed = False

    def start(self, on_finished: OnFinished) -> None:
        self.on_finished = on_finished

    def report(self, task_ids: Collection[int] | None) -> bool | None:
        assert self.on_finished is not None
        return self.on_finished(task_ids)

    def nudge(self) -> None:
        with self.changed:
            self.nudges.append(time.monotonic())
            self.nudged.set()
            self.changed.notify_all()

    def close(self) -> None:
        self.closed = True


class Store:
    """Just what waiting reads: which tasks finished, and the watcher."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.watcher = Watcher()
        self.reads: list[set[int]] = []

    def watch_finished(self) -> Watcher:
        return self.watcher

    def finished(self, task_ids: Collection[int]) -> dict[int, Finished | None]:
        self.reads.append(set(task_ids))
        return {
            i: Finished(i, "t", TaskState.SUCCEEDED, 1, i * 10, None, None)
            for i in task_ids
            if i in self.done
        }


def settled(store: Store, task_ids: set[int]) -> None:
    """Wait until ``task_ids`` were read (waiters just added) and each read's nudge came:
    what the test tells the watcher next starts from a quiet thread."""

    def quiet() -> bool:
        return task_ids <= set().union(*store.reads) and len(store.watcher.nudges) == len(
            store.reads
        )

    with store.watcher.changed:
        assert store.watcher.changed.wait_for(quiet, WAIT)
        store.watcher.nudges.clear()
        store.watcher.nudged.clear()


def delivered(waiter: Waiter) -> int:
    assert waiter.wait(WAIT), "never delivered"
    assert waiter.record is not None
    result: int = waiter.record.result
    return result


def test_results_streaming_in_are_read_in_batches() -> None:
    """After a read that delivered results while other handles still wait, the watcher
    is asked to keep what finishes next (it is answered True) and is nudged only when
    the batch ends; once nobody waits, at once."""
    store, batch = Store(), 0.5
    waiters = Waiters(store, batch=batch, fallback=60)  # type: ignore[arg-type]
    first, second, third = Waiter(), Waiter(), Waiter()
    try:
        for task_id, waiter in ((1, first), (2, second), (3, third)):
            waiters.add(task_id, waiter)
        settled(store, {1, 2, 3})
        store.done.add(1)
        assert store.watcher.report({1}) is True  # a batch asked for, always
        assert delivered(first) == 10
        assert store.watcher.nudged.wait(WAIT)  # at the batch's end
        store.done.update({2, 3})
        store.watcher.nudged.clear()
        store.watcher.report({2, 3})
        assert (delivered(second), delivered(third)) == (20, 30)
        assert store.watcher.nudged.wait(WAIT)  # nobody waits now: nudged at once
        assert len(store.watcher.nudges) == 2
    finally:
        waiters.close()
    gap = store.watcher.nudges[1] - store.watcher.nudges[0]
    assert gap < batch, "with nobody left waiting, the watcher is nudged at once"


def test_the_batch_holds_back_the_nudge() -> None:
    """The nudge that ends a batch comes `batch` seconds after the read that began it."""
    store, batch = Store(), 0.3
    waiters = Waiters(store, batch=batch, fallback=60)  # type: ignore[arg-type]
    first, second = Waiter(), Waiter()
    try:
        waiters.add(1, first)
        waiters.add(2, second)
        settled(store, {1, 2})
        store.done.add(1)
        store.watcher.report({1})
        delivered(first)
        began = time.monotonic()  # the batch began after the delivery, so no earlier
        assert store.watcher.nudged.wait(WAIT)
        assert store.watcher.nudges[0] - began >= batch - 0.05
        assert second.record is None and waiters.waiting == 1
    finally:
        waiters.close()


def test_the_fallback_reads_every_wait_whatever_the_watcher_says() -> None:
    """A task the watcher never names is read at the fallback even while the watcher
    keeps naming others (a NOTIFY lost under a stream of them)."""
    store = Store()
    waiters = Waiters(store, batch=0, fallback=0.2)  # type: ignore[arg-type]
    lost, other = Waiter(), Waiter()
    stop = threading.Event()

    def chatter() -> None:  # news every 20 ms, never of task 1
        n = 100
        while not stop.wait(0.02):
            n += 1
            store.done.add(n)
            store.watcher.report({n})

    thread = threading.Thread(target=chatter)
    try:
        waiters.add(1, lost)
        waiters.add(99, other)  # someone else waits too: the reads go on
        thread.start()
        store.done.add(1)  # finished, and never told
        assert delivered(lost) == 10
    finally:
        stop.set()
        thread.join(WAIT)
        waiters.close()


def test_a_coroutines_deadline_outlives_the_waiting_thread() -> None:
    """Closed while a coroutine waits with a timeout, its deadline moves to its loop."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> bool:
        waiter = Waiter(asyncio.get_running_loop())
        assert waiter.future is not None
        waiters.add(1, waiter, timeout=0.05)
        await asyncio.to_thread(waiters.close)
        await asyncio.wait_for(waiter.future, WAIT)
        return waiter.expired

    assert asyncio.run(main()) is True


def test_a_deadline_expires_only_the_waits_still_pending() -> None:
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[bool, bool, int]:
        loop = asyncio.get_running_loop()
        late, done = Waiter(loop), Waiter(loop)
        assert late.future is not None and done.future is not None
        store.done.add(2)
        waiters.add(1, late, timeout=0.05)
        waiters.add(2, done, timeout=0.05)
        await asyncio.wait_for(asyncio.gather(late.future, done.future), WAIT)
        return late.expired, done.expired, waiters.waiting

    try:
        assert asyncio.run(main()) == (True, False, 0)
    finally:
        waiters.close()


@pytest.mark.parametrize("timeout", [0, 0.0])
def test_a_zero_timeout_still_reads_once(timeout: float) -> None:
    """A task already finished is delivered, not expired, even with no time to wait."""
    store = Store()
    store.done.add(5)
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[bool, int]:
        waiter = Waiter(asyncio.get_running_loop())
        assert waiter.future is not None
        waiters.add(5, waiter, timeout=timeout)
        record = await asyncio.wait_for(waiter.future, WAIT)
        return waiter.expired, -1 if record is None else record.result

    try:
        assert asyncio.run(main()) == (False, 50)
    finally:
        waiters.close()
