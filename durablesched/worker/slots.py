"""The attempts running in a worker: its slots, and the waits on them.

Shared by every thread of the worker, owning none: the claim loop and the
group commit's leader add attempts, task threads and the leader remove them,
heartbeats read them, tests wait on them. One lock guards the set (and the
group commit's pending outcomes, which are counted against it); its condition
wakes whoever waits for the set to change.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from durablesched.clock import thread_timeout
from durablesched.context import AttemptSignals, TaskContext
from durablesched.records import Claim
from durablesched.registry import TaskDefinition
from durablesched.tracing import AttemptTrace


@dataclass(slots=True)
class Running:
    """One attempt held here, from its claim until its outcome is committed: running, or
    waiting for a slot (claimed ahead) until the worker starts it."""

    claim: Claim
    context: TaskContext
    #: What the worker tells the attempt (cancel, lost lease); its context reads them.
    signals: AttemptSignals
    #: Its task as registered here, or None for a name this worker does not know
    #: (claimed under ``unknown_tasks="fail"``): looked up once, when claimed.
    definition: TaskDefinition | None = None
    started: float = field(default_factory=time.monotonic)
    #: Its outcome was handed over for recording (or its cancel enforced): a
    #: heartbeat that no longer finds its claim is then no sign of a lost lease.
    ended: bool = False
    #: It stopped for the worker's shutdown and gave its claim back (ctx.sleep).
    given_back: bool = False
    #: Its trace, when a tracer is installed (docs/tracing.md): ended with its outcome.
    trace: AttemptTrace | None = None
    #: Claimed ahead and not started yet: it waits in the worker for a slot.
    waiting: bool = False


class Slots:
    """The attempts running here, by task id; a slot stays taken until its outcome commits.

    While any attempt runs, the worker hears this process's cancel requests:
    ``subscribe()`` is called when the first one arrives and what it returned
    (the unsubscribe) when the last one leaves, under the lock.
    """

    def __init__(self, subscribe: Callable[[], Callable[[], None]]) -> None:
        self.lock = threading.Lock()
        #: Notified whenever the set changes (and when the last pending outcome arrives).
        self.changed = threading.Condition(self.lock)
        #: Notified when attempts are added or a claim ahead starts: what
        #: :meth:`wait_running` waits on. Apart from ``changed``, whose waiter (the group
        #: commit's leader, gathering outcomes) a start would wake for nothing, taking
        #: the interpreter from the task that just started.
        self.started_changed = threading.Condition(self.lock)
        #: Read without the lock only for a count, as a hint.
        self.active: dict[int, Running] = {}
        self._subscribe = subscribe
        self._unsubscribe: Callable[[], None] | None = None

    def add(self, started: list[Running]) -> None:
        with self.changed:
            if not self.active:
                # Hear this process's cancel requests while we hold tasks.
                self._unsubscribe = self._subscribe()
            for running in started:
                self.active[running.claim.task_id] = running
            self.changed.notify_all()
            self.started_changed.notify_all()

    def remove(self, done: list[Running]) -> None:
        with self.changed:
            for running in done:
                self.active.pop(running.claim.task_id, None)
            if not self.active and self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
            self.changed.notify_all()

    def get(self, task_id: int) -> Running | None:
        with self.lock:
            return self.active.get(task_id)

    def held(self) -> dict[int, Running]:
        """A copy of the set, to act on without the lock (a heartbeat, a lease check)."""
        with self.lock:
            return {task_id: r for task_id, r in self.active.items()}

    def wait_idle(self, timeout: float) -> bool:
        """Block until no attempt runs here (True) or ``timeout`` seconds pass (False;
        ``math.inf``: as long as it takes)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.active:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.changed.wait(thread_timeout(remaining)):
                    return not self.active
            return True

    def wait_running(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` attempts run here (True) or ``timeout`` seconds pass
        (``math.inf``: as long as it takes)."""
        deadline = time.monotonic() + timeout
        with self.started_changed:
            while self.started() < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.started_changed.wait(thread_timeout(remaining)):
                    return self.started() >= count
            return True

    def started(self) -> int:
        """How many held attempts have started (call with the lock held): claims ahead
        waiting for a slot are not counted."""
        return sum(1 for r in self.active.values() if not r.waiting)

    def mark_started(self) -> None:
        """A waiting claim started: wake whoever waits for attempts to run (call with
        the lock held)."""
        self.started_changed.notify_all()


def free_slots(
    running: Iterable[Running], concurrency: int, queues: Mapping[str, int] | None
) -> tuple[int, dict[str, int] | None]:
    """What a claim may take with these attempts running: how many in all and, when the
    worker serves chosen queues, how many of each (a full queue blocks no other)."""
    held = list(running)
    if queues is None:
        return concurrency - len(held), None
    used = Counter(r.claim.queue for r in held)
    free = {q: n - used[q] for q, n in queues.items() if n > used[q]}
    return sum(free.values()), free
