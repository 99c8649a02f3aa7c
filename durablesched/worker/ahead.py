"""Claims ahead: the tasks a worker holds beyond its slots, waiting for one to free.

Shared by the claim loop, the committer and the task threads, owning no thread.
A claim ahead is a :class:`Running` with ``waiting`` set: in the slots' set (so
heartbeats renew its lease and cancel requests reach it) but not started. The
waiting ones start in claim order as slots free (a task thread that ends an
attempt takes the next one at once); a cancelled one is acknowledged and never
starts; at shutdown they are given back unstarted, no attempt counted. Every
change is made under the slots' lock, and so is the reservation that keeps the
claim loop and the committer from claiming into the same room at once.

How many to hold: no more than ``ahead``, and no more than this worker will
start within ``ahead_window`` seconds at its recent rate (its slots over the
recent length of an attempt, or over the age of the oldest attempt running
here, whichever is longer). A worker of long tasks therefore claims none ahead,
and one whose tasks turn long stops at once; a claim that has waited longer
than the window anyway is given back for any worker to take.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from datetime import datetime

from durablesched.worker.options import WorkerOptions
from durablesched.worker.slots import Running, Slots

#: How much each ended attempt moves the recent length of an attempt (an average).
_WEIGHT = 0.1


@dataclass(frozen=True, slots=True)
class Room:
    """What one claim may take: ``limit`` into free slots (of each queue: ``queues``), and
    ``ahead`` more to wait; reserved until :meth:`Ahead.settle` with it."""

    limit: int
    queues: dict[str, int] | None
    ahead: int

    @property
    def total(self) -> int:
        return self.limit + self.ahead


class Ahead:
    """The claims a worker holds ahead of its slots, and how many it may hold."""

    def __init__(self, slots: Slots, options: WorkerOptions) -> None:
        self._slots = slots
        self._lock = slots.lock
        self._concurrency = options.concurrency
        self._queues = options.queues
        self._most = options.ahead
        self._window = options.ahead_window
        #: Waiting, in claim order.
        self._waiting: deque[Running] = deque()
        #: Claimed (or being claimed) and not yet in the slots' set: the room reserved.
        self._reserved = 0
        self._reserved_queues: Counter[str] = Counter()
        #: The recent length of an attempt here (seconds), None before the first ends.
        self._recent: float | None = None
        #: A claim ahead waited past the window: none more until an attempt ends here
        #: (the slots it waited for are held by long attempts; another worker may
        #: have one free, and would otherwise lose the task to this one again).
        self._held_off = False

    # -- how many ---------------------------------------------------------------------------

    def ended(self, seconds: float) -> None:
        """An attempt ran ``seconds``: the recent length moves towards it."""
        with self._lock:
            recent = self._recent
            self._recent = seconds if recent is None else recent + _WEIGHT * (seconds - recent)
            self._held_off = False

    def target(self, oldest_running: float) -> int:
        """How many claims to hold ahead now (call with the lock held): what this worker
        starts within the window at its recent rate, at most ``ahead``."""
        if self._most == 0 or self._recent is None or self._held_off:
            return 0
        length = max(self._recent, oldest_running, 1e-6)
        return min(self._most, int(self._concurrency * self._window / length))

    def reserve(self, *, leaving: frozenset[int] = frozenset()) -> Room:
        """The room a claim may take now, reserved against any other claim until settled.

        ``leaving``: ids of attempts about to be recorded (a group commit's batch),
        whose slots count as free. Attempts whose outcome was handed over count as
        ended too: their threads have moved on.
        """
        with self._lock:
            now = time.monotonic()
            held = [
                r
                for r in self._slots.active.values()
                if not r.ended and id(r) not in leaving and not r.signals.lease_lost
            ]
            oldest = max((now - r.started for r in held if not r.waiting), default=0.0)
            target = self.target(oldest)
            count = len(held) + self._reserved
            if self._queues is None:
                limit, queues = max(0, self._concurrency - count), None
            else:
                used = Counter(r.claim.queue for r in held) + self._reserved_queues
                queues = {q: n - used[q] for q, n in self._queues.items() if n > used[q]}
                limit = sum(queues.values())
            ahead = max(0, self._concurrency + target - max(count, self._concurrency))
            room = Room(limit, queues, ahead)
            self._reserved += room.total
            if queues is not None:
                self._reserved_queues.update(queues)
            return room

    def settle(self, room: Room) -> None:
        """The claim made with ``room`` is over (its claims are in the slots' set, or none)."""
        with self._lock:
            self._reserved -= room.total
            if room.queues is not None:
                self._reserved_queues.subtract(room.queues)

    # -- the waiting ones -------------------------------------------------------------------

    def hold(self, waiting: list[Running]) -> None:
        """Claims ahead, already in the slots' set: they wait here, in claim order."""
        with self._lock:
            self._waiting.extend(waiting)

    def take(self, now: datetime) -> Running | None:
        """The first waiting claim a free slot may start, marked started at ``now``; None if
        none may start. Cancelled and lost ones are left for :meth:`take_stopped`."""
        with self._lock:
            if not self._waiting:
                return None
            running = [r for r in self._slots.active.values() if not r.waiting and not r.ended]
            if len(running) >= self._concurrency:
                return None
            busy = Counter(r.claim.queue for r in running) if self._queues else None
            for waiting in self._waiting:
                if waiting.signals.cancelled or waiting.signals.lease_lost:
                    continue
                queue = waiting.claim.queue
                if (
                    busy is not None
                    and self._queues is not None
                    and busy[queue] >= self._queues.get(queue, 0)
                ):
                    continue
                self._waiting.remove(waiting)
                start(waiting, now)
                return waiting
            return None

    def take_stopped(self) -> list[Running]:
        """The waiting claims whose cancellation was requested or whose lease was lost:
        never to start."""
        with self._lock:
            stopped = [r for r in self._waiting if r.signals.cancelled or r.signals.lease_lost]
            for r in stopped:
                self._waiting.remove(r)
            return stopped

    def take_stale(self, older_than: float) -> list[Running]:
        """The waiting claims that have waited more than ``older_than`` seconds."""
        with self._lock:
            limit = time.monotonic() - older_than
            stale = [r for r in self._waiting if r.started < limit]
            for r in stale:
                self._waiting.remove(r)
            if stale:
                self._held_off = True
            return stale

    def next_stale(self) -> float | None:
        """Seconds until the longest-waiting claim ahead has waited the window (at least
        a millisecond), or None if none waits."""
        with self._lock:
            if not self._waiting:
                return None
            oldest = min(r.started for r in self._waiting)
        return max(0.001, oldest + self._window - time.monotonic())

    def take_all(self) -> list[Running]:
        """Every waiting claim (the worker is stopping)."""
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
            return taken

    @property
    def count(self) -> int:
        """How many claims wait here (a hint: read without the lock)."""
        return len(self._waiting)

    @property
    def stale_after(self) -> float:
        """Seconds a claim waits before it is given back for any worker to take."""
        return self._window


def start(running: Running, now: datetime) -> None:
    """``running`` starts now: its claim carries the time, its timeout counts from here."""
    running.waiting = False
    running.claim = replace(running.claim, started_at=now)
    running.context.claim = running.claim
    running.started = time.monotonic()
    begin(running)


def begin(running: Running) -> None:
    """Its timeout counts from now, its start."""
    definition = running.definition
    if definition is not None and definition.timeout is not None:
        running.context.deadline = running.started + definition.timeout.total_seconds()
