"""Leases: keeping this worker's alive, hearing what became of them, ending lapsed ones.

Runs on the claim loop's thread (:meth:`Leases.run_once`, from the worker's
pass) or on the caller's (``Worker.heartbeat``, ``Worker.reclaim``,
``Worker.shutdown``); owns no thread. It reads the running attempts as a copy
taken under the slots' lock and talks to the store without it, then tells
each attempt, through its signals, of a lost lease or a cancel request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from durablesched.records import LeaseStatus
from durablesched.scheduler import Scheduler
from durablesched.worker.options import WorkerOptions
from durablesched.worker.presence import Presence
from durablesched.worker.slots import Running, Slots

# The logger name the worker's lines have always carried, whichever module
# logs them: people filter logs by it.
log = logging.getLogger("durablesched.worker")


class Leases:
    """The heartbeat of every lease this worker holds, and the reclaim of expired ones.

    A heartbeat renews every held lease in one store call, every
    ``heartbeat_interval``, and marks this worker seen (a registered worker's
    heartbeat runs even when it holds nothing); in between, a lease check (a read) hears of lost
    leases and cancel requests when another process committed. Expired leases,
    anyone's, are looked for at most every ``reclaim_interval``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        slots: Slots,
        options: WorkerOptions,
        retry_delay: Callable[[str, int], timedelta],
        presence: Presence,
    ) -> None:
        self._scheduler = scheduler
        self._slots = slots
        self._owner = options.owner
        self._lease = options.lease
        self._heartbeat_interval = options.heartbeat_interval
        #: A registered worker heartbeats even holding nothing: the heartbeat marks it seen.
        self._presence = presence
        #: For the reclaim: when a task whose lease expired is tried again.
        self._retry_delay = retry_delay
        self.next_heartbeat: datetime | None = None
        #: Expired leases are looked for at most this often by run_once().
        self.reclaim_interval = min(self._heartbeat_interval, timedelta(seconds=1))
        self.next_reclaim: datetime | None = None

    def run_once(self, now: datetime, *, early: bool) -> None:
        """The worker's pass: heartbeat if due (else check leases if ``early``); reclaim if due."""
        if self.next_heartbeat is None or now >= self.next_heartbeat:
            self.heartbeat(now)
        elif early:
            # Between heartbeats a read does: it hears of a cancel without
            # queueing for the write lock behind other processes (and holding
            # this process's group commits up meanwhile).
            self.check(now)
        if self.next_reclaim is None or now >= self.next_reclaim:
            # Not on every pass: a busy worker wakes after each group commit.
            self.reclaim(now)
            self.next_reclaim = now + self.reclaim_interval

    def start_heartbeats(self) -> bool:
        """Tasks are held now: the first heartbeat is due an interval from now, if none is
        (True: the claim loop must hear of it)."""
        if self.next_heartbeat is not None:
            return False
        self.next_heartbeat = self._scheduler.clock.now() + self._heartbeat_interval
        return True

    def heartbeat(self, now: datetime | None = None, *, force: bool = True) -> None:
        """Renew every lease this worker holds in one store call, and pass on cancel requests.

        The same call marks the worker seen in the workers table.
        """
        now = now or self._scheduler.clock.now()
        if not force and self.next_heartbeat is not None and now < self.next_heartbeat:
            return
        self.next_heartbeat = now + self._heartbeat_interval
        held = self._slots.held()
        if held or self._presence.registered:
            claims = [r.claim for r in held.values()]
            try:
                statuses = self._scheduler.store.heartbeat(self._owner, claims, now, self._lease)
            except BaseException:
                # Not renewed (a busy or broken database): try again on the next
                # pass, not an interval later, or the leases run out meanwhile.
                self.next_heartbeat = now
                raise
            self._take(held, statuses)

    def check(self, now: datetime) -> None:
        """What a heartbeat would tell, read without renewing: lost leases, cancel requests."""
        held = self._slots.held()
        if held:
            claims = [r.claim for r in held.values()]
            self._take(held, self._scheduler.store.check_leases(self._owner, claims, now))

    def _take(self, held: dict[int, Running], statuses: list[LeaseStatus]) -> None:
        """Act on a heartbeat's (or a lease check's) answer for the tasks held when it began."""
        renewed = {s.task_id: s for s in statuses}
        for task_id, running in held.items():
            status = renewed.get(task_id)
            if status is None:
                if running.ended:
                    continue  # recorded by a group commit while this heartbeat ran
                # A durable wait that gave the claim back itself (its attempt ends) lost
                # nothing: no warning, though it is marked as any claim no longer held.
                if not running.signals.lease_lost and not running.context.suspended:
                    log.warning(
                        "lease lost: task %s (%s) attempt %s; its outcome will be discarded",
                        task_id,
                        running.claim.name,
                        running.claim.attempt,
                    )
                running.signals.mark_lease_lost()
            elif status.cancel_requested:
                running.signals.request_cancel()

    def reclaim(self, now: datetime | None = None) -> int:
        """Finalise tasks whose leases expired, in any worker. Returns how many."""
        now = now or self._scheduler.clock.now()
        reclaimed = self._scheduler.store.reclaim_expired(now, self._retry_delay)
        for r in reclaimed:
            log.warning(
                "reclaim: task %s (%s) attempt %s of %s lost its lease -> %s",
                r.task_id,
                r.name,
                r.attempt,
                r.owner,
                r.state,
            )
        return len(reclaimed)
