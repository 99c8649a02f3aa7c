"""The worker's public face and its claim loop: a pass claims into free slots, then it waits.

The loop runs on the thread that calls :meth:`Worker.run` (its own,
``durablesched-<owner>``, after :meth:`Worker.start`) and sleeps on the
scheduler's clock until a task is due, a heartbeat or reclaim is, a slot frees
or another process commits. A worker claims into its free slots and, with
``ahead``, a few tasks ahead of them: no more than it starts within
``ahead_window`` at its recent rate (``ahead``'s module says how).
User code always runs with no lock of ours held; outcomes are written through
the store, fenced by the claim that started the attempt. :class:`Worker`
composes the parts that do the work (see the package's docstring).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from durablesched.errors import ConfigurationError, DurableSchedError, StoreError
from durablesched.records import Claim, Environment, ErrorInfo, Outcome
from durablesched.registry import TaskRegistry
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState
from durablesched.tracing import (
    CANCELLED,
    LEASE_LOST,
    RELEASED,
    end_attempt,
    start_attempt,
    tracing_hook,
)
from durablesched.worker.ahead import Ahead, begin
from durablesched.worker.attempt import AttemptRunner
from durablesched.worker.commit import GroupCommit
from durablesched.worker.committer import Committer
from durablesched.worker.leases import Leases
from durablesched.worker.options import WorkerOptions, finite_seconds
from durablesched.worker.presence import Presence
from durablesched.worker.schedules import ScheduleStep
from durablesched.worker.slots import Running, Slots, free_slots
from durablesched.worker.threads import TaskThreads
from durablesched.worker.trouble import StoreTrouble
from durablesched.worker.watch import ChangeWatch

# The logger name the worker's lines have always carried, whichever module
# logs them: people filter logs by it.
log = logging.getLogger("durablesched.worker")


class Worker:
    """Runs the tasks of ``scheduler.registry`` with up to ``concurrency`` threads.

    ``lease`` is how long a claim lasts without a heartbeat; heartbeats renew
    every held lease at ``heartbeat_interval`` (a third of the lease by
    default). A store error is backed off from (exponentially, capped at 5 s,
    jittered) for up to ``give_up_after`` seconds of the scheduler's clock, then
    :meth:`run` gives up with a StoreError; a damaged database
    (:class:`CorruptDatabase`) or an unusable schema stops it at once.
    Outcomes are group-committed: every outcome pending in one transaction
    (waiting up to ``commit_delay`` for the tasks still running here) that
    also claims into the freed slots. With ``ahead`` > 0 (8 by default) a
    committer thread records them (an attempt that is all the worker holds records
    its own), and the worker holds up to ``ahead`` claims
    beyond its slots, waiting for a slot: no more than it starts within
    ``ahead_window`` seconds at its recent rate (none for long tasks), never
    from a queue with a stored limit. ``ahead=0`` claims only into free slots
    (docs/design.md; the trade-off: docs/performance.md).
    Use :meth:`run` (blocking), :meth:`start`/:meth:`stop` (in a thread), or
    :meth:`run_once` and :meth:`run_due` from tests. The options are read-only
    attributes once the worker is built (see :class:`WorkerOptions`).

    ``after_commit(outcome, state, at)``, if given, is called once an attempt's
    outcome (its claim, and its result or error) is committed, on the thread that
    committed it, with the state the task was left in (None: the outcome was
    discarded, its lease lost) and the time the commit recorded (a finished
    task's ``finished_at``); what it raises is logged, never the worker's concern.
    Integrations (Django's ``task_finished``) hang their "it is done" here:
    nothing is said before the commit.

    ``unknown_tasks`` says what happens to a task whose name the registry lacks.
    ``"skip"`` (the default): it is never claimed here, and waits for a worker
    that registers it, since several programs (or two versions of one, during a
    deploy) may share a database, each running its own names. ``"fail"``: it is
    claimed like any other and fails at once, not retried, with a
    ``durablesched.UnknownTaskNameError`` naming it: for a worker that runs
    every task of its database (a Django project's).
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
        give_up_after: float = 60.0,
        max_store_failures: int | None = None,
        environment: str | Environment = Environment.THREAD,
        cancel_grace: float = 5.0,
        queues: Mapping[str, int] | None = None,
        after_commit: Callable[[Outcome, TaskState | None, datetime], object] | None = None,
        unknown_tasks: str = "skip",
        ahead: int = 8,
        ahead_window: float = 0.05,
    ) -> None:
        if scheduler.registry is None:
            raise ConfigurationError("a worker needs a scheduler with a task registry")
        if max_store_failures is not None:
            warnings.warn(
                "Worker(max_store_failures=...) is deprecated: use give_up_after (seconds)",
                DeprecationWarning,
                stacklevel=2,
            )
        self._options = options = WorkerOptions.checked(
            concurrency=concurrency,
            lease=lease,
            heartbeat_interval=heartbeat_interval,
            owner=owner,
            poll_interval=poll_interval,
            commit_delay=commit_delay,
            give_up_after=give_up_after,
            max_store_failures=max_store_failures,
            environment=environment,
            cancel_grace=cancel_grace,
            queues=queues,
            unknown_tasks=unknown_tasks,
            ahead=ahead,
            ahead_window=ahead_window,
        )
        self.scheduler = scheduler
        self.registry: TaskRegistry = scheduler.registry
        #: Set to wake the claim loop: a slot freed and stayed free, a task was submitted here...
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        slots = self._slots = Slots(lambda: self.scheduler.subscribe(self._on_event))
        rng = rng or random.Random()
        attempts = self._attempts = AttemptRunner(scheduler, self.registry, slots, options, rng)
        self._trouble = StoreTrouble(options.give_up_after, rng, options.max_store_failures)
        self._watch = ChangeWatch(slots, options.concurrency, self._wakeup)
        self._presence = Presence(scheduler, options)
        self._leases = Leases(scheduler, slots, options, attempts.retry_delay, self._presence)
        self._ahead = Ahead(slots, options)
        self._commit = GroupCommit(
            scheduler,
            self.registry,
            slots,
            options,
            attempts=attempts,
            watch=self._watch,
            launch=self._launch,
            stopping=self._stopping,
            wakeup=self._wakeup,
            trouble=self._trouble,
            after_commit=after_commit,
            ahead=self._ahead if options.ahead else None,
        )
        self._committer = Committer(self._commit, f"durablesched-commit-{options.owner}")
        self._pool: TaskThreads[Running] | None = None
        self._thread: threading.Thread | None = None
        self._schedules = ScheduleStep(scheduler, self.registry)
        #: When the loop, asleep, looks next (None: not before it is woken).
        self._looks_at: datetime | None = None

    # -- one pass ---------------------------------------------------------------------------

    def run_once(self, now: datetime | None = None) -> int:
        """Heartbeat if due, reclaim expired leases, claim into free slots. Returns claims made.

        ``now`` is the time of the pass (by default, the scheduler's clock's):
        a test can drive passes at times of its choosing, with no loop running.
        Claimed tasks start on the worker's threads; this call does not wait for them.
        """
        if not self._commit.detached:  # else the committer records them, and retries
            self._commit.drain()  # outcomes whose recording failed earlier
        if now is None:
            now = self.scheduler.clock.now()
        self._leases.run_once(now, early=self._watch.early_heartbeat_due())
        if self._ahead.count:
            self._settle_waiting(now)
        if self._stopping.is_set():
            return 0
        self._schedules.run_once(now)
        if self._options.ahead:
            room = self._ahead.reserve()
            try:
                if room.total <= 0:
                    return 0
                queues = room.queues
                if queues is not None and self._options.queues is not None:
                    queues = {q: queues.get(q, 0) for q in self._options.queues}
                claims = self._claim(room.limit, now, queues, ahead=room.ahead)
                self._launch(claims)
            finally:
                self._ahead.settle(room)
            return len(claims)
        with self._slots.lock:
            running = list(self._slots.active.values())
        free, queues = free_slots(running, self._options.concurrency, self._options.queues)
        if free <= 0:
            return 0
        claims = self._claim(free, now, queues)
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
            self._schedules.run_once(now)
            claims = self._claim(1, now)
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

    # -- the loop ---------------------------------------------------------------------------

    def run(
        self, stop: threading.Event | None = None, *, burst: bool = False, burst_wait: float = 5.0
    ) -> None:
        """Loop until ``stop`` is set (or :meth:`stop` is called), then wait for running tasks.

        The worker registers in the store's workers table as the loop starts
        (:meth:`Scheduler.workers` lists it), is marked seen by every heartbeat,
        idle or not, and removes its row once it stops with nothing running
        (else at the end of :meth:`shutdown` or :meth:`stop`).

        With ``burst``, return once nothing runs here and no task could be claimed
        now or within ``burst_wait`` seconds: a retry due that soon, or the lease
        of another worker expiring that soon (its task is then reclaimed and run
        here), is waited for; a task due later, or running under a lease that
        lasts longer, is left. Store errors are backed off from, then given up
        on (see the class): the error that ends the loop is raised.
        """
        wait_at_most = timedelta(seconds=finite_seconds(burst_wait, "burst_wait"))
        stop_event = stop or self._stopping
        unsubscribe = self.scheduler.subscribe(self._on_event)
        self._watch.open(self.scheduler.store, self._options.poll_interval, self._on_change)
        if self._pool is None:
            self._pool = TaskThreads(self._options.concurrency)
        self._commit.looping = True
        if self._options.ahead:
            self._committer.start()
        clock = self.scheduler.clock
        try:
            while not stop_event.is_set() and not self._stopping.is_set():
                self._wakeup.clear()
                if self._watch.error is not None:
                    raise self._watch.error
                try:
                    if not self._presence.registered:
                        self._presence.register(clock.now())
                    # What comes next is looked for after the pass's own time, not
                    # after the time it ended: a task the pass reclaimed, due a short
                    # retry delay after that time, may be due before the pass ends.
                    now = clock.now()
                    claimed = self.run_once(now)
                    if self._commit.error is not None:
                        raise self._commit.error  # outcomes it could not record
                    next_claim = self._next_claim_time(now)
                    done = (
                        burst
                        and claimed == 0
                        and self.active_count == 0
                        and self._burst_done(now, next_claim, wait_at_most)
                    )
                    if self._commit.settled():
                        self._trouble.recovered(now)
                except StoreError as e:
                    self._back_off(e, stop_event)
                    continue
                if done:
                    return
                self._looks_at = self._next_wake_time(now, next_claim)
                clock.wait(self._wakeup, self._looks_at)
        finally:
            self._commit.looping = False
            self._committer.stop()
            unsubscribe()
            self._watch.close()
            if self._stopping.is_set():
                self._release_waiting()
                self._tell_shutdown()
            if not self.active_count:
                # Nothing left to finish: gone from the workers table now (with tasks
                # still running, shutdown() or stop() removes the row once they end).
                self._presence.deregister()

    def request_stop(self) -> None:
        """Stop claiming new tasks; :meth:`run` returns soon after. Safe from a signal handler.

        Running tasks see ``ctx.shutdown_requested`` (and ``ctx.wait()`` returns)
        once :meth:`run` has returned or :meth:`shutdown` begins: a signal
        handler may not take the locks that telling them needs.
        """
        self._stopping.set()
        self._wakeup.set()

    def shutdown(
        self, grace: float, *, on_wait: Callable[[int, float], object] | None = None
    ) -> int:
        """After :meth:`run`: let running tasks finish for up to ``grace`` seconds, heartbeating,
        then give back what is still running as PENDING. Returns how many were given back
        (those that stopped for it in ``ctx.sleep()`` and gave themselves back included).

        A task still running after that keeps its thread, but its outcome will
        be refused: the claim is no longer valid. ``on_wait(running, seconds_left)``,
        if given, is called before each wait, about once a second, while tasks run
        (the CLI counts down with it).
        """
        self.request_stop()
        given_back = self._release_waiting()
        self._tell_shutdown()
        deadline = time.monotonic() + grace
        step = min(1.0, self._options.heartbeat_interval.total_seconds())
        while self.active_count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if on_wait is not None:
                on_wait(self.active_count, remaining)
            self.wait_idle(min(remaining, step))
            self.heartbeat(force=False)
            self._commit.drain()
        self._commit.drain()
        with self._slots.lock:
            unfinished = [r.claim for r in self._slots.active.values()]
        released = 0
        if unfinished:
            released = self.scheduler.store.release(unfinished, self.scheduler.clock.now())
            for running in list(self._slots.active.values()):
                running.signals.mark_lease_lost()
                if running.trace is not None:
                    end_attempt(running.trace, RELEASED)
        if self._pool is not None:
            self._pool.shutdown(wait=not unfinished)
            self._pool = None
        self._presence.deregister()
        return released + given_back + self._attempts.given_back

    def start(self) -> threading.Thread:
        """Run the loop in a background thread, registered in the workers table before
        this returns."""
        if self._thread is not None:
            raise ConfigurationError("this worker was already started")
        # Registered before start() returns, so that the caller sees it listed at once
        # (a store error propagates: the worker did not start).
        self._presence.register(self.scheduler.clock.now())
        self._thread = threading.Thread(
            target=self.run, name=f"durablesched-{self.owner}", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Stop claiming, let running tasks finish, and return True once all have ended
        (False if ``timeout`` seconds passed first; None: however long they take)."""
        self.request_stop()
        self._release_waiting()
        self._tell_shutdown()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        finished = True
        if self._pool is not None:
            finished = self.wait_idle(timeout if timeout is not None else float("inf"))
            self._pool.shutdown(wait=finished)
            self._pool = None
        self._presence.deregister()
        return finished

    def wait_idle(self, timeout: float) -> bool:
        """Block until no task is running here (True) or ``timeout`` seconds pass (False)."""
        return self._slots.wait_idle(timeout)

    def wait_running(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` tasks run here (True) or ``timeout`` seconds pass."""
        return self._slots.wait_running(count, timeout)

    @property
    def active_count(self) -> int:
        """How many tasks this worker holds: running, or claimed ahead and waiting."""
        with self._slots.lock:
            return len(self._slots.active)

    @property
    def waiting_count(self) -> int:
        """How many of them are claimed ahead, waiting here for a slot."""
        return self._ahead.count

    # -- internals --------------------------------------------------------------------------

    def _claim(
        self, limit: int, now: datetime, queues: Mapping[str, int] | None = None, ahead: int = 0
    ) -> list[Claim]:
        if queues is None and self._options.queues is not None:
            queues = {q: min(n, limit) for q, n in self._options.queues.items()}
        return self.scheduler.store.claim(
            self._options.owner,
            limit,
            now,
            self._options.lease,
            self._attempts.claim_names(),
            process_names=self._attempts.process_names(),
            queues=queues,
            ahead=ahead,
        )

    def _register(self, claim: Claim) -> Running:
        return self._register_all([claim])[0]

    def _register_all(self, claims: list[Claim]) -> list[Running]:
        started = self._attempts.prepare(claims)
        self._slots.add(started)
        if self._leases.start_heartbeats():
            self._wakeup.set()  # a group commit's claims: the loop must wait for less
        return started

    def _launch(self, claims: list[Claim]) -> None:
        if not claims:
            return
        held = self._register_all(claims)
        if self._pool is None:
            # run_once() called outside run(): use a pool of our own, made once.
            self._pool = TaskThreads(self._options.concurrency)
        # Split before holding: once held, a task thread may take a claim ahead (and mark
        # it started) at any moment; reading ``waiting`` after would start it twice.
        starting = [running for running in held if not running.waiting]
        waiting = [running for running in held if running.waiting]
        if waiting:
            self._ahead.hold(waiting)
            looks_at = self._looks_at
            window = timedelta(seconds=self._ahead.stale_after)
            if looks_at is None or looks_at > self.scheduler.clock.now() + window:
                # The loop gives back what waits past the window: it must look by then.
                self._wakeup.set()
        for running in starting:
            self._pool.submit(self._execute, running)
        if waiting:
            # Claimed ahead of slots that were busy when the room was reserved: those
            # slots may have freed meanwhile (their threads found nothing waiting and went
            # idle), and no thread would take these until the loop's next pass.
            self._start_waiting()

    def _execute(self, running: Running | None) -> None:
        """On a task thread: run attempts, the one handed over and then the claims ahead
        waiting here (in claim order), until none may start."""
        while running is not None:
            self._execute_one(running)
            running = self._next_waiting()

    def _next_waiting(self) -> Running | None:
        """A claim ahead to start on this thread, now that its attempt ended, or None."""
        if not self._ahead.count or self._stopping.is_set():
            return None
        running = self._ahead.take(self.scheduler.clock.now())
        if running is not None:
            self._commit.started(running.claim)  # and waiters for starts are told
        return running

    def _settle_waiting(self, now: datetime) -> None:
        """The loop's pass over the claims ahead: a cancelled one is acknowledged (it never
        starts), a lost one forgotten, one that waited too long given back for any worker;
        the rest start if slots are free."""
        for stopped in self._ahead.take_stopped():
            if stopped.signals.lease_lost:
                self._commit.forget([stopped])
            else:
                log.info(
                    "cancel: task %s (%s) claimed ahead, acknowledged without starting",
                    stopped.claim.task_id,
                    stopped.claim.name,
                )
                self._commit.hand_over(stopped, Outcome(stopped.claim, cancelled=True))
        stale = self._ahead.take_stale(self._ahead.stale_after)
        if stale:
            self._give_back(stale, now, why="unstarted: claimed ahead, it waited past the window")
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Hand the claims ahead that free slots may start now to the task threads."""
        while self._pool is not None:
            starting = self._next_waiting()
            if starting is None:
                break
            self._pool.submit(self._execute, starting)

    def _release_waiting(self) -> int:
        """The worker stops: every claim ahead goes back at once, no attempt counted."""
        waiting = self._ahead.take_all()
        if not waiting:
            return 0
        return self._give_back(waiting, self.scheduler.clock.now())

    def _give_back(self, waiting: list[Running], now: datetime, *, why: str = "at shutdown") -> int:
        try:
            released = self.scheduler.store.release([r.claim for r in waiting], now, why=why)
        except DurableSchedError as e:
            # Their leases lapse and a reclaim takes them back (counted, as after a crash).
            log.error("could not give back %d task(s) claimed ahead: %s", len(waiting), e)
            released = 0
        for running in waiting:
            running.signals.mark_lease_lost()
        self._commit.forget(waiting)
        return released

    def _execute_one(self, running: Running) -> None:
        """On a task thread: run user code (no lock held), then hand the outcome over."""
        running.started = time.monotonic()
        begin(running)  # its timeout counts from here
        claim = running.claim
        log.info("start: task %s (%s) attempt %s", claim.task_id, claim.name, claim.attempt)
        tracer = tracing_hook.tracer
        trace = running.trace = None if tracer is None else start_attempt(tracer, claim, self.owner)
        try:
            if trace is None:
                outcome = self._attempts.run(running)
            else:
                with trace.running():
                    outcome = self._attempts.run(running)
        except BaseException as exc:
            # Not the task's own failure (that is an Outcome): let the lease lapse.
            log.exception("task %s could not be run", claim.task_id)
            if trace is not None:
                end_attempt(trace, LEASE_LOST, ErrorInfo.from_exception(exc))
            self._commit.forget([running])
            raise
        if outcome is None:  # already recorded: its process was terminated, or given back
            if trace is not None:
                lost = running.context.lease_lost
                ended = RELEASED if running.given_back else LEASE_LOST if lost else CANCELLED
                end_attempt(trace, ended)
            self._commit.forget([running])
            return
        self._commit.hand_over(running, outcome)

    def _back_off(self, error: StoreError, stop: threading.Event) -> None:
        """A full disk or an I/O error may pass: wait, and let :meth:`run` try again,
        or raise to give up (see :class:`StoreTrouble`). Only a stop cuts the wait
        short: commits elsewhere or tasks ending here do not make the retries faster."""
        clock = self.scheduler.clock
        now = clock.now()
        until = now + self._trouble.failed(error, now)
        while not stop.is_set() and not self._stopping.is_set() and clock.now() < until:
            clock.wait(self._wakeup, until)
            self._wakeup.clear()

    def _on_change(self, error: Exception | None) -> bool:
        """From the change watcher's thread: another process committed (or it failed).

        Handed to the watcher as this attribute when :meth:`run` starts (tests
        wrap it); :meth:`ChangeWatch.on_change` says what it answers.
        """
        return self._watch.on_change(error)

    def _on_event(self, event: str, task_id: int) -> None:
        """From the scheduler, in this process: pass a cancel on at once; wake the loop."""
        if event == "cancel":
            running = self._slots.get(task_id)
            if running is not None:
                running.signals.request_cancel()
        elif event == "schedule":
            self._schedules.changed()
        self._wakeup.set()

    def _tell_shutdown(self) -> None:
        """Tell every attempt running here that the worker is stopping (no lock held
        while telling: a task woken by it may at once take the worker's locks)."""
        with self._slots.lock:
            running = list(self._slots.active.values())
        for attempt in running:
            attempt.signals.request_shutdown()

    def _burst_done(self, now: datetime, next_claim: datetime | None, wait: timedelta) -> bool:
        """Idle here, in burst mode: is nothing claimable now or within ``wait``?"""
        if next_claim is not None and next_claim <= now + wait:
            return False
        # A lease that expired since the last reclaim (they are spaced out) does
        # not show in next_wakeup: its task is reclaimed, and then runnable.
        return self.reclaim(now) == 0

    def _next_claim_time(self, now: datetime) -> datetime | None:
        """When a claim or a reclaim could next succeed, if a slot is free to use it."""
        if self.active_count < self._options.concurrency:
            return self.scheduler.store.next_wakeup(
                now, self._attempts.claim_names(), self._options.queues
            )
        return None

    def _next_wake_time(self, now: datetime, next_claim: datetime | None) -> datetime | None:
        times: list[datetime] = [] if next_claim is None else [next_claim]
        if (self.active_count or self._presence.registered) and (
            self._leases.next_heartbeat is not None
        ):
            times.append(self._leases.next_heartbeat)
        if self._watch.changed_elsewhere and self.active_count:
            # A commit seen while an early heartbeat was not yet allowed: make it
            # when it is (see ChangeWatch.on_change).
            times.append(self._watch.early_heartbeat_at(now))
        if self._leases.next_reclaim is not None:
            times.append(self._leases.next_reclaim)
        stale = self._ahead.next_stale()
        if stale is not None:
            # A claim ahead that waits too long is given back (Ahead.take_stale) as soon
            # as it has: a long task waits at most about the window for another worker.
            times.append(now + timedelta(seconds=stale))
        if self._schedules.next_fire is not None:
            times.append(self._schedules.next_fire)
        return min(times, default=None)

    # -- the options, read-only -------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self._options.concurrency

    @property
    def lease(self) -> timedelta:
        return self._options.lease

    @property
    def heartbeat_interval(self) -> timedelta:
        return self._options.heartbeat_interval

    @property
    def owner(self) -> str:
        return self._options.owner

    @property
    def poll_interval(self) -> float:
        return self._options.poll_interval

    @property
    def commit_delay(self) -> float:
        return self._options.commit_delay

    @property
    def give_up_after(self) -> float:
        return self._options.give_up_after

    @property
    def max_store_failures(self) -> int | None:
        """Deprecated: see ``give_up_after``."""
        return self._options.max_store_failures

    @property
    def queues(self) -> Mapping[str, int] | None:
        """The queues served with their slots, or None: every queue."""
        return self._options.queues

    @property
    def ahead(self) -> int:
        """At most how many claims beyond its slots this worker holds (0: none)."""
        return self._options.ahead

    @property
    def ahead_window(self) -> float:
        return self._options.ahead_window

    @property
    def environment(self) -> Environment:
        return self._options.environment

    @property
    def cancel_grace(self) -> float:
        return self._options.cancel_grace

    @property
    def _reclaim_interval(self) -> timedelta:
        """How often run_once() looks for expired leases (tests slow it down)."""
        return self._leases.reclaim_interval

    @_reclaim_interval.setter
    def _reclaim_interval(self, interval: timedelta) -> None:
        self._leases.reclaim_interval = interval
