"""Helpers for races made to happen every time: a gate that holds the first thread to
reach it, and a call run in a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..conftest import WAIT


class Gate:
    """Holds the thread that reaches it (the first one only) until released."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        self._taken = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            if self._taken:
                return
            self._taken = True
        self.reached.set()
        assert self.released.wait(WAIT), "the test never released the gate"


class Run(threading.Thread):
    """A store call in a thread of its own, its answer or exception kept."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as e:  # handed to the test thread, which raises it
            self.error = e
        finally:
            self.done.set()

    def answer(self) -> Any:
        assert self.done.wait(WAIT), "the call never finished"
        if self.error is not None:
            raise self.error
        return self.result
