"""Schedules from declaration to task: the registry, the Scheduler's API, the worker's step,
the task's context, and the testing helper; all on a manual clock, none sleeping."""

from __future__ import annotations

import bisect
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durablesched import (
    InvalidScheduleError,
    ManualClock,
    MemoryStore,
    ScheduleConflictError,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    UnknownTaskNameError,
    Worker,
)
from durablesched.schedules.timing import cron_times, iter_fires
from durablesched.testing import run_schedules_until

from ..conftest import WAIT

START = datetime(2030, 1, 1, tzinfo=UTC)


def app() -> tuple[TaskRegistry, list[tuple[Any, ...]]]:
    registry = TaskRegistry()
    seen: list[tuple[Any, ...]] = []

    @registry.task("report", pass_context=True)
    def report(ctx: TaskContext, region: str = "eu") -> None:
        seen.append((ctx.schedule, ctx.fire_time, ctx.catch_up, region, ctx.idempotency_key))

    return registry, seen


# (settings, the error, words it must say)
BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"cron": "0 7 * *"}, InvalidScheduleError, "must have 5 fields"),
    ({"cron": "0 25 * * *"}, InvalidScheduleError, "is not valid: Bad hour"),
    ({"cron": "0 7 31 2 *"}, InvalidScheduleError, "is not valid"),
    (
        {"cron": "0 7 * * *", "timezone": "Europe/Nowhere"},
        InvalidScheduleError,
        "unknown time zone",
    ),
    ({"every": 0}, InvalidScheduleError, "every must be from 1s"),
    ({"every": -5}, InvalidScheduleError, "every must be from 1s"),
    ({"every": timedelta(seconds=-1)}, InvalidScheduleError, "every must be from 1s"),
    ({"every": 60, "cron": "* * * * *"}, InvalidScheduleError, "either cron= or every="),
    ({}, InvalidScheduleError, "either cron= or every="),
    ({"every": 60, "timezone": "Europe/Berlin"}, InvalidScheduleError, "every= is elapsed time"),
    ({"every": 60, "misfire": "sometimes"}, InvalidScheduleError, "misfire must be"),
    ({"every": 60, "overlap": "maybe"}, InvalidScheduleError, "overlap must be"),
    ({"every": 60, "max_catch_up": 0}, InvalidScheduleError, "max_catch_up must be"),
    ({"every": 60, "queue": "no spaces"}, InvalidScheduleError, "queue must be"),
    ({"every": 60, "priority": 101}, InvalidScheduleError, "priority must be"),
    ({"every": 60, "args": {"nope": 1}}, InvalidScheduleError, "args do not fit"),
    ({"every": 60, "args": [1]}, InvalidScheduleError, "must be a JSON object"),
]


@pytest.mark.parametrize(("settings", "error", "words"), BAD, ids=lambda v: str(v)[:40])
def test_bad_declarations_name_the_problem_and_store_nothing(
    settings: dict[str, Any], error: type[Exception], words: str
) -> None:
    registry, _ = app()
    with pytest.raises(error, match=words):
        registry.schedule("report", name="bad", **settings)
    assert registry.schedules == []
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(START))
    with pytest.raises(error, match=words):
        scheduler.add_schedule("report", name="bad", **settings)
    assert scheduler.schedules() == []


def test_unknown_task_and_a_name_taken_with_other_settings() -> None:
    registry, _ = app()
    with pytest.raises(UnknownTaskNameError, match="'nope'"):
        registry.schedule("nope", every=60)
    registry.schedule("report", every=60)
    registry.schedule("report", every=60)  # the same again: allowed
    with pytest.raises(ScheduleConflictError, match="'report'"):
        registry.schedule("report", every=120)
    registry.schedule("report", name="us", every=60, args={"region": "us"})
    assert [s.name for s in registry.schedules] == ["report", "us"]


def test_the_worker_syncs_at_its_first_pass_and_fires_at_the_fire_time() -> None:
    registry, seen = app()
    registry.schedule("report", cron="0 7 * * *", timezone="Europe/Berlin")
    clock = ManualClock(START)
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    worker = Worker(scheduler)
    assert worker.run_due() == 0
    (info,) = scheduler.schedules()
    assert info.next_fire_at == datetime(2030, 1, 1, 6, tzinfo=UTC)  # 07:00 CET
    # An idle worker (no task due) sleeps until then.
    assert worker._next_wake_time(clock.now(), None) == info.next_fire_at
    clock.set(datetime(2030, 1, 1, 5, 59, 59, tzinfo=UTC))
    assert worker.run_due() == 0
    clock.set(datetime(2030, 1, 1, 6, tzinfo=UTC))
    assert worker.run_due() == 1
    assert seen == [
        ("report", datetime(2030, 1, 1, 6, tzinfo=UTC), False, "eu",
         "schedule:report:2030-01-01T06:00:00Z"),
    ]  # fmt: skip
    assert worker.run_due() == 0


def test_after_an_outage_the_latest_missed_fire_runs_once_as_a_catch_up() -> None:
    registry, seen = app()
    registry.schedule("report", every=3600)
    clock = ManualClock(START)
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    Worker(scheduler).run_due()
    clock.set(START + timedelta(hours=10, minutes=30))  # no worker ran for ten hours
    assert Worker(scheduler).run_due() == 1
    assert seen[0][1:3] == (START + timedelta(hours=10), True)
    assert seen[0][4] == "schedule:report:2030-01-01T10:00:00Z:catch-up"


def test_a_sleeping_worker_wakes_at_the_fire_time_of_a_manual_clock() -> None:
    registry, seen = app()
    registry.schedule("report", every=60, overlap="allow")
    clock = ManualClock(START)
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    worker = Worker(scheduler)
    worker.run_once()  # synced at START: the first fire is at one minute
    pause = threading.Event()
    worker.start()
    try:
        for n in (1, 2, 3):
            clock.advance(60)
            for _ in range(int(WAIT * 100)):  # bounded: the worker is woken, not polled
                if len(seen) >= n:
                    break
                pause.wait(0.01)
        assert [s[1] for s in seen] == [START + timedelta(minutes=m) for m in (1, 2, 3)]
    finally:
        assert worker.stop(WAIT)


def test_a_schedule_removed_from_code_stops_firing_and_says_so() -> None:
    registry, _ = app()
    registry.schedule("report", every=60)
    store = MemoryStore()
    clock = ManualClock(START)
    Worker(Scheduler(store, registry=registry, clock=clock)).run_due()
    changed, _ = app()  # the next deploy declares no schedule, and still has the task
    Worker(Scheduler(store, registry=changed, clock=clock)).run_due()
    (info,) = store.list_schedules()
    assert info.status == "removed from code"
    clock.advance(3600)
    assert Worker(Scheduler(store, registry=changed, clock=clock)).run_due() == 0


def test_run_schedules_until_walks_a_week_of_minutes_across_the_berlin_fall_back() -> None:
    registry, seen = app()
    registry.schedule("report", cron="* * * * *", timezone="Europe/Berlin", overlap="allow")
    clock = ManualClock(datetime(2026, 10, 22, tzinfo=UTC))
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    ran = run_schedules_until(scheduler, clock, datetime(2026, 10, 29, tzinfo=UTC))
    # Seven days of minutes, less the repeated hour's, which fired the first time round.
    assert ran == len(seen) == 7 * 24 * 60 - 60
    times = [s[1] for s in seen]
    assert len(set(times)) == len(times) and times == sorted(times)
    assert not any(s[2] for s in seen)
    tasks = scheduler.list_tasks(state=TaskState.SUCCEEDED, limit=20_000)
    assert len(tasks) == ran


def test_a_schedule_takes_its_tasks_queue_and_priority_unless_it_says() -> None:
    registry = TaskRegistry()
    registry.task("mail", queue="mail", priority=5)(lambda: None)
    assert (registry.schedule("mail", every=60).queue, registry.schedules[0].priority) == (
        "mail",
        5,
    )
    own = registry.schedule("mail", name="urgent", every=60, queue="urgent", priority=50)
    assert (own.queue, own.priority) == ("urgent", 50)


# -- nights the clocks change: a worker's start and restart --------------------------------------

#: Both 2026 transitions of Berlin and New York: (zone, the instant the clocks change).
NIGHTS = [
    pytest.param("Europe/Berlin", datetime(2026, 3, 29, 1, tzinfo=UTC), id="berlin-spring"),
    pytest.param("Europe/Berlin", datetime(2026, 10, 25, 1, tzinfo=UTC), id="berlin-fall"),
    pytest.param("America/New_York", datetime(2026, 3, 8, 7, tzinfo=UTC), id="new-york-spring"),
    pytest.param("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC), id="new-york-fall"),
]
QUARTERS = "*/15 * * * *"
GRACE = timedelta(seconds=60)


def quarters(zone: str, change: datetime) -> list[datetime]:
    """The quarter-hours' fire times around ``change``, walked from two days before it."""
    times = cron_times(QUARTERS, zone)
    return list(iter_fires(times, change - timedelta(days=2), change + timedelta(days=2)))


@pytest.mark.parametrize(("zone", "change"), NIGHTS)
def test_started_at_any_minute_of_a_night_the_clocks_change_the_next_fire_is_the_first_after(
    zone: str, change: datetime
) -> None:
    """A worker started at any minute of the day around the change syncs the code's
    schedule at its first pass: its next fire is the first of the sequence after then.
    (The store's other ways to it: tests/contract/test_schedule_clock_changes.py.)"""
    registry, _ = app()
    registry.schedule("report", cron=QUARTERS, timezone=zone)
    times = quarters(zone, change)
    wrong = []
    for m in range(-12 * 60, 12 * 60 + 1):
        now = change + timedelta(minutes=m)
        scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(now))
        assert Worker(scheduler).run_due() == 0
        (info,) = scheduler.schedules()
        if info.next_fire_at != times[bisect.bisect_right(times, now)]:
            wrong.append((now, info.next_fire_at, times[bisect.bisect_right(times, now)]))
    assert wrong == [], f"{len(wrong)} wrong (now, got, expected), the first: {wrong[:2]}"


@pytest.mark.parametrize(("zone", "change"), NIGHTS)
def test_restarted_at_any_minute_around_a_change_the_latest_missed_then_the_next_on_time(
    zone: str, change: datetime
) -> None:
    """A worker stopped 1 to 150 minutes before a minute of the six hours around the
    change, and another started then: the default policy runs the latest missed fire
    time as a catch-up, then those on time; the next fire is the first after the start."""
    registry, seen = app()
    registry.schedule("report", cron=QUARTERS, timezone=zone)
    times = quarters(zone, change)
    wrong: list[tuple[Any, ...]] = []
    for i, m in enumerate(range(-3 * 60, 3 * 60 + 1)):
        now = change + timedelta(minutes=m)
        stopped = now - timedelta(minutes=1 + (i * 37) % 150)
        clock = ManualClock(stopped)
        scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
        Worker(scheduler).run_due()
        clock.set(now)
        seen.clear()
        Worker(scheduler).run_due()
        due = times[bisect.bisect_right(times, stopped) : bisect.bisect_right(times, now)]
        missed = [(t, True) for t in due if t < now - GRACE]
        expected = missed[-1:] + [(t, False) for t in due if t >= now - GRACE]
        if [s[1:3] for s in seen] != expected:
            wrong.append((stopped, now, [s[1:3] for s in seen], expected))
        (info,) = scheduler.schedules()
        if info.next_fire_at != times[bisect.bisect_right(times, now)]:
            wrong.append((stopped, now, info.next_fire_at, times[bisect.bisect_right(times, now)]))
    assert wrong == [], f"{len(wrong)} wrong (stopped, now, got, expected), the first: {wrong[:2]}"


def test_stopped_in_the_first_pass_and_started_in_the_second_it_fires_at_three_cet() -> None:
    """Issue 27's case: a */15 schedule's worker stopped at 02:40 CEST, one started at
    02:50 CET runs 02:45 CEST as a catch-up; the next fire is 03:00 CET, not 04:00."""
    registry, seen = app()
    registry.schedule("report", cron=QUARTERS, timezone="Europe/Berlin")
    clock = ManualClock(datetime(2026, 10, 25, 0, 40, tzinfo=UTC))
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=clock)
    Worker(scheduler).run_due()
    clock.set(datetime(2026, 10, 25, 1, 50, tzinfo=UTC))
    assert Worker(scheduler).run_due() == 1
    assert [s[1:3] for s in seen] == [(datetime(2026, 10, 25, 0, 45, tzinfo=UTC), True)]
    assert scheduler.schedules()[0].next_fire_at == datetime(2026, 10, 25, 2, tzinfo=UTC)
