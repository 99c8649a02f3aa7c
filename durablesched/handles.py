"""A handle on one stored task: its state, its record, its result when it is finished.

``scheduler.enqueue`` returns one; ``scheduler.handle(task_id, task)`` makes one from
an id. Waiting is done by the scheduler's :class:`~durablesched.waiting.Waiters` (one
thread and one watcher, however many handles wait), never by reading in a loop.
"""

from __future__ import annotations

import asyncio
import reprlib
from collections.abc import Generator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from durablesched.clock import thread_timeout
from durablesched.errors import InvalidTaskError, UnsupportedOperationError, WaitInTaskError
from durablesched.records import CancelOutcome, Finished, TaskRecord
from durablesched.states import TERMINAL, TaskState
from durablesched.waiting import Waiter, Waiters, outcome, timed_out

if TYPE_CHECKING:
    from durablesched.store.protocol import Store

R = TypeVar("R")

#: True while the thread (or coroutine) runs a task's attempt: set by the worker, read
#: by a handle, which refuses to wait there (:class:`~durablesched.WaitInTaskError`).
RUNNING_TASK: ContextVar[bool] = ContextVar("durablesched_running_task", default=False)


class HandleOwner(Protocol):
    """What a handle asks of its :class:`~durablesched.Scheduler`."""

    def get(self, task_id: int) -> TaskRecord: ...

    def cancel(self, task_id: int) -> CancelOutcome: ...

    @property
    def waiters(self) -> Waiters: ...

    @property
    def store(self) -> Store: ...


class TaskHandle(Generic[R]):
    """A stored task, typed by its function's result ``R``.

    Cheap to make and to keep (an id and its scheduler): nothing is read until
    asked. Equal handles name the same task.
    """

    __slots__ = ("_id", "_owner", "name")

    def __init__(self, owner: HandleOwner, task_id: int | None, name: str | None = None) -> None:
        self._owner = owner
        self._id = task_id
        #: The task's name, where the handle was made knowing it.
        self.name = name

    @property
    def id(self) -> int:
        """The task's id. A child enqueued by a running task (``ctx.enqueue``) is stored,
        and given its id, only when that attempt succeeds: its handle has none before
        (:class:`UnsupportedOperationError`)."""
        if self._id is None:
            raise UnsupportedOperationError(
                f"a child task ({self.name}) enqueued by a running task is stored, and given "
                "its id, only when that attempt succeeds"
            )
        return self._id

    def record(self) -> TaskRecord:
        """The task as stored now; :class:`TaskNotFoundError` if there is none."""
        return self._owner.get(self.id)

    def state(self) -> TaskState:
        """The task's state now."""
        return self.record().state

    def cancel(self) -> CancelOutcome:
        """Cancel the task, as ``scheduler.cancel`` does (and says)."""
        return self._owner.cancel(self.id)

    def result(self, timeout: float | None = None) -> R:
        """Block until the task is finished and return its result (as stored: JSON).

        :class:`TaskFailed` (its error, attempts and traceback) if it failed,
        :class:`TaskCancelled` if it was cancelled, ``TimeoutError`` if ``timeout``
        seconds pass first, :class:`TaskNotFoundError` if no task has the id,
        ``RuntimeError`` if the scheduler is closed meanwhile.
        Refused inside a running task (:class:`WaitInTaskError`).
        """
        if RUNNING_TASK.get():
            raise _refused(self)
        task = self._owner.get(self.id)  # TaskNotFoundError if no task has the id
        record: Finished | None = Finished.of(task)
        if task.state not in TERMINAL:
            waiter = Waiter()
            waiters = self._owner.waiters
            waiters.add(self.id, waiter)
            if not waiter.wait(timeout):
                waiters.discard(self.id, waiter)
                if not waiter.wait(0):  # not delivered in the meantime either
                    raise TimeoutError(timed_out(self.id, timeout))
            if waiter.closed is not None:
                raise RuntimeError(waiter.closed)
            record = waiter.record
        result: R = outcome(self.id, record)
        return result

    def aresult(self, timeout: float | None = None) -> asyncio.Future[R]:
        """:meth:`result` for asyncio code: a future of the event loop running (call it
        there) that resolves as :meth:`result` returns or raises, without blocking the
        loop.

        A plain method, not a coroutine function: the future is all a wait makes
        (no coroutine, no Task, no timer; the scheduler's waiting thread reads for every
        handle at once, keeps their deadlines together and resolves each loop's
        futures in one call per read), so ``asyncio.gather`` of a thousand handles
        costs what gathering a thousand futures does. Await it, gather it, or pass it
        to ``asyncio.wait_for``; cancelling it (or the code awaiting it) stops the wait.
        """
        if RUNNING_TASK.get():  # (inline, as below: made once per handle awaited)
            raise _refused(self)
        task_id = self.id if self._id is None else self._id
        future: asyncio.Future[R] = self._owner.waiters.future(
            task_id, asyncio.get_running_loop(), timeout
        )
        return future

    def __await__(self) -> Generator[Any, None, R]:
        """``await handle``: :meth:`aresult` without a timeout."""
        return self.aresult().__await__()

    async def arecord(self) -> TaskRecord:
        """:meth:`record`, read on a worker thread of the event loop's executor."""
        return await asyncio.to_thread(self.record)

    async def astate(self) -> TaskState:
        """:meth:`state`, read on a worker thread of the event loop's executor."""
        return (await self.arecord()).state

    async def acancel(self) -> CancelOutcome:
        """:meth:`cancel`, on a worker thread of the event loop's executor."""
        return await asyncio.to_thread(self.cancel)

    def __eq__(self, other: object) -> bool:
        if self._id is None:
            return other is self
        return isinstance(other, TaskHandle) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id) if self._id is not None else id(self)

    def __repr__(self) -> str:
        name = "" if self.name is None else f" ({self.name})"
        task = "child to be stored" if self._id is None else str(self._id)
        return f"<TaskHandle {task}{name}>"


def gather(
    owner: HandleOwner,
    handles: Sequence[TaskHandle[Any]],
    timeout: float | None,
    return_exceptions: bool,
) -> list[Any]:
    """``scheduler.gather``: one read of them all, then one wait for those not finished
    (one event, however many), its timeout kept by this thread."""
    ids = _gathered_ids(owner, handles)
    if not ids:
        return []
    waiters = owner.waiters
    gathering = waiters.gathering(
        ids, owner.store.finished(set(ids)), return_exceptions=return_exceptions, timeout=timeout
    )
    if not gathering.done:
        assert gathering.event is not None
        ended = gathering.event.wait(None if timeout is None else thread_timeout(timeout))
        # Not ended, and not ending just now (delivered, or closed: both set under the
        # waiters' lock, which ``drop`` takes): it timed out.
        if not ended and waiters.drop(gathering):
            raise TimeoutError(gathering.timed_out())
        if gathering.closed is not None:
            raise RuntimeError(gathering.closed)
    return gathering.values()


def agather(
    owner: HandleOwner,
    handles: Sequence[TaskHandle[Any]],
    timeout: float | None,
    return_exceptions: bool,
) -> asyncio.Future[list[Any]]:
    """``scheduler.agather``: one future for them all, resolved on the running loop in
    one call once the last is finished (or at the timeout, kept by the waiting thread)."""
    ids = _gathered_ids(owner, handles)
    loop = asyncio.get_running_loop()
    if not ids:
        future: asyncio.Future[list[Any]] = loop.create_future()
        future.set_result([])
        return future
    gathering = owner.waiters.gathering(
        ids, {}, return_exceptions=return_exceptions, loop=loop, timeout=timeout
    )
    assert gathering.future is not None
    return gathering.future


def _gathered_ids(owner: HandleOwner, handles: Sequence[TaskHandle[Any]]) -> list[int]:
    """The handles' ids, in order: refused inside a running task, or for a handle that
    is not one, or is a scheduler's on another store (its id could name another
    database's task)."""
    if RUNNING_TASK.get():
        raise _refused(repr(handles[0]) if len(handles) == 1 else f"{len(handles)} handles")
    ids = []
    for handle in handles:
        if not isinstance(handle, TaskHandle):
            raise InvalidTaskError(
                f"gather takes task handles, got {reprlib.repr(handle)} "
                "(a list of them is passed unpacked: gather(*handles))"
            )
        if handle._owner is not owner and handle._owner.store is not owner.store:
            raise InvalidTaskError(
                f"{handle!r} is a handle of a scheduler on another store: gather it with "
                "that scheduler"
            )
        ids.append(handle.id)
    return ids


def _refused(handle: TaskHandle[Any] | str) -> WaitInTaskError:
    """What waiting on ``handle`` (or what it says) inside a running task raises."""
    what = handle if isinstance(handle, str) else repr(handle)
    return WaitInTaskError(
        f"waiting on {what} inside a running task is refused: the waiting "
        "task would hold its worker slot, and a worker whose every slot waits on "
        "tasks that need a slot never finishes. Submit a follow-up task instead "
        '(docs/api.md, "Handles")'
    )
