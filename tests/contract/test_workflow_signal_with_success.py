"""A signal sent from inside a task, with its success (``ctx.signal``, docs/workflows.md),
on every backend: delivered in the transaction that records the success, so a failed
attempt, a lost lease or a refused signal sends nothing; the receiving workflow is woken
by that transaction, as by ``scheduler.signal``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from durablesched import (
    InvalidTaskError,
    InvalidTransitionError,
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskNotFoundError,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.records import NewTask, Outcome, SignalSend
from durablesched.testing import run_until_complete
from durablesched.workflows.steps import FOREVER

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)


def _two(store: BackendStore) -> tuple[int, int]:
    """A workflow suspended waiting for "go", and a sender, claimed: their ids."""
    store.submit([NewTask("wf", {}, T0, 3, None)], T0)
    (wf,) = store.claim("w", 1, at(11), LEASE, ["wf"])
    assert store.suspend(wf, FOREVER, at(11), detail="waiting", signal="go") is TaskState.PENDING
    return wf.task_id, store.submit([NewTask("sender", {}, T0, 3, None)], T0)[0].task_id


def test_a_success_delivers_its_signal_and_wakes_the_waiting_workflow(
    store: BackendStore,
) -> None:
    wf_id, _ = _two(store)
    (sender,) = store.claim("w", 1, at(12), LEASE, ["sender"])
    assert store.complete(sender, None, at(13), signals=[SignalSend(wf_id, "go", {"by": "ada"})])
    (sent,) = store.signals(wf_id)
    assert (sent.name, sent.payload, sent.sent_at) == ("go", {"by": "ada"}, at(13))
    record = store.get(wf_id)
    assert record is not None and (record.state, record.due_at) == (TaskState.PENDING, at(13))


def test_a_refused_signal_undoes_the_whole_success(store: BackendStore) -> None:
    """An unknown or finished target (the sender itself included) refuses the signal, and
    the success with it: nothing written, the claim still valid, as an effect that raises."""
    wf_id, _ = _two(store)
    (sender,) = store.claim("w", 1, at(12), LEASE, ["sender"])
    child = NewTask("child", {}, T0, 1, None)
    for target, error in [
        (10_000, TaskNotFoundError),
        (sender.task_id, InvalidTransitionError),
    ]:
        with pytest.raises(error):
            store.complete(
                sender,
                1,
                at(13),
                children=[child],
                signals=[SignalSend(wf_id, "go", 1), SignalSend(target, "go", 2)],
            )
        record = store.get(sender.task_id)
        assert record is not None and record.state is TaskState.RUNNING
        assert store.signals(wf_id) == []
        assert sorted(t.name for t in store.list_tasks()) == ["sender", "wf"]
    assert store.complete(sender, 1, at(13), signals=[SignalSend(wf_id, "go", 3)])


def test_a_lost_claim_sends_no_signal(store: BackendStore) -> None:
    wf_id, _ = _two(store)
    (sender,) = store.claim("w", 1, at(12), LEASE, ["sender"])
    assert not store.complete(sender, None, at(43), signals=[SignalSend(wf_id, "go", 1)])
    assert store.signals(wf_id) == []
    record = store.get(wf_id)
    assert record is not None and record.due_at == FOREVER


def test_a_finished_target_refuses_only_its_own_outcome_in_a_group_commit(
    store: BackendStore,
) -> None:
    wf_id, _ = _two(store)
    store.submit([NewTask("sender", {}, T0, 3, None)], T0)
    done, other = store.claim("w", 2, at(12), LEASE, ["sender"])
    assert store.complete(done, None, at(12))
    results, _ = store.record_and_claim(
        [
            Outcome(other, result=1, signals=(SignalSend(done.task_id, "go"),)),
            Outcome(done, result=1),
        ],
        at(13),
        owner="w",
        limit=0,
        lease=LEASE,
    )
    assert isinstance(results[0], InvalidTransitionError)
    assert results[1] is None  # finished already: its claim is spent
    record = store.get(other.task_id)
    assert record is not None and record.state is TaskState.RUNNING
    results, _ = store.record_and_claim(
        [Outcome(other, result=1, signals=(SignalSend(wf_id, "go", 7),))],
        at(13),
        owner="w",
        limit=0,
        lease=LEASE,
    )
    assert results == [TaskState.SUCCEEDED]
    assert [s.payload for s in store.signals(wf_id)] == [7]


# -- ctx.signal on a worker ----------------------------------------------------------------------


def test_ctx_signal_resumes_a_waiting_workflow_only_with_the_senders_success(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("approve", pass_context=True)
    def approve(ctx: TaskContext) -> object:
        return ctx.wait_for_signal("approved")

    attempts: list[int] = []

    later = RetryPolicy(max_attempts=3, initial=timedelta(minutes=1), jitter=0)

    @registry.task("reviewer", pass_context=True, retry=later)
    def reviewer(ctx: TaskContext, workflow: int) -> None:
        attempts.append(ctx.attempt)
        ctx.signal(workflow, "approved", {"attempt": ctx.attempt})
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails after signalling")

    wf_id = scheduler.submit("approve")
    worker = Worker(scheduler, owner="w")
    assert worker.run_due() == 1
    assert scheduler.get(wf_id).due_at == FOREVER
    scheduler.submit("reviewer", {"workflow": wf_id})
    assert worker.run_due() == 1
    assert scheduler.store.signals(wf_id) == []  # the failed attempt sent nothing
    assert scheduler.get(wf_id).due_at == FOREVER
    run_until_complete(scheduler, clock)
    assert attempts == [1, 2]
    (sent,) = scheduler.store.signals(wf_id)
    assert sent.payload == {"attempt": 2}
    record = scheduler.get(wf_id)
    assert (record.state, record.result) == (TaskState.SUCCEEDED, {"attempt": 2})


def test_ctx_signal_to_an_unknown_task_fails_the_attempt(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("sender", pass_context=True, retry=RetryPolicy(max_attempts=1))
    def sender(ctx: TaskContext) -> str:
        ctx.signal(10_000, "go")
        return "sent"

    task_id = scheduler.submit("sender")
    run_until_complete(scheduler, clock)
    record = scheduler.get(task_id)
    assert record.state is TaskState.FAILED
    assert record.last_error is not None and "no task with id 10000" in record.last_error.message


def test_ctx_signal_checks_what_it_can_at_once(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    seen: list[str] = []

    @registry.task("sender", pass_context=True)
    def sender(ctx: TaskContext) -> None:
        not_an_id: Any = "1"
        calls: list[Callable[[], None]] = [
            lambda: ctx.signal(ctx.task_id, "go"),
            lambda: ctx.signal(1, ""),
            lambda: ctx.signal(1, "go", object()),
            lambda: ctx.signal(not_an_id, "go"),
        ]
        for bad in calls:
            with pytest.raises(InvalidTaskError) as caught:
                bad()
            seen.append(str(caught.value))

    scheduler.submit("sender")
    run_until_complete(scheduler, clock)
    assert len(seen) == 4 and "itself" in seen[0]
    assert ctx_free(scheduler)


def ctx_free(scheduler: Scheduler) -> bool:
    """No signal went anywhere."""
    return all(scheduler.store.signals(t.id) == [] for t in scheduler.list_tasks())


def test_ctx_signal_from_a_task_in_a_child_process(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    """The child sends its signals back with its result: the worker records them."""

    @registry.task("approve", pass_context=True)
    def approve(ctx: TaskContext) -> object:
        return ctx.wait_for_signal("approved")

    @registry.task("forked", pass_context=True, environment="process")
    def forked(ctx: TaskContext, workflow: int) -> None:
        ctx.signal(workflow, "approved", "from a child process")

    wf_id = scheduler.submit("approve")
    run_until_complete(scheduler, clock)
    scheduler.submit("forked", {"workflow": wf_id})
    run_until_complete(scheduler, clock)
    assert scheduler.get(wf_id).result == "from a child process"
