"""What a running task sees of itself: its identity, cancellation, children and effects."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from durablesched.errors import TaskCancelled, TaskTimeout, UnsupportedOperationError
from durablesched.records import Claim, Environment, NewTask
from durablesched.store.protocol import Effect
from durablesched.submission import build_task

if TYPE_CHECKING:
    from .scheduler import Scheduler


_EVENT_LOCK = threading.Lock()


class TaskContext:
    """Handed to a task registered with ``pass_context=True``.

    Children submitted here and effects registered with :meth:`on_success`
    take effect only together with this attempt's success: a failed or lost
    attempt leaves none of them behind.
    """

    def __init__(self, claim: Claim, scheduler: Scheduler) -> None:
        self.claim = claim
        self.scheduler = scheduler
        # Plain flags: an Event per task costs more than the no-op tasks it serves;
        # one is made only for a task that waits on cancellation.
        self._cancelled = False
        self._lost = False
        self._cancel_event: threading.Event | None = None
        self._cancel_hooks: list[Callable[[], object]] = []
        self.children: list[NewTask] = []
        self.effects: list[Effect] = []
        #: "thread" or "process": where this attempt runs (docs/execution.md).
        self.environment = Environment.THREAD
        #: ``time.monotonic()`` past which this attempt has overrun its timeout.
        self.deadline: float | None = None

    @property
    def task_id(self) -> int:
        return self.claim.task_id

    @property
    def name(self) -> str:
        return self.claim.name

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self.claim.attempt

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt of this task: hand it to external systems.

        It makes an external effect effectively-once only if the destination
        deduplicates on it; see docs/durability.md.
        """
        return self.claim.idempotency_key

    def now(self) -> datetime:
        return self.scheduler.clock.now()

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked this task to stop (or its lease was lost)."""
        return self._cancelled or self._lost

    @property
    def timed_out(self) -> bool:
        """True once this attempt ran past its task's timeout: it will count as a failure."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat found the claim gone: no outcome of this attempt will count."""
        return self._lost

    def raise_if_cancelled(self) -> None:
        """Acknowledge a requested cancellation by raising :class:`TaskCancelled`,
        or an overrun timeout by raising :class:`TaskTimeout`."""
        if self.cancel_requested:
            raise TaskCancelled(f"task {self.task_id} stopped on request")
        if self.timed_out:
            raise TaskTimeout(f"task {self.task_id} ran past its timeout")

    def wait_for_cancel(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for a cancellation request; True if one came."""
        with _EVENT_LOCK:
            if self._cancel_event is None:
                self._cancel_event = threading.Event()
                if self._cancelled:
                    self._cancel_event.set()
        return self._cancel_event.wait(timeout)

    def submit(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
    ) -> None:
        """Submit a child task that appears only if this attempt succeeds."""
        self.children.append(
            build_task(
                name,
                args,
                now=self.now(),
                at=at,
                delay=delay,
                max_attempts=max_attempts,
                key=key,
                registry=self.scheduler.registry,
            )
        )

    def on_success(self, effect: Effect) -> None:
        """Run ``effect(connection)`` inside the transaction that records success.

        If the lease was lost, that transaction rolls back and the effect never
        happens. Keep effects short: they run while the database write lock is held.
        Not available in the process environment: the child process has no
        database connection (submit children, or use the idempotency key).
        """
        if self.environment == Environment.PROCESS:
            raise UnsupportedOperationError(
                f"task {self.name!r} runs in the process environment, where database "
                "effects cannot be committed with its success (docs/execution.md)"
            )
        self.effects.append(effect)

    # The worker's side.
    def _request_cancel(self) -> None:
        with _EVENT_LOCK:
            self._cancelled = True
            if self._cancel_event is not None:
                self._cancel_event.set()
            hooks = list(self._cancel_hooks)
        for hook in hooks:
            hook()

    def _on_cancel(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` when cancellation is requested (at once if it already was)."""
        with _EVENT_LOCK:
            self._cancel_hooks.append(hook)
            already = self._cancelled
        if already:
            hook()

    def _mark_lease_lost(self) -> None:
        self._lost = True
