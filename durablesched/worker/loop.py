"""Claiming, running and recording tasks with a bounded number of threads.

A worker claims a task only when it has a free slot, so nothing sits claimed
inside a busy worker while another could run it. User code always runs with
no lock of ours held; outcomes are written through the store, fenced by the
claim that started the attempt.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta

from durablesched.clock import positive_duration
from durablesched.errors import (
    ConfigurationError,
    DurableSchedError,
    SchemaError,
    StoreError,
)
from durablesched.records import Claim, Environment, Outcome
from durablesched.records import environment as parse_environment
from durablesched.registry import TaskRegistry
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState
from durablesched.worker.attempt import AttemptRunner
from durablesched.worker.leases import Leases
from durablesched.worker.slots import Running, Slots
from durablesched.worker.threads import TaskThreads
from durablesched.worker.watch import ChangeWatch

log = logging.getLogger("durablesched.worker.loop")


class Worker:
    """Runs the tasks of ``scheduler.registry`` with up to ``concurrency`` threads.

       ``lease`` is how long a claim lasts without a heartbeat; heartbeats renew
       every held lease at ``heartbeat_interval`` (a third of the lease by
       default). Outcomes are group-committed: the first thread to finish records
       every outcome pending (waiting up to ``commit_delay`` for the tasks still
       running here) and, in the same transaction, claims into the freed slots.
    Use :meth:`run` (blocking), :meth:`start`/:meth:`stop` (in a
       thread), or :meth:`run_once` and :meth:`run_due` from tests.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        concurrency: int = 1,
        lease: timedelta | float = timedelta(seconds=30),
        heartbeat_interval: timedelta | float | None = None,
        owner: str | None = None,
        rng: random.Random | None = None,
        poll_interval: float = 0.01,
        commit_delay: float = 0.002,
        max_store_failures: int = 10,
        environment: str | Environment = Environment.THREAD,
        cancel_grace: float = 5.0,
    ) -> None:
        if scheduler.registry is None:
            raise ConfigurationError("a worker needs a scheduler with a task registry")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        self.scheduler = scheduler
        self.registry: TaskRegistry = scheduler.registry
        self.concurrency = concurrency
        self.lease = positive_duration(lease, "lease")
        self.heartbeat_interval = (
            self.lease / 3
            if heartbeat_interval is None
            else positive_duration(heartbeat_interval, "heartbeat_interval")
        )
        if self.heartbeat_interval >= self.lease:
            raise ConfigurationError("heartbeat_interval must be shorter than the lease")
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: How often an idle worker looks for commits by other processes (seconds),
        #: where inotify cannot tell it at once.
        self.poll_interval = poll_interval
        #: How long a finished task's outcome may wait for others still running here,
        #: to share their commit (seconds). Trades a little latency for throughput.
        self.commit_delay = commit_delay
        #: How many store errors in a row run() backs off from before it raises.
        self.max_store_failures = max_store_failures
        #: Where a task that does not say runs its attempts (docs/execution.md).
        self.environment = parse_environment(environment)
        #: Seconds a task in the process environment has to stop by itself once
        #: asked, before its process is terminated.
        if isinstance(cancel_grace, bool) or not isinstance(cancel_grace, int | float):
            raise ConfigurationError(f"cancel_grace must be seconds, got {cancel_grace!r}")
        if cancel_grace < 0:
            raise ConfigurationError(f"cancel_grace must not be negative, got {cancel_grace!r}")
        self.cancel_grace = float(cancel_grace)
        self._slots = Slots(lambda: self.scheduler.subscribe(self._on_event))
        self._attempts = AttemptRunner(
            scheduler,
            self.registry,
            self._slots,
            environment=self.environment,
            cancel_grace=self.cancel_grace,
            rng=rng or random.Random(),
        )
        self._lock = self._slots.lock
        self._changed = self._slots.changed
        self._active = self._slots.active
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._leases = Leases(
            scheduler,
            self._slots,
            owner=self.owner,
            lease=self.lease,
            heartbeat_interval=self.heartbeat_interval,
            retry_delay=self._attempts.retry_delay,
        )
        self._pool: TaskThreads[Running] | None = None
        self._thread: threading.Thread | None = None
        #: Outcomes waiting for the next group commit, with their tasks.
        self._pending: list[tuple[Running, Outcome]] = []
        self._flush_lock = threading.Lock()
        #: True while run() loops: then a group commit also claims into freed slots.
        self._looping = False
        self._watch = ChangeWatch(self._slots, self.concurrency, self._wakeup)

    # -- one pass ---------------------------------------------------------------------------

    def run_once(self) -> int:
        """Heartbeat if due, reclaim expired leases, claim into free slots. Returns claims made.

        Claimed tasks start on the worker's threads; this call does not wait for them.
        """
        self._drain()  # outcomes whose recording failed earlier
        now = self.scheduler.clock.now()
        self._leases.run_once(now, early=self._watch.early_heartbeat_due())
        if self._stopping.is_set():
            return 0
        free = self.concurrency - self.active_count
        if free <= 0:
            return 0
        claims = self.scheduler.store.claim(
            self.owner,
            free,
            now,
            self.lease,
            self.registry.names,
            process_names=self._attempts.process_names(),
        )
        self._launch(claims)
        return len(claims)

    def run_due(self) -> int:
        """Run every task due now, one at a time in the calling thread; returns how many ran.

        Meant for tests and scripts: with a manual clock, retries due later
        wait until the clock is advanced.
        """
        ran = 0
        while True:
            now = self.scheduler.clock.now()
            self.reclaim(now)
            claims = self.scheduler.store.claim(
                self.owner,
                1,
                now,
                self.lease,
                self.registry.names,
                process_names=self._attempts.process_names(),
            )
            if not claims:
                return ran
            running = self._register(claims[0])
            self._execute(running)
            ran += 1

    def heartbeat(self, now: datetime | None = None, *, force: bool = True) -> None:
        """Renew every lease this worker holds in one store call, and pass on cancel requests."""
        self._leases.heartbeat(now, force=force)

    def reclaim(self, now: datetime | None = None) -> int:
        """Finalise tasks whose leases expired, in any worker. Returns how many."""
        return self._leases.reclaim(now)

    @property
    def _reclaim_interval(self) -> timedelta:
        """How often run_once() looks for expired leases (tests slow it down)."""
        return self._leases.reclaim_interval

    @_reclaim_interval.setter
    def _reclaim_interval(self, interval: timedelta) -> None:
        self._leases.reclaim_interval = interval

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, *, burst: bool = False) -> None:
        """Loop until ``stop`` is set (or :meth:`stop` is called), then wait for running tasks.

        With ``burst``, return as soon as nothing is due and nothing is running,
        here or in another worker (whose lease, if it died, this one reclaims).
        """
        stop_event = stop or self._stopping
        unsubscribe = self.scheduler.subscribe(self._on_event)
        self._watch.open(self.scheduler.store, self.poll_interval, self._on_change)
        if self._pool is None:
            self._pool = TaskThreads(self.concurrency)
        self._looping = True
        failures = 0
        try:
            while not stop_event.is_set() and not self._stopping.is_set():
                self._wakeup.clear()
                if self._watch.error is not None:
                    raise self._watch.error
                try:
                    claimed = self.run_once()
                    failures = 0
                except SchemaError:
                    raise
                except StoreError as e:
                    # A full disk or an I/O error may pass: back off and try again,
                    # a bounded number of times, then give up loudly.
                    failures += 1
                    if failures > self.max_store_failures:
                        raise
                    delay = min(0.1 * 2 ** (failures - 1), 5.0)
                    log.error(
                        "store error (%s in a row), retrying in %.1fs: %s", failures, delay, e
                    )
                    clock = self.scheduler.clock
                    clock.wait(self._wakeup, clock.now() + timedelta(seconds=delay))
                    continue
                if (
                    burst
                    and claimed == 0
                    and self.active_count == 0
                    and not self._running_anywhere()
                ):
                    return
                self.scheduler.clock.wait(self._wakeup, self._next_wake_time())
        finally:
            self._looping = False
            unsubscribe()
            self._watch.close()

    def request_stop(self) -> None:
        """Stop claiming new tasks; :meth:`run` returns soon after. Safe from a signal handler."""
        self._stopping.set()
        self._wakeup.set()

    def shutdown(self, grace: float) -> int:
        """After :meth:`run`: let running tasks finish for up to ``grace`` seconds, heartbeating,
        then give back what is still running as PENDING. Returns how many were given back.

        A task still running after that keeps its thread, but its outcome will
        be refused: the claim is no longer valid.
        """
        self.request_stop()
        deadline = time.monotonic() + grace
        while self.active_count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.wait_idle(min(remaining, self.heartbeat_interval.total_seconds()))
            self.heartbeat(force=False)
            self._drain()
        self._drain()
        with self._lock:
            unfinished = [r.claim for r in self._active.values()]
        released = 0
        if unfinished:
            released = self.scheduler.store.release(unfinished, self.scheduler.clock.now())
            for running in list(self._active.values()):
                running.signals.mark_lease_lost()
        if self._pool is not None:
            self._pool.shutdown(wait=not unfinished)
            self._pool = None
        return released

    def _on_change(self, error: Exception | None) -> bool:
        """From the change watcher's thread: another process committed (or it failed).

        Given to the watcher as this method, looked up when :meth:`run` starts
        (tests wrap it); :meth:`ChangeWatch.on_change` says what it answers.
        """
        return self._watch.on_change(error)

    def start(self) -> threading.Thread:
        """Run the loop in a background thread."""
        if self._thread is not None:
            raise ConfigurationError("this worker was already started")
        self._thread = threading.Thread(
            target=self.run, name=f"durablesched-{self.owner}", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Stop claiming, let running tasks finish, and return True once all have ended."""
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if self._pool is not None:
            finished = self.wait_idle(timeout if timeout is not None else float("inf"))
            self._pool.shutdown(wait=finished)
            self._pool = None
            return finished
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Block until no task is running here (True) or ``timeout`` seconds pass (False)."""
        return self._slots.wait_idle(timeout)

    def wait_running(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` tasks run here (True) or ``timeout`` seconds pass."""
        return self._slots.wait_running(count, timeout)

    @property
    def active_count(self) -> int:
        return self._slots.count()

    # -- internals --------------------------------------------------------------------------

    def _on_event(self, event: str, task_id: int) -> None:
        if event == "cancel":
            running = self._slots.get(task_id)
            if running is not None:
                running.signals.request_cancel()
        self._wakeup.set()

    def _running_anywhere(self) -> bool:
        return bool(self.scheduler.store.list_tasks(state=TaskState.RUNNING, limit=1))

    def _next_wake_time(self) -> datetime | None:
        now = self.scheduler.clock.now()
        times: list[datetime] = []
        if self.active_count < self.concurrency:
            nxt = self.scheduler.store.next_wakeup(now, self.registry.names)
            if nxt is not None:
                times.append(nxt)
        if self.active_count and self._leases.next_heartbeat is not None:
            times.append(self._leases.next_heartbeat)
        if self._watch.changed_elsewhere and self.active_count:
            # A commit seen while an early heartbeat was not yet allowed: make it
            # when it is (see _on_change).
            times.append(self._watch.early_heartbeat_at(now))
        if self._leases.next_reclaim is not None:
            times.append(self._leases.next_reclaim)
        return min(times, default=None)

    def _register(self, claim: Claim) -> Running:
        return self._register_all([claim])[0]

    def _register_all(self, claims: list[Claim]) -> list[Running]:
        started = self._attempts.prepare(claims)
        self._slots.add(started)
        self._leases.start_heartbeats()
        return started

    def _launch(self, claims: list[Claim]) -> None:
        if not claims:
            return
        started = self._register_all(claims)
        if self._pool is None:
            # run_once() called outside run(): use a pool of our own, made once.
            self._pool = TaskThreads(self.concurrency)
        for running in started:
            self._pool.submit(self._execute, running)

    def _execute(self, running: Running) -> None:
        """On a task thread: run user code (no lock held), then hand the outcome over."""
        claim = running.claim
        log.info("start: task %s (%s) attempt %s", claim.task_id, claim.name, claim.attempt)
        try:
            outcome = self._attempts.run(running)
        except BaseException:
            # Not the task's own failure (that is an Outcome): let the lease lapse.
            log.exception("task %s could not be run", claim.task_id)
            self._forget([running])
            raise
        if outcome is None:  # already recorded: its process was terminated
            self._forget([running])
            return
        running.ended = True
        with self._changed:
            self._pending.append((running, outcome))
            if len(self._pending) >= len(self._active):
                self._changed.notify_all()  # a leader waiting for the last one can go
        self._drain()

    def _drain(self) -> None:
        """Group commit: whichever thread gets here first records everything pending.

        Others just leave their outcome in the list and go; the leader loops
        until the list is empty, so every outcome waiting while one transaction
        commits shares the next one.
        """
        while True:
            with self._lock:
                if not self._pending:
                    return
            if not self._flush_lock.acquire(blocking=False):
                return  # the leader will see what we left
            try:
                batch = self._gather()
                recorded = self._flush(batch) if batch else True
            finally:
                self._flush_lock.release()
            if not recorded:
                return

    def _gather(self) -> list[tuple[Running, Outcome]]:
        """Take the pending outcomes, first waiting up to ``commit_delay`` for the tasks
        still running here, so that short tasks share one commit (and one fsync)."""
        deadline = time.monotonic() + self.commit_delay
        with self._changed:
            while len(self._pending) < len(self._active):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            batch, self._pending = self._pending, []
        return batch

    def _flush(self, batch: list[tuple[Running, Outcome]]) -> bool:
        """Record ``batch`` and, while looping, claim into the slots it frees: one transaction."""
        limit = 0
        if self._looping and not self._stopping.is_set():
            with self._lock:
                limit = self.concurrency - (len(self._active) - len(batch))
        try:
            results, claims = self.scheduler.store.record_and_claim(
                [outcome for _, outcome in batch],
                self.scheduler.clock.now(),
                owner=self.owner,
                limit=limit,
                lease=self.lease,
                names=self.registry.names,
                process_names=self._attempts.process_names(),
            )
        except DurableSchedError as e:
            # Kept to retry on the next pass; the leases stay renewed meanwhile.
            log.error("could not record %s outcome(s), will retry: %s", len(batch), e)
            with self._lock:
                self._pending[:0] = batch
            return False
        finished: list[Running] = []
        again: list[tuple[Running, Outcome]] = []
        for (running, outcome), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                # Its effects raised (or it acknowledged an unrequested cancellation):
                # nothing of it was written; record the attempt as failed instead.
                again.append((running, self._attempts.failure(running.claim, result)))
                continue
            self._log_outcome(running, outcome, result)
            finished.append(running)
        if again:
            with self._lock:
                self._pending.extend(again)
        self._forget(finished, nudge=False)
        self._launch(claims)
        self._watch.nudge_if_free()  # only now: the slots may be full again
        return True

    def _forget(self, done: list[Running], *, nudge: bool = True) -> None:
        self._slots.remove(done)
        self._wakeup.set()
        if nudge:
            self._watch.nudge_if_free()

    def _log_outcome(self, running: Running, outcome: Outcome, state: TaskState | None) -> None:
        if state is TaskState.SUCCEEDED and not log.isEnabledFor(logging.INFO):
            return  # the common case, at --log-level warning: nothing to work out
        claim = running.claim
        elapsed = time.monotonic() - running.started
        what = (
            "failure"
            if outcome.error
            else "cancel acknowledgement"
            if outcome.cancelled
            else "success"
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
                f"; next at {outcome.retry_at.isoformat()}"
                if retry and outcome.retry_at
                else "; no retry",
            )
