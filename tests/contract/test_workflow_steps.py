"""Workflow steps on every backend: the store's checkpoints (``record_step``, ``steps``)
and ``ctx.step`` on a worker (docs/workflows.md).

Each guard has a test here that fails without it: the claim's fence on a checkpoint
(a zombie records nothing), one checkpoint per position, replay returning the
recorded result without calling the step, and the name check at a position.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, text

from durablesched import (
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    UnsupportedOperationError,
)
from durablesched.errors import CheckpointRefused, WorkflowChanged
from durablesched.records import NewTask
from durablesched.store.sql.store import SQLStore
from durablesched.testing import run_until_complete
from durablesched.workflows import step

from ..conftest import T0, BackendStore, at, sql_backends_only

LEASE = timedelta(seconds=30)
NOW_RETRY = RetryPolicy(max_attempts=3, initial=timedelta(0), jitter=0)


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


@pytest.fixture
def ledger(store: BackendStore) -> Iterator[bool]:
    """A table the effects write, on the SQL backends (True); False on memory."""
    if not isinstance(store, SQLStore):
        yield False
        return
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE step_ledger (task_id INTEGER, note TEXT)"))
    yield True


def ledger_rows(store: object) -> list[tuple[int, str]]:
    assert isinstance(store, SQLStore)
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT task_id, note FROM step_ledger ORDER BY note")).all()
    return [(r[0], r[1]) for r in rows]


def write(conn: Connection, result: Any) -> None:
    conn.execute(text("INSERT INTO step_ledger VALUES (:t, :n)"), {"t": 1, "n": str(result)})


# -- the store's checkpoints ---------------------------------------------------------------------


def test_a_checkpoint_is_recorded_under_a_valid_claim_and_changes_no_task(
    store: BackendStore,
) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    before, history = store.get(claim.task_id), store.history(claim.task_id)
    assert store.record_step(claim, 0, "charge", {"id": "ch_1"}, at(12))
    assert store.record_step(claim, 1, "ship", [1, "a", None], at(13))
    steps = store.steps(claim.task_id)
    assert [(s.position, s.name, s.result, s.recorded_at, s.attempt) for s in steps] == [
        (0, "charge", {"id": "ch_1"}, at(12), 1),
        (1, "ship", [1, "a", None], at(13), 1),
    ]
    assert store.get(claim.task_id) == before
    assert store.history(claim.task_id) == history
    assert store.steps(10_000) == []


def test_a_position_is_recorded_once(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.record_step(claim, 0, "charge", 1, at(12))
    assert not store.record_step(claim, 0, "charge", 2, at(13))
    assert [(s.name, s.result) for s in store.steps(claim.task_id)] == [("charge", 1)]


def test_a_zombie_records_no_checkpoint(store: BackendStore) -> None:
    """The claim's fence guards the checkpoint: the same owner, reclaimed and claiming
    again, holds an old claim whose step is refused; an expired lease too."""
    store.submit([NewTask("wf", {}, T0, 5, None)], T0)
    (old,) = store.claim("w", 1, at(10), LEASE)
    assert not store.record_step(old, 0, "late", 1, at(40))  # lease expired
    store.reclaim_expired(at(40), no_delay)
    (new,) = store.claim("w", 1, at(41), LEASE)
    assert not store.record_step(old, 0, "zombie", 1, at(42))  # a lease, not its fence
    assert store.record_step(new, 0, "live", 2, at(42))
    assert [(s.name, s.attempt) for s in store.steps(new.task_id)] == [("live", 2)]


def test_a_checkpoints_effects_commit_with_it_or_not_at_all(
    store: BackendStore, ledger: bool
) -> None:
    store.submit([NewTask("wf", {}, T0, 5, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)

    def effect(conn: Connection) -> None:
        conn.execute(text("INSERT INTO step_ledger VALUES (1, 'a')"))

    if not ledger:
        with pytest.raises(UnsupportedOperationError):
            store.record_step(claim, 0, "s", 1, at(12), effects=[effect])
        assert store.steps(claim.task_id) == []
        return

    def boom(conn: Connection) -> None:
        conn.execute(text("INSERT INTO step_ledger VALUES (1, 'b')"))
        raise RuntimeError("effect failed")

    with pytest.raises(RuntimeError, match="effect failed"):
        store.record_step(claim, 0, "s", 1, at(12), effects=[boom])
    assert store.steps(claim.task_id) == [] and ledger_rows(store) == []
    assert store.record_step(claim, 0, "s", 1, at(12), effects=[effect])
    assert not store.record_step(claim, 0, "s", 1, at(13), effects=[effect])  # no second run
    assert ledger_rows(store) == [(1, "a")]


def test_a_deleted_task_takes_its_steps_with_it(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 5, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.record_step(claim, 0, "s", 1, at(12))
    assert store.complete(claim, None, at(13))
    store.delete_task(claim.task_id)
    assert store.steps(claim.task_id) == []


# -- ctx.step on a worker ------------------------------------------------------------------------


def run(scheduler: Scheduler, clock: ManualClock) -> None:
    run_until_complete(scheduler, clock)


def test_replay_returns_the_recorded_results_without_calling_the_steps(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    calls: list[str] = []
    failing = [True]

    def charge(order: int, amount: int) -> dict[str, int]:
        calls.append("charge")
        return {"order": order, "charged": amount}

    def ship(charged: dict[str, int]) -> list[int]:
        calls.append("ship")
        if failing[0]:
            failing[0] = False
            raise RuntimeError("carrier down")
        return [charged["order"], 1]

    @registry.task("order", pass_context=True, retry=NOW_RETRY)
    def order(ctx: TaskContext, order_id: int) -> list[int]:
        charged = ctx.step("charge", charge, order_id, 100)
        shipped: list[int] = ctx.step("ship", ship, charged, retry=RetryPolicy(max_attempts=1))
        return shipped

    task_id = scheduler.submit("order", {"order_id": 7})
    run(scheduler, clock)
    record = scheduler.get(task_id)
    assert (record.state, record.attempts, record.result) == (TaskState.SUCCEEDED, 2, [7, 1])
    assert calls == ["charge", "ship", "ship"]  # charge ran once, on attempt 1
    steps = scheduler.store.steps(task_id)
    assert [(s.name, s.result, s.attempt) for s in steps] == [
        ("charge", {"order": 7, "charged": 100}, 1),
        ("ship", [7, 1], 2),
    ]


def test_a_failing_step_is_retried_by_its_own_policy_before_the_task_sees_it(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("try again")
        return "ok"

    @registry.task("wf", pass_context=True, retry=RetryPolicy(max_attempts=1))
    def wf(ctx: TaskContext) -> str:
        result: str = ctx.step("flaky", flaky, retry=NOW_RETRY)
        return result

    task_id = scheduler.submit("wf")
    run(scheduler, clock)
    record = scheduler.get(task_id)
    assert (record.state, record.attempts, record.result, len(tries)) == (
        TaskState.SUCCEEDED,
        1,
        "ok",
        3,
    )


def test_a_step_renamed_at_its_position_fails_the_task_naming_both(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    names = ["reserve"]

    @registry.task("wf", pass_context=True, retry=NOW_RETRY)
    def wf(ctx: TaskContext) -> None:
        ctx.step(names[0], lambda: 1)
        names[0] = "charge"  # the code changes under the workflow in flight
        raise RuntimeError("crash after the step")

    task_id = scheduler.submit("wf")
    run(scheduler, clock)
    record = scheduler.get(task_id)
    assert record.state is TaskState.FAILED and record.attempts == 2  # not retried again
    assert record.last_error is not None
    assert record.last_error.type.endswith("WorkflowChanged")
    assert "'charge'" in record.last_error.message and "'reserve'" in record.last_error.message


def test_the_step_log_refuses_another_name_at_a_recorded_position(
    store: BackendStore, scheduler: Scheduler
) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.record_step(claim, 0, "reserve", 1, at(12))
    ctx = TaskContext(claim, scheduler)
    with pytest.raises(WorkflowChanged, match=r"'charge'.*'reserve'"):
        ctx.step("charge", lambda: 2)


def test_a_step_run_by_a_zombie_is_not_recorded_and_stops_it(
    store: BackendStore, scheduler: Scheduler
) -> None:
    store.submit([NewTask("wf", {}, T0, 5, None)], T0)
    (old,) = store.claim("w", 1, at(10), LEASE)
    store.reclaim_expired(at(40), no_delay)
    store.claim("w", 1, at(41), LEASE)
    assert isinstance(scheduler.clock, ManualClock)
    scheduler.clock.set(at(42))
    with pytest.raises(CheckpointRefused, match="no longer valid"):
        TaskContext(old, scheduler).step("s", lambda: 1)
    assert store.steps(old.task_id) == []


@sql_backends_only
def test_step_effects_happen_once_across_a_crash_and_replay(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, ledger: bool
) -> None:
    assert ledger  # the table the effects write
    crashes = [1]

    @registry.task("wf", pass_context=True, retry=NOW_RETRY)
    def wf(ctx: TaskContext) -> int:
        first: int = ctx.step("a", lambda: 1, effect=write)
        ctx.step("b", lambda: 2, effect=write)
        if crashes:
            crashes.pop()
            raise RuntimeError("crash after two steps")
        return first

    scheduler.submit("wf")
    run(scheduler, clock)
    assert ledger_rows(scheduler.store) == [(1, "1"), (1, "2")]


def test_a_step_decorator_names_the_step_and_carries_its_policy(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    tries: list[int] = []

    @step(name="fetch", retry=NOW_RETRY)
    def fetch(url: str, *, timeout: int) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("reset")
        return f"{url}:{timeout}"

    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> str:
        return fetch(ctx, "u", timeout=3)

    task_id = scheduler.submit("wf")
    run(scheduler, clock)
    assert scheduler.get(task_id).result == "u:3"
    assert [s.name for s in scheduler.store.steps(task_id)] == ["fetch"]
    assert fetch.fn("v", timeout=1) == "v:1"  # the plain function, nothing recorded


def test_an_async_task_awaits_its_steps(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    calls: list[str] = []

    async def remote(x: int) -> int:
        calls.append("remote")
        return x * 2

    def local(x: int) -> int:
        calls.append("local")
        return x + 1

    failing = [True]

    @registry.task("awf", pass_context=True, retry=NOW_RETRY)
    async def awf(ctx: TaskContext, x: int) -> int:
        doubled: int = await ctx.astep("remote", remote, x)
        added: int = await ctx.astep("local", local, doubled)
        if failing[0]:
            failing[0] = False
            raise RuntimeError("crash")
        return added

    task_id = scheduler.submit("awf", {"x": 5})
    run(scheduler, clock)
    record = scheduler.get(task_id)
    assert (record.state, record.result, calls) == (TaskState.SUCCEEDED, 11, ["remote", "local"])


def test_a_result_json_cannot_hold_fails_the_task_at_once(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("wf", pass_context=True, retry=NOW_RETRY)
    def wf(ctx: TaskContext) -> None:
        ctx.step("s", object)

    task_id = scheduler.submit("wf")
    run(scheduler, clock)
    record = scheduler.get(task_id)
    assert (record.state, record.attempts) == (TaskState.FAILED, 1)
    assert scheduler.store.steps(task_id) == []
