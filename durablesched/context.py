"""What a running task sees of itself: its identity, cancellation, children and effects."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .errors import TaskCancelled
from .records import Claim, NewTask
from .store import Effect
from .submission import build_task

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
        self.children: list[NewTask] = []
        self.effects: list[Effect] = []

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
    def lease_lost(self) -> bool:
        """True once a heartbeat found the claim gone: no outcome of this attempt will count."""
        return self._lost

    def raise_if_cancelled(self) -> None:
        """Acknowledge a requested cancellation by raising :class:`TaskCancelled`."""
        if self.cancel_requested:
            raise TaskCancelled(f"task {self.task_id} stopped on request")

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
        """
        self.effects.append(effect)

    # The worker's side.
    def _request_cancel(self) -> None:
        with _EVENT_LOCK:
            self._cancelled = True
            if self._cancel_event is not None:
                self._cancel_event.set()

    def _mark_lease_lost(self) -> None:
        self._lost = True
