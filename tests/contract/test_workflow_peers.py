"""The peers' recovery bugs (issue 31), as tests here: two workers racing to reclaim one
workflow run it once; a signal taken by a wait whose task is then reclaimed replays the
same payload; purging a finished workflow and reusing its idempotency key never
replays the old steps. The last, a database restarted while a worker reclaims a dead
worker's workflows, needs real processes and a server: tests/processes/test_workflows.py
(``test_a_database_restart_during_a_reclaim_...``, PostgreSQL)."""

from __future__ import annotations

import threading
from datetime import timedelta

from durablesched import ManualClock, Scheduler, TaskContext, TaskRegistry, TaskState, Worker
from durablesched.records import NewTask
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, WAIT, BackendStore, at, sql_backends_only

LEASE = timedelta(seconds=30)


def no_delay(name: str, attempt: int) -> timedelta:
    return timedelta(0)


def test_two_workers_racing_to_reclaim_a_workflow_run_each_step_once(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    runs: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> str:
        with lock:
            runs.append(name)
        return name

    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> list[str]:
        return [ctx.step(n, record, n) for n in ("a", "b", "c")]

    task_id = scheduler.submit("wf")
    (dead,) = scheduler.store.claim("dead", 1, clock.now(), LEASE)
    assert scheduler.store.record_step(dead, 0, "a", "a", clock.now())
    clock.advance(LEASE + timedelta(seconds=1))  # the dead worker's lease ran out
    workers = [Worker(scheduler, owner=f"w{i}") for i in range(2)]
    start = threading.Barrier(2)

    def race(worker: Worker) -> None:
        start.wait(WAIT)
        worker.run_due()

    threads = [threading.Thread(target=race, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    for _ in range(3):  # the retry the reclaim scheduled, by whichever worker
        clock.advance(60)
        for worker in workers:
            worker.run_due()
    record_ = scheduler.get(task_id)
    assert (record_.state, record_.result) == (TaskState.SUCCEEDED, ["a", "b", "c"])
    assert runs == ["b", "c"]  # a replayed from the dead worker's checkpoint; b, c once


def test_a_signal_taken_before_a_reclaim_replays_the_same_payload(
    store: BackendStore, scheduler: Scheduler, clock: ManualClock
) -> None:
    store.submit([NewTask("wf", {}, T0, 5, None)], T0)
    (first,) = store.claim("w1", 1, at(11), LEASE)
    store.send_signal(first.task_id, "go", "one", at(11))
    store.send_signal(first.task_id, "go", "two", at(11))
    clock.set(at(12))
    assert TaskContext(first, scheduler).wait_for_signal("go") == "one"
    store.reclaim_expired(at(45), no_delay)  # its worker died after the wait
    (second,) = store.claim("w2", 1, at(46), LEASE)
    clock.set(at(47))
    assert TaskContext(second, scheduler).wait_for_signal("go") == "one"  # the recorded one
    assert [s.consumed_position for s in store.signals(first.task_id)] == [1, None]


@sql_backends_only
def test_a_reused_key_after_a_purge_never_replays_the_old_steps(
    store: BackendStore, scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock
) -> None:
    assert isinstance(store, SQLStore)
    runs: list[int] = []

    def charge(task_id: int) -> int:
        runs.append(task_id)
        return task_id

    @registry.task("wf", pass_context=True)
    def wf(ctx: TaskContext) -> int:
        return int(ctx.step("charge", charge, ctx.task_id))

    old = scheduler.submit("wf", key="order-7")
    Worker(scheduler, owner="w").run_due()
    assert scheduler.get(old).result == old
    clock.advance(timedelta(days=8))
    assert store.purge(clock.now()) == 1
    new = scheduler.submit("wf", key="order-7")
    assert new != old  # ids are never reused: no step of the old one belongs to it
    Worker(scheduler, owner="w").run_due()
    assert scheduler.get(new).result == new
    assert runs == [old, new]
