"""The worker's task threads: where attempts run, started as needed, up to the slot count.

Owns the threads named ``durablesched-task_N``. Leaner than
ThreadPoolExecutor, whose Future (a Condition each) costs more than a no-op
task: a handed-over item is one queue put, and no result comes back (the
attempt hands its outcome to the group commit itself).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class TaskThreads(Generic[T]):
    """Up to ``size`` threads running what is handed to them, started as needed.

    The threads are daemons: a task still running when the interpreter exits
    is abandoned, and its lease lapses to be reclaimed.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        #: Handed over and not yet finished.
        self._outstanding = 0

    def submit(self, run: Callable[[T], None], item: T) -> None:
        with self._lock:
            self._outstanding += 1
            if self._outstanding > len(self._threads) and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._loop,
                    args=(run,),
                    name=f"durablesched-task_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        self._queue.put(item)

    def _loop(self, run: Callable[[T], None]) -> None:
        while (item := self._queue.get()) is not None:
            try:
                run(item)
            except BaseException:  # noqa: S110 - logged where it was raised; the thread goes on
                pass
            finally:
                with self._lock:
                    self._outstanding -= 1

    def shutdown(self, wait: bool) -> None:
        """Let the threads go once what was handed over has run; ``wait`` for them."""
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
