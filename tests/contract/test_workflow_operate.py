"""Seeing and steering workflows (docs/workflows.md, docs/cli.md, docs/sql.md): forgetting
steps from a position (``retry --from-step``), ``show``, the views, and purge taking a
workflow's steps, signals and children links with it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from durablesched import (
    ErrorInfo,
    InvalidTransitionError,
    ManualClock,
    RetryPolicy,
    Scheduler,
    SQLiteStore,
    TaskContext,
    TaskNotFoundError,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import NewTask
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, BackendStore, at, sql_backends_only
from ..unit.test_cli_edges import Run, db, run

__all__ = ["db", "run"]

LEASE = timedelta(seconds=30)


def a_failed_workflow(store: BackendStore) -> int:
    store.submit([NewTask("wf", {}, T0, 1, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    store.send_signal(claim.task_id, "go", 1, at(11))
    assert store.record_step(claim, 0, "a", 1, at(12))
    assert store.receive_signal(claim, 1, "signal:go", "go", at(12)) == (True, 1)
    assert store.record_step(claim, 2, "c", 3, at(12))
    store.fail(claim, ErrorInfo("E", "boom", ""), None, at(13))
    return claim.task_id


def test_forget_steps_from_a_position_keeps_those_before_and_gives_signals_back(
    store: BackendStore,
) -> None:
    task_id = a_failed_workflow(store)
    assert store.forget_steps(task_id, 1) == 2
    assert [s.name for s in store.steps(task_id)] == ["a"]
    assert [s.consumed_position for s in store.signals(task_id)] == [None]  # to be taken again
    assert store.forget_steps(task_id, 0) == 1
    with pytest.raises(TaskNotFoundError):
        store.forget_steps(10_000, 0)


def test_a_live_workflows_steps_are_not_forgotten(store: BackendStore) -> None:
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.record_step(claim, 0, "a", 1, at(12))
    with pytest.raises(InvalidTransitionError, match="finished"):
        store.forget_steps(claim.task_id, 0)
    assert len(store.steps(claim.task_id)) == 1


def a_failed_keyed_workflow(store: BackendStore, key: str) -> int:
    (submitted,) = store.submit([NewTask("wf", {}, T0, 1, key)], T0)
    (claim,) = store.claim("w", 1, at(11), LEASE)
    assert store.record_step(claim, 0, "a", 1, at(12))
    assert store.record_step(claim, 1, "b", 2, at(12))
    store.fail(claim, ErrorInfo("E", "boom", ""), None, at(13))
    return submitted.task_id


@sql_backends_only
def test_retry_from_a_step_forgets_steps_only_if_the_requeue_is_taken(
    store: BackendStore,
) -> None:
    """``retry --from-step`` is one transaction: refused (another task took the key
    meanwhile, or the task is not FAILED or CANCELLED) it forgets no step."""
    assert isinstance(store, SQLStore)
    first = a_failed_keyed_workflow(store, "order-1")
    (second,) = store.submit([NewTask("wf", {}, at(14), 1, "order-1")], at(14))
    assert second.created
    with pytest.raises(InvalidTransitionError, match="held by"):
        store.requeue(first, at(15), from_step=0)
    assert [s.name for s in store.steps(first)] == ["a", "b"]
    assert (store.get(first) or pytest.fail("gone")).state is TaskState.FAILED
    with pytest.raises(InvalidTransitionError, match="PENDING"):
        store.requeue(second.task_id, at(15), from_step=0)
    other = a_failed_keyed_workflow(store, "order-2")
    store.requeue(other, at(15), from_step=1)
    assert [s.name for s in store.steps(other)] == ["a"]
    assert (store.get(other) or pytest.fail("gone")).state is TaskState.PENDING


@sql_backends_only
def test_purge_takes_the_steps_signals_and_children_links_with_the_task(
    store: BackendStore,
) -> None:
    assert isinstance(store, SQLStore)
    task_id = a_failed_workflow(store)
    assert store.purge(at(3600)) == 1
    assert store.steps(task_id) == [] and store.signals(task_id) == []
    with store.engine.connect() as conn:
        for table in ("task_steps", "task_signals", "task_waits", "task_children"):
            assert conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() == 0


@sql_backends_only
def test_the_views_list_steps_and_signals(store: BackendStore) -> None:
    assert isinstance(store, SQLStore)
    a_failed_workflow(store)
    with store.engine.connect() as conn:
        steps = conn.execute(
            text("SELECT position, step, result_size, attempt FROM workflow_steps ORDER BY 1")
        ).all()
        signals = conn.execute(text("SELECT signal, taken_by_step FROM workflow_signals")).all()
    # The JSON's text: PostgreSQL's jsonb writes a space after a colon.
    assert [(r[0], r[1], r[3]) for r in steps] == [(0, "a", 1), (1, "signal:go", 1), (2, "c", 1)]
    assert [r[2] for r in steps][::2] == [1, 1] and steps[1][2] in (13, 14)
    assert [tuple(r) for r in signals] == [("go", 1)]


def test_retry_from_a_step_runs_it_again_and_keeps_those_before(
    run: Run, db: Path, tmp_path: Path
) -> None:
    calls: list[str] = []
    fail = [True]
    registry = TaskRegistry()

    @registry.task("wf", pass_context=True, retry=RetryPolicy(max_attempts=1))
    def wf(ctx: TaskContext) -> str:
        ctx.step("a", lambda: calls.append("a"))
        ctx.step("b", lambda: calls.append("b"))
        if fail:
            fail.pop()
            raise RuntimeError("c went wrong")
        return "done"

    clock = ManualClock(T0)
    store = SQLiteStore(db)
    scheduler = Scheduler(store, registry=registry, clock=clock)
    task_id = scheduler.submit("wf")
    Worker(scheduler, owner="w").run_due()
    assert scheduler.get(task_id).state is TaskState.FAILED
    shown = run("show", str(task_id))
    assert "steps:" in shown.out and " a " in shown.out and " b " in shown.out
    flow = json.loads(run("--json", "show", str(task_id)).out)
    assert [s["name"] for s in flow["steps"]] == ["a", "b"]
    result = run("retry", str(task_id), "--from-step", "1")
    assert result.code == 0 and "from 1 on run again" in result.out
    clock.set(clock.now() + timedelta(days=1))  # the CLI's retry is due at the real now
    Worker(scheduler, owner="w").run_due()
    record = scheduler.get(task_id)
    store.close()
    assert (record.state, record.result) == (TaskState.SUCCEEDED, "done")
    assert calls == ["a", "b", "b"]  # a kept, b run again
    bad = run("retry", str(task_id), "--from-step", "-1")
    assert bad.code == 2 and "0 or more" in bad.err
