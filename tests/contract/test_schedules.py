"""Schedules on every backend: each (schedule, fire time) makes one task, by the same rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durablesched import TaskState
from durablesched.errors import ScheduleConflictError, ScheduleNotFoundError
from durablesched.schedules.declaration import (
    Origin,
    ScheduleStatus,
    parse_fire_key,
    schedule,
)

from ..conftest import BackendStore

MINUTE = timedelta(minutes=1)
LEASE = timedelta(seconds=30)
#: Midnight: the schedules here fire on whole minutes and hours after it.
START = datetime(2030, 1, 1, tzinfo=UTC)


def test_a_fire_time_makes_one_task_however_often_it_is_fired(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="tick", every=60, args={"n": 1}), START)
    assert store.next_fire_time() == datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    now = START + MINUTE
    (fired,) = store.fire_schedules(now)
    assert store.fire_schedules(now) == []
    assert store.fire_schedules(now + timedelta(seconds=30)) == []
    assert fired.task_id is not None and not fired.catch_up
    task = store.get(fired.task_id)
    assert task is not None
    assert (task.name, task.args, task.due_at, task.state) == (
        "t",
        {"n": 1},
        datetime(2030, 1, 1, 0, 1, tzinfo=UTC),
        TaskState.PENDING,
    )
    assert task.idempotency_key == "schedule:tick:2030-01-01T00:01:00Z"
    key = parse_fire_key(task.idempotency_key)
    assert key is not None and (key.schedule, key.fire_at, key.catch_up) == (
        "tick",
        fired.fire_at,
        False,
    )
    assert [e.detail for e in store.history(fired.task_id)] == ["submitted"]
    assert store.next_fire_time() == datetime(2030, 1, 1, 0, 2, tzinfo=UTC)


def _finish_all(store: BackendStore, now: datetime) -> None:
    for claim in store.claim("w", 100, now, LEASE):
        store.complete(claim, None, now)


@pytest.mark.parametrize(
    ("misfire", "expected"),
    [("skip", []), ("latest", [9]), ("all", [7, 8, 9])],
)
def test_misfire_policy_after_an_outage(
    store: BackendStore, misfire: str, expected: list[int]
) -> None:
    store.add_schedule(
        schedule("t", name="hourly", every=3600, misfire=misfire, max_catch_up=3), START
    )
    # No worker from 00:00 to 09:30: fire times 01:00 to 09:00 were missed.
    fired = store.fire_schedules(datetime(2030, 1, 1, 9, 30, tzinfo=UTC))
    assert [f.fire_at.hour for f in fired] == expected
    assert all(f.catch_up for f in fired)
    for f in fired:
        assert f.task_id is not None
        task = store.get(f.task_id)
        assert task is not None and task.idempotency_key is not None
        assert task.idempotency_key.endswith(":catch-up")
    assert store.next_fire_time() == datetime(2030, 1, 1, 10, tzinfo=UTC)


def test_overlap_skip_records_the_skip_and_allow_fires(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="skip", every=60), START)
    store.add_schedule(schedule("t", name="allow", every=60, overlap="allow"), START)
    first = store.fire_schedules(START + MINUTE)
    assert all(f.task_id for f in first)
    second = {f.schedule: f for f in store.fire_schedules(START + 2 * MINUTE)}
    assert second["skip"].task_id is None and second["skip"].skipped == "overlap"
    assert second["allow"].task_id is not None
    info = {i.schedule.name: i for i in store.list_schedules()}
    assert info["skip"].last_skip == "overlap"
    assert info["skip"].last_fire_at == START + 2 * MINUTE
    _finish_all(store, START + 2 * MINUTE)
    third = {f.schedule: f for f in store.fire_schedules(START + 3 * MINUTE)}
    assert third["skip"].task_id is not None  # the task before it finished
    info = {i.schedule.name: i for i in store.list_schedules()}
    assert info["skip"].last_task_state is TaskState.PENDING
    assert info["allow"].last_task_id == third["allow"].task_id


def test_sync_adds_updates_removes_and_restores_by_name(store: BackendStore) -> None:
    a = schedule("t", name="a", every=60)
    b = schedule("t", name="b", cron="0 7 * * *", timezone="Europe/Berlin")
    assert store.sync_schedules([a, b], START, {"t"}) == {"a": "added", "b": "added"}
    assert store.sync_schedules([a, b], START, {"t"}) == {}
    store.add_schedule(schedule("t", name="ops", every=300), START)
    store.pause_schedule("a", True, START)
    a2 = schedule("t", name="a", every=60, args={"n": 2})
    changes = store.sync_schedules([a2], START + MINUTE, {"t"})
    assert changes == {"a": "updated", "b": ScheduleStatus.REMOVED}
    info = {i.schedule.name: i for i in store.list_schedules()}
    assert info["a"].status == ScheduleStatus.PAUSED  # the pause stands
    assert info["a"].schedule.args == {"n": 2}
    assert info["b"].status == ScheduleStatus.REMOVED  # kept, firing nothing
    assert (info["ops"].status, info["ops"].origin) == (ScheduleStatus.ACTIVE, Origin.OPERATOR)
    assert store.fire_schedules(START + timedelta(days=2)) != []
    assert {f.schedule for f in store.fire_schedules(START + timedelta(days=3))} == {"ops"}
    assert store.sync_schedules([a2, b], START + timedelta(days=3), {"t"}) == {"b": "restored"}


def test_sync_leaves_the_schedules_of_tasks_it_does_not_have(store: BackendStore) -> None:
    store.sync_schedules([schedule("other", name="theirs", every=60)], START, {"other"})
    assert store.sync_schedules([], START, {"t"}) == {}
    assert store.sync_schedules([], START, {"other"}) == {"theirs": ScheduleStatus.REMOVED}


def test_sync_keeps_the_next_fire_time_when_the_times_did_not_change(store: BackendStore) -> None:
    store.sync_schedules([schedule("t", name="a", every=60)], START, {"t"})
    later = START + timedelta(hours=1)
    store.sync_schedules([schedule("t", name="a", every=60, args={"x": 1})], later, {"t"})
    (info,) = store.list_schedules()
    assert info.next_fire_at == START + MINUTE  # the missed fires stay missed, for the policy
    store.sync_schedules([schedule("t", name="a", every=120, args={"x": 1})], later, {"t"})
    (info,) = store.list_schedules()
    assert info.next_fire_at == later + 2 * MINUTE


def test_add_refuses_other_settings_under_a_name_and_changes_nothing(store: BackendStore) -> None:
    assert store.add_schedule(schedule("t", name="a", every=60), START) is True
    assert store.add_schedule(schedule("t", name="a", every=60), START) is False
    with pytest.raises(ScheduleConflictError, match="'a' exists with other settings"):
        store.add_schedule(schedule("t", name="a", every=61), START)
    (info,) = store.list_schedules()
    assert info.schedule.every == MINUTE


def test_pause_resume_remove_and_unknown_names(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="a", every=60), START)
    store.pause_schedule("a", True, START)
    assert store.next_fire_time() is None
    assert store.fire_schedules(START + timedelta(hours=1)) == []
    info = store.pause_schedule("a", False, START + timedelta(hours=1, seconds=30))
    assert info.status == ScheduleStatus.ACTIVE
    assert info.next_fire_at == START + timedelta(hours=1, minutes=1)  # no catch-up of the pause
    for call in (
        lambda: store.pause_schedule("nope", True, START),
        lambda: store.remove_schedule("nope"),
        lambda: store.fire_schedule_now("nope", START),
    ):
        with pytest.raises(ScheduleNotFoundError, match="no schedule named 'nope'"):
            call()
    store.fire_schedules(START + timedelta(hours=1, minutes=1))
    store.remove_schedule("a")
    assert store.list_schedules() == []


def test_run_now_makes_a_task_and_leaves_the_next_fire_time(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="a", every=3600), START)
    store.pause_schedule("a", True, START)
    now = START + timedelta(seconds=5)
    fired = store.fire_schedule_now("a", now)
    assert fired.task_id is not None and fired.fire_at == now
    task = store.get(fired.task_id)
    assert task is not None and task.idempotency_key == "schedule:a:2030-01-01T00:00:05Z:run-now"
    assert store.fire_schedule_now("a", now).task_id == fired.task_id
    (info,) = store.list_schedules()
    assert (info.status, info.next_fire_at) == (ScheduleStatus.PAUSED, START + timedelta(hours=1))


@pytest.mark.parametrize(
    ("zone", "expression", "start", "days", "expected"),
    [
        ("Europe/Berlin", "30 2 * * *", datetime(2026, 3, 28, tzinfo=UTC), 3,
         ["03-28 01:30", "03-29 01:00", "03-30 00:30"]),
        ("Europe/Berlin", "30 2 * * *", datetime(2026, 10, 24, tzinfo=UTC), 3,
         ["10-24 00:30", "10-25 00:30", "10-26 01:30"]),
        ("America/New_York", "30 2 * * *", datetime(2026, 3, 7, tzinfo=UTC), 3,
         ["03-07 07:30", "03-08 07:00", "03-09 06:30"]),
        ("America/New_York", "30 1 * * *", datetime(2026, 10, 31, tzinfo=UTC), 3,
         ["10-31 05:30", "11-01 05:30", "11-02 06:30"]),
    ],
)  # fmt: skip
def test_daylight_saving_nights_fire_once_through_the_store(  # noqa: PLR0917 - the case's fields
    store: BackendStore, zone: str, expression: str, start: datetime, days: int,
    expected: list[str],
) -> None:  # fmt: skip
    store.add_schedule(
        schedule("t", name="nightly", cron=expression, timezone=zone, overlap="allow"), start
    )
    fired = []
    now = start
    while now < start + timedelta(days=days):  # a worker's step every ten minutes
        now += timedelta(minutes=10)
        fired += store.fire_schedules(now)
    assert [f.fire_at.strftime("%m-%d %H:%M") for f in fired] == expected
    assert not any(f.catch_up for f in fired)


def test_a_schedules_tasks_go_to_its_queue_with_its_priority(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="q", every=60, queue="reports", priority=7), START)
    store.add_schedule(schedule("t", name="plain", every=60), START)
    made = {f.schedule: f.task_id or 0 for f in store.fire_schedules(START + MINUTE)}
    queued, plain = store.get(made["q"]), store.get(made["plain"])
    assert queued is not None and plain is not None
    assert (queued.queue, queued.priority) == ("reports", 7)
    assert (plain.queue, plain.priority) == ("default", 0)


def test_overlap_skip_looks_at_the_latest_fires_task_not_the_first(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="skip", every=60), START)
    (first,) = store.fire_schedules(START + MINUTE)
    _finish_all(store, START + MINUTE)  # the first fire's task is done
    (second,) = store.fire_schedules(START + 2 * MINUTE)
    assert second.task_id is not None and second.task_id != first.task_id
    # The second fire's task is still pending: the third fire is skipped, although the
    # first fire's task (the oldest with a task) has finished.
    (third,) = store.fire_schedules(START + 3 * MINUTE)
    assert (third.task_id, third.skipped) == (None, "overlap")
    assert len(store.list_tasks()) == 2


def test_a_fire_time_taken_by_run_now_makes_no_second_task_on_time(store: BackendStore) -> None:
    # Run-now at the very instant of the next fire time takes that fire: the step at
    # that time records nothing new (one fire per schedule and time, whatever made it).
    store.add_schedule(schedule("t", name="a", every=60, overlap="allow"), START)
    by_hand = store.fire_schedule_now("a", START + MINUTE)
    assert by_hand.task_id is not None
    assert store.fire_schedules(START + MINUTE) == []
    assert [t.id for t in store.list_tasks()] == [by_hand.task_id]
    assert store.next_fire_time() == START + 2 * MINUTE


def test_run_now_twice_at_one_instant_is_one_fire_even_after_its_task_ended(
    store: BackendStore,
) -> None:
    # The fire is recorded once: the second call answers with it, even when the task's
    # idempotency key is free again (cancelled), so a new task would otherwise be made.
    store.add_schedule(schedule("t", name="a", every=3600), START)
    now = START + timedelta(seconds=5)
    fired = store.fire_schedule_now("a", now)
    assert fired.task_id is not None
    store.request_cancel(fired.task_id, now)
    again = store.fire_schedule_now("a", now)
    assert (again.task_id, again.fire_at) == (fired.task_id, now)
    assert len(store.list_tasks()) == 1
