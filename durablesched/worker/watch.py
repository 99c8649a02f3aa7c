"""What a worker does when another process commits: wake, check leases early, keep quiet.

The store's change watcher (inotify or ``PRAGMA data_version`` for SQLite,
LISTEN/NOTIFY for PostgreSQL) runs in a thread of its own and calls
:meth:`ChangeWatch.on_change` there; this module owns no thread. The claim
loop asks it whether an early lease check is due; whichever thread frees a
slot calls :meth:`ChangeWatch.nudge_if_free`. No lock: each flag has one
writer per transition, and a stale read costs one pass at most.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from durablesched.store.protocol import ChangeWatcher, OnChange, Store
from durablesched.worker.slots import Slots

#: Seconds between heartbeats sent early because another process committed:
#: how soon a cancel requested elsewhere reaches a running task, at most.
EARLY_HEARTBEAT = 0.25


class ChangeWatch:
    """The worker's side of the store's change watcher, while :meth:`Worker.run` loops.

    A commit elsewhere wakes the claim loop (``wakeup``) and, while tasks run
    here, asks for an early lease check, at most every EARLY_HEARTBEAT seconds.
    While all ``concurrency`` slots are taken the watcher may keep quiet,
    until a slot frees.
    """

    def __init__(self, slots: Slots, concurrency: int, wakeup: threading.Event) -> None:
        self._active = slots.active
        self._concurrency = concurrency
        self._wakeup = wakeup
        #: The change watcher while run() loops (told when a slot frees).
        self._watcher: ChangeWatcher | None = None
        #: Set by the change watcher if it failed (say, the database file was removed).
        self.error: Exception | None = None
        #: Set by the change watcher: another process committed since the last pass.
        self.changed_elsewhere = False
        self._last_early_heartbeat = 0.0

    def open(self, store: Store, poll_interval: float, on_change: OnChange) -> None:
        """Start watching ``store``, if it can be watched; ``on_change`` is called on commits."""
        watcher = store.watch_changes(poll_interval)
        self.error = None
        if watcher is not None:
            self._watcher = watcher
            watcher.start(on_change)

    def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()

    def on_change(self, error: Exception | None) -> bool:
        """From the change watcher's thread: another process committed (or it failed).

        Answers True while every slot is taken: the group commit claims for a
        full worker, and cancel notices wait for EARLY_HEARTBEAT anyway, so the
        watcher may keep quiet until a slot frees (:meth:`nudge_if_free`).
        Otherwise this worker's own commits would wake it a few times each.
        """
        if error is not None:
            self.error = error
        self.changed_elsewhere = True
        full = error is None and len(self._active) >= self._concurrency
        if full and time.monotonic() - self._last_early_heartbeat < EARLY_HEARTBEAT:
            # The last early lease check is recent: nothing to do until one is due.
            # Under load from other processes this spares a pass per commit they make.
            return True
        self._wakeup.set()
        return full

    def nudge_if_free(self) -> None:
        """A slot is free: the change watcher must tell of commits elsewhere at once again."""
        watcher = self._watcher
        if watcher is not None and len(self._active) < self._concurrency:
            watcher.nudge()

    def early_heartbeat_due(self) -> bool:
        """Check the leases now, ahead of the heartbeat, because another process committed
        (it may have asked a task of ours to stop): at most every EARLY_HEARTBEAT seconds,
        and only while tasks run here, so that a cancel reaches them promptly."""
        if not self.changed_elsewhere:
            return False
        if not self._active:
            self.changed_elsewhere = False  # no task here to tell
            return False
        now = time.monotonic()
        if now - self._last_early_heartbeat < EARLY_HEARTBEAT:
            return False  # kept for later: early_heartbeat_at() tells the loop when
        self.changed_elsewhere = False
        self._last_early_heartbeat = now
        return True

    def early_heartbeat_at(self, now: datetime) -> datetime:
        """When a commit seen while an early heartbeat was not yet allowed may be acted on."""
        wait = EARLY_HEARTBEAT - (time.monotonic() - self._last_early_heartbeat)
        return now + timedelta(seconds=max(0.0, wait))
