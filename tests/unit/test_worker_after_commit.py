"""``Worker(after_commit=)``: told of each outcome once it is committed, never before."""

from __future__ import annotations

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

from ..conftest import T0


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
