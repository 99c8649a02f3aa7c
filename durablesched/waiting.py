"""Waiting for tasks to finish: one thread and one watcher per scheduler, however many wait.

Every :class:`~durablesched.TaskHandle` of a scheduler that waits registers here.
One thread reads, in one query, the outcomes of the awaited tasks that the store's
:class:`~durablesched.store.protocol.FinishWatcher` says finished (PostgreSQL: a
NOTIFY naming the tasks its transaction finished; memory: the store itself), those
of waiters just arrived, and each wait again at most :data:`FALLBACK` seconds
after it last read it (and no sooner than half that), whatever it hears
(:class:`Rereads`: a watcher that failed or a lost notification delays a result by
at most that). SQLite's watcher
reads the outcomes itself, in the statement of its look at the history's lines
written since the last (after a commit seen through inotify or ``data_version``),
for the tasks this process waits on (those in ``Waiters._waiting``); they are
delivered from its thread (:meth:`Waiters._take_outcomes`), with no read and no
wake-up of this one. A finished task wakes its waiters: threads through an event,
coroutines through their event loop, one call per loop and read. A coroutine's wait
is a bare future (:class:`WaitingFuture`): no coroutine, Task or timer of its own.
Many tasks can be waited on as one (:class:`Gathering`: ``scheduler.gather`` and
``agather``), registered under each and delivered once, at the last of them.

Results that stream in are read in batches: after a read that delivered some while
other handles still wait, the watcher keeps what finishes next to itself for
:data:`BATCH` seconds (its own looks at the database stop meanwhile) and then tells
it all at once (SQLite's is answered the batch's length and looks again by itself;
the others are nudged at its end). A stream that goes on is read less often: each
batch of it lasts at least twice the one before, up to :data:`MAX_BATCH` (fewer,
larger reads cost the waiting process less CPU: docs/performance.md). So a
wait costs this process a few reads a second under any load, and a result arriving
alone is read at once. A batch ends no later than the stream's rate says the waits
left will all have finished (:meth:`Waiters._spread`): the last results of a drain
are not held for a whole batch after the last commit. A coroutine's
timeout is kept here too, in :class:`Deadlines` (no timer on its event loop).
Closing wakes every wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Any

from durablesched.clock import thread_timeout
from durablesched.errors import DurableSchedError, TaskCancelled, TaskFailed, TaskNotFoundError
from durablesched.records import Finished
from durablesched.states import TaskState
from durablesched.store.protocol import FinishWatcher, Outcomes, Store

log = logging.getLogger("durablesched.waiting")

#: The most seconds after the waiting thread read an awaited task that it reads it
#: again, whatever the watcher says (:class:`Rereads`): the bound on a lost wake-up.
FALLBACK = 1.0
#: Seconds before reading again after a read failed (the database went away).
RETRY_AFTER = 0.1
#: Seconds the watcher gathers what finishes after a read that delivered results while
#: other handles still wait: the most a result streaming in waits for its batch.
BATCH = 0.02
#: The share of a core that the reads of a stream of results may take: a batch lasts
#: :data:`BATCH`, or longer when the read (and hand-over) that began it cost more
#: than this share of that time (a slow database, a loaded machine), up to
#: :data:`MAX_BATCH`. So a stream costs the waiting thread about this share, however
#: long its reads take, and a result waits for its batch at most ``MAX_BATCH``.
READ_SHARE = 0.015
#: The longest a batch lasts (seconds), however costly the reads or long the stream:
#: the most a result streaming in waits for its batch.
MAX_BATCH = 0.1
#: Futures with a deadline that stopped waiting (delivered, cancelled) before the
#: deadlines are compacted (when they are also half of them at least).
COMPACT_AFTER = 64


class Waiter:
    """A thread's wait for one task (:meth:`TaskHandle.result`): delivered once, from the
    waiting thread, the task's outcome (None if no task has that id any more), or told
    that the scheduler closed."""

    __slots__ = ("_done", "closed", "record")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.record: Finished | None = None
        #: Woken with no outcome, and why (the scheduler closed, or its waiting thread
        #: failed): what its handle raises. None: not so.
        self.closed: str | None = None

    def wait(self, timeout: float | None) -> bool:
        """Block until delivered (True) or ``timeout`` seconds pass (False; ``math.inf``, as
        None: no bound)."""
        return self._done.wait(None if timeout is None else thread_timeout(timeout))

    def deliver(self, record: Finished | None) -> None:
        self.record = record
        self._done.set()


class WaitingFuture(asyncio.Future[Any]):
    """A coroutine's wait for one task: the future :meth:`TaskHandle.aresult` hands out,
    resolved on its event loop with the task's result (or its :func:`failure`, a
    ``TimeoutError`` at its deadline, a ``RuntimeError`` if the scheduler closes).

    The only object a wait makes: no coroutine, no Task, no timer. Cancelling it (the
    awaiting code was cancelled, or ``wait_for`` gave up) stops the wait at once; an
    outcome read meanwhile is dropped.
    """

    __slots__ = ("deadline", "task_id", "timeout", "waiters")

    task_id: int
    timeout: float | None
    #: When it times out (monotonic seconds), with a timeout.
    deadline: float
    #: Where it waits: told when it is cancelled.
    waiters: Waiters

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        self.waiters.discard(self.task_id, self)
        return True


class Gathering:
    """One wait for many tasks (``scheduler.gather`` / ``agather``), registered under each
    task it still waits for and delivered once, when the last of them is finished: a
    thread's through an event, a coroutine's through its future (one call on its loop),
    so that a thousand tasks gathered cost one wake-up, not a thousand.

    ``found`` holds the outcomes read so far (by id; None: no such task); ``left`` is
    how many of its tasks are not among them. ``done`` (set under the waiters' lock)
    says it takes nothing more: complete, timed out, cancelled, or closed.
    """

    __slots__ = (
        "closed",
        "deadline",
        "done",
        "event",
        "found",
        "future",
        "ids",
        "left",
        "return_exceptions",
        "timeout",
    )

    def __init__(
        self,
        ids: list[int],
        found: dict[int, Finished | None],
        *,
        return_exceptions: bool,
        future: GatheringFuture | None = None,
        timeout: float | None = None,
    ) -> None:
        #: The tasks, in the order their values are returned (an id may repeat).
        self.ids = ids
        self.found = found
        self.left = len(set(ids) - found.keys())
        self.return_exceptions = return_exceptions
        #: A coroutine's: resolved on its loop. None: a thread's, woken by ``event``.
        self.future = future
        self.event: threading.Event | None = None if future is not None else threading.Event()
        #: Seconds it waits at most (None: no bound); a coroutine's deadline (monotonic
        #: seconds) is kept by the waiting thread, a thread keeps its own.
        self.timeout = timeout
        self.deadline = math.inf
        if timeout is not None and future is not None:
            self.deadline = time.monotonic() + (timeout if timeout > 0 else 0.0)
        self.done = not self.left
        #: Woken with no outcome, and why (as :attr:`Waiter.closed`).
        self.closed: str | None = None

    def unfinished(self) -> list[int]:
        """Its tasks not read finished yet, once each, in order."""
        found = self.found
        return [i for i in dict.fromkeys(self.ids) if i not in found]

    def values(self) -> list[Any]:
        """The tasks' results, in order; the first that did not succeed raises its
        :func:`failure`, unless ``return_exceptions`` (then it stands in its place)."""
        found, succeeded, values = self.found, TaskState.SUCCEEDED, []
        for task_id in self.ids:
            record = found[task_id]
            if record is not None and record.state is succeeded:
                values.append(record.result)
            elif self.return_exceptions:
                values.append(failure(task_id, record))
            else:
                raise failure(task_id, record)
        return values

    def timed_out(self) -> str:
        left = self.unfinished()
        return (
            f"{len(left)} of the {len(set(self.ids))} tasks gathered did not finish within "
            f"{self.timeout or 0:g} s (the first: task {left[0]})"
        )

    def closed_while(self, failure: BaseException | None) -> str:
        """Why it ended with no outcome: as :func:`closed_while_waiting`."""
        gathered = f"{len(set(self.ids))} tasks were gathered"
        if failure is None:
            return f"the scheduler was closed while {gathered}"
        return f"waiting failed while {gathered}: {ended_by(failure)}"


class GatheringFuture(asyncio.Future[list[Any]]):
    """A coroutine's :class:`Gathering`: resolved with the tasks' values in order (or the
    first failure, a ``TimeoutError``, a ``RuntimeError``). Cancelling it stops the
    wait for every task at once."""

    __slots__ = ("gathering", "waiters")

    gathering: Gathering
    waiters: Waiters

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        self.waiters.drop(self.gathering)
        return True


#: A wait registered with :class:`Waiters`.
AnyWaiter = Waiter | WaitingFuture | Gathering
#: What a read hands one event loop: the futures it resolves, those past their
#: deadline, and the gatherings it completes (or that time out).
LoopBatch = tuple[list[WaitingFuture], list[WaitingFuture], list[Gathering]]


def outcome(task_id: int, record: Finished | None) -> Any:
    """The result of a task as read (``record``), or its :func:`failure` raised."""
    if record is not None and record.state is TaskState.SUCCEEDED:
        return record.result
    raise failure(task_id, record)


def failure(task_id: int, record: Finished | None) -> Exception:
    """What waiting on a task that did not succeed raises."""
    if record is None:
        return TaskNotFoundError(f"no task with id {task_id} (deleted while waited on?)")
    if record.state is TaskState.CANCELLED:
        cancelled = TaskCancelled(f"task {task_id} ({record.name}) was cancelled")
        cancelled.task_id = task_id
        return cancelled
    return TaskFailed(task_id, record.name, record.last_error, record.attempts)


def timed_out(task_id: int, timeout: float | None) -> str:
    if not timeout:
        return f"task {task_id} is not finished"
    return f"task {task_id} did not finish within {timeout:g} s"


def closed_while_waiting(task_id: int, failure: BaseException | None = None) -> str:
    """Why a wait ended with no outcome: the scheduler closed, or (``failure``) its
    waiting thread failed."""
    if failure is None:
        return f"the scheduler was closed while task {task_id} was waited on"
    return f"waiting for task {task_id} failed: {ended_by(failure)}"


def ended_by(failure: BaseException) -> str:
    """What a failure of the waiting thread is called where a wait or a new one is told."""
    return f"the scheduler's waiting thread failed ({type(failure).__name__}: {failure})"


def _settle(
    futures: list[WaitingFuture],
    found: Mapping[int, Finished | None],
    expired: list[WaitingFuture],
    gatherings: list[Gathering],
) -> None:
    """On the futures' event loop, one call per read: resolve those read finished (by
    ``found``), expire those past their deadline, and resolve the gatherings that
    ended; a future cancelled meanwhile is left as it is (its outcome dropped)."""
    succeeded = TaskState.SUCCEEDED
    for future in futures:
        if not future.done():
            record = found[future.task_id]
            if record is not None and record.state is succeeded:
                future.set_result(record.result)
            else:
                future.set_exception(failure(future.task_id, record))
    for future in expired:
        if not future.done():
            future.set_exception(TimeoutError(timed_out(future.task_id, future.timeout)))
    for gathering in gatherings:
        _gathered(gathering)


def _gathered(gathering: Gathering) -> None:
    """On its loop: resolve a coroutine's :class:`Gathering` that ended (its values, its
    first failure, or its timeout: the tasks it still waited for)."""
    future = gathering.future
    if future is None or future.done():
        return
    if gathering.left:
        future.set_exception(TimeoutError(gathering.timed_out()))
        return
    try:
        values = gathering.values()
    except DurableSchedError as e:
        future.set_exception(e)
    else:
        future.set_result(values)


def _hand_over(
    found: Mapping[int, Finished | None],
    threads: list[Waiter],
    by_loop: dict[asyncio.AbstractEventLoop, LoopBatch],
    gathered: list[Gathering],
) -> None:
    """After a read, out of the lock: wake the threads' waits delivered and their
    gatherings that ended, and hand each event loop its batch (and its gatherings that
    ended) in one call."""
    for waiter in threads:
        waiter.deliver(waiter.record)
    for gathering in gathered:
        if gathering.future is None:
            assert gathering.event is not None
            gathering.event.set()
        else:
            by_loop.setdefault(gathering.future.get_loop(), ([], [], []))[2].append(gathering)
    for loop, (futures, expired, ended) in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, futures, found, expired, ended)
        except RuntimeError:  # its loop was closed: nobody is left to tell
            log.debug("an event loop closed while %d of its handles waited", len(futures))


def _closed_gatherings(
    waiting: Mapping[int, list[AnyWaiter]], failure: BaseException | None
) -> list[Gathering]:
    """The gatherings among ``waiting`` (once each), ended: closed (``failure``: so)."""
    gatherings = []
    for waiters in waiting.values():
        for waiter in waiters:
            if isinstance(waiter, Gathering) and not waiter.done:
                waiter.done = True
                waiter.closed = waiter.closed_while(failure)
                gatherings.append(waiter)
    return gatherings


def _close(futures: list[WaitingFuture | Gathering], failure: BaseException | None) -> None:
    """On the futures' event loop: the scheduler closed (or its waiting thread failed:
    ``failure``), none of them will be resolved."""
    future: asyncio.Future[Any] | None
    for waiter in futures:
        if isinstance(waiter, Gathering):
            future, reason = waiter.future, waiter.closed_while(failure)
        else:
            future, reason = waiter, closed_while_waiting(waiter.task_id, failure)
        if future is not None and not future.done():
            future.set_exception(RuntimeError(reason))


class Deadlines:
    """The futures' deadlines, earliest first: a run of deadlines that never decrease
    (a deque: waits made with one timeout, in the order they were made), and a heap of
    the others (a shorter timeout after a longer one). A wait with the timeout of the
    run's last costs an append, not a heap push of a tuple."""

    __slots__ = ("_order", "_rest", "_run")

    def __init__(self) -> None:
        self._run: deque[WaitingFuture] = deque()
        self._rest: list[tuple[float, int, WaitingFuture]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._run) + len(self._rest)

    def add(self, future: WaitingFuture) -> None:
        run = self._run
        if not run or run[-1].deadline <= future.deadline:
            run.append(future)
        else:
            heapq.heappush(self._rest, (future.deadline, next(self._order), future))

    def first(self) -> float:
        """The earliest deadline; ``math.inf`` with none."""
        run, rest = self._run, self._rest
        return min(run[0].deadline if run else math.inf, rest[0][0] if rest else math.inf)

    def pop_due(self, now: float) -> list[WaitingFuture]:
        """Take out the futures whose deadline is ``now`` or earlier."""
        due = []
        run, rest = self._run, self._rest
        while run and run[0].deadline <= now:
            due.append(run.popleft())
        while rest and rest[0][0] <= now:
            due.append(heapq.heappop(rest)[2])
        return due

    def keep(self, waiting: Mapping[int, list[AnyWaiter]]) -> None:
        """Drop the futures that stopped waiting: those no longer among ``waiting``'s
        waits on their task (tested inline: no call per future)."""
        self._run = deque([f for f in self._run if f in waiting.get(f.task_id, ())])
        self._rest = [e for e in self._rest if e[2] in waiting.get(e[2].task_id, ())]
        heapq.heapify(self._rest)


class Rereads:
    """When each wait is read again whatever the watcher says: once the waiting thread's
    oldest read of a wait still waiting is ``every`` seconds old, every wait it last read
    at least ``every / 2`` seconds ago, in one read (its reads, oldest first, with the
    tasks each read). So no wait goes longer than ``every`` without a read, waits that
    began at scattered times are read again together (one read per ``every / 2`` at the
    most, not one per wait), and the waits of a drain that ends within ``every / 2`` of
    their first read are read once (a tick shared by all read them again whenever it
    fell in the drain)."""

    __slots__ = ("_every", "_reads")

    def __init__(self, every: float) -> None:
        self._every = every
        self._reads: deque[tuple[float, set[int]]] = deque()

    def read(self, at: float, task_ids: set[int], *, every_wait: bool = False) -> None:
        """The waiting thread read ``task_ids`` at ``at`` (``every_wait``: they are all
        the waits, so no earlier read is still due)."""
        if every_wait:
            self._reads.clear()
        if task_ids:
            self._reads.append((at, task_ids))

    def next(self) -> float:
        """When the next wait is due to be read again; ``math.inf`` with none."""
        reads = self._reads
        return reads[0][0] + self._every if reads else math.inf

    def due(self, now: float, waiting: Mapping[int, object]) -> set[int]:
        """Take out the waits due to be read again at ``now``, those still ``waiting``:
        none before the oldest read is ``every`` seconds old, then every one read at
        least ``every / 2`` seconds ago."""
        due: set[int] = set()
        reads = self._reads
        if reads and reads[0][0] <= now - self._every:
            until = now - self._every / 2
            while reads and reads[0][0] <= until:
                due |= reads.popleft()[1] & waiting.keys()
        return due


class Waiters:
    """The tasks this scheduler's handles wait on, and the one thread that watches them.

    Started by the first wait, and stopped by :meth:`close` (the scheduler's).
    ``fallback`` and ``batch`` default to :data:`FALLBACK` and :data:`BATCH`;
    ``cpu_clock`` (this thread's CPU seconds) measures what a read cost, to spread
    the next batch (:meth:`_nudge_when`); ``clock`` (monotonic seconds) times the
    reads that deliver, for the stream's rate (:meth:`_spread`).
    """

    def __init__(
        self,
        store: Store,
        *,
        fallback: float = FALLBACK,
        batch: float = BATCH,
        cpu_clock: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._fallback = fallback
        self._batch = batch
        #: This thread's CPU seconds: what a read cost, for the next batch's length.
        self._cpu_clock = cpu_clock
        #: When the reads that deliver happen: the stream's rate (:meth:`_spread`).
        self._clock = clock
        #: When the last read that delivered while others still waited happened (by
        #: ``clock``), and the batch it began (seconds); None: no stream under way.
        self._streamed_at: float | None = None
        self._streamed_for = 0.0
        self._lock = threading.Lock()
        #: The waits by task. One dict for the object's life: the watcher holds its
        #: ``__contains__`` (:meth:`_start`).
        self._waiting: dict[int, list[AnyWaiter]] = {}
        #: Ids registered since the last read: read at once.
        self._fresh: set[int] = set()
        #: Ids the watcher named since the last read; None: any may have finished.
        self._heard: set[int] | None = set()
        #: Futures' deadlines (monotonic seconds), earliest first.
        self._deadlines = Deadlines()
        #: Futures with a deadline that stopped waiting since they were compacted.
        self._ended_since = 0
        #: Coroutines' gatherings with a timeout, still waiting (few: one per call).
        self._gathering_deadlines: list[Gathering] = []
        #: When the watcher's batch ends (monotonic seconds); None: it is not gathering.
        self._batch_ends: float | None = None
        self._wake = threading.Event()
        self._closed = False
        #: What ended the waiting thread, if it failed (then closed: no wait is served).
        self.failure: BaseException | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: FinishWatcher | None = None
        #: Reads made, for tests and benchmarks: how hard waiting worked (the store's,
        #: and the watcher's looks that read outcomes and reported some).
        self.reads = 0

    def add(self, task_id: int, waiter: Waiter) -> None:
        """Wait on ``task_id`` from a thread: ``waiter`` is delivered its outcome once it
        is finished (the thread keeps its own timeout).

        The watcher is listening before the read that covers the new id, so a task
        finishing at any moment is seen by one or the other.
        """
        with self._lock:
            self._register(task_id, waiter)

    def future(
        self, task_id: int, loop: asyncio.AbstractEventLoop, timeout: float | None = None
    ) -> WaitingFuture:
        """Wait on ``task_id`` from a coroutine on ``loop``: a future resolved with the
        task's result once it is finished, or with a ``TimeoutError`` after ``timeout``
        seconds if it is not finished by then (a deadline in this thread's
        :class:`Deadlines`)."""
        future = WaitingFuture(loop=loop)
        future.task_id = task_id
        future.timeout = timeout
        future.waiters = self
        if timeout is not None:
            future.deadline = time.monotonic() + (timeout if timeout > 0 else 0.0)
        with self._lock:
            self._register(task_id, future)
            if timeout is not None:
                self._deadlines.add(future)
        return future

    def gathering(
        self,
        task_ids: list[int],
        found: dict[int, Finished | None],
        *,
        return_exceptions: bool,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float | None = None,
    ) -> Gathering:
        """Wait at once on every task of ``task_ids`` not in ``found`` (outcomes already
        read): a :class:`Gathering`, delivered when the last of them is finished (one
        registered under each, read at once). From a thread (``loop`` None) its event
        is set then, and the thread keeps its own ``timeout``; from a coroutine on
        ``loop`` its future is resolved there, or with a ``TimeoutError`` once
        ``timeout`` seconds pass (kept by this thread, as :class:`Deadlines` are)."""
        future = None
        if loop is not None:
            future = GatheringFuture(loop=loop)
            future.waiters = self
        gathering = Gathering(
            task_ids,
            found,
            return_exceptions=return_exceptions,
            future=future,
            timeout=timeout,
        )
        if future is not None:
            future.gathering = gathering
        if gathering.done:
            return gathering  # every task already read finished: nothing to wait on
        unfinished = gathering.unfinished()
        with self._lock:
            self._ready()
            waiting = self._waiting
            for task_id in unfinished:
                waiters = waiting.get(task_id)
                if waiters is None:
                    waiting[task_id] = [gathering]
                else:
                    waiters.append(gathering)
            if not self._fresh:
                self._wake.set()
            self._fresh.update(unfinished)
            if gathering.deadline < math.inf:
                self._gathering_deadlines.append(gathering)
        return gathering

    def drop(self, gathering: Gathering) -> bool:
        """Stop a gathering's wait (timed out, cancelled): True, or False if it ended
        meanwhile (delivered, or closed), which then stands."""
        with self._lock:
            if gathering.done:
                return False
            self._drop(gathering)
            return True

    def _drop(self, gathering: Gathering) -> None:
        """Under the lock: ``gathering`` takes nothing more; it no longer waits on the
        tasks it has not had."""
        gathering.done = True
        waiting = self._waiting
        for task_id in gathering.unfinished():
            waiters = waiting.get(task_id)
            if waiters is not None and gathering in waiters:
                waiters.remove(gathering)
                if not waiters:
                    del waiting[task_id]
        if gathering.deadline < math.inf:
            self._gathering_deadlines.remove(gathering)

    def _ready(self) -> None:
        """Under the lock, before a wait registers: refused once closed; the thread and
        the watcher started by the first."""
        if self._closed:
            if self.failure is not None:
                raise RuntimeError(f"{ended_by(self.failure)}: nothing can be waited on")
            raise RuntimeError("the scheduler was closed: nothing can be waited on")
        if self._thread is None:
            self._start()

    def _register(self, task_id: int, waiter: AnyWaiter) -> None:
        """Under the lock: ``waiter`` waits on ``task_id``, read at once."""
        self._ready()
        waiting = self._waiting.get(task_id)
        if waiting is None:
            self._waiting[task_id] = [waiter]
        else:
            waiting.append(waiter)
        if not self._fresh:  # else the thread has yet to take them: it is awake
            self._wake.set()
        self._fresh.add(task_id)

    def discard(self, task_id: int, waiter: AnyWaiter) -> None:
        """Stop waiting (a thread's timeout, a cancelled future); nothing if it was
        delivered meanwhile."""
        with self._lock:
            waiters = self._waiting.get(task_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiting[task_id]
            if isinstance(waiter, WaitingFuture) and waiter.timeout is not None:
                self._ended(1)

    def _ended(self, count: int) -> None:
        """Under the lock: ``count`` futures with a deadline stopped waiting (delivered
        or cancelled). Their deadlines stay, skipped when they pass, until they are as
        many as those still waiting (and more than :data:`COMPACT_AFTER`): then only
        the waits still waiting are kept, so that short waits with long timeouts do not
        keep their futures (and results) for those timeouts. Once nothing waits, none
        is kept (no wait to look for)."""
        self._ended_since += count
        if not self._waiting:
            self._deadlines = Deadlines()
            self._ended_since = 0
        elif self._ended_since > COMPACT_AFTER and self._ended_since * 2 > len(self._deadlines):
            self._deadlines.keep(self._waiting)
            self._ended_since = 0

    @property
    def waiting(self) -> int:
        """How many tasks are waited on."""
        with self._lock:
            return len(self._waiting)

    def _start(self) -> None:
        watcher = self._store.watch_finished()
        if watcher is not None:
            # Asked from the watcher's thread, without the lock, for each task it sees
            # finish: the dict's own method, no Python call. A wait registered just
            # after is read at once anyway (:attr:`_fresh`); one ended just before
            # drops what is delivered to it. (So ``_waiting`` stays this dict: closing
            # empties it.)
            watcher.start(self._on_finished, self._waiting.__contains__)
        self._watcher = watcher
        self._thread = threading.Thread(target=self._run, name="durablesched-wait", daemon=True)
        self._thread.start()

    def _on_finished(self, task_ids: Collection[int] | None) -> bool | float:
        """From the watcher's thread: these tasks finished (None: some may have). Answers
        True: the watcher keeps what comes next until nudged (:meth:`_nudge_when`).
        Outcomes the watcher read itself are delivered here (:meth:`_take_outcomes`)."""
        if isinstance(task_ids, Outcomes):
            return self._take_outcomes(task_ids)
        with self._lock:
            if task_ids is None:
                self._heard = None
            elif self._heard is not None:
                self._heard.update(task_ids)
        self._wake.set()
        return True

    def _take_outcomes(self, outcomes: Outcomes) -> bool | float:
        """From the watcher's thread: deliver the outcomes its look read (SQLite), with no
        read and no wake-up of this thread. While other handles still wait, answers a
        batch's length for the watcher to keep quiet by itself (as :meth:`_nudge_when`
        spreads it: :data:`BATCH`, or longer when the look and this hand-over cost more
        than :data:`READ_SHARE` of it, up to :data:`MAX_BATCH`, and no longer than the
        waits left need at the stream's rate); else False: the next commit is looked at
        as it comes."""
        cpu = self._cpu_clock()
        delivered = self._deliver(outcomes)
        spent = outcomes.cost + self._cpu_clock() - cpu
        with self._lock:
            self.reads += 1
            if not self._waiting:
                self._streamed_at = None  # the stream is over: the next has no rate yet
            if not (delivered and self._waiting and self._batch > 0):
                return False
            return self._spread(delivered, spent)

    def _run(self) -> None:
        """The thread: :meth:`_serve`, and if it fails (a bug), every wait ended with the
        failure rather than left hanging (and the failure logged): the scheduler makes
        another :class:`Waiters` for the waits after."""
        try:
            self._serve()
        except BaseException as e:  # any: nothing else would ever end the waits
            log.exception("the waiting thread failed: every wait still waiting ends with it")
            watcher, _ = self._end(e)
            if watcher is not None:
                watcher.close()

    def _serve(self) -> None:
        rereads = Rereads(self._fallback)
        while True:
            with self._lock:
                if self._closed:
                    return
                until = min(
                    rereads.next(),
                    self._deadlines.first(),
                    math.inf if self._batch_ends is None else self._batch_ends,
                    min((g.deadline for g in self._gathering_deadlines), default=math.inf),
                )
            # With nothing due (no wait, no deadline, no batch), ``until`` is infinite:
            # a wait as long as a thread's takes (more would end this thread).
            self._wake.wait(thread_timeout(max(0.0, until - time.monotonic())))
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                heard = self._heard
                every_wait = heard is None
                if heard is None:
                    wanted = set(self._waiting)
                else:
                    wanted = self._fresh | (heard & self._waiting.keys())
                    wanted |= rereads.due(now, self._waiting)
                self._fresh = set()
                self._heard = set()
            rereads.read(now, wanted, every_wait=every_wait)
            delivered, cpu = 0, self._cpu_clock()
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
            self._nudge_when(delivered, self._cpu_clock() - cpu)

    def _nudge_when(self, delivered: int, spent: float) -> None:
        """End the watcher's batch now, or after a read that delivered results while
        others still wait (a stream: let more gather), :data:`BATCH` seconds later, or
        as long as makes the read's ``spent`` CPU seconds :data:`READ_SHARE` of it
        (at most :data:`MAX_BATCH`; :meth:`_spread`)."""
        now = time.monotonic()
        with self._lock:
            ends = self._batch_ends
            if ends is None and delivered and self._waiting:
                spread = self._spread(delivered, spent) if self._batch > 0 else 0.0
                self._batch_ends = now + spread
                return
            if ends is not None and now < ends:
                return  # gathering: the thread wakes at its end
            self._batch_ends = None
            if not self._waiting:
                self._streamed_at = None  # the stream is over: the next has no rate yet
            watcher = self._watcher
        if watcher is not None:
            watcher.nudge()

    def _spread(self, delivered: int, spent: float) -> float:
        """Under the lock, after a read that delivered ``delivered`` results while others
        still wait, at a cost of ``spent`` CPU seconds: how long the batch it begins
        lasts. :data:`BATCH`, or as long as makes ``spent`` :data:`READ_SHARE` of it,
        and in a stream at least twice the batch before, each up to :data:`MAX_BATCH`;
        but no longer than the waits left take to finish at the rate this read and the
        one before delivered (a drain's last batch ends as its last results should
        commit, not a whole batch after: if some are late, the read at its end begins a
        shorter one). The first read of a stream (after one that left nothing waited
        on) has no rate and no batch before; a rate from long ago is low, and caps
        nothing."""
        spread = max(self._batch, min(spent / READ_SHARE, MAX_BATCH))
        now = self._clock()
        last, self._streamed_at = self._streamed_at, now
        if last is not None and now > last:
            spread = max(spread, min(2 * self._streamed_for, MAX_BATCH))
            spread = min(spread, len(self._waiting) * (now - last) / delivered)
        self._streamed_for = spread
        return spread

    def _deliver(self, found: Mapping[int, Finished | None]) -> int:
        """Hand the finished tasks to their waiters, and expire the futures past their
        deadline: one call per event loop. Returns how many were delivered."""
        now = time.monotonic()
        threads: list[Waiter] = []
        by_loop: dict[asyncio.AbstractEventLoop, LoopBatch] = {}
        gathered: list[Gathering] = []  # those that end
        delivered = timed = 0
        # The futures of the loop met last (a process mostly has one): no lookup each.
        last_loop: asyncio.AbstractEventLoop | None = None
        futures: list[WaitingFuture] = []
        with self._lock:
            pop = self._waiting.pop
            for task_id, record in found.items():
                waiters = pop(task_id, None)
                if waiters is None:
                    continue
                delivered += len(waiters)
                for waiter in waiters:
                    if isinstance(waiter, Waiter):
                        waiter.record = record
                        threads.append(waiter)
                        continue
                    if isinstance(waiter, Gathering):
                        waiter.found[task_id] = record
                        waiter.left -= 1
                        if not waiter.left:
                            gathered.append(waiter)
                        continue
                    loop = waiter.get_loop()
                    if loop is not last_loop:
                        batch = by_loop.get(loop)
                        if batch is None:
                            by_loop[loop] = batch = ([], [], [])
                        last_loop, futures = loop, batch[0]
                    futures.append(waiter)
                    if waiter.timeout is not None:
                        timed += 1
            if self._deadlines.first() <= now:
                self._expire(now, by_loop)
            if timed:
                self._ended(timed)
            if gathered or self._gathering_deadlines:
                self._gathered(gathered, now)
        _hand_over(found, threads, by_loop, gathered)
        return delivered

    def _gathered(self, gathered: list[Gathering], now: float) -> None:
        """Under the lock: the gatherings ``gathered`` were delivered their last task;
        those whose deadline is past join them, timed out (each ends once), but for
        those not read yet (as :meth:`_expire`)."""
        deadlines, fresh = self._gathering_deadlines, self._fresh
        for gathering in gathered:
            gathering.done = True
            if gathering.deadline < math.inf:
                deadlines.remove(gathering)
        for gathering in [g for g in deadlines if g.deadline <= now]:
            if not fresh.isdisjoint(gathering.unfinished()):
                continue
            self._drop(gathering)
            gathered.append(gathering)

    def _expire(self, now: float, by_loop: dict[asyncio.AbstractEventLoop, LoopBatch]) -> None:
        """Under the lock: stop the waits of the futures past their deadline (those still
        waiting) and add them to their loop's expired. One not read yet (its task among
        :attr:`_fresh`: the watcher's delivery came first) keeps its deadline: a wait
        on a task already finished returns its result, whatever its timeout."""
        waiting, fresh = self._waiting, self._fresh
        for future in self._deadlines.pop_due(now):
            if future.task_id in fresh:
                self._deadlines.add(future)
                continue
            waiters = waiting.get(future.task_id)
            if waiters is not None and future in waiters:
                waiters.remove(future)
                if not waiters:
                    del waiting[future.task_id]
                batch = by_loop.setdefault(future.get_loop(), ([], [], []))
                batch[1].append(future)

    def close(self) -> None:
        """Stop the thread and the watcher, and wake every wait still waiting: a
        thread's returns (its handle raises ``RuntimeError``), a future is resolved with
        a ``RuntimeError`` on its loop (one call per loop). Nothing can finish them now."""
        watcher, thread = self._end(None)
        self._stopped.set()
        self._wake.set()
        if watcher is not None:
            watcher.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._fallback + 1)

    def _end(
        self, failure: BaseException | None
    ) -> tuple[FinishWatcher | None, threading.Thread | None]:
        """Serve no more waits (``failure``: the thread failed so), and wake every one
        still waiting, each told why. Returns the watcher and the thread, to stop."""
        with self._lock:
            if not self._closed:
                self.failure = failure
            self._closed = True
            thread, self._thread = self._thread, None
            watcher, self._watcher = self._watcher, None
            waiting = dict(self._waiting)
            self._waiting.clear()
            self._deadlines = Deadlines()
            self._gathering_deadlines = []
            failure = self.failure
            # Under the lock: a ``drop`` after sees each ended so, and why.
            gatherings = _closed_gatherings(waiting, failure)
        by_loop: dict[asyncio.AbstractEventLoop, list[WaitingFuture | Gathering]] = {}
        for task_id, waiters in waiting.items():
            for waiter in waiters:
                if isinstance(waiter, Waiter):
                    waiter.closed = closed_while_waiting(task_id, failure)
                    waiter.deliver(None)
                elif isinstance(waiter, WaitingFuture):
                    by_loop.setdefault(waiter.get_loop(), []).append(waiter)
        for gathering in gatherings:
            if gathering.future is None:
                assert gathering.event is not None
                gathering.event.set()
            else:
                by_loop.setdefault(gathering.future.get_loop(), []).append(gathering)
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(_close, futures, failure)
            except RuntimeError:  # its loop was closed: nobody is left to tell
                log.debug("an event loop closed while %d of its handles waited", len(futures))
        return watcher, thread
