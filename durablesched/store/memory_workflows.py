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

from durablesched.errors import (
    InvalidTransitionError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from durablesched.records import (
    Claim,
    ErrorInfo,
    NewTask,
    SignalRecord,
    StepRecord,
    Submitted,
    TaskRecord,
)
from durablesched.states import TERMINAL, TaskState, check_transition
from durablesched.store.protocol import Effect


class MemoryWorkflows:
    """Step checkpoints, by task id, in position order."""

    _lock: threading.Lock
    _heap: list[tuple[datetime, int, int]]
    _running: set[int]
    _tasks: dict[int, TaskRecord]
    _stale: int

    def __init__(self) -> None:
        self._steps: dict[int, list[StepRecord]] = {}
        #: Signals by task, oldest first; ids from one counter, as the SQL's.
        self._signals: dict[int, list[SignalRecord]] = {}
        self._signal_ids = 0
        #: The signal each suspended workflow waits for (task_waits).
        self._waits: dict[int, str] = {}
        #: Spawned children: child -> parent, and parent -> children in order.
        self._parents: dict[int, int] = {}
        self._children: dict[int, list[int]] = {}

    # The store's own (MemoryStore defines each; these only declare them here).
    def _valid(self, claim: Claim, owner: str, now: datetime) -> TaskRecord | None:
        raise NotImplementedError

    def _put(self, task: TaskRecord) -> TaskRecord:
        raise NotImplementedError

    def _event(
        self, task: TaskRecord, now: datetime, detail: str | None, error: ErrorInfo | None = None
    ) -> None:
        raise NotImplementedError

    def _insert(self, new: NewTask, now: datetime) -> Submitted:
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
        self,
        claim: Claim,
        until: datetime,
        now: datetime,
        *,
        detail: str,
        signal: str | None = None,
        children: tuple[Sequence[int], int] | None = None,
    ) -> TaskState | None:
        with self._lock:
            task = self._valid(claim, claim.owner, now)
            if task is None:
                return None
            if task.cancel_requested_at is not None:
                self._finish(task, TaskState.CANCELLED, now, detail="cancelled while suspending")
                return TaskState.CANCELLED
            check_transition(task.state, TaskState.PENDING, operator=True)
            if signal is None:
                self._waits.pop(task.id, None)
            else:
                self._waits[task.id] = signal
                if self._pending_signal(task.id, signal) is not None and until > now:
                    until = now  # sent while this attempt ran: no wake-up is lost
            if children is not None and until > now:
                ids, seen = children
                ended = sum(
                    1 for i in ids if (t := self._tasks.get(i)) is not None and t.state in TERMINAL
                )
                if ended > seen:
                    until = now  # a child ended while this attempt ran
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

    def send_signal(self, task_id: int, name: str, payload: Any, now: datetime) -> int:
        with self._lock:
            refused = self._signal_refused(task_id)
            if refused is not None:
                raise refused
            return self._deliver(task_id, name, payload, now)

    def _signal_refused(self, task_id: int, finishing: int | None = None) -> Exception | None:
        """Why the task takes no signal (unknown, or finished: ``finishing`` is the task
        whose success is being recorded), or None; under the lock."""
        task = self._tasks.get(task_id)
        if task is None:
            return TaskNotFoundError(f"no task with id {task_id}")
        state = TaskState.SUCCEEDED if task_id == finishing else task.state
        if state in TERMINAL:
            return InvalidTransitionError(
                f"task {task_id} is {state}: a finished task takes no signal"
            )
        return None

    def _deliver(self, task_id: int, name: str, payload: Any, now: datetime) -> int:
        """Keep the signal, and wake the task if it waits for it; under the lock, for a
        task that takes signals."""
        task = self._tasks[task_id]
        self._signal_ids += 1
        self._signals.setdefault(task_id, []).append(
            SignalRecord(self._signal_ids, task_id, name, payload, now)
        )
        waits = self._waits.get(task_id)
        if task.state is TaskState.PENDING and task.due_at > now and waits == name:
            task = self._put(replace(task, due_at=now, updated_at=now))
            self._stale += 1  # its entry at the old due time
            heapq.heappush(self._heap, (task.due_at, task.seq, task.id))
        return self._signal_ids

    def receive_signal(
        self, claim: Claim, position: int, step: str, name: str, now: datetime
    ) -> tuple[bool, Any] | None:
        with self._lock:
            if self._valid(claim, claim.owner, now) is None:
                return None
            recorded = self._steps.setdefault(claim.task_id, [])
            if any(s.position == position for s in recorded):
                return None
            index = self._pending_signal(claim.task_id, name)
            if index is None:
                return False, None
            signals = self._signals[claim.task_id]
            taken = signals[index]
            signals[index] = replace(taken, consumed_at=now, consumed_position=position)
            recorded.append(
                StepRecord(
                    claim.task_id, position, step, {"payload": taken.payload}, now, claim.attempt
                )
            )
            recorded.sort(key=lambda s: s.position)
            return True, taken.payload

    def signals(self, task_id: int) -> list[SignalRecord]:
        with self._lock:
            return list(self._signals.get(task_id, ()))

    def spawn(
        self, claim: Claim, position: int, step: str, tasks: Sequence[NewTask], now: datetime
    ) -> list[Submitted] | None:
        with self._lock:
            if self._valid(claim, claim.owner, now) is None:
                return None
            recorded = self._steps.setdefault(claim.task_id, [])
            if any(s.position == position for s in recorded):
                return None
            submitted = [self._insert(task, now) for task in tasks]
            for sub in submitted:
                if sub.created:
                    self._parents[sub.task_id] = claim.task_id
                    self._children.setdefault(claim.task_id, []).append(sub.task_id)
            ids = [sub.task_id for sub in submitted]
            recorded.append(
                StepRecord(claim.task_id, position, step, {"ids": ids}, now, claim.attempt)
            )
            recorded.sort(key=lambda s: s.position)
            return submitted

    def forget_steps(self, task_id: int, position: int) -> int:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            if task.state not in TERMINAL:
                raise InvalidTransitionError(
                    f"task {task_id} is {task.state}: only a finished workflow's steps can be "
                    "forgotten"
                )
            steps = self._steps.get(task_id, [])
            kept = [s for s in steps if s.position < position]
            self._steps[task_id] = kept
            self._signals[task_id] = [
                replace(s, consumed_at=None, consumed_position=None)
                if s.consumed_position is not None and s.consumed_position >= position
                else s
                for s in self._signals.get(task_id, [])
            ]
            return len(steps) - len(kept)

    def children(self, task_id: int) -> list[int]:
        with self._lock:
            return list(self._children.get(task_id, ()))

    def _wake_parent(self, child_id: int, now: datetime) -> None:
        """A child ended: its parent, suspended (PENDING, due later), is due now, at the
        wake (as a signal's wake); under the lock, from the store's ``_finish``."""
        parent = self._tasks.get(self._parents.get(child_id, 0))
        if parent is None or parent.state is not TaskState.PENDING:
            return
        if parent.due_at > now:
            parent = self._put(replace(parent, due_at=now, updated_at=now))
            self._stale += 1
            heapq.heappush(self._heap, (parent.due_at, parent.seq, parent.id))

    def _pending_signal(self, task_id: int, name: str) -> int | None:
        """The index of the task's oldest signal ``name`` no wait took yet."""
        for index, sent in enumerate(self._signals.get(task_id, ())):
            if sent.name == name and sent.consumed_position is None:
                return index
        return None

    def steps(self, task_id: int) -> list[StepRecord]:
        with self._lock:
            return list(self._steps.get(task_id, ()))

    def _forget_workflow(self, task_id: int) -> None:
        """A deleted task's steps, signals and wait go with it (SQL's ON DELETE CASCADE);
        under the lock."""
        self._steps.pop(task_id, None)
        self._signals.pop(task_id, None)
        self._waits.pop(task_id, None)
        parent = self._parents.pop(task_id, None)
        if parent is not None:
            self._children[parent].remove(task_id)
        for child in self._children.pop(task_id, ()):
            del self._parents[child]
