"""Fan-out and fan-in on every backend (docs/workflows.md): ``ctx.spawn`` stores a child
with its step (never twice on replay), ``ctx.gather`` / ``ctx.wait_first`` suspend
without a slot until children end, a child's end wakes its parent in its own outcome
transaction, cancelling a parent cancels its unfinished children."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest

from durablesched import (
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskFailed,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import NewTask
from durablesched.store.protocol import Operator
from durablesched.workflows.steps import FOREVER

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
NOW_RETRY = RetryPolicy(max_attempts=3, initial=timedelta(0), jitter=0)


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


# -- the store -----------------------------------------------------------------------------------


def test_spawn_stores_the_children_with_their_step_once(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    kids = [NewTask("kid", {"i": i}, at(12), 3, None) for i in range(2)]
    submitted = store.spawn(claim, 0, "spawn:kid", kids, at(12))
    assert submitted is not None and all(s.created for s in submitted)
    ids = [s.task_id for s in submitted]
    assert store.children(claim.task_id) == ids
    assert store.steps(claim.task_id)[0].result == {"ids": ids}
    assert store.spawn(claim, 0, "spawn:kid", kids, at(13)) is None  # the position is taken
    assert store.children(claim.task_id) == ids
    assert len(store.list_tasks(name="kid")) == 2


def test_a_zombie_spawns_nothing(store: BackendStore) -> None:
    """The claim's fence guards the spawn: a reclaimed attempt's child never appears."""
    store.submit([NewTask("wf", {}, T0, 5, None)], T0)
    (old,) = store.claim("w", 1, at(11), LEASE)
    store.reclaim_expired(at(41), no_delay)
    store.claim("w", 1, at(42), LEASE)
    assert store.spawn(old, 0, "spawn:kid", [NewTask("kid", {}, at(43), 3, None)], at(43)) is None
    assert store.list_tasks(name="kid") == [] and store.children(old.task_id) == []


def test_a_childs_end_wakes_its_suspended_parent_in_its_own_transaction(
    store: BackendStore,
) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (parent,) = store.claim("w", 1, at(11), LEASE, names=["wf"])
    submitted = store.spawn(parent, 0, "spawn:kid", [NewTask("kid", {}, at(12), 3, None)], at(12))
    assert submitted is not None
    kid_id = submitted[0].task_id
    state = store.suspend(parent, FOREVER, at(13), detail="waiting", children=([kid_id], 0))
    assert state is TaskState.PENDING
    assert store.get(parent.task_id).due_at == FOREVER  # type: ignore[union-attr]
    (kid,) = store.claim("w", 1, at(20), LEASE, names=["kid"])
    assert store.complete(kid, 7, at(21))
    woken = store.get(parent.task_id)
    # Due at the wake (the child's end), as a signal's wake: not at its suspension (13),
    # which would read as a task kept waiting since then (docs/workflows.md).
    assert woken is not None
    assert (woken.state, woken.due_at, woken.updated_at) == (TaskState.PENDING, at(21), at(21))


def test_a_woken_workflow_is_not_reported_overdue_for_the_time_it_waited(
    store: BackendStore,
) -> None:
    """Suspended for an hour, woken by its child's end: due at the wake, so ``check`` does
    not find it waiting past its due time (it would, due at its suspension)."""
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (parent,) = store.claim("w", 1, at(11), LEASE, names=["wf"])
    submitted = store.spawn(parent, 0, "spawn:kid", [NewTask("kid", {}, at(12), 3, None)], at(12))
    assert submitted is not None
    store.suspend(parent, FOREVER, at(13), detail="waiting", children=([submitted[0].task_id], 0))
    (kid,) = store.claim("w", 1, at(3600), LEASE, names=["kid"])
    assert store.complete(kid, 7, at(3601))
    report = cast(Operator, store).check(at(3602))
    assert not [f for f in report.findings if parent.task_id in f.task_ids]


def test_a_child_that_ended_while_the_parent_ran_is_not_a_lost_wakeup(
    store: BackendStore,
) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (parent,) = store.claim("w", 1, at(11), LEASE, names=["wf"])
    submitted = store.spawn(parent, 0, "spawn:kid", [NewTask("kid", {}, at(12), 3, None)], at(12))
    assert submitted is not None
    (kid,) = store.claim("w", 1, at(13), LEASE, names=["kid"])
    assert store.complete(kid, 7, at(14))  # the parent RUNNING: nothing to wake
    store.suspend(parent, FOREVER, at(15), detail="waiting", children=([kid.task_id], 0))
    woken = store.get(parent.task_id)
    assert woken is not None and woken.due_at == at(15)


# -- on a worker ---------------------------------------------------------------------------------


def test_fan_out_and_in_with_a_slot_for_one(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    """One slot: the parent suspends while its children run in that slot, and is woken."""
    spawned: list[int] = []

    @registry.task("square")
    def square(n: int) -> int:
        return n * n

    @registry.task("fan", pass_context=True)
    def fan(ctx: TaskContext, n: int) -> int:
        handles = [ctx.spawn(square, i) for i in range(n)]
        spawned.extend(h.id for h in handles)
        return sum(ctx.gather(*handles))

    task_id = scheduler.submit("fan", {"n": 4})
    worker = Worker(scheduler, owner="w", concurrency=1)
    for _ in range(10):
        if not worker.run_due():
            break
    record = scheduler.get(task_id)
    assert (record.state, record.result, record.attempts) == (TaskState.SUCCEEDED, 14, 1)
    assert len(set(spawned)) == 4  # the replays returned the same four children
    assert scheduler.store.children(task_id) == sorted(set(spawned))
    assert len(scheduler.store.list_tasks(name="square")) == 4


def test_gather_raises_a_failed_childs_error_or_returns_it(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("boom", retry=RetryPolicy(max_attempts=1))
    def boom() -> None:
        raise ValueError("no")

    @registry.task("ok")
    def ok() -> int:
        return 1

    @registry.task("strict", pass_context=True, retry=RetryPolicy(max_attempts=1))
    def strict(ctx: TaskContext) -> object:
        return ctx.gather(ctx.spawn(ok), ctx.spawn(boom))

    @registry.task("lenient", pass_context=True)
    def lenient(ctx: TaskContext) -> object:
        got = ctx.gather(ctx.spawn(ok), ctx.spawn(boom), return_exceptions=True)
        return [g if not isinstance(g, TaskFailed) else g.error.message for g in got]  # type: ignore[union-attr]

    strict_id = scheduler.submit("strict")
    lenient_id = scheduler.submit("lenient")
    worker = Worker(scheduler, owner="w")
    for _ in range(10):
        if not worker.run_due():
            break
    failed = scheduler.get(strict_id)
    assert failed.state is TaskState.FAILED and failed.last_error is not None
    assert "TaskFailed" in failed.last_error.type and "ValueError: no" in failed.last_error.message
    assert scheduler.get(lenient_id).result == [1, "no"]


def test_wait_first_returns_the_first_child_to_end(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("quick")
    def quick() -> str:
        return "quick"

    @registry.task("race", pass_context=True)
    def race(ctx: TaskContext) -> object:
        slow = ctx.spawn(quick.options(delay=3600))
        fast = ctx.spawn(quick.options(delay=60))
        first = ctx.wait_first(slow, fast)
        return [first.id == fast.id, ctx.gather(first)]

    task_id = scheduler.submit("race")
    worker = Worker(scheduler, owner="w")
    worker.run_due()
    assert scheduler.get(task_id).state is TaskState.PENDING
    clock.advance(60)
    worker.run_due()  # the fast child ends, waking the parent
    worker.run_due()
    assert scheduler.get(task_id).result == [True, ["quick"]]


def test_a_replay_never_spawns_twice(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    crashes = [1]

    @registry.task("kid")
    def kid() -> None: ...

    @registry.task("wf", pass_context=True, retry=NOW_RETRY)
    def wf(ctx: TaskContext) -> int:
        handle = ctx.spawn(kid)
        if crashes:
            crashes.pop()
            raise RuntimeError("crash after the spawn")
        return handle.id

    task_id = scheduler.submit("wf")
    worker = Worker(scheduler, owner="w")
    for _ in range(5):
        worker.run_due()
    assert len(scheduler.store.list_tasks(name="kid")) == 1
    assert scheduler.get(task_id).result == scheduler.store.children(task_id)[0]


@pytest.mark.parametrize("children", [True, False])
def test_cancelling_a_parent_cancels_its_unfinished_children_unless_told_not_to(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, children: bool
) -> None:
    @registry.task("kid")
    def kid() -> None: ...

    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> None:
        ctx.gather(ctx.spawn(kid.options(delay=60)), ctx.spawn(kid.options(delay=60)))

    task_id = scheduler.submit("wf")
    Worker(scheduler, owner="w").run_due()
    assert scheduler.get(task_id).state is TaskState.PENDING  # suspended, waiting
    scheduler.cancel(task_id, children=children)
    kids = [scheduler.get(i).state for i in scheduler.store.children(task_id)]
    expected = TaskState.CANCELLED if children else TaskState.PENDING
    assert kids == [expected, expected]
    assert scheduler.get(task_id).state is TaskState.CANCELLED


def test_an_async_workflow_waits_durably_without_blocking_its_loop(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("double")
    def double(n: int) -> int:
        return 2 * n

    @registry.task("awf", pass_context=True)
    async def awf(ctx: TaskContext) -> object:
        kids = [await ctx.aspawn(double, n) for n in (1, 2)]
        first = await ctx.await_first(*kids)
        doubled = await ctx.agather(*kids)
        await ctx.asleep_for(timedelta(minutes=1))
        got = await ctx.await_for_signal("go", timeout=timedelta(hours=1))
        return [first.id in {k.id for k in kids}, doubled, got]

    task_id = scheduler.submit("awf")
    worker = Worker(scheduler, owner="w")
    for _ in range(6):
        worker.run_due()
    assert scheduler.get(task_id).state is TaskState.PENDING  # asleep, then waiting
    clock.advance(60)
    worker.run_due()
    scheduler.signal(task_id, "go", "yes")
    worker.run_due()
    record = scheduler.get(task_id)
    assert (record.state, record.result, record.attempts) == (
        TaskState.SUCCEEDED,
        [True, [2, 4], "yes"],
        1,
    )


def test_a_reclaim_of_more_tasks_than_one_statement_binds_wakes_their_parents(
    store: BackendStore,
) -> None:
    """Finished tasks wake their parents in batches: a reclaim ends any number at once."""
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (parent,) = store.claim("w", 1, at(11), LEASE, names=["wf"])
    kids = [NewTask("kid", {"i": i}, at(12), 1, None) for i in range(1200)]
    assert store.spawn(parent, 0, "spawn:kid", kids, at(12)) is not None
    store.suspend(parent, FOREVER, at(13), detail="waiting")
    store.claim("w", 1200, at(14), LEASE, names=["kid"])
    assert len(store.reclaim_expired(at(100), no_delay)) == 1200
    woken = store.get(parent.task_id)
    assert woken is not None and woken.due_at == at(100)
