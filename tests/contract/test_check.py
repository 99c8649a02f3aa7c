"""``check``: the same findings on every backend for expired leases, overdue tasks and
schedules."""

from __future__ import annotations

from datetime import timedelta

from durablesched import Finding, HealthReport, QueueLimits
from durablesched.records import NewTask
from durablesched.schedules.declaration import schedule

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)


def check(store: BackendStore, seconds: float, overdue_after: float = 300) -> HealthReport:
    report: HealthReport = store.check(  # type: ignore[attr-defined]
        at(seconds), overdue_after=timedelta(seconds=overdue_after)
    )
    return report


def test_a_healthy_queue_has_no_findings(store: BackendStore) -> None:
    store.submit([NewTask("t", {}, at(10), 3), NewTask("later", {}, at(10_000), 3)], T0)
    store.claim("w", 1, at(10), LEASE)
    report = check(store, 20)
    assert report.healthy and report.findings == ()


def test_an_expired_lease_is_a_finding_naming_its_task(store: BackendStore) -> None:
    ids = [s.task_id for s in store.submit([NewTask(n, {}, at(10), 3) for n in "ab"], T0)]
    store.claim("w", 2, at(10), LEASE)
    assert check(store, 39.9).healthy  # it expires at 40
    (finding,) = check(store, 45).findings
    assert finding == Finding(
        "leases",
        "2 RUNNING tasks on an expired lease (the oldest expired 5s ago)",
        finding.advice,
        tuple(ids),
    )
    assert "a running worker reclaims them" in finding.advice


def test_a_task_nobody_claimed_long_after_its_due_time_is_a_finding(
    store: BackendStore,
) -> None:
    (s,) = store.submit([NewTask("t", {}, at(10), 3)], T0)
    assert check(store, 310).healthy  # due 300 s ago: not more than 300 s
    (finding,) = check(store, 400).findings
    assert (finding.check, finding.task_ids) == ("overdue", (s.task_id,))
    assert (
        finding.problem == "1 task due more than 300s ago and not claimed (the oldest due 390s ago)"
    )
    assert "is a worker running" in finding.advice


def test_a_paused_queue_s_tasks_are_held_back_not_overdue(store: BackendStore) -> None:
    (late,) = store.submit([NewTask("t", {}, at(10), 3)], T0)
    store.submit([NewTask("t", {}, at(10), 3, queue="reports")] * 2, T0)
    store.put_queue(QueueLimits("reports", paused=True), T0)
    (finding,) = check(store, 400).findings  # the default queue's task alone is late
    assert (finding.check, finding.task_ids) == ("overdue", (late.task_id,))
    assert finding.problem.startswith("1 task due")
    store.put_queue(QueueLimits("reports"), T0)  # resumed: its tasks are late again
    (finding,) = check(store, 400).findings
    assert finding.problem.startswith("3 tasks due")


def test_an_active_schedule_nothing_fired_long_after_its_time_is_a_finding(
    store: BackendStore,
) -> None:
    for name in ("b-tick", "a-tick", "resting"):
        store.add_schedule(schedule("t", name=name, every=60), T0)  # each first due at 60
    store.pause_schedule("resting", True, T0)
    assert check(store, 360).healthy  # due 300 s ago: not more than 300 s
    (finding,) = check(store, 400).findings
    assert finding == Finding(
        "schedules",
        "2 active schedules due to fire more than 300s ago and not fired "
        "(the oldest due 340s ago): a-tick, b-tick",
        finding.advice,
    )
    assert "start one" in finding.advice
    store.fire_schedules(at(400))  # a worker came back: the next fires are in the future
    assert check(store, 400).healthy
