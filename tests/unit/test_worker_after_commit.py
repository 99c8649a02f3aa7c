"""``Worker(after_commit=)``: told of each outcome once it is committed, never before."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from durablesched import (
    ManualClock,
    MemoryStore,
    Outcome,
    RetryPolicy,
    Scheduler,
    TaskRegistry,
    TaskState,
    Worker,
)

from ..conftest import T0, WAIT


def test_the_hook_hears_each_outcome_after_its_commit() -> None:
    registry = TaskRegistry()
    store = MemoryStore()
    scheduler = Scheduler(store, registry=registry, clock=ManualClock(T0))
    seen: list[tuple[int, TaskState | None, TaskState]] = []

    @registry.task("ok")
    def ok() -> int:
        return 1

    @registry.task("bad", retry=RetryPolicy(max_attempts=1))
    def bad() -> None:
        raise ValueError("boom")

    def after_commit(outcome: Outcome, state: TaskState | None, at: datetime) -> None:
        # What the store holds by now is the committed outcome, recorded at ``at``.
        record = store.get(outcome.claim.task_id)
        assert record is not None
        assert record.finished_at == at
        assert (outcome.result, outcome.error is not None) == (
            (1, False) if state is TaskState.SUCCEEDED else (None, True)
        )
        seen.append((outcome.claim.task_id, state, record.state))

    ok_id, bad_id = scheduler.submit("ok"), scheduler.submit("bad")
    worker = Worker(scheduler, after_commit=after_commit, lease=timedelta(minutes=5))
    worker.run(burst=True, burst_wait=0)
    assert sorted(seen) == [
        (ok_id, TaskState.SUCCEEDED, TaskState.SUCCEEDED),
        (bad_id, TaskState.FAILED, TaskState.FAILED),
    ]


def test_a_hook_that_raises_changes_nothing() -> None:
    registry = TaskRegistry()
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))
    registry.register(lambda: 1, name="ok")
    calls: list[int] = []

    def after_commit(outcome: Outcome, state: TaskState | None, at: datetime) -> None:
        calls.append(outcome.claim.task_id)
        raise RuntimeError("a listener's bug")

    ids = [scheduler.submit("ok") for _ in range(3)]
    Worker(scheduler, after_commit=after_commit).run(burst=True, burst_wait=0)
    assert sorted(calls) == ids
    assert all(scheduler.get(i).state is TaskState.SUCCEEDED for i in ids)


def test_an_idle_workers_only_attempt_records_its_own_outcome() -> None:
    """With claims ahead a committer thread records outcomes, so that task threads never
    wait; but a thread whose attempt is all the worker holds has nothing else to run,
    and records its outcome itself: no hand-off to wait for (a signalled workflow's
    resumption on an idle worker). With another attempt running, the committer records
    it. Fails with every outcome handed over (first half) or none (second)."""
    registry = TaskRegistry()
    scheduler = Scheduler(MemoryStore(), registry=registry)
    release = threading.Event()
    registry.task("quick")(lambda: None)

    @registry.task("block")
    def block() -> None:
        assert release.wait(WAIT)

    threads: dict[int, str] = {}
    told = threading.Condition()

    def after_commit(outcome: Outcome, state: TaskState | None, at: datetime) -> None:
        with told:
            threads[outcome.claim.task_id] = threading.current_thread().name
            told.notify_all()

    worker = Worker(scheduler, concurrency=2, after_commit=after_commit, ahead=8)
    worker.start()
    try:
        alone = scheduler.submit("quick")
        with told:
            assert told.wait_for(lambda: alone in threads, WAIT)
        assert threads[alone].startswith("durablesched-task_")
        blocking = scheduler.submit("block")
        assert worker.wait_running(1, WAIT)
        beside = scheduler.submit("quick")
        with told:
            assert told.wait_for(lambda: beside in threads, WAIT)
        assert threads[beside].startswith("durablesched-commit-")
        release.set()
        with told:
            assert told.wait_for(lambda: blocking in threads, WAIT)
    finally:
        release.set()
        worker.stop(WAIT)
