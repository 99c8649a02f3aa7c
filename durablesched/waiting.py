"""Waiting for tasks to finish: one thread and one watcher per scheduler, however many wait.

Every :class:`~durablesched.TaskHandle` of a scheduler that waits registers here.
One thread reads, in one query, the outcomes of the awaited tasks that the store's
:class:`~durablesched.store.protocol.FinishWatcher` says finished (SQLite: the
history's lines written since its last look, after a commit seen through inotify
or ``data_version``; PostgreSQL: a NOTIFY naming the tasks its transaction
finished; memory: the store itself), those of waiters just arrived, and every
:data:`FALLBACK` seconds those of all, whatever it hears (a watcher that failed or
a lost notification delays a result by at most that). A finished task wakes its
waiters: threads through an event, coroutines through their event loop, one call
per loop and read.

Results that stream in are read in batches: after a read that delivered some while
other handles still wait, the watcher keeps what finishes next to itself for
:data:`BATCH` seconds (its own looks at the database stop meanwhile) and then tells
it all at once. So a wait costs this process a few reads a second under any load,
and a result arriving alone is read at once. A coroutine's timeout is kept here too,
in one heap, rather than as a timer on its event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Collection

from durablesched.records import Finished
from durablesched.store.protocol import FinishWatcher, Store

log = logging.getLogger("durablesched.waiting")

#: Seconds between reads of every awaited task, whatever the watcher says: the bound on
#: a lost wake-up.
FALLBACK = 1.0
#: Seconds before reading again after a read failed (the database went away).
RETRY_AFTER = 0.1
#: Seconds the watcher gathers what finishes after a read that delivered results while
#: other handles still wait: the most a result streaming in waits for its batch.
BATCH = 0.02


class Waiter:
    """One wait for one task: a thread's (``loop`` None) or a coroutine's.

    Delivered once, from the waiting thread: the task's outcome, or None if no task
    has that id (any more); or, for a coroutine with a deadline, ``expired``.
    """

    __slots__ = ("_done", "expired", "future", "loop", "pending", "record")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future[Finished | None] | None = (
            None if loop is None else loop.create_future()
        )
        self._done = threading.Event() if loop is None else None
        self.record: Finished | None = None
        #: Neither delivered, expired nor given up (changed under the waiters' lock).
        self.pending = True
        #: Its deadline passed first (a coroutine's: the future's result is then None).
        self.expired = False

    def wait(self, timeout: float | None) -> bool:
        """Block a thread until delivered (True) or ``timeout`` seconds pass (False)."""
        assert self._done is not None
        return self._done.wait(timeout)

    def deliver(self, record: Finished | None) -> None:
        self.record = record
        if self._done is not None:
            self._done.set()


def _settle(waiters: list[Waiter]) -> None:
    """On the waiters' event loop: resolve their futures (those not cancelled meanwhile)."""
    for waiter in waiters:
        future = waiter.future
        if future is not None and not future.done():
            future.set_result(waiter.record)


def _expire_later(timers: list[tuple[float, Waiter]]) -> None:
    """On the waiters' event loop, once the waiting thread is gone: a timer per deadline."""
    loop = asyncio.get_running_loop()
    for deadline, waiter in timers:
        loop.call_later(max(0.0, deadline - time.monotonic()), _expire, waiter)


def _expire(waiter: Waiter) -> None:
    if waiter.pending and waiter.future is not None and not waiter.future.done():
        waiter.pending = False
        waiter.expired = True
        waiter.future.set_result(None)


class Waiters:
    """The tasks this scheduler's handles wait on, and the one thread that watches them.

    Started by the first wait, and stopped by :meth:`close` (the scheduler's).
    ``fallback`` and ``batch`` default to :data:`FALLBACK` and :data:`BATCH`.
    """

    def __init__(self, store: Store, *, fallback: float = FALLBACK, batch: float = BATCH) -> None:
        self._store = store
        self._fallback = fallback
        self._batch = batch
        self._lock = threading.Lock()
        self._waiting: dict[int, list[Waiter]] = {}
        #: Ids registered since the last read: read at once.
        self._fresh: set[int] = set()
        #: Ids the watcher named since the last read; None: any may have finished.
        self._heard: set[int] | None = set()
        #: Coroutines' deadlines (monotonic seconds), earliest first.
        self._deadlines: list[tuple[float, int, int, Waiter]] = []
        self._order = itertools.count()
        #: When the watcher's batch ends (monotonic seconds); None: it is not gathering.
        self._batch_ends: float | None = None
        self._wake = threading.Event()
        self._closed = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: FinishWatcher | None = None
        #: Reads made, for tests and benchmarks: how hard waiting worked.
        self.reads = 0

    def add(self, task_id: int, waiter: Waiter, timeout: float | None = None) -> None:
        """Wait on ``task_id``: ``waiter`` is delivered its outcome once it is finished,
        or, with ``timeout`` (a coroutine's waiter only), expired after that many seconds
        if it is not finished by then.

        The watcher is listening before the read that covers the new id, so a task
        finishing at any moment is seen by one or the other.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            if self._closed:
                raise RuntimeError("the scheduler was closed: nothing can be waited on")
            if self._thread is None:
                self._start()
            self._waiting.setdefault(task_id, []).append(waiter)
            if deadline is not None:
                assert waiter.loop is not None, "a thread's waiter times out on its own"
                heapq.heappush(self._deadlines, (deadline, next(self._order), task_id, waiter))
            wake = not self._fresh  # else the thread has yet to take them: it is awake
            self._fresh.add(task_id)
        if wake:
            self._wake.set()

    def discard(self, task_id: int, waiter: Waiter) -> None:
        """Stop waiting (a timeout, a cancelled coroutine)."""
        with self._lock:
            waiter.pending = False
            waiters = self._waiting.get(task_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiting[task_id]

    @property
    def waiting(self) -> int:
        """How many tasks are waited on."""
        with self._lock:
            return len(self._waiting)

    def _start(self) -> None:
        watcher = self._store.watch_finished()
        if watcher is not None:
            watcher.start(self._on_finished)
        self._watcher = watcher
        self._thread = threading.Thread(target=self._run, name="durablesched-wait", daemon=True)
        self._thread.start()

    def _on_finished(self, task_ids: Collection[int] | None) -> bool:
        """From the watcher's thread: these tasks finished (None: some may have). Answers
        True: the watcher keeps what comes next until nudged (:meth:`_nudge_when`)."""
        with self._lock:
            if task_ids is None:
                self._heard = None
            elif self._heard is not None:
                self._heard.update(task_ids)
        self._wake.set()
        return True

    def _run(self) -> None:
        next_fallback = time.monotonic() + self._fallback
        while True:
            with self._lock:
                if self._closed:
                    return
                until = min(
                    next_fallback,
                    self._deadlines[0][0] if self._deadlines else math.inf,
                    math.inf if self._batch_ends is None else self._batch_ends,
                )
            self._wake.wait(max(0.0, until - time.monotonic()))
            self._wake.clear()
            now = time.monotonic()
            fallback = now >= next_fallback
            with self._lock:
                if self._closed:
                    return
                if fallback or self._heard is None:
                    wanted = set(self._waiting)
                else:
                    wanted = self._fresh | (self._heard & self._waiting.keys())
                self._fresh = set()
                self._heard = set()
            if fallback:
                next_fallback = now + self._fallback
            delivered = 0
            if wanted:
                try:
                    found = self._store.finished(wanted)
                except Exception as e:  # the database went away: read again soon
                    log.warning("reading which awaited tasks finished failed: %s", e)
                    with self._lock:
                        self._heard = None
                        closed = self._closed
                    if closed:
                        return
                    self._stopped.wait(RETRY_AFTER)
                    self._wake.set()
                    continue
                self.reads += 1
                delivered = self._deliver(found)
            else:
                self._deliver({})  # deadlines only
            self._nudge_when(delivered)

    def _nudge_when(self, delivered: int) -> None:
        """End the watcher's batch now, or :data:`BATCH` seconds after a read that
        delivered results while others still wait (a stream: let more gather)."""
        now = time.monotonic()
        with self._lock:
            ends = self._batch_ends
            if ends is None and delivered and self._waiting:
                self._batch_ends = now + self._batch
                return
            if ends is not None and now < ends:
                return  # gathering: the thread wakes at its end
            self._batch_ends = None
            watcher = self._watcher
        if watcher is not None:
            watcher.nudge()

    def _deliver(self, found: dict[int, Finished | None]) -> int:
        """Hand the finished tasks to their waiters, and expire those past their
        deadline; returns how many were delivered."""
        now = time.monotonic()
        with self._lock:
            ready: list[Waiter] = []
            for task_id, record in found.items():
                for waiter in self._waiting.pop(task_id, ()):
                    waiter.pending = False
                    waiter.record = record
                    ready.append(waiter)
            delivered = len(ready)
            while self._deadlines and self._deadlines[0][0] <= now:
                _, _, task_id, waiter = heapq.heappop(self._deadlines)
                if waiter.pending:
                    waiter.pending = False
                    waiter.expired = True
                    ready.append(waiter)
                    waiters = self._waiting.get(task_id)
                    if waiters is not None:
                        waiters.remove(waiter)
                        if not waiters:
                            del self._waiting[task_id]
        by_loop: dict[asyncio.AbstractEventLoop, list[Waiter]] = {}
        for waiter in ready:
            if waiter.loop is None:
                waiter.deliver(waiter.record)
            else:
                by_loop.setdefault(waiter.loop, []).append(waiter)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, batch)
            except RuntimeError:  # its loop was closed: nobody is left to tell
                log.debug("an event loop closed while %d of its handles waited", len(batch))
        return delivered

    def close(self) -> None:
        """Stop the thread and the watcher; waiters still waiting are left to time out
        (a coroutine's deadline moves to a timer on its event loop)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            watcher, self._watcher = self._watcher, None
            deadlines, self._deadlines = self._deadlines, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[float, Waiter]]] = {}
        for deadline, _, _, waiter in deadlines:
            if waiter.pending and waiter.loop is not None:
                by_loop.setdefault(waiter.loop, []).append((deadline, waiter))
        for loop, timers in by_loop.items():
            try:
                loop.call_soon_threadsafe(_expire_later, timers)
            except RuntimeError:  # its loop was closed: nobody is left to tell
                log.debug("an event loop closed while %d of its handles waited", len(timers))
        self._stopped.set()
        self._wake.set()
        if watcher is not None:
            watcher.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._fallback + 1)
