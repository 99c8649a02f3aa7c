"""What a suspended workflow waits for, as ``durablesched ls`` and the dashboard's task
list say it (docs/workflows.md, "Seeing a workflow"), on every backend: real workflows
suspended by a sleep, signal waits with and without a timeout, a gather with one of
two children ended and a ``wait_first``; read in two reads (``Store.latest_events``,
``Store.finished``) whatever the number of tasks. Under a manual clock."""

from __future__ import annotations

from datetime import datetime, timedelta

from durablesched import ManualClock, Scheduler, TaskContext, TaskRegistry, TaskState, Worker
from durablesched.records import NewTask
from durablesched.workflows import waits
from durablesched.workflows.waits import waiting_for

from ..conftest import T0, BackendStore, at

HOUR = timedelta(hours=1)


def _iso(value: datetime) -> str:
    return value.isoformat()


def _settle(worker: Worker) -> None:
    for _ in range(20):
        if not worker.run_due():
            return
    raise AssertionError("the workflows never settled")


def test_ls_says_what_each_suspended_workflow_waits_for(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    @registry.task("quick")
    def quick() -> int:
        return 1

    @registry.task("sleeper", pass_context=True)
    def sleeper(ctx: TaskContext) -> None:
        ctx.sleep_for(timedelta(days=3))

    @registry.task("approval", pass_context=True)
    def approval(ctx: TaskContext, hours: int | None) -> object:
        return ctx.wait_for_signal("approved", None if hours is None else hours * HOUR)

    @registry.task("fan", pass_context=True)
    def fan(ctx: TaskContext) -> list[object]:
        return ctx.gather(ctx.spawn(quick), ctx.spawn(approval, None))

    @registry.task("race", pass_context=True)
    def race(ctx: TaskContext) -> int:
        return ctx.wait_first(ctx.spawn(approval, 1), ctx.spawn(approval, 2)).id

    ids = {
        "sleeper": scheduler.submit("sleeper"),
        "timed": scheduler.submit("approval", {"hours": 48}),
        "untimed": scheduler.submit("approval", {"hours": None}),
        "fan": scheduler.submit("fan"),
        "race": scheduler.submit("race"),
    }
    plain = scheduler.submit("quick", delay=timedelta(days=1))  # waits for its due time only
    _settle(Worker(scheduler, owner="w"))
    tasks = [scheduler.get(i) for i in [*ids.values(), plain]]
    assert all(t.state is TaskState.PENDING for t in tasks)
    said = waiting_for(scheduler.store, tasks, clock.now(), _iso)
    assert said == {
        ids["sleeper"]: f"sleep until {_iso(T0 + timedelta(days=3))}",
        ids["timed"]: f"signal approved (timeout {_iso(T0 + 48 * HOUR)})",
        ids["untimed"]: "signal approved",
        ids["fan"]: "children 1 of 2",
        ids["race"]: "first of 2 children (0 ended)",
    }
    # A signal makes its workflow due: it waits for a worker now, and says no more.
    scheduler.signal(ids["untimed"], "approved", 1)
    assert ids["untimed"] not in waiting_for(
        scheduler.store, [scheduler.get(ids["untimed"])], clock.now(), _iso
    )


def test_latest_events_reads_the_last_history_line_of_each_task(store: BackendStore) -> None:
    first, second = store.submit(
        [NewTask("wf", {}, T0, 3, None), NewTask("wf", {}, T0, 3, None)], T0
    )
    (claim,) = store.claim("w", 1, at(11), timedelta(seconds=30))
    store.suspend(claim, at(100), at(12), detail=waits.sleeping(0, at(100)))
    latest = store.latest_events([first.task_id, second.task_id, 999_999])
    assert set(latest) == {first.task_id, second.task_id}  # an unknown id is left out
    for task_id, event in latest.items():
        assert event == store.history(task_id)[-1]
    suspended = latest[claim.task_id]
    assert (suspended.state, suspended.detail) == (
        TaskState.PENDING,
        f"suspended at step 0: sleeping until {at(100).isoformat()}",
    )
    assert store.latest_events([]) == {}


def test_a_suspension_line_reads_back_as_its_wait() -> None:
    until = at(50)
    assert waits.parse(waits.sleeping(3, until)) == waits.Wait("sleep", until=until)
    for name in ("approved", 'it\'s "quoted"', "back\\slash"):
        assert waits.parse(waits.signal(1, name, until)) == waits.Wait(
            "signal", until=until, name=name
        )
        assert waits.parse(waits.signal(1, name, None)) == waits.Wait("signal", name=name)
    assert waits.parse(waits.children(2, [5, 6, 6], 1)) == waits.Wait("children", ids=(5, 6, 6))
    assert waits.parse(waits.first_child(2, [7])) == waits.Wait("first", ids=(7,))
    for other in (None, "submitted", "given back at shutdown", "suspended at step 1: dozing"):
        assert waits.parse(other) is None
