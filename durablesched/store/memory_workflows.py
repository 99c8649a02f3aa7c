"""The in-memory backend's part of workflows (docs/workflows.md): step checkpoints.

Kept apart from :mod:`durablesched.store.memory` (a second full implementation of
the store already); :class:`~durablesched.store.memory.MemoryStore` takes it in as a
base class, and this part reaches the store's state only through the few names
declared here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from durablesched.errors import UnsupportedOperationError
from durablesched.records import Claim, StepRecord, TaskRecord
from durablesched.store.protocol import Effect


class MemoryWorkflows:
    """Step checkpoints, by task id, in position order."""

    _lock: threading.Lock

    def __init__(self) -> None:
        self._steps: dict[int, list[StepRecord]] = {}

    def _valid(self, claim: Claim, owner: str, now: datetime) -> TaskRecord | None:
        raise NotImplementedError  # the store's own

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
