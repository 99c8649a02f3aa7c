"""Claims ahead (``Worker(ahead=)``): held beyond the slots, started in claim order as
slots free; what must stay true of them (issue 29), each test failing without its guard."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from durablesched import (
    ConfigurationError,
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.worker.ahead import start
from durablesched.worker.slots import Running

from ..conftest import T0, WAIT

LEASE = timedelta(seconds=30)


class Tasks:
    """A task that holds its slot until released, and a quick one that notes its start."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.blocking = threading.Event()
        self.ran: list[str] = []
        self.quick_ran = threading.Event()
        #: Called by the blocking task just before it returns (on its thread).
        self.before_return: list[object] = []
        self.deadlines: list[float | None] = []
        self.registry = registry = TaskRegistry()

        @registry.task("block")
        def block() -> None:
            self.blocking.set()
            assert self.release.wait(WAIT)
            for hook in self.before_return:
                hook()  # type: ignore[operator]

        @registry.task("quick")
        def quick(tag: str) -> None:
            self.ran.append(tag)
            self.quick_ran.set()

        @registry.task("timed", timeout=timedelta(seconds=60), pass_context=True)
        def timed(ctx: TaskContext) -> None:
            self.deadlines.append(ctx.deadline)


@pytest.fixture
def tasks() -> Tasks:
    return Tasks()


@pytest.fixture
def scheduler(tasks: Tasks) -> Scheduler:
    return Scheduler(MemoryStore(), registry=tasks.registry, clock=ManualClock(T0))


def ahead_worker(scheduler: Scheduler) -> Worker:
    """A worker of one slot that claims up to 2 ahead: the window is long and the recent
    length of an attempt short, as after a run of quick tasks."""
    worker = Worker(
        scheduler,
        concurrency=1,
        lease=LEASE,
        owner="w",
        ahead=2,
        ahead_window=1000.0,
    )
    worker._ahead.ended(0.001)
    return worker


@pytest.fixture
def worker(scheduler: Scheduler) -> Iterator[Worker]:
    w = ahead_worker(scheduler)
    yield w
    w.stop(WAIT)


def test_claims_ahead_wait_and_start_in_claim_order(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    block = scheduler.submit("block")
    first = scheduler.submit("quick", {"tag": "first"})
    second = scheduler.submit("quick", {"tag": "second"})
    scheduler.submit("quick", {"tag": "third"})  # beyond the slot and 2 ahead
    assert worker.run_once() == 3
    assert tasks.blocking.wait(WAIT)
    assert (worker.active_count, worker.waiting_count) == (3, 2)
    assert scheduler.get(first).state is TaskState.RUNNING
    tasks.release.set()
    assert worker.wait_idle(WAIT)
    assert tasks.ran == ["first", "second"]
    for task_id in (block, first, second):
        assert scheduler.get(task_id).state is TaskState.SUCCEEDED


def test_a_cancelled_claim_ahead_never_starts_and_is_acknowledged(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """The cancel arrives while it waits; the slot frees on the blocking task's thread,
    which takes the next claim at once, with no pass of the loop in between. Fails with
    the cancelled check dropped from Ahead.take (it would start), or without the
    loop's sweep (it would never be acknowledged)."""
    scheduler.submit("block")
    doomed = scheduler.submit("quick", {"tag": "doomed"})
    scheduler.submit("quick", {"tag": "after"})
    assert worker.run_once() == 3
    assert tasks.blocking.wait(WAIT)
    tasks.before_return.append(lambda: scheduler.cancel(doomed))
    tasks.release.set()
    assert tasks.quick_ran.wait(WAIT)  # the next claim after it started instead
    worker.run_once()  # the loop's pass acknowledges it
    assert worker.wait_idle(WAIT)
    assert tasks.ran == ["after"]
    task = scheduler.get(doomed)
    assert task is not None and task.state is TaskState.CANCELLED
    assert task.attempts == 1


def test_shutdown_gives_claims_ahead_back_at_once_uncounted(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """Another worker can take them at once, no lease to wait for, no attempt counted.
    Fails with the release dropped from shutdown()."""
    scheduler.submit("block")
    waiting = scheduler.submit("quick", {"tag": "waiting"})
    assert worker.run_once() == 2
    assert tasks.blocking.wait(WAIT)
    seen = threading.Event()
    checked: list[tuple[TaskState, int, list[int]]] = []

    def on_wait(running: int, seconds_left: float) -> None:
        if not seen.is_set():
            task = scheduler.get(waiting)
            assert task is not None
            other = scheduler.store.claim("other", 5, scheduler.clock.now(), LEASE)
            checked.append((task.state, task.attempts, [c.task_id for c in other]))
            seen.set()
            tasks.release.set()

    assert worker.shutdown(WAIT, on_wait=on_wait) == 1
    assert checked == [(TaskState.PENDING, 0, [waiting])]  # and "other" claims it at once
    assert tasks.ran == []


def test_a_timeout_counts_from_the_start_not_the_claim(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """Fails with the deadline set when the claim is made (AttemptRunner.prepare)."""
    scheduler.submit("block")
    scheduler.submit("timed")
    assert worker.run_once() == 2
    assert tasks.blocking.wait(WAIT)
    freed_at = time.monotonic()
    tasks.release.set()
    assert worker.wait_idle(WAIT)
    (deadline,) = tasks.deadlines
    assert deadline is not None and deadline >= freed_at + 60


def test_two_claims_at_once_never_share_the_room(scheduler: Scheduler) -> None:
    """The claim loop and the committer reserve the room they claim into: a second claim
    while the first is in flight gets none. Fails without the reservation."""
    worker = Worker(scheduler, concurrency=2, lease=LEASE, owner="w", ahead=3, ahead_window=1000)
    worker._ahead.ended(0.001)
    first = worker._ahead.reserve()
    assert (first.limit, first.ahead) == (2, 3)
    second = worker._ahead.reserve()
    assert (second.limit, second.ahead) == (0, 0)
    worker._ahead.settle(first)
    again = worker._ahead.reserve()
    assert (again.limit, again.ahead) == (2, 3)


def test_the_default_claims_ahead_only_what_starts_within_the_window(
    scheduler: Scheduler,
) -> None:
    """8 slots, a 50 ms window: none before an attempt ended; with 1 ms attempts, the
    cap (8); with 20 ms ones, 20; with 2 s ones, none; none either while an attempt
    here has run 2 s, whatever the recent length. Fails with the age of the oldest
    attempt running left out."""
    assert Worker(scheduler).ahead == 8  # the default
    worker = Worker(scheduler, concurrency=8, lease=LEASE, owner="w")
    assert (worker.ahead, worker.ahead_window) == (8, 0.05)
    ahead = worker._ahead
    assert ahead.target(0.0) == 0
    ahead.ended(0.001)
    assert ahead.target(0.0) == 8
    assert ahead.target(2.0) == 0
    ahead._recent = 0.1
    assert ahead.target(0.0) == 4
    ahead._recent = 2.0
    assert ahead.target(0.0) == 0
    assert Worker(scheduler, ahead=0)._ahead.target(0.0) == 0


def test_a_claim_ahead_that_waits_too_long_is_given_back(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """For any worker with a free slot to take: a long task holds the slot here."""
    scheduler.submit("block")
    waiting = scheduler.submit("quick", {"tag": "waiting"})
    assert worker.run_once() == 2
    assert tasks.blocking.wait(WAIT)
    worker._ahead._window = 0.0  # everything waiting is now stale
    worker._ahead._most = 0
    worker.run_once()
    task = scheduler.get(waiting)
    assert task is not None and (task.state, task.attempts) == (TaskState.PENDING, 0)
    assert worker.waiting_count == 0
    assert scheduler.history(waiting)[-1].detail == (
        "given back by w unstarted: claimed ahead, it waited past the window"
    )
    tasks.release.set()


def test_after_a_claim_ahead_is_given_back_none_is_claimed_ahead_until_an_attempt_ends(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """The slot it waited for is held by a long attempt: claiming it ahead again at once
    would take it from a worker with a free slot, window after window (the mixed
    benchmark saw one task given back and claimed again by the same worker three
    times, 185 ms). Fails without the hold-off."""
    scheduler.submit("block")
    waiting = scheduler.submit("quick", {"tag": "waiting"})
    assert worker.run_once() == 2
    assert tasks.blocking.wait(WAIT)
    window = worker._ahead._window
    worker._ahead._window = 0.0  # everything waiting is now stale
    worker.run_once()
    worker._ahead._window = window  # the blocking attempt is young again: 2 ahead allowed
    assert worker.run_once() == 0
    task = scheduler.get(waiting)
    assert task is not None and task.state is TaskState.PENDING
    worker._ahead.ended(0.001)  # an attempt ended here: claiming ahead again
    assert worker._ahead.target(0.0) == 2
    tasks.release.set()


@pytest.mark.parametrize("bad", [-1, 10_001, 1.5, True, "8"])
def test_ahead_must_be_a_count(scheduler: Scheduler, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="ahead must be an integer"):
        Worker(scheduler, ahead=bad)  # type: ignore[arg-type]


def test_ahead_window_must_be_seconds(scheduler: Scheduler) -> None:
    with pytest.raises(ConfigurationError, match="ahead_window"):
        Worker(scheduler, ahead_window=-1)


def test_a_claim_ahead_shows_waiting_then_its_real_start(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """RUNNING with no start while it waits; once started, its record and its attempt
    (the history) carry the start, recorded with the blocking task's outcome, and the
    worker's row counts it as running, not claimed ahead. Fails without the start
    handed to the group commit (GroupCommit.started)."""
    scheduler.submit("block")
    later = scheduler.submit("quick", {"tag": "later"})
    assert worker.run_once() == 2
    assert tasks.blocking.wait(WAIT)
    task = scheduler.get(later)
    assert task is not None and (task.state, task.started_at) == (TaskState.RUNNING, None)
    clock = scheduler.clock
    assert isinstance(clock, ManualClock)
    clock.advance(timedelta(seconds=5))
    tasks.release.set()
    assert worker.wait_idle(WAIT)
    task = scheduler.get(later)
    assert task is not None and task.state is TaskState.SUCCEEDED
    assert task.started_at == T0 + timedelta(seconds=5)
    (attempt,) = scheduler.attempts(later)
    assert attempt.started_at == T0 + timedelta(seconds=5)


def test_a_claim_ahead_taken_the_moment_it_is_held_is_not_started_again(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """A task thread whose attempt ends may take a claim ahead as soon as it is held,
    before the launch that held it has handed the claims that start at once to the
    threads: the launch must not read the taken one as a claim to start (it ran twice
    in a three-process test). Fails with the split made after holding."""
    scheduler.submit("block")
    raced = scheduler.submit("quick", {"tag": "raced"})
    hold = worker._ahead.hold

    def held_then_taken(waiting: list[Running]) -> None:
        hold(waiting)
        with worker._slots.lock:  # as Ahead.take does, on a thread whose slot just freed
            taken = worker._ahead._waiting.popleft()
        start(taken, scheduler.clock.now())

    worker._ahead.hold = held_then_taken  # type: ignore[method-assign]
    assert worker.run_once() == 2
    assert worker._pool is not None
    assert worker._pool._outstanding == 1  # the blocking task alone went to the threads
    assert tasks.blocking.wait(WAIT)
    task = scheduler.get(raced)
    assert task is not None and task.state is TaskState.RUNNING
    tasks.release.set()
    worker._commit.forget([r for r in worker._slots.held().values() if r.claim.task_id == raced])
    assert worker.wait_idle(WAIT)
    assert tasks.ran == []


def test_claims_ahead_held_while_a_slot_is_free_start_at_once(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """A group commit reserves its room while the slots are busy and claims only ahead;
    by the time its claims are held the slot may have freed, its thread gone idle. The
    launch starts them: no thread would take them before the loop's next pass (the
    CPU-bound benchmark spent half its time with none running, and gave them back as
    stale). Fails with the launch only holding them."""
    scheduler.submit("quick", {"tag": "first"})
    scheduler.submit("quick", {"tag": "second"})
    claims = scheduler.store.claim("w", 0, scheduler.clock.now(), LEASE, ahead=2)
    assert [c.started_at for c in claims] == [None, None]  # claimed ahead, waiting
    worker._launch(claims)  # no loop pass follows
    assert worker.wait_idle(WAIT)
    assert tasks.ran == ["first", "second"]


class SpyLock:
    """A lock that counts the tries that found it taken, and says when one waits for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failed_tries = 0
        self.waited_for = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking:
            self.waited_for.set()
        got = self._lock.acquire(blocking, timeout)
        if not got:
            self.failed_tries += 1
        return got

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


def test_the_committer_waits_for_another_leader_rather_than_spin(
    scheduler: Scheduler, worker: Worker
) -> None:
    """While another thread leads a group commit, the committer waits for it: it spun on
    what was pending, holding the interpreter from the task threads (117,000 tries in a
    2,000-task CPU-bound run). Fails with the committer's drain trying without waiting."""
    scheduler.submit("quick", {"tag": "x"})
    (claim,) = scheduler.store.claim("w", 1, scheduler.clock.now(), LEASE)
    commit = worker._commit
    spy = SpyLock()
    commit._flush_lock = spy  # type: ignore[assignment]
    assert spy.acquire()  # another thread leads
    with commit.changed:
        commit._starts.append(claim)  # something to record
    worker._committer.start()
    try:
        assert spy.waited_for.wait(WAIT)
        assert spy.failed_tries == 0
    finally:
        spy.release()
        worker._committer.stop()
    assert not commit.pending


def test_claims_ahead_held_while_the_loop_sleeps_past_the_window_wake_it(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """A group commit may hold claims ahead while the loop sleeps until its next
    heartbeat: it must wake to give them back if they wait past the window (the mixed
    benchmark saw them given back 150 ms after their claim). Not when it looks soon
    enough anyway (a pass per commit would take the interpreter from the tasks).
    Fails without the wake-up."""
    scheduler.submit("block")
    scheduler.submit("quick", {"tag": "a"})
    scheduler.submit("quick", {"tag": "b"})
    now = scheduler.clock.now()
    (block,) = scheduler.store.claim("w", 1, now, LEASE)
    worker._launch([block])
    assert tasks.blocking.wait(WAIT)
    worker._ahead._window = 1.0
    worker._looks_at = now + timedelta(seconds=0.01)  # the loop looks within the window
    worker._wakeup.clear()
    worker._launch(scheduler.store.claim("w", 0, now, LEASE, ahead=1))
    assert not worker._wakeup.is_set()
    worker._looks_at = now + timedelta(seconds=10)  # asleep until its heartbeat
    worker._launch(scheduler.store.claim("w", 0, now, LEASE, ahead=1))
    assert worker._wakeup.is_set()
    tasks.release.set()


class CountingCondition(threading.Condition):
    """A condition that counts its notify_all calls."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


def test_a_start_wakes_the_committer_only_when_nothing_else_is_pending(
    scheduler: Scheduler, worker: Worker
) -> None:
    """A start with nothing else pending (a claim ahead started by the launch or the
    loop, a slot being free) wakes the idle committer, so that it is recorded while the
    task runs; a start beside a pending outcome does not (the committer is gathering
    already: waking it would only take the interpreter from the task just started).
    Fails with the committer never woken by a start, or woken by every one."""
    scheduler.submit("quick", {"tag": "a"})
    scheduler.submit("quick", {"tag": "b"})
    first, second = scheduler.store.claim("w", 2, scheduler.clock.now(), LEASE)
    commit = worker._commit
    counting = CountingCondition(worker._slots.lock)
    commit._changed = counting
    commit.detached = True  # as while the committer runs
    commit.started(first)
    assert counting.notified == 1  # idle: woken
    commit.started(second)
    assert counting.notified == 1  # the first start is pending: not woken again
    assert [c.task_id for c in commit._starts] == [first.task_id, second.task_id]
    commit.detached = False


def test_a_wait_for_running_attempts_sees_a_claim_ahead_start(
    scheduler: Scheduler, tasks: Tasks, worker: Worker
) -> None:
    """``wait_running`` waits on a condition of its own (a start no longer wakes the
    group commit's leader): a claim ahead that starts must still be told to it. Fails
    with the start not notifying that condition."""
    scheduler.submit("block")
    answer: list[bool] = []
    waiter = threading.Thread(target=lambda: answer.append(worker.wait_running(1, WAIT)))
    waiter.start()
    deadline = time.monotonic() + WAIT
    while not worker._slots.started_changed._waiters:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the waiter never waited"
        time.sleep(0)  # a yield to the waiter, not a timed wait
    claims = scheduler.store.claim("w", 0, scheduler.clock.now(), LEASE, ahead=1)
    told = time.monotonic()
    worker._launch(claims)  # held as waiting (not running), then started at once
    waiter.join(WAIT)
    assert answer == [True]
    assert time.monotonic() - told < WAIT / 2  # told, not timed out
    assert tasks.blocking.is_set() or tasks.blocking.wait(WAIT)
    tasks.release.set()


def test_the_loop_is_woken_for_a_slot_no_claim_ahead_will_take(
    scheduler: Scheduler, tasks: Tasks
) -> None:
    """The group commit wakes the claim loop only for a slot still free once it has
    recorded: a claim waiting here takes an ended attempt's slot on that attempt's
    thread, so a pass for it would claim nothing; a slot beyond the waiting claims needs
    the pass. Fails with the ended attempts counted as holding their slots, or with the
    waiting claims counted twice (they are in the slots' set too)."""
    worker = Worker(scheduler, concurrency=2, lease=LEASE, owner="w", ahead=2, ahead_window=1000.0)
    worker._ahead.ended(0.001)
    scheduler.submit("block")
    scheduler.submit("block")
    scheduler.submit("quick", {"tag": "a"})
    try:
        assert worker.run_once() == 3
        assert worker.waiting_count == 1
        first, second = [r for r in worker._slots.held().values() if not r.waiting]
        assert not worker._commit._free()
        first.ended = True  # as between its end and the commit of its outcome
        assert not worker._commit._free()  # the claim waiting here takes its slot
        second.ended = True
        assert worker._commit._free()  # and one slot is left over
    finally:
        tasks.release.set()
        worker.stop(WAIT)
