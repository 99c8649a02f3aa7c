"""Waiting for tasks to finish: one thread and one watcher per scheduler, however many wait.

Every :class:`~durablesched.TaskHandle` of a scheduler that waits registers here.
One thread reads, in one query, which of the awaited tasks finished, whenever the
store's :class:`~durablesched.store.protocol.FinishWatcher` says some may have
(SQLite: any commit, seen through inotify or ``data_version``; PostgreSQL: a NOTIFY
naming the tasks its transaction finished; memory: the store itself), when a new
waiter arrives, and every :data:`FALLBACK` seconds whatever it hears (a watcher
that failed or a lost notification delays a result by at most that). A finished
task wakes its waiters: threads through an event, coroutines through their event
loop, one call per loop and read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection

from durablesched.records import TaskRecord
from durablesched.store.protocol import FinishWatcher, Store

log = logging.getLogger("durablesched.waiting")

#: Seconds between reads when the watcher says nothing: the bound on a lost wake-up.
FALLBACK = 1.0
#: Seconds before reading again after a read failed (the database went away).
RETRY_AFTER = 0.1


class Waiter:
    """One wait for one task: a thread's (``loop`` None) or a coroutine's.

    Delivered once, from the waiting thread: the task's record, or None if no task
    has that id (any more).
    """

    __slots__ = ("_done", "future", "loop", "record")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future[TaskRecord | None] | None = (
            None if loop is None else loop.create_future()
        )
        self._done = threading.Event() if loop is None else None
        self.record: TaskRecord | None = None

    def wait(self, timeout: float | None) -> bool:
        """Block a thread until delivered (True) or ``timeout`` seconds pass (False)."""
        assert self._done is not None
        return self._done.wait(timeout)

    def deliver(self, record: TaskRecord | None) -> None:
        self.record = record
        if self._done is not None:
            self._done.set()


def _settle(delivered: list[tuple[Waiter, TaskRecord | None]]) -> None:
    """On a waiter's event loop: resolve its futures (those not cancelled meanwhile)."""
    for waiter, record in delivered:
        future = waiter.future
        if future is not None and not future.done():
            future.set_result(record)


class Waiters:
    """The tasks this scheduler's handles wait on, and the one thread that watches them.

    Started by the first wait, and stopped by :meth:`close` (the scheduler's).
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._waiting: dict[int, list[Waiter]] = {}
        #: Ids registered since the last read: read at once.
        self._fresh: set[int] = set()
        #: Ids the watcher named since the last read; None: any may have finished.
        self._heard: set[int] | None = set()
        self._wake = threading.Event()
        self._closed = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: FinishWatcher | None = None
        #: Reads made, for tests and benchmarks: how hard waiting worked.
        self.reads = 0

    def add(self, task_id: int, waiter: Waiter) -> None:
        """Wait on ``task_id``: ``waiter`` is delivered its record once it is finished.

        The watcher is listening before the read that covers the new id, so a task
        finishing at any moment is seen by one or the other.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the scheduler was closed: nothing can be waited on")
            if self._thread is None:
                self._start()
            self._waiting.setdefault(task_id, []).append(waiter)
            self._fresh.add(task_id)
        self._wake.set()

    def discard(self, task_id: int, waiter: Waiter) -> None:
        """Stop waiting (a timeout, a cancelled coroutine)."""
        with self._lock:
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

    def _on_finished(self, task_ids: Collection[int] | None) -> None:
        """From the watcher's thread: these tasks finished (None: some may have)."""
        with self._lock:
            if task_ids is None:
                self._heard = None
            elif self._heard is not None:
                self._heard.update(task_ids)
        self._wake.set()

    def _run(self) -> None:
        while True:
            told = self._wake.wait(FALLBACK)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                if not told or self._heard is None:
                    wanted = set(self._waiting)
                else:
                    wanted = self._fresh | (self._heard & self._waiting.keys())
                self._fresh = set()
                self._heard = set()
            if not wanted:
                continue
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
            if found:
                self._deliver(found)

    def _deliver(self, found: dict[int, TaskRecord | None]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Waiter, TaskRecord | None]]] = {}
        with self._lock:
            delivered = [
                (waiter, record)
                for task_id, record in found.items()
                for waiter in self._waiting.pop(task_id, ())
            ]
        for waiter, record in delivered:
            waiter.deliver(record)
            if waiter.loop is not None:
                by_loop.setdefault(waiter.loop, []).append((waiter, record))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, batch)
            except RuntimeError:  # its loop was closed: nobody is left to tell
                log.debug("an event loop closed while %d of its handles waited", len(batch))

    def close(self) -> None:
        """Stop the thread and the watcher; waiters still waiting are left to time out."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            watcher, self._watcher = self._watcher, None
        self._stopped.set()
        self._wake.set()
        if watcher is not None:
            watcher.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(FALLBACK + 1)
