"""The in-memory backend's part of workflows (docs/workflows.md): step checkpoints.

Kept apart from :mod:`durablesched.store.memory` (a second full implementation of
the store already); :class:`~durablesched.store.memory.MemoryStore` takes it in as a
base class, and this part reaches the store's state only through the few names
declared here.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from durablesched.errors import UnsupportedOperationError
from durablesched.records import Claim, ErrorInfo, StepRecord, TaskRecord
from durablesched.states import TaskState, check_transition
from durablesched.store.protocol import Effect


class MemoryWorkflows:
    """Step checkpoints, by task id, in position order."""

    _lock: threading.Lock
    _heap: list[tuple[datetime, int, int]]
    _running: set[int]

    def __init__(self) -> None:
        self._steps: dict[int, list[StepRecord]] = {}

    # The store's own (MemoryStore defines each; these only declare them here).
    def _valid(self, claim: Claim, owner: str, now: datetime) -> TaskRecord | None:
        raise NotImplementedError

    def _put(self, task: TaskRecord) -> TaskRecord:
        raise NotImplementedError

    def _event(
        self, task: TaskRecord, now: datetime, detail: str | None, error: ErrorInfo | None = None
    ) -> None:
        raise NotImplementedError

    def _finish(
        self,
        task: TaskRecord,
        state: TaskState,
        now: datetime,
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        detail: str | None = None,
    ) -> None:
        raise NotImplementedError

    def suspend(
        self, claim: Claim, until: datetime, now: datetime, *, detail: str
    ) -> TaskState | None:
        with self._lock:
            task = self._valid(claim, claim.owner, now)
            if task is None:
                return None
            if task.cancel_requested_at is not None:
                self._finish(task, TaskState.CANCELLED, now, detail="cancelled while suspending")
                return TaskState.CANCELLED
            check_transition(task.state, TaskState.PENDING, operator=True)
            task = self._put(
                replace(
                    task,
                    state=TaskState.PENDING,
                    due_at=until,
                    attempts=task.attempts - 1,
                    lease_owner=None,
                    lease_expires_at=None,
                    updated_at=now,
                )
            )
            self._running.discard(task.id)
            heapq.heappush(self._heap, (task.due_at, task.seq, task.id))
            self._event(task, now, detail)
            return TaskState.PENDING

    def record_step(
        self,
        claim: Claim,
        position: int,
        name: str,
        result: Any,
        now: datetime,
        *,
        effects: Sequence[Effect] = (),
    ) -> bool:
        if effects:
            raise UnsupportedOperationError(
                "the in-memory backend has no database: a step's effects need the SQLite "
                "or PostgreSQL backend"
            )
        with self._lock:
            if self._valid(claim, claim.owner, now) is None:
                return False
            recorded = self._steps.setdefault(claim.task_id, [])
            if any(s.position == position for s in recorded):
                return False
            recorded.append(StepRecord(claim.task_id, position, name, result, now, claim.attempt))
            recorded.sort(key=lambda s: s.position)
            return True

    def steps(self, task_id: int) -> list[StepRecord]:
        with self._lock:
            return list(self._steps.get(task_id, ()))

    def _forget_steps(self, task_id: int) -> None:
        """A deleted task's steps go with it (SQL's ON DELETE CASCADE); under the lock."""
        self._steps.pop(task_id, None)
