"""A schedule's next fire time from any moment of a night the clocks change, on every backend.

Every way a store works one out from now (adding a schedule, the sync at a worker's start,
a change of its times, resuming, the first fire after a restart) must give the first fire
time after now of the schedule's whole sequence, walked from two days before: also from
the second pass of a repeated hour, whose times fired the first time round
(docs/schedules.md, "Fire times and daylight saving"). They all compute it with
``schedules/timing.py``, whose walk from every minute of the day around each change, for
more expressions, is in tests/unit/test_schedule_timing.py; here each way through a
store is walked across the changed hour.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from durablesched.schedules.declaration import Schedule, schedule
from durablesched.schedules.timing import cron_times, iter_fires

from ..conftest import BackendStore

#: Quarter-hours, and fixed times in and just after either zone's changed hour.
QUARTERS, NIGHTLY = "*/15 * * * *", "0,30 1-3 * * *"
#: A fire time is on time until this long after it (the default ``misfire_grace``).
GRACE = timedelta(seconds=60)


@dataclasses.dataclass
class Night:
    """One night the clocks change, and the fire times around it."""

    zone: str
    #: The instant the clocks change.
    change: datetime

    def __post_init__(self) -> None:
        self.times = {
            e: list(
                iter_fires(
                    cron_times(e, self.zone),
                    self.change - timedelta(days=2),
                    self.change + timedelta(days=2),
                )
            )
            for e in (QUARTERS, NIGHTLY)
        }
        self._checked: dict[tuple[Any, ...], Schedule] = {}

    def walk(self, backend: str) -> Iterator[tuple[str, str, datetime]]:
        """(a schedule name, its expression, now) for each moment to start from: on the
        in-memory store every minute of the six hours around the change; on a database,
        where each is a commit or more, every other minute of the changed hour and a few
        either side, for the quarter-hours."""
        if backend == "memory":
            minutes = range(-3 * 60, 3 * 60 + 1)
            starts = [(e, m) for e in (QUARTERS, NIGHTLY) for m in minutes]
        else:
            starts = [(QUARTERS, m) for m in range(-4, 66, 2)]
        for i, (expression, m) in enumerate(starts):
            name = f"{self.zone.split('/')[-1]}-{self.change:%m}-{i}"
            yield name, expression, self.change + timedelta(minutes=m)

    def first_after(self, expression: str, now: datetime) -> datetime:
        times = self.times[expression]
        return times[bisect.bisect_right(times, now)]

    def between(self, expression: str, after: datetime, until: datetime) -> list[datetime]:
        times = self.times[expression]
        return times[bisect.bisect_right(times, after) : bisect.bisect_right(times, until)]

    def schedule(self, name: str, expression: str, **settings: Any) -> Schedule:
        """The schedule named ``name`` (checked once per expression and settings)."""
        key = (expression, *sorted(settings.items()))
        if key not in self._checked:
            self._checked[key] = schedule("t", cron=expression, timezone=self.zone, **settings)
        return dataclasses.replace(self._checked[key], name=name)


def nights() -> list[Night]:
    """Both 2026 transitions of Berlin and of New York."""
    return [
        Night("Europe/Berlin", datetime(2026, 3, 29, 1, tzinfo=UTC)),
        Night("Europe/Berlin", datetime(2026, 10, 25, 1, tzinfo=UTC)),
        Night("America/New_York", datetime(2026, 3, 8, 7, tzinfo=UTC)),
        Night("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC)),
    ]


class Stored:
    """Next fire times to compare with the stored ones, a batch at a time; a checked
    batch is removed, so that no sync reads thousands of schedules."""

    BATCH = 120

    def __init__(self, store: BackendStore) -> None:
        self.store = store
        self.expected: dict[str, tuple[datetime, datetime]] = {}
        self.wrong: list[tuple[str, datetime, datetime, datetime]] = []

    def expect(self, name: str, now: datetime, next_fire_at: datetime) -> None:
        self.expected[name] = (now, next_fire_at)
        if len(self.expected) == self.BATCH:
            self.check()

    def check(self) -> None:
        stored = {i.schedule.name: i.next_fire_at for i in self.store.list_schedules()}
        for name, (now, expected) in self.expected.items():
            if stored[name] != expected:
                self.wrong.append((name, now, stored[name], expected))
            self.store.remove_schedule(name)
        self.expected.clear()

    def assert_right(self) -> None:
        self.check()
        assert self.wrong == [], report(self.wrong, "(schedule, now, stored, expected)")


def report(wrong: list[Any], fields: str) -> str:
    return f"{len(wrong)} wrong {fields}, the first: {wrong[:3]}"


def test_added_at_any_moment_the_first_fire_is_the_first_after_it(
    store: BackendStore, backend: str
) -> None:
    stored = Stored(store)
    for night in nights():
        for name, expression, now in night.walk(backend):
            assert store.add_schedule(night.schedule(name, expression), now)
            stored.expect(name, now, night.first_after(expression, now))
    stored.assert_right()


def test_synced_at_a_workers_start_at_any_moment_the_first_fire_is_the_first_after_it(
    store: BackendStore, backend: str
) -> None:
    stored = Stored(store)
    for night in nights():
        for name, expression, now in night.walk(backend):
            declared = [night.schedule(name, expression)]
            assert store.sync_schedules(declared, now, set()) == {name: "added"}
            stored.expect(name, now, night.first_after(expression, now))
    stored.assert_right()


def test_times_changed_at_any_moment_the_next_fire_is_the_first_after_it(
    store: BackendStore, backend: str
) -> None:
    stored = Stored(store)
    for night in nights():
        for name, expression, now in night.walk(backend):
            # Declared hourly a day before; the code now says the expression.
            before = [night.schedule(name, "0 * * * *")]
            store.sync_schedules(before, night.change - timedelta(days=1), set())
            changed = [night.schedule(name, expression)]
            assert store.sync_schedules(changed, now, set()) == {name: "updated"}
            stored.expect(name, now, night.first_after(expression, now))
    stored.assert_right()


def test_resumed_at_any_moment_the_next_fire_is_the_first_after_it(
    store: BackendStore, backend: str
) -> None:
    wrong = []
    for night in nights():
        for name, expression, now in night.walk(backend):
            store.add_schedule(night.schedule(name, expression), night.change - timedelta(days=1))
            store.pause_schedule(name, True, night.change - timedelta(days=1))
            got = store.pause_schedule(name, False, now).next_fire_at
            if got != night.first_after(expression, now):
                wrong.append((name, now, got, night.first_after(expression, now)))
    assert wrong == [], report(wrong, "(schedule, now, stored, expected)")


def test_restarted_at_any_moment_the_missed_fires_then_the_first_after_it(
    store: BackendStore, backend: str
) -> None:
    """No worker ran from ``stopped`` (1 to 150 minutes before now): ``misfire="all"``
    fires every fire time of the sequence since, those more than grace ago as catch-ups,
    and then the first fire time after now."""
    wrong: list[tuple[Any, ...]] = []
    for night in nights():
        for i, (name, expression, now) in enumerate(night.walk(backend)):
            stopped = now - timedelta(minutes=1 + (i * 37) % 150)
            declared = night.schedule(name, expression, misfire="all", max_catch_up=100)
            store.add_schedule(declared, stopped)
            fired = [(f.fire_at, f.catch_up) for f in store.fire_schedules(now)]
            due = [(t, t < now - GRACE) for t in night.between(expression, stopped, now)]
            if fired != due:
                wrong.append((name, stopped, now, fired, due))
            got = store.next_fire_time()
            if got != night.first_after(expression, now):
                wrong.append((name, stopped, now, got, night.first_after(expression, now)))
            store.remove_schedule(name)  # the next restart fires only its own schedule
    assert wrong == [], report(wrong, "(schedule, stopped, now, got, expected)")
