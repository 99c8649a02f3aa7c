"""The group commit: outcomes of many attempts recorded in one transaction, fenced by their claims.

Runs on whichever thread hands an outcome over (a task thread) or asks for a
drain (the claim loop, for outcomes whose recording failed; ``shutdown``);
owns no thread. The first to arrive becomes the leader, holding the flush
lock, and records everything pending; the others leave their outcome and go
back to running tasks. The pending list is guarded by the slots' lock, since
the leader waits for it to catch up with the running attempts. No lock is
held while the store records (or while user code runs anywhere).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from durablesched.errors import DurableSchedError, StoreError
from durablesched.records import Claim, Outcome
from durablesched.registry import TaskRegistry
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState
from durablesched.tracing import end_attempt, outcome_of
from durablesched.worker.ahead import Ahead, Room
from durablesched.worker.attempt import AttemptRunner
from durablesched.worker.options import WorkerOptions
from durablesched.worker.slots import Running, Slots, free_slots
from durablesched.worker.trouble import StoreTrouble
from durablesched.worker.watch import ChangeWatch

# The logger name the worker's lines have always carried, whichever module
# logs them: people filter logs by it.
log = logging.getLogger("durablesched.worker")


class GroupCommit:
    """Records the outcomes of a worker's attempts, many to a transaction.

    The leader waits up to ``commit_delay`` for the tasks still running here,
    then records what is pending and, while the worker loops (``looping``),
    claims into the slots this frees in the same transaction, handing the new
    claims to ``launch``. A slot stays taken until its outcome is committed.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        slots: Slots,
        options: WorkerOptions,
        *,
        attempts: AttemptRunner,
        watch: ChangeWatch,
        launch: Callable[[list[Claim]], None],
        stopping: threading.Event,
        wakeup: threading.Event,
        trouble: StoreTrouble,
        after_commit: Callable[[Outcome, TaskState | None, datetime], object] | None = None,
        ahead: Ahead | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._ahead = ahead
        self._after_commit = after_commit
        self._registry = registry
        self._slots = slots
        self._lock = slots.lock
        self._changed = slots.changed
        self._active = slots.active
        self._options = options
        self._attempts = attempts
        self._watch = watch
        self._launch = launch
        self._stopping = stopping
        self._wakeup = wakeup
        self._trouble = trouble
        #: The store error of the last group commit, if it failed (None once one works):
        #: the claim loop backs off from it (or stops on it) as from its own.
        self.error: StoreError | None = None
        #: Outcomes waiting for the next group commit, with their tasks.
        self._pending: list[tuple[Running, Outcome]] = []
        #: Claims ahead that started since, to record with the next group commit.
        self._starts: list[Claim] = []
        self._flush_lock = threading.Lock()
        #: True while run() loops: then a group commit also claims into freed slots.
        self.looping = False
        #: True while a committer thread leads every group commit (the worker claims
        #: ahead): a task thread hands its outcome over and goes on at once.
        self.detached = False
        #: Notified when an outcome is handed over (the committer waits on it).
        self.changed = slots.changed

    @property
    def pending(self) -> bool:
        """Outcomes or starts wait to be recorded (read with the slots' lock held)."""
        return bool(self._pending or self._starts)

    def started(self, claim: Claim) -> None:
        """A claim ahead started (its ``started_at`` set): recorded with the next group
        commit, the one that records the outcome whose slot it took if it comes in
        time (``commit_delay``), else on its own.

        The committer is woken only if nothing else was pending: it then waits for
        work, and must gather this start. With something pending it is already
        gathering or recording, and takes this start with its batch or the next one;
        a wake-up would only take the interpreter from the task just started.
        """
        with self._changed:
            idle = not self._pending and not self._starts
            self._starts.append(claim)
            self._slots.mark_started()
            if self.detached and idle:
                self._changed.notify_all()

    def hand_over(self, running: Running, outcome: Outcome) -> None:
        """On a task thread: leave the outcome for the next commit; lead that if none is."""
        running.ended = True
        if self._ahead is not None:
            self._ahead.ended(time.monotonic() - running.started)
        with self._changed:
            self._pending.append((running, outcome))
            if self.detached and not self._alone():
                self._changed.notify_all()  # the committer records it
                return
            if len(self._pending) >= len(self._active):
                self._changed.notify_all()  # a leader waiting for the last one can go
        if not self.drain() and self.detached:
            with self._changed:
                self._changed.notify_all()  # it failed (kept, see ``error``): the committer retries

    def _alone(self) -> bool:
        """The attempt handing its outcome over is all this worker holds, and no commit is
        under way (call with the slots' lock held): its thread has nothing else to run,
        so it records the outcome itself (an idle worker's task, a signalled workflow's
        resumption: no hand-off to the committer's thread to wait for)."""
        return (
            len(self._active) == 1
            and len(self._pending) == 1
            and not self._starts
            and not self._flush_lock.locked()
        )

    def drain(self, *, wait: bool = False) -> bool:
        """Group commit: whichever thread gets here first records everything pending.

        Others just leave their outcome in the list and go; the leader loops
        until the list is empty, so every outcome waiting while one transaction
        commits shares the next one. With ``wait`` (the committer), wait for a
        leader to finish rather than return: the committer would otherwise spin
        on what is pending, holding the interpreter, until the leader is done.
        """
        while True:
            with self._lock:
                if not self._pending and not self._starts:
                    return True
            if not self._flush_lock.acquire(blocking=wait):
                return True  # the leader will see what we left
            try:
                batch, starts = self._gather()
                recorded = self._flush(batch, starts) if batch or starts else True
            finally:
                self._flush_lock.release()
            if not recorded:
                return False

    def settled(self) -> bool:
        """Nothing is waiting to be recorded, or being recorded, and the last try worked:
        then a pass of the loop that worked means the store works (a group commit in
        flight might yet fail)."""
        with self._lock:
            return not self._pending and not self._flush_lock.locked() and self.error is None

    def _gather(self) -> tuple[list[tuple[Running, Outcome]], list[Claim]]:
        """Take the pending outcomes, first waiting up to ``commit_delay`` for the tasks
        still running here, so that short tasks share one commit (and one fsync)."""
        deadline = time.monotonic() + self._options.commit_delay
        with self._changed:
            while len(self._pending) < self._slots.started():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            batch, self._pending = self._pending, []
            starts, self._starts = self._starts, []
        return batch, starts

    def _flush(self, batch: list[tuple[Running, Outcome]], starts: list[Claim]) -> bool:
        """Record ``batch`` and, while looping, claim into the slots it frees: one transaction."""
        limit, queues, room = 0, None, None
        if self.looping and not self._stopping.is_set():
            finishing = frozenset(id(running) for running, _ in batch)
            if self._ahead is not None:
                # Reserved: the claim loop cannot claim into the same room meanwhile.
                room = self._ahead.reserve(leaving=finishing)
                limit, queues = room.limit, room.queues
            else:
                with self._lock:
                    staying = [r for r in self._active.values() if id(r) not in finishing]
                limit, queues = free_slots(staying, self._options.concurrency, self._options.queues)
        try:
            return self._record(batch, starts, limit, queues, room)
        finally:
            if room is not None and self._ahead is not None:
                self._ahead.settle(room)

    def _record(
        self,
        batch: list[tuple[Running, Outcome]],
        starts: list[Claim],
        limit: int,
        queues: dict[str, int] | None,
        room: Room | None,
    ) -> bool:
        now = self._scheduler.clock.now()
        if room is not None and queues is not None and self._options.queues is not None:
            queues = {q: queues.get(q, 0) for q in self._options.queues}
        try:
            results, claims = self._scheduler.store.record_and_claim(
                [outcome for _, outcome in batch],
                now,
                owner=self._options.owner,
                limit=limit,
                lease=self._options.lease,
                names=self._attempts.claim_names(),
                process_names=self._attempts.process_names(),
                queues=queues,
                ahead=0 if room is None else room.ahead,
                started=starts,
            )
        except DurableSchedError as e:
            # Kept to retry on the next pass; the leases stay renewed meanwhile.
            # Logged once per distinct error; the loop backs off from it, or gives up.
            error = e if isinstance(e, StoreError) else StoreError(str(e))
            self._trouble.note(error, self._scheduler.clock.now())
            with self._lock:
                self._pending[:0] = batch
                self._starts[:0] = starts
                self.error = error
            self._wakeup.set()
            return False
        with self._lock:
            self.error = None
        self._trouble.recovered(self._scheduler.clock.now())
        finished: list[Running] = []
        again: list[tuple[Running, Outcome]] = []
        for (running, outcome), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                # Its effects raised (or it acknowledged an unrequested cancellation):
                # nothing of it was written; record the attempt as failed instead.
                again.append((running, self._attempts.failure(running.claim, result)))
                continue
            _log_outcome(running, outcome, result)
            if running.trace is not None:
                end_attempt(running.trace, outcome_of(result), outcome.error)
            finished.append(running)
            if self._after_commit is not None:
                self._tell(outcome, result, now)
        if again:
            with self._lock:
                self._pending.extend(again)
        self._slots.remove(finished)
        self._launch(claims)
        # Only now, and only if a slot is still free: with the freed slots filled
        # again, the claim loop has nothing to do, and waking it would take the
        # interpreter from the running tasks for a pass that claims nothing.
        if self._free() or self._stopping.is_set():
            self._wakeup.set()
            self._watch.nudge_if_free()
        return True

    def _free(self) -> bool:
        """A slot is free here: nothing holds it, nor waits for it."""
        with self._lock:
            if self._ahead is None:
                return len(self._active) < self._options.concurrency
            # The claims waiting here are in the set too, not ended: each takes the
            # next free slot on a task thread, so a pass for that slot claims nothing.
            held = sum(1 for r in self._active.values() if not r.ended)
        return held < self._options.concurrency

    def _tell(self, outcome: Outcome, state: TaskState | None, at: datetime) -> None:
        """The ``after_commit`` hook, whose failure is logged: the outcome stands."""
        assert self._after_commit is not None
        try:
            self._after_commit(outcome, state, at)
        except Exception:
            claim = outcome.claim
            log.exception("after_commit hook failed for task %s (%s)", claim.task_id, claim.name)

    def forget(self, done: list[Running], *, nudge: bool = True) -> None:
        """Free the slots of attempts that are over (recorded, or never to be), and say so."""
        self._slots.remove(done)
        self._wakeup.set()
        if nudge:
            self._watch.nudge_if_free()


def _log_outcome(running: Running, outcome: Outcome, state: TaskState | None) -> None:
    if state is TaskState.SUCCEEDED and not log.isEnabledFor(logging.INFO):
        return  # the common case, at --log-level warning: nothing to work out
    claim = running.claim
    elapsed = time.monotonic() - running.started
    what = (
        "failure" if outcome.error else "cancel acknowledgement" if outcome.cancelled else "success"
    )
    if state is None:
        log.warning(
            "lease lost: the %s of task %s (%s) attempt %s was discarded",
            what,
            claim.task_id,
            claim.name,
            claim.attempt,
        )
    elif state is TaskState.SUCCEEDED:
        log.info(
            "success: task %s (%s) attempt %s in %.3fs",
            claim.task_id,
            claim.name,
            claim.attempt,
            elapsed,
        )
    elif state is TaskState.CANCELLED:
        log.info(
            "cancel: task %s (%s) attempt %s acknowledged in %.3fs",
            claim.task_id,
            claim.name,
            claim.attempt,
            elapsed,
        )
    else:
        _log_failure(claim, outcome, state, elapsed)


def _log_failure(claim: Claim, outcome: Outcome, state: TaskState, elapsed: float) -> None:
    error = outcome.error
    assert error is not None
    retry = state is TaskState.RETRY_WAIT and outcome.retry_at is not None
    log.log(
        logging.WARNING if retry else logging.ERROR,
        "%s: task %s (%s) attempt %s failed in %.3fs (%s: %s)%s",
        "retry" if retry else "failure",
        claim.task_id,
        claim.name,
        claim.attempt,
        elapsed,
        error.type.rsplit(".", 1)[-1],
        error.message,
        f"; next at {outcome.retry_at.isoformat()}" if retry and outcome.retry_at else "; no retry",
    )
