"""The worker's schedule step: sync the code's schedules once, then fire what is due.

Every worker runs it from its pass (``Worker.run_once``); there is no leader.
Firing is the store's ``fire_schedules``, which makes each (schedule, fire
time) at most once however many workers call it at the same moment. Between
fires the step reads nothing: it keeps the earliest next fire time and the
worker sleeps until it (:attr:`ScheduleStep.next_fire`). It reads it again
after firing, when told of a change in this process (:meth:`changed`), and at
most every :data:`REFRESH` seconds otherwise, so that a schedule added or
resumed by another process is seen that soon.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from durablesched.registry import TaskRegistry
from durablesched.scheduler import Scheduler

log = logging.getLogger("durablesched.worker")

#: Seconds between reads of the next fire time when nothing else asks for one.
REFRESH = 0.1
#: Schedules fired per store call (a step calls again while it fills one).
BATCH = 100


class ScheduleStep:
    """Sync once, then fire due schedules; keeps the next fire time for the worker's sleep."""

    def __init__(self, scheduler: Scheduler, registry: TaskRegistry) -> None:
        self._scheduler = scheduler
        self._registry = registry
        self._synced = False
        self._lock = threading.Lock()
        self._next: datetime | None = None
        #: ``time.monotonic()`` after which the next fire time is read again.
        self._stale_at = 0.0

    @property
    def next_fire(self) -> datetime | None:
        """The earliest next fire time of an active schedule, as last read."""
        return self._next

    def changed(self) -> None:
        """Schedules changed here (added, resumed...): read the next fire time again."""
        self._stale_at = 0.0

    def sync(self, now: datetime) -> dict[str, str]:
        """Make the registry's schedules the stored ones (``ScheduleStore.sync_schedules``)."""
        store = self._scheduler.store
        changes = store.sync_schedules(self._registry.schedules, now, self._registry.names)
        for name, change in changes.items():
            log.info("schedule %s: %s", name, change)
        self._synced = True
        self.changed()
        return changes

    def run_once(self, now: datetime) -> int:
        """Fire every schedule due at ``now``; returns how many tasks that made."""
        with self._lock:  # run_once and run_due may overlap in tests
            if not self._synced:
                self.sync(now)
            store = self._scheduler.store
            if self._stale_at <= time.monotonic():
                self._next = store.next_fire_time()
                self._stale_at = time.monotonic() + REFRESH
            made = 0
            while self._next is not None and self._next <= now:
                fired = store.fire_schedules(now, limit=BATCH)
                tasks = [f for f in fired if f.task_id is not None]
                made += len(tasks)
                for f in fired:
                    log.info(
                        "schedule %s: fire %s%s: %s",
                        f.schedule,
                        f.fire_at.isoformat(),
                        " (catch-up)" if f.catch_up else "",
                        f"task {f.task_id}" if f.task_id is not None else f"skipped ({f.skipped})",
                    )
                self._next = store.next_fire_time()
                self._stale_at = time.monotonic() + REFRESH
                if len(fired) < BATCH:
                    break
            # The tasks made are claimed by the rest of this pass; other processes
            # hear of them through the commit, as of any submit.
            return made
