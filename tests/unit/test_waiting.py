"""The waiting thread that every handle of a scheduler shares (durablesched/waiting.py):
results that stream in are read in batches, the fallback reads every wait again
whatever the watcher says (within a fallback of its own last read), a future's deadline,
cancellation and the scheduler's close each end its wait.

Against a store and a watcher made here, driven by the test: no database, no sleeps
(waits are on events, bounded by WAIT)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import pytest

from durablesched import TaskCancelled, TaskFailed, TaskNotFoundError, waiting
from durablesched.records import Finished
from durablesched.states import TaskState
from durablesched.store.protocol import Awaited, OnFinished, Outcomes
from durablesched.waiting import Waiter, Waiters

from ..conftest import RecordingEvent

WAIT = 10.0  # seconds: the bound on every wait below; none should take near it


class Watcher:
    """A finish watcher the test drives: ``report`` is what the store's would tell."""

    def __init__(self) -> None:
        self.on_finished: OnFinished | None = None
        self.awaited: Awaited | None = None
        self.nudges: list[float] = []
        self.nudged = threading.Event()
        self.changed = threading.Condition()
        self.closed = False

    def start(self, on_finished: OnFinished, awaited: Awaited | None = None) -> None:
        self.on_finished = on_finished
        self.awaited = awaited

    def report(self, task_ids: Collection[int] | None) -> bool | float | None:
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


def clocked(store: Store, batch: float, now: list[float]) -> Waiters:
    """Waiters on ``store`` whose reads cost nothing and whose stream's clock is ``now[0]``."""
    return Waiters(
        store,  # type: ignore[arg-type]
        batch=batch,
        fallback=60,
        cpu_clock=lambda: 0.0,  # cheap reads: READ_SHARE asks for nothing longer
        clock=lambda: now[0],
    )


def report_at(store: Store, now: list[float], at: float, *task_ids: int) -> bool | float | None:
    """The watcher reports ``task_ids`` succeeded, their outcomes read in its own look, at
    ``at`` on the clock ``now``: what it is answered (a batch's length, or False)."""
    now[0] = at
    outcomes = Outcomes()
    for task_id in task_ids:
        outcomes[task_id] = Finished(task_id, "t", TaskState.SUCCEEDED, 1, 1, None, None)
    return store.watcher.report(outcomes)


def streaming(
    batch: float, count: int
) -> tuple[Store, Waiters, Callable[..., bool | float | None]]:
    """A store, its :func:`clocked` waiters with threads waiting on tasks ``1 .. count``
    (their first read made), and :func:`report_at` on the waiters' clock."""
    now = [0.0]
    store = Store()
    waiters = clocked(store, batch, now)
    threads_wait(store, waiters, set(range(1, count + 1)))
    return store, waiters, functools.partial(report_at, store, now)


def threads_wait(store: Store, waiters: Waiters, task_ids: set[int]) -> None:
    """A thread's wait on each of ``task_ids``, their first read made (:func:`settled`),
    the store's earlier reads forgotten."""
    store.reads.clear()
    for task_id in task_ids:
        waiters.add(task_id, Waiter())
    settled(store, task_ids)


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


@pytest.mark.parametrize(
    "read_cpu",
    [
        0.0,  # cheap reads: the batch asked for (50 ms)
        0.0015,  # 1.5 ms a read is READ_SHARE (1.5 %) of 100 ms
        1.0,  # however costly: MAX_BATCH (200 ms here)
    ],
)
def test_a_costly_read_spreads_the_next_batch(
    monkeypatch: pytest.MonkeyPatch, read_cpu: float
) -> None:
    """A batch lasts as long as makes the read that began it READ_SHARE of a core,
    never less than the batch asked for, never more than MAX_BATCH."""
    monkeypatch.setattr(waiting, "MAX_BATCH", 0.2)
    monkeypatch.setattr(waiting, "READ_SHARE", 0.015)
    calls = itertools.count()

    def clock() -> float:  # read before and after each read: each read costs read_cpu
        return (next(calls) + 1) // 2 * read_cpu

    store = Store()
    waiters = Waiters(store, batch=0.05, fallback=60, cpu_clock=clock)  # type: ignore[arg-type]
    first, second = Waiter(), Waiter()
    try:
        waiters.add(1, first)
        waiters.add(2, second)
        settled(store, {1, 2})
        store.done.add(1)
        store.watcher.report({1})
        delivered(first)
        began = time.monotonic()
        assert store.watcher.nudged.wait(WAIT)
        gap = store.watcher.nudges[0] - began
    finally:
        waiters.close()
    expected = min(max(0.05, read_cpu / 0.015), 0.2)
    assert expected - 0.02 <= gap < expected + 0.1, (gap, expected)


@pytest.mark.parametrize("look_cpu", [0.0, 0.0015, 0.01])
def test_outcomes_the_watcher_read_are_delivered_from_its_thread_with_no_read(
    monkeypatch: pytest.MonkeyPatch, look_cpu: float
) -> None:
    """A watcher that read the outcomes in its own look (SQLite) reports them as
    Outcomes: they are delivered before the report returns (on the watcher's thread),
    with no read of the store and no nudge. While other handles still wait, the watcher
    is answered the batch's length (spread by the look's cost as by a read's), to keep
    quiet that long by itself; once nobody waits, False: the next commit is news."""
    monkeypatch.setattr(waiting, "MAX_BATCH", 0.2)
    monkeypatch.setattr(waiting, "READ_SHARE", 0.015)
    store = Store()
    waiters = Waiters(store, batch=0.05, fallback=60, cpu_clock=lambda: 0.0)  # type: ignore[arg-type]
    first, second = Waiter(), Waiter()
    try:
        waiters.add(1, first)
        waiters.add(2, second)
        settled(store, {1, 2})
        reads = len(store.reads)
        outcomes = Outcomes(look_cpu)
        for task_id in (1, 7):  # 7: nobody waits on it any more
            outcomes[task_id] = Finished(task_id, "t", TaskState.SUCCEEDED, 1, 10, None, None)
        answer = store.watcher.report(outcomes)
        assert first.wait(0) and first.record is not None and first.record.result == 10
        assert answer == min(max(0.05, look_cpu / 0.015), 0.2)
        assert not second.wait(0)
        last = Outcomes()
        last[2] = Finished(2, "t", TaskState.SUCCEEDED, 1, 20, None, None)
        assert store.watcher.report(last) is False  # nobody waits now
        assert second.wait(0) and delivered(second) == 20
        assert len(store.reads) == reads  # nothing read again
        assert store.watcher.nudges == []
        assert waiters.reads == reads + 2  # each report counted as a read
    finally:
        waiters.close()


def test_the_watcher_is_told_which_tasks_are_waited_on_while_they_are() -> None:
    """What the watcher asks for each task it sees finish (SQLite's look reads only
    those outcomes) answers for the waits of now: one begun after others ended, one
    ended, and none once the scheduler closed."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    first, second = Waiter(), Waiter()
    try:
        waiters.add(1, first)
        awaited = store.watcher.awaited
        assert awaited is not None and awaited(1) and not awaited(2)
        outcomes = Outcomes()
        outcomes[1] = Finished(1, "t", TaskState.SUCCEEDED, 1, 10, None, None)
        store.watcher.report(outcomes)
        assert delivered(first) == 10 and not awaited(1)
        waiters.add(2, second)
        assert awaited(2)
    finally:
        waiters.close()
    assert not awaited(2)


def test_a_stream_s_batch_ends_when_its_rate_says_the_waits_left_will_have_finished() -> None:
    """The batch a delivering read begins lasts no longer than the waits left take at
    the rate of that read and the one before: a drain's last results are not held for
    a whole batch after their commits. A stream's first read has no rate (the batch
    asked for), and neither has the first read of the next stream (after nobody waited)."""
    store, waiters, report = streaming(0.05, 12)
    try:
        assert report(1.0, 1, 2, 3, 4) == 0.05  # no rate yet: the batch asked for
        # 4 left at 80 a second: 50 ms, not twice the last batch (100 ms), no less.
        assert report(1.05, 5, 6, 7, 8) == pytest.approx(0.05)
        assert report(1.1, 9, 10) == pytest.approx(0.05)  # 2 left at 40 a second
        assert report(1.12, 11) == pytest.approx(0.02)  # 1 left at 50 a second
        assert report(1.13, 12) is False  # nobody waits: the next commit is news
        threads_wait(store, waiters, {20, 21})
        assert report(1.14, 20) == 0.05  # a new stream: no rate from the last one
    finally:
        waiters.close()


def test_a_stream_that_goes_on_is_read_half_as_often_each_batch_up_to_max_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each batch of a stream lasts at least twice the one before (fewer, larger reads
    cost the waiting process less), up to MAX_BATCH, the most a streaming result waits;
    the stream's rate still ends a batch sooner; the next stream starts again at the
    batch asked for."""
    monkeypatch.setattr(waiting, "MAX_BATCH", 0.1)
    store, waiters, report = streaming(0.02, 100)
    try:
        assert report(1.0, 1) == 0.02  # no stream before: the batch asked for
        assert report(1.02, 2) == pytest.approx(0.04)  # twice the last
        assert report(1.06, 3) == pytest.approx(0.08)
        assert report(1.14, 4) == pytest.approx(0.1)  # MAX_BATCH, not 0.16
        assert report(1.24, 5) == pytest.approx(0.1)
        # 90 delivered in 0.1 s (900 a second): the 5 left take 5.6 ms, not 100.
        assert report(1.34, *range(6, 96)) == pytest.approx(5 * 0.1 / 90)
        assert report(1.35, *range(96, 101)) is False  # nobody waits: the stream is over
        threads_wait(store, waiters, {200, 201})
        assert report(2.0, 200) == 0.02  # a new stream: nothing doubled from the last one
    finally:
        waiters.close()


def test_a_read_s_batch_ends_when_the_stream_s_rate_says_the_waits_left_will_have_finished() -> (
    None
):
    """The same for a watcher that is nudged at the batch's end (PostgreSQL, memory)."""
    now = [0.0]
    store = Store()
    waiters = Waiters(store, batch=0.05, fallback=60, clock=lambda: now[0])  # type: ignore[arg-type]
    waits = [Waiter() for _ in range(4)]

    def batch_after(at: float, delivered: int) -> float:
        """What the batch begun by a read at ``at`` delivering ``delivered`` lasts."""
        now[0] = at
        with waiters._lock:
            waiters._batch_ends = None  # the batch before ended
        began = time.monotonic()
        waiters._nudge_when(delivered, 0.0)
        with waiters._lock:
            assert waiters._batch_ends is not None
            return waiters._batch_ends - began

    try:
        for task_id, waiter in enumerate(waits, 1):
            waiters.add(task_id, waiter)
        settled(store, {1, 2, 3, 4})
        for task_id in (1, 2):
            waiters.discard(task_id, waits[task_id - 1])
        assert batch_after(1.0, 2) >= 0.05  # no rate yet
        waiters.discard(3, waits[2])
        assert batch_after(1.01, 1) <= 0.011  # 1 left at 100 a second
        waiters.discard(4, waits[3])
        now[0] = 1.02
        with waiters._lock:
            waiters._batch_ends = None
        waiters._nudge_when(1, 0.0)  # the last result read: nobody waits now
        store.reads.clear()
        store.watcher.nudges.clear()
        later = [Waiter(), Waiter()]
        waiters.add(5, later[0])
        waiters.add(6, later[1])
        settled(store, {5, 6})
        waiters.discard(5, later[0])
        assert batch_after(1.03, 1) >= 0.05  # a new stream: no rate from the last one
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


def test_a_wait_is_read_again_within_a_fallback_of_its_own_last_read() -> None:
    """Each wait is read again within the fallback of its own last read, not at a tick
    shared by all: a wait read under half the fallback ago is not read then (a drain
    shorter than that is read once); the waits read at least half of it ago are read
    with the one due (waits begun at scattered times share a read, not one each); a
    wait no longer waited on is not read at all."""
    rereads = waiting.Rereads(1.0)
    assert rereads.next() == math.inf
    rereads.read(0.0, {1, 2})
    rereads.read(0.6, {3})
    rereads.read(0.7, set())  # a read of nothing (deadlines only): nothing to read again
    still = {1: None, 3: None, 4: None}  # task 2 was delivered
    assert rereads.next() == 1.0
    assert rereads.due(0.99, still) == set()
    assert rereads.due(1.0, still) == {1}  # not 3, read 0.4 s ago
    assert rereads.next() == 1.6
    rereads.read(1.0, {1})
    rereads.read(1.3, {4})
    assert rereads.due(1.59, still) == set()  # 1, read 0.59 s ago, waits for 3's turn
    assert rereads.due(1.6, still) == {1, 3}  # 1 with 3; not 4, read 0.3 s ago
    assert rereads.next() == 2.3
    rereads.read(1.6, {1, 3})
    rereads.read(1.7, {1, 3, 4}, every_wait=True)  # every wait read: none earlier is due
    assert rereads.next() == 2.7
    assert rereads.due(2.7, {}) == set()  # nothing waits any more
    assert rereads.next() == math.inf


@pytest.mark.parametrize("timeout", [math.inf, 1e12])
def test_a_thread_s_wait_takes_a_timeout_of_any_length(timeout: float) -> None:
    """``handle.result(timeout=math.inf)`` (or of centuries) waits with no bound, where a
    lock's wait would raise ``OverflowError``."""
    waiter = Waiter()
    waiter._done = done = RecordingEvent()
    waiter.deliver(None)
    assert waiter.wait(timeout)
    assert done.timeouts == [threading.TIMEOUT_MAX]


def test_with_nothing_due_the_thread_sleeps_until_woken_and_serves_later_waits() -> None:
    """Once nothing is waited on and no read is due (no wait, no deadline, no batch), the
    waiting thread sleeps as long as a thread's wait takes, not for ever (a lock's wait
    refuses ``math.inf``: the thread would end, and no later wait would be read or time
    out)."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    wake = waiters._wake = RecordingEvent()
    try:
        store.done.update({1, 2})
        first = Waiter()
        waiters.add(1, first)
        assert delivered(first) == 10
        # Nothing waits; "any task may have finished": every wait is read (none), and no
        # earlier read is due again.
        store.watcher.report(None)
        with wake.slept:  # (the read due next was a minute away)
            assert wake.slept.wait_for(lambda: max(wake.timeouts, default=0) > 3600, WAIT)
            assert max(wake.timeouts) <= threading.TIMEOUT_MAX
        second = Waiter()
        waiters.add(2, second)
        assert delivered(second) == 20
    finally:
        waiters.close()


def test_a_deadline_expires_only_the_waits_still_pending() -> None:
    """A future past its deadline raises TimeoutError and leaves nothing waiting; one
    whose task finished in time has its result."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[str, object, int]:
        loop = asyncio.get_running_loop()
        store.done.add(2)
        late = waiters.future(1, loop, timeout=0.05)
        done = waiters.future(2, loop, timeout=0.05)
        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(late, WAIT)
        return str(raised.value), await done, waiters.waiting

    try:
        assert asyncio.run(main()) == ("task 1 did not finish within 0.05 s", 20, 0)
    finally:
        waiters.close()


@pytest.mark.parametrize("timeout", [0, 0.0])
def test_a_zero_timeout_still_reads_once(timeout: float) -> None:
    """A task already finished is delivered, not expired, even with no time to wait."""
    store = Store()
    store.done.add(5)
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> object:
        return await asyncio.wait_for(waiters.future(5, asyncio.get_running_loop(), timeout), WAIT)

    try:
        assert asyncio.run(main()) == 50
    finally:
        waiters.close()


def test_a_cancelled_future_stops_waiting() -> None:
    """Cancelling the future (or the code awaiting it) unregisters it at once: nothing is
    left waiting on its task, whether it had a deadline or not."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        plain, timed = waiters.future(1, loop), waiters.future(2, loop, timeout=WAIT)
        awaiting = asyncio.ensure_future(asyncio.gather(plain, timed))
        await asyncio.sleep(0)
        before = waiters.waiting
        awaiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await awaiting
        return before, waiters.waiting

    try:
        assert asyncio.run(main()) == (2, 0)
    finally:
        waiters.close()


class HandOvers:
    """Counts ``loop``'s ``call_soon_threadsafe`` calls from now on: the waiting thread's
    hand-overs to it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.calls = 0
        real = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            self.calls += 1
            return real(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]


def test_a_read_resolves_a_loop_s_futures_in_one_call() -> None:
    """However many of a loop's futures a read finds finished, the waiting thread hands
    them to that loop in one ``call_soon_threadsafe`` (a wake-up of the loop each would
    cost it more than the futures themselves)."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[list[object], int]:
        loop = asyncio.get_running_loop()
        hand_overs = HandOvers(loop)
        futures = [waiters.future(i, loop, timeout=WAIT) for i in range(100)]
        waiters._deliver(
            {i: Finished(i, "t", TaskState.SUCCEEDED, 1, i, None, None) for i in range(100)}
        )
        return await asyncio.wait_for(asyncio.gather(*futures), WAIT), hand_overs.calls

    try:
        assert asyncio.run(main()) == (list(range(100)), 1)
    finally:
        waiters.close()


def test_deadlines_come_out_earliest_first_whatever_order_they_went_in() -> None:
    """Deadlines of one timeout, made in order, are kept as a run (an append each); one
    earlier than the run's last (a shorter timeout after a longer) goes in the heap
    beside it: either way each comes out at its time, not before, not after."""
    deadlines = waiting.Deadlines()
    futures = [waiting.WaitingFuture.__new__(waiting.WaitingFuture) for _ in range(7)]
    for task_id, (future, deadline) in enumerate(
        zip(futures, [5.0, 7.0, 3.0, 7.0, 6.0, 9.0, 8.0], strict=True)
    ):
        future.task_id = task_id
        future.deadline = deadline
        deadlines.add(future)
    assert (len(deadlines), deadlines.first()) == (7, 3.0)
    assert deadlines.pop_due(4.0) == [futures[2]]
    assert deadlines.first() == 5.0
    assert sorted(f.deadline for f in deadlines.pop_due(7.0)) == [5.0, 6.0, 7.0, 7.0]
    deadlines.keep({5: [futures[5]]})  # the heap's 8.0 (task 6) stopped waiting
    assert (len(deadlines), deadlines.first()) == (1, 9.0)
    assert deadlines.pop_due(10.0) == [futures[5]]
    assert (len(deadlines), deadlines.first()) == (0, math.inf)


def test_cancelled_futures_deadlines_are_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits given up by the many do not keep their futures in the deadline heap until
    their deadlines pass."""
    monkeypatch.setattr(waiting, "COMPACT_AFTER", 4)
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> int:
        loop = asyncio.get_running_loop()
        futures = [waiters.future(i, loop, timeout=WAIT) for i in range(10)]
        for future in futures[:9]:
            future.cancel()
        return len(waiters._deadlines)

    try:
        assert asyncio.run(main()) < 5
    finally:
        waiters.close()


def long_waits_delivered(waiters: Waiters, count: int) -> list[object]:
    """Futures on tasks ``0 .. count - 1``, each with a timeout far longer than the test,
    gathered on a loop of their own: their results."""

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        futures = [waiters.future(i, loop, timeout=WAIT * 100) for i in range(count)]
        return await asyncio.wait_for(asyncio.gather(*futures), WAIT)

    return asyncio.run(main())


def test_delivered_futures_deadlines_are_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short waits with long timeouts do not keep their futures (and results) in the
    deadline heap for those timeouts once delivered."""
    monkeypatch.setattr(waiting, "COMPACT_AFTER", 4)
    store = Store()
    store.done.update(range(10))
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    try:
        assert long_waits_delivered(waiters, 10) == [i * 10 for i in range(10)]
        assert len(waiters._deadlines) <= 4  # compacted at least once; at most 4 since
    finally:
        waiters.close()


def test_once_nothing_waits_no_deadline_is_kept() -> None:
    """However few ended (no compaction yet), the last wait's end lets every deadline go:
    none can belong to a wait still waiting."""
    store = Store()
    store.done.update(range(3))
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    try:
        assert long_waits_delivered(waiters, 3) == [0, 10, 20]
        assert len(waiters._deadlines) == 0
    finally:
        waiters.close()


def test_an_outcome_read_for_a_future_cancelled_meanwhile_is_dropped() -> None:
    """The waiting thread read the task and handed its future to the loop; the future is
    cancelled before the loop settles it: it stays cancelled, and nothing is raised."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    handed = threading.Event()
    deliver = waiters._deliver

    def deliver_then_tell(found: Mapping[int, Finished | None]) -> int:
        delivered = deliver(found)
        if found:
            handed.set()
        return delivered

    waiters._deliver = deliver_then_tell  # type: ignore[method-assign]
    errors: list[dict[str, object]] = []

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        store.done.add(3)
        future = waiters.future(3, loop)
        assert handed.wait(WAIT)  # blocks the loop: the settling call waits behind us
        future.cancel()
        for _ in range(3):
            await asyncio.sleep(0)  # the settling call runs
        return future.cancelled()

    try:
        assert asyncio.run(main()) is True
        assert errors == []
    finally:
        waiters.close()


def test_closing_wakes_every_wait() -> None:
    """Nothing can finish a wait once the waiting thread is gone: closing resolves every
    future with a RuntimeError on its loop and wakes every thread's waiter."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    thread_waiter = Waiter()

    async def main() -> list[BaseException | object]:
        loop = asyncio.get_running_loop()
        waiters.add(1, thread_waiter)
        futures = [waiters.future(1, loop), waiters.future(2, loop, timeout=WAIT)]
        await asyncio.to_thread(waiters.close)
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT)

    outcomes = asyncio.run(main())
    assert [str(e) for e in outcomes] == [
        "the scheduler was closed while task 1 was waited on",
        "the scheduler was closed while task 2 was waited on",
    ]
    assert all(isinstance(e, RuntimeError) for e in outcomes)
    assert thread_waiter.wait(0) and thread_waiter.closed
    with pytest.raises(RuntimeError, match="closed"):
        waiters.add(3, Waiter())


def test_a_failing_waiting_thread_ends_every_wait_with_its_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in the waiting thread must not leave waits hanging: each wait still waiting (a
    thread's, a coroutine's) ends with a RuntimeError naming the failure, a new wait is
    refused saying so, and the failure is logged."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    thread_waiter = Waiter()
    thread: list[threading.Thread] = []

    def broken(found: Mapping[int, Finished | None]) -> int:
        raise ValueError("a bug")

    async def main() -> list[BaseException | object]:
        loop = asyncio.get_running_loop()
        waiters.add(1, thread_waiter)
        futures = [waiters.future(2, loop), waiters.future(3, loop, timeout=WAIT)]
        await asyncio.to_thread(settled, store, {1, 2, 3})
        assert waiters._thread is not None
        thread.append(waiters._thread)
        waiters._deliver = broken  # type: ignore[method-assign]
        store.watcher.report({1})  # the thread reads task 1, and fails delivering it
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT)

    outcomes = asyncio.run(main())
    failed = "the scheduler's waiting thread failed (ValueError: a bug)"
    assert [str(e) for e in outcomes] == [
        f"waiting for task 2 failed: {failed}",
        f"waiting for task 3 failed: {failed}",
    ]
    assert all(isinstance(e, RuntimeError) for e in outcomes)
    assert thread_waiter.wait(WAIT)
    assert thread_waiter.closed == f"waiting for task 1 failed: {failed}"
    assert isinstance(waiters.failure, ValueError)
    with pytest.raises(RuntimeError, match=r"waiting thread failed \(ValueError: a bug\)"):
        waiters.add(4, Waiter())
    assert "the waiting thread failed" in caplog.text
    thread[0].join(WAIT)  # it closes the watcher after ending the waits
    assert store.watcher.closed
    waiters.close()  # closing after a failure keeps it
    assert isinstance(waiters.failure, ValueError)


def finished(task_id: int, state: TaskState = TaskState.SUCCEEDED) -> Finished:
    return Finished(task_id, "t", state, 1, task_id * 10, None, None)


def test_a_gathering_is_resolved_once_in_one_call_when_its_last_task_finishes() -> None:
    """``agather``'s wait: registered once under each task (a repeated one too), its
    values in the order asked, resolved in one call on its loop, only when the last task
    is delivered: no future or callback per task."""
    store = Store()
    store.done.add(2)
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[bool, list[Any], int]:
        loop = asyncio.get_running_loop()
        gathering = waiters.gathering([1, 2, 1, 3], {}, return_exceptions=False, loop=loop)
        assert gathering.future is not None
        await asyncio.to_thread(settled, store, {1, 2, 3})  # task 2 read finished
        assert waiters.waiting == 2
        hand_overs = HandOvers(loop)
        waiters._deliver({1: finished(1)})
        await asyncio.sleep(0)
        early = gathering.future.done()
        waiters._deliver({3: finished(3), 4: finished(4)})
        return early, await asyncio.wait_for(gathering.future, WAIT), hand_overs.calls

    try:
        assert asyncio.run(main()) == (False, [10, 20, 10, 30], 1)
        assert waiters.waiting == 0
    finally:
        waiters.close()


def test_a_gathering_raises_its_first_failure_in_order_unless_return_exceptions() -> None:
    """Every task finished, the first (in the order asked) that did not succeed raises as
    its handle's ``result()`` would; with ``return_exceptions`` each such one stands in
    its place, the others' results around it."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    outcomes: dict[int, Finished | None] = {
        1: finished(1),
        2: finished(2, TaskState.CANCELLED),
        3: finished(3, TaskState.FAILED),
        4: None,
    }

    async def gathered(return_exceptions: bool) -> list[Any]:
        loop = asyncio.get_running_loop()
        gathering = waiters.gathering(
            [1, 3, 2, 4], {}, return_exceptions=return_exceptions, loop=loop
        )
        assert gathering.future is not None
        waiters._deliver(outcomes)
        return await asyncio.wait_for(gathering.future, WAIT)

    try:
        with pytest.raises(TaskFailed, match="task 3"):
            asyncio.run(gathered(False))
        values = asyncio.run(gathered(True))
        assert values[0] == 10
        assert [type(v) for v in values[1:]] == [TaskFailed, TaskCancelled, TaskNotFoundError]
    finally:
        waiters.close()


def test_a_gathering_s_deadline_ends_it_and_leaves_nothing_waiting() -> None:
    """Its timeout is kept by the waiting thread: once past, the future raises
    TimeoutError naming how many tasks were not finished, and no task is waited on for it
    any more; a task already finished is still read first (a zero timeout too)."""
    store = Store()
    store.done.add(2)
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[str, list[Any], int]:
        loop = asyncio.get_running_loop()
        late = waiters.gathering([1, 2], {}, return_exceptions=False, loop=loop, timeout=0.05)
        ready = waiters.gathering([2], {}, return_exceptions=False, loop=loop, timeout=0)
        assert late.future is not None and ready.future is not None
        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(late.future, WAIT)
        return str(raised.value), await ready.future, waiters.waiting

    try:
        assert asyncio.run(main()) == (
            "1 of the 2 tasks gathered did not finish within 0.05 s (the first: task 1)",
            [20],
            0,
        )
    finally:
        waiters.close()


def test_a_cancelled_gathering_stops_waiting_on_every_task() -> None:
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]

    async def main() -> tuple[int, int, bool]:
        loop = asyncio.get_running_loop()
        gathering = waiters.gathering([1, 2, 3], {}, return_exceptions=False, loop=loop)
        assert gathering.future is not None
        before = waiters.waiting
        gathering.future.cancel()
        return before, waiters.waiting, waiters.drop(gathering)

    try:
        assert asyncio.run(main()) == (3, 0, False)
    finally:
        waiters.close()


def test_a_thread_s_gathering_is_woken_once_its_last_task_is_delivered() -> None:
    """``gather``'s wait (a thread's): outcomes read before it registers are kept, only
    the others are waited on, and its event is set once the last is delivered; a drop
    after that (a timeout losing the race) is refused, so the delivery stands."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    try:
        gathering = waiters.gathering([5, 6], {5: finished(5)}, return_exceptions=False)
        assert gathering.event is not None and not gathering.done
        settled(store, {6})
        assert waiters.waiting == 1 and not gathering.event.is_set()
        waiters._deliver({6: finished(6)})
        assert gathering.event.wait(WAIT)
        assert not waiters.drop(gathering)
        assert gathering.values() == [50, 60]
        ready = waiters.gathering([5], {5: finished(5)}, return_exceptions=False)
        assert ready.done and ready.values() == [50]  # nothing to wait on: not registered
        assert waiters.waiting == 0
    finally:
        waiters.close()


def test_closing_ends_every_gathering() -> None:
    """A thread's gathering is woken with why (its handle's ``gather`` raises it), a
    coroutine's future raises RuntimeError; a timeout after loses to the close."""
    store = Store()
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    threads = waiters.gathering([1, 2], {}, return_exceptions=False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gathering = waiters.gathering([2, 3], {}, return_exceptions=False, loop=loop)
        assert gathering.future is not None
        await asyncio.to_thread(waiters.close)
        with pytest.raises(RuntimeError, match="closed while 2 tasks were gathered"):
            await asyncio.wait_for(gathering.future, WAIT)

    asyncio.run(main())
    assert threads.event is not None and threads.event.wait(0)
    assert threads.closed == "the scheduler was closed while 2 tasks were gathered"
    assert not waiters.drop(threads)


class Gate(threading.Event):
    """The waiting thread's wake-up, held shut until the test opens ``gate``: what the
    test does first happens before the thread's next read."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        assert self.gate.wait(WAIT)
        return super().wait(timeout)


def test_a_wait_not_read_yet_does_not_expire_on_another_s_delivery() -> None:
    """A wait with no time to wait (timeout 0) on a task already finished has its result,
    even when another delivery (the watcher's, from its own thread) comes between its
    registration and the waiting thread's first read of it: only a wait read once
    expires, a future's and a gathering's alike."""
    store = Store()
    store.done.add(5)
    waiters = Waiters(store, fallback=60)  # type: ignore[arg-type]
    wake = waiters._wake = Gate()

    async def main() -> tuple[object, list[Any]]:
        loop = asyncio.get_running_loop()
        future = waiters.future(5, loop, timeout=0)
        gathering = waiters.gathering([5], {}, return_exceptions=False, loop=loop, timeout=0)
        assert gathering.future is not None
        waiters._deliver({})  # another delivery, past both deadlines, before any read
        wake.gate.set()
        return await asyncio.wait_for(future, WAIT), await asyncio.wait_for(gathering.future, WAIT)

    try:
        assert asyncio.run(main()) == (50, [50])
    finally:
        waiters.close()
