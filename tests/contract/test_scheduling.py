"""The scheduler and worker together, on every backend: the worked example and friends."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from durablesched import (
    CancelOutcome,
    InvalidTaskError,
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskCancelled,
    TaskContext,
    TaskNotFoundError,
    TaskRegistry,
    TaskState,
    UnknownTaskNameError,
    Worker,
)
from durablesched.testing import run_due, run_until_complete
from durablesched.workflows.steps import FOREVER

from ..conftest import WAIT, at

NO_JITTER = RetryPolicy(max_attempts=3, initial=timedelta(seconds=5), jitter=0)


class Gates:
    """Per-task events a test opens to let a blocked task finish."""

    def __init__(self) -> None:
        self._gates: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self._lock = threading.Lock()

    def wait(self, label: str) -> None:
        with self._lock:
            self.started.append(label)
            gate = self._gates.setdefault(label, threading.Event())
        assert gate.wait(WAIT), f"gate {label} was never opened"

    def open(self, label: str) -> None:
        with self._lock:
            self._gates.setdefault(label, threading.Event()).set()


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
def worker(scheduler: Scheduler) -> Iterator[Worker]:
    w = Worker(scheduler, concurrency=1, lease=30, owner="w1")
    yield w
    w.stop()
    # Stop any pool made by run_once().
    if w._pool is not None:
        w._pool.shutdown(wait=True)


def state(scheduler: Scheduler, task_id: int) -> TaskState:
    return scheduler.get(task_id).state


def test_worked_example(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, gates: Gates, worker: Worker
) -> None:
    """At 10: A and B due at 12, C at 20, one slot. A fails once; B runs meanwhile."""
    failures = {"A": 1}

    @registry.task("job", retry=NO_JITTER)
    def job(label: str) -> str:
        gates.wait(label)
        if failures.get(label, 0) > 0:
            failures[label] -= 1
            raise RuntimeError(f"{label} failed")
        return label

    a = scheduler.submit("job", {"label": "A"}, at=at(12))
    b = scheduler.submit("job", {"label": "B"}, at=at(12))
    c = scheduler.submit("job", {"label": "C"}, at=at(20))

    assert worker.run_once() == 0  # time 10: nothing is due
    clock.set(at(12))
    assert worker.run_once() == 1
    assert worker.wait_running(1, WAIT)
    assert [state(scheduler, t) for t in (a, b, c)] == [
        TaskState.RUNNING,
        TaskState.PENDING,
        TaskState.PENDING,
    ]
    assert worker.run_once() == 0  # the only slot is busy: B stays unclaimed
    assert scheduler.get(b).lease_owner is None

    gates.open("A")  # A fails explicitly
    assert worker.wait_idle(WAIT)
    task_a = scheduler.get(a)
    assert task_a.state is TaskState.RETRY_WAIT
    assert task_a.due_at == at(17)  # 12 + 5 s backoff: a later due time, no sleeping worker
    assert task_a.last_error is not None and task_a.last_error.message == "A failed"

    assert worker.run_once() == 1  # B runs meanwhile
    gates.open("B")
    assert worker.wait_idle(WAIT)
    assert state(scheduler, b) is TaskState.SUCCEEDED

    clock.set(at(17))
    assert worker.run_once() == 1  # A's retry
    assert worker.wait_idle(WAIT)
    assert scheduler.get(a).state is TaskState.SUCCEEDED
    assert scheduler.get(a).attempts == 2

    clock.set(at(19.999))
    assert worker.run_once() == 0
    clock.set(at(20))
    gates.open("C")
    assert worker.run_once() == 1
    assert worker.wait_idle(WAIT)
    assert state(scheduler, c) is TaskState.SUCCEEDED
    assert gates.started == ["A", "B", "A", "C"]
    assert [scheduler.get(t).result for t in (a, b, c)] == ["A", "B", "C"]


def test_capacity_saturation(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, gates: Gates
) -> None:
    @registry.task("job")
    def job(label: str) -> None:
        gates.wait(label)

    ids = [scheduler.submit("job", {"label": str(i)}) for i in range(7)]
    worker = Worker(scheduler, concurrency=3, owner="w")
    try:
        assert worker.run_once() == 3
        assert worker.wait_running(3, WAIT)
        assert worker.run_once() == 0
        states = [state(scheduler, t) for t in ids]
        assert states.count(TaskState.RUNNING) == 3
        assert states.count(TaskState.PENDING) == 4
        assert all(scheduler.get(t).lease_owner is None for t in ids[3:])
        for i in range(7):
            gates.open(str(i))
    finally:
        worker.stop()
        assert worker.wait_idle(WAIT)


def test_retry_exhaustion_keeps_the_last_error(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    calls: list[int] = []

    @registry.task("flaky", retry=NO_JITTER, pass_context=True)
    def flaky(ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        raise ValueError(f"attempt {ctx.attempt} broke")

    task_id = scheduler.submit("flaky")
    run_until_complete(scheduler, clock)
    task = scheduler.get(task_id)
    assert calls == [1, 2, 3]
    assert (task.state, task.attempts) == (TaskState.FAILED, 3)
    assert task.last_error is not None
    assert task.last_error.type == "builtins.ValueError"
    assert task.last_error.message == "attempt 3 broke"
    assert "Traceback" in task.last_error.traceback and "flaky" in task.last_error.traceback
    # Backoff grew: 5 s then 10 s after the failures.
    retries = [e.at for e in scheduler.history(task_id) if e.state is TaskState.RUNNING]
    assert retries == [at(10), at(15), at(25)]


def test_max_attempts_per_submit_overrides_policy(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("boom", retry=NO_JITTER)
    def boom() -> None:
        raise RuntimeError("no")

    task_id = scheduler.submit("boom", max_attempts=1)
    assert run_due(scheduler) == 1
    assert scheduler.get(task_id).state is TaskState.FAILED


def test_task_submits_a_child_visible_only_with_success(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    seen: list[int] = []

    @registry.task("parent", pass_context=True, retry=NO_JITTER)
    def parent(ctx: TaskContext, fail: bool) -> None:
        ctx.submit("child", {"n": ctx.attempt})
        if fail and ctx.attempt == 1:
            raise RuntimeError("first attempt fails after submitting")

    @registry.task("child")
    def child(n: int) -> int:
        seen.append(n)
        return n

    scheduler.submit("parent", {"fail": True})
    run_until_complete(scheduler, clock)
    children = scheduler.list_tasks(name="child")
    # Only the successful second attempt's child exists.
    assert [(t.args, t.state) for t in children] == [({"n": 2}, TaskState.SUCCEEDED)]
    assert seen == [2]


def test_task_may_submit_through_the_scheduler_at_once(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("parent", retry=NO_JITTER)
    def parent() -> None:
        scheduler.submit("child")
        raise RuntimeError("the direct submit stays")

    @registry.task("child")
    def child() -> None:
        return None

    scheduler.submit("parent", max_attempts=1)
    run_until_complete(scheduler, clock)
    assert [t.state for t in scheduler.list_tasks(name="child")] == [TaskState.SUCCEEDED]


def test_cancel_running_task_that_acknowledges(
    scheduler: Scheduler, registry: TaskRegistry, worker: Worker
) -> None:
    @registry.task("long", pass_context=True)
    def long(ctx: TaskContext) -> None:
        assert ctx.wait_for_cancel(WAIT)
        ctx.raise_if_cancelled()

    task_id = scheduler.submit("long")
    worker.run_once()
    assert worker.wait_running(1, WAIT)
    assert scheduler.cancel(task_id) is CancelOutcome.REQUESTED
    assert worker.wait_idle(WAIT)
    task = scheduler.get(task_id)
    assert task.state is TaskState.CANCELLED
    assert task.cancel_requested_at is not None


def test_cancel_running_task_that_ignores_the_request(
    scheduler: Scheduler, registry: TaskRegistry, worker: Worker, gates: Gates
) -> None:
    @registry.task("stubborn")
    def stubborn() -> str:
        gates.wait("go")
        return "finished anyway"

    task_id = scheduler.submit("stubborn")
    worker.run_once()
    assert worker.wait_running(1, WAIT)
    assert scheduler.cancel(task_id) is CancelOutcome.REQUESTED
    gates.open("go")
    assert worker.wait_idle(WAIT)
    task = scheduler.get(task_id)
    assert (task.state, task.result) == (TaskState.SUCCEEDED, "finished anyway")
    assert scheduler.cancel(task_id) is CancelOutcome.TOO_LATE


def test_cancel_request_reaches_the_task_through_a_heartbeat(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    """A request made elsewhere (no in-process notification) arrives with the next heartbeat."""
    seen = threading.Event()

    @registry.task("long", pass_context=True)
    def long(ctx: TaskContext) -> None:
        assert ctx.wait_for_cancel(WAIT)
        seen.set()
        ctx.raise_if_cancelled()

    task_id = scheduler.submit("long")
    worker = Worker(scheduler, concurrency=1, lease=30, owner="w")
    try:
        worker.run_once()
        assert worker.wait_running(1, WAIT)
        # Bypass the scheduler: as if another process asked.
        scheduler.store.request_cancel(task_id, clock.now())
        clock.advance(10)
        worker.run_once()  # heartbeat due at a third of the lease
        assert seen.wait(WAIT)
        assert worker.wait_idle(WAIT)
        assert scheduler.get(task_id).state is TaskState.CANCELLED
    finally:
        worker.stop()


def test_a_heartbeat_that_overlaps_a_recorded_success_loses_no_lease(
    scheduler: Scheduler,
    registry: TaskRegistry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A heartbeat that set out before a group commit and returns after it no longer
    finds the finished task's claim: that is no lost lease (it was logged as one for
    about 2 % of no-op tasks under load)."""
    registry.task("quick")(lambda: None)
    task_id = scheduler.submit("quick")
    worker = Worker(scheduler, concurrency=1, lease=30, owner="w")
    (claim,) = scheduler.store.claim("w", 1, scheduler.clock.now(), timedelta(seconds=30))
    running = worker._register(claim)
    real_heartbeat = scheduler.store.heartbeat

    def overlapped(*args: Any, **kwargs: Any) -> Any:
        worker._execute(running)  # the task ends and its success commits meanwhile
        return real_heartbeat(*args, **kwargs)

    monkeypatch.setattr(scheduler.store, "heartbeat", overlapped)
    with caplog.at_level(logging.WARNING, logger="durablesched"):
        worker.heartbeat()
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED
    assert not running.context.lease_lost
    assert "lease lost" not in caplog.text


def test_a_heartbeat_after_a_suspension_committed_reports_no_lost_lease(
    scheduler: Scheduler,
    registry: TaskRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A workflow's durable wait gives its claim back itself (``Store.suspend``), then
    its attempt ends: a heartbeat in between no longer finds the claim, and that is no
    lost lease (it was logged as one, "its outcome will be discarded", after a
    suspension). Fails with the suspended attempt not told from a lost one."""
    registry.task("flow")(lambda: None)
    task_id = scheduler.submit("flow")
    worker = Worker(scheduler, concurrency=1, lease=30, owner="w")
    now = scheduler.clock.now()
    (claim,) = scheduler.store.claim("w", 1, now, timedelta(seconds=30))
    running = worker._register(claim)
    scheduler.store.suspend(claim, FOREVER, now, detail="waiting for signal 'go'", signal="go")
    running.context.suspended = True  # as ctx.wait_for_signal marks it, then raises
    with caplog.at_level(logging.WARNING, logger="durablesched"):
        worker.heartbeat()
    assert scheduler.get(task_id).state is TaskState.PENDING
    assert "lease lost" not in caplog.text


def test_raising_task_cancelled_unasked_is_a_failure(
    scheduler: Scheduler, registry: TaskRegistry
) -> None:
    @registry.task("quitter")
    def quitter() -> None:
        raise TaskCancelled("nobody asked")

    task_id = scheduler.submit("quitter", max_attempts=1)
    run_due(scheduler)
    task = scheduler.get(task_id)
    assert task.state is TaskState.FAILED
    assert task.last_error is not None and "TaskCancelled" in task.last_error.type


def test_lease_expiry_and_reclaim_reject_the_stale_completion(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, gates: Gates
) -> None:
    @registry.task("slow", retry=NO_JITTER, pass_context=True)
    def slow(ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            gates.wait("zombie")
        return ctx.attempt

    task_id = scheduler.submit("slow")
    zombie = Worker(scheduler, concurrency=1, lease=30, owner="zombie")
    rescuer = Worker(scheduler, concurrency=1, lease=30, owner="rescuer")
    try:
        zombie.run_once()
        assert zombie.wait_running(1, WAIT)
        clock.advance(31)  # the zombie never heartbeats: its lease runs out
        assert rescuer.reclaim() == 1
        assert scheduler.get(task_id).state is TaskState.RETRY_WAIT
        clock.advance(5)
        assert rescuer.run_due() == 1
        assert scheduler.get(task_id).result == 2
        gates.open("zombie")  # the zombie finishes late; its success is refused
        assert zombie.wait_idle(WAIT)
        task = scheduler.get(task_id)
        assert (task.state, task.result, task.attempts) == (TaskState.SUCCEEDED, 2, 2)
        events = [(e.state, e.attempt) for e in scheduler.history(task_id)]
        assert events.count((TaskState.SUCCEEDED, 2)) == 1
        assert len([e for e in events if e[0] is TaskState.SUCCEEDED]) == 1
    finally:
        zombie.stop()
        if zombie._pool is not None:
            zombie._pool.shutdown(wait=True)


def test_user_code_runs_while_other_threads_submit_and_cancel(
    scheduler: Scheduler, registry: TaskRegistry, gates: Gates
) -> None:
    """No scheduler or store lock is held while a task body runs."""
    done_inside: list[Any] = []

    @registry.task("holder")
    def holder() -> None:
        gates.wait("hold")

    @registry.task("other")
    def other() -> None:
        return None

    scheduler.submit("holder")
    worker = Worker(scheduler, concurrency=1, owner="w")
    try:
        worker.run_once()
        assert worker.wait_running(1, WAIT)

        def meddle() -> None:
            new_id = scheduler.submit("other", delay=60)
            done_inside.append(scheduler.cancel(new_id))
            done_inside.append(len(scheduler.list_tasks()))

        t = threading.Thread(target=meddle)
        t.start()
        t.join(WAIT)
        assert not t.is_alive()
        assert done_inside == [CancelOutcome.CANCELLED, 2]
        gates.open("hold")
        assert worker.wait_idle(WAIT)
    finally:
        worker.stop()


def test_threaded_worker_loop_wakes_on_submit_and_on_clock(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    ran = threading.Event()
    ran_later = threading.Event()

    @registry.task("now")
    def now_task() -> None:
        ran.set()

    @registry.task("later")
    def later_task() -> None:
        ran_later.set()

    worker = Worker(scheduler, concurrency=2, owner="loop")
    worker.start()
    try:
        scheduler.submit("later", delay=60)
        scheduler.submit("now")
        assert ran.wait(WAIT)
        assert not ran_later.is_set()
        clock.advance(60)  # wakes the loop, which finds "later" due
        assert ran_later.wait(WAIT)
    finally:
        assert worker.stop(WAIT)


def test_unknown_ids_raise(scheduler: Scheduler) -> None:
    with pytest.raises(TaskNotFoundError):
        scheduler.get(999)
    with pytest.raises(TaskNotFoundError):
        scheduler.history(999)
    with pytest.raises(TaskNotFoundError):
        scheduler.cancel(999)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"args": {"x": object()}}, "JSON-serialisable"),
        ({"args": {"x": float("nan")}}, "JSON-serialisable"),
        ({"args": [1, 2]}, "JSON object"),
        ({"delay": -1}, "negative"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"key": ""}, "idempotency key"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(
    scheduler: Scheduler, registry: TaskRegistry, kwargs: dict[str, Any], message: str
) -> None:
    registry.register(lambda **_: None, name="ok")
    with pytest.raises(InvalidTaskError, match=message):
        scheduler.submit("ok", **kwargs)
    assert scheduler.list_tasks() == []


def test_naive_datetime_and_unknown_names_are_refused(
    scheduler: Scheduler, registry: TaskRegistry
) -> None:
    registry.register(lambda: None, name="ok")
    with pytest.raises(InvalidTaskError, match="naive"):
        scheduler.submit("ok", at=at(12).replace(tzinfo=None))
    with pytest.raises(UnknownTaskNameError, match="nope"):
        scheduler.submit("nope")
    assert scheduler.list_tasks() == []


def test_result_must_be_json(scheduler: Scheduler, registry: TaskRegistry) -> None:
    @registry.task("weird")
    def weird() -> object:
        return object()

    task_id = scheduler.submit("weird", max_attempts=1)
    run_due(scheduler)
    task = scheduler.get(task_id)
    assert task.state is TaskState.FAILED
    assert task.last_error is not None and "JSON" in task.last_error.message


def test_submit_many_keeps_order(scheduler: Scheduler, registry: TaskRegistry) -> None:
    order: list[int] = []

    @registry.task("n")
    def n(i: int) -> None:
        order.append(i)

    ids = scheduler.submit_many("n", [{"i": i} for i in range(50)])
    assert len(set(ids)) == 50
    run_due(scheduler)
    assert order == list(range(50))


def test_idempotency_key_is_stable_across_attempts(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    keys: list[str] = []

    @registry.task("pay", pass_context=True, retry=NO_JITTER)
    def pay(ctx: TaskContext) -> None:
        keys.append(ctx.idempotency_key)
        if ctx.attempt < 3:
            raise RuntimeError("gateway timeout")

    keyed = scheduler.submit("pay", key="order-7")
    unkeyed = scheduler.submit("pay")
    run_until_complete(scheduler, clock)
    assert keys[0::2] == ["order-7"] * 3
    assert keys[1::2] == [f"durablesched-task-{unkeyed}"] * 3
    assert scheduler.submit("pay", key="order-7") == keyed


def test_a_heartbeat_that_finds_the_claim_gone_tells_the_running_task(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    """The lease lapsed and another worker reclaimed the task: the next heartbeat of the
    worker running it tells the attempt (``lease_lost``, ``cancel_requested``), so a
    cooperative task stops instead of running on for nothing."""
    told = threading.Event()
    seen: list[tuple[bool, bool]] = []

    @registry.task("long", pass_context=True)
    def long(ctx: TaskContext) -> str:
        assert ctx.wait(WAIT)  # wakes on a lost lease, a cancel or a shutdown
        seen.append((ctx.lease_lost, ctx.cancel_requested))
        told.set()
        return "too late"

    task_id = scheduler.submit("long")
    worker = Worker(scheduler, concurrency=1, lease=30, owner="w")
    try:
        worker.run_once()
        assert worker.wait_running(1, WAIT)
        clock.advance(31)  # no heartbeat ran: the lease lapsed
        assert Worker(scheduler, owner="other").reclaim(clock.now()) == 1
        worker.heartbeat()
        assert told.wait(WAIT)
        assert worker.wait_idle(WAIT)
    finally:
        worker.stop()
    assert seen == [(True, True)]
    task = scheduler.get(task_id)
    assert (task.state, task.result) == (TaskState.RETRY_WAIT, None)
