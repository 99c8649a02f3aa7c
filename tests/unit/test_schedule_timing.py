"""Fire times by the rules of docs/schedules.md: plain datetimes, no store, no clock."""

from __future__ import annotations

import bisect
import itertools
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from durablesched.schedules.timing import (
    CronTimes,
    EveryTimes,
    Fire,
    Misfire,
    cron_times,
    iter_fires,
    plan,
)


def u(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc,arg-type]


def fires(times: CronTimes | EveryTimes, after: datetime, until: datetime) -> list[datetime]:
    return list(iter_fires(times, after, until))


# (zone, expression, after, until, expected fire times in UTC)
DST_CASES = [
    pytest.param(
        "Europe/Berlin", "30 2 * * *", u(2026, 3, 28, 0), u(2026, 3, 30, 12),
        [u(2026, 3, 28, 1, 30), u(2026, 3, 29, 1, 0), u(2026, 3, 30, 0, 30)],
        id="berlin-spring-missing-0230-fires-at-0300-cest",
    ),
    pytest.param(
        "Europe/Berlin", "*/30 * * * *", u(2026, 3, 29, 0, 10), u(2026, 3, 29, 1, 40),
        [u(2026, 3, 29, 0, 30), u(2026, 3, 29, 1, 0), u(2026, 3, 29, 1, 30)],
        id="berlin-spring-missing-hour-fires-once-at-the-jump",
    ),
    pytest.param(
        "Europe/Berlin", "30 2 * * *", u(2026, 10, 24, 12), u(2026, 10, 26, 12),
        [u(2026, 10, 25, 0, 30), u(2026, 10, 26, 1, 30)],
        id="berlin-fall-repeated-0230-fires-once-first",
    ),
    pytest.param(
        "Europe/Berlin", "*/30 * * * *", u(2026, 10, 24, 23, 40), u(2026, 10, 25, 2, 40),
        [u(2026, 10, 25, 0, 0), u(2026, 10, 25, 0, 30), u(2026, 10, 25, 2, 0),
         u(2026, 10, 25, 2, 30)],
        id="berlin-fall-repeated-hour-not-again",
    ),
    pytest.param(
        "America/New_York", "30 2 * * *", u(2026, 3, 7, 12), u(2026, 3, 9, 12),
        [u(2026, 3, 8, 7, 0), u(2026, 3, 9, 6, 30)],
        id="new-york-spring-missing-0230-fires-at-0300-edt",
    ),
    pytest.param(
        "America/New_York", "30 1 * * *", u(2026, 10, 31, 12), u(2026, 11, 2, 12),
        [u(2026, 11, 1, 5, 30), u(2026, 11, 2, 6, 30)],
        id="new-york-fall-repeated-0130-fires-once-first",
    ),
    pytest.param(
        "America/New_York", "0 * * * *", u(2026, 11, 1, 3, 30), u(2026, 11, 1, 7, 30),
        [u(2026, 11, 1, 4), u(2026, 11, 1, 5), u(2026, 11, 1, 7)],
        id="new-york-fall-hourly-skips-the-repeated-0100",
    ),
    pytest.param(
        "America/New_York", "0 * * * *", u(2026, 3, 8, 5, 30), u(2026, 3, 8, 8, 30),
        [u(2026, 3, 8, 6), u(2026, 3, 8, 7), u(2026, 3, 8, 8)],
        id="new-york-spring-hourly-0200-is-0300",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("zone", "expression", "after", "until", "expected"), DST_CASES)
def test_daylight_saving_rules(
    zone: str, expression: str, after: datetime, until: datetime, expected: list[datetime]
) -> None:
    assert fires(cron_times(expression, zone), after, until) == expected


def test_inside_the_second_pass_of_a_repeated_hour_nothing_fires_again() -> None:
    times = cron_times("30 2 * * *", "Europe/Berlin")
    second_pass = u(2026, 10, 25, 1, 10)  # 02:10 CET, after 02:30 CEST fired at 00:30 UTC
    assert times.next_after(second_pass) == u(2026, 10, 26, 1, 30)
    assert times.latest_before(second_pass, u(2026, 10, 20), 1) == [u(2026, 10, 25, 0, 30)]


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
@pytest.mark.parametrize("expression", ["* * * * *", "*/7 * * * *", "15,45 1-3 * * *"])
def test_latest_before_agrees_with_next_after_across_both_2026_transitions(
    zone: str, expression: str
) -> None:
    times = cron_times(expression, zone)
    for start, end in [(u(2026, 3, 7, 20), u(2026, 3, 30)), (u(2026, 10, 24), u(2026, 11, 2, 12))]:
        forward = fires(times, start, end)
        assert forward == sorted(set(forward))
        for i in range(5, len(forward), max(1, len(forward) // 40)):
            got = times.latest_before(forward[i] + timedelta(seconds=1), start, 5)
            assert got == forward[i - 4 : i + 1]


def test_a_month_of_minutes_in_berlin_is_every_minute_once_less_the_repeated_hour() -> None:
    times = cron_times("* * * * *", "Europe/Berlin")
    started = time.perf_counter()
    october = fires(times, u(2026, 9, 30, 22) - timedelta(seconds=1), u(2026, 10, 31, 22, 59))
    elapsed = time.perf_counter() - started
    # 31 days of minutes plus the hour October gains, less that hour's minutes,
    # which already fired the first time round.
    assert len(october) == 31 * 24 * 60
    assert len(set(october)) == len(october)
    gaps = {b - a for a, b in itertools.pairwise(october)}
    assert gaps == {timedelta(minutes=1), timedelta(hours=1, minutes=1)}
    assert elapsed < 2.0, elapsed


def test_every_is_exact_elapsed_time_across_a_clock_change() -> None:
    times = EveryTimes(timedelta(minutes=45))
    got = fires(times, u(2026, 10, 25, 0, 0), u(2026, 10, 25, 3, 0))
    assert got == [u(2026, 10, 25, 0, 45), u(2026, 10, 25, 1, 30), u(2026, 10, 25, 2, 15),
                   u(2026, 10, 25, 3, 0)]  # fmt: skip
    assert times.latest_before(u(2026, 10, 25, 3, 0), u(2026, 10, 25, 1), 2) == got[1:3]
    assert times.next_after(u(2026, 10, 25, 3, 0)) == u(2026, 10, 25, 3, 45)


def test_six_fields_have_seconds_first() -> None:
    times = CronTimes("*/15 * * * * *", ZoneInfo("UTC"))
    assert fires(times, u(2030, 1, 1), u(2030, 1, 1, 0, 1)) == [
        u(2030, 1, 1, 0, 0, s) for s in (15, 30, 45)
    ] + [u(2030, 1, 1, 0, 1)]


# -- misfires ---------------------------------------------------------------------------------

HOURLY = EveryTimes(timedelta(hours=1))


def test_nothing_due_plans_nothing() -> None:
    p = plan(HOURLY, u(2030, 1, 1, 5), u(2030, 1, 1, 4, 59), misfire=Misfire.ALL, max_catch_up=9)
    assert (p.fires, p.next_fire_at) == ((), u(2030, 1, 1, 5))


def test_on_time_fire() -> None:
    p = plan(HOURLY, u(2030, 1, 1, 5), u(2030, 1, 1, 5, 0, 1), misfire=Misfire.SKIP, max_catch_up=1)
    assert p.fires == (Fire(u(2030, 1, 1, 5), catch_up=False),)
    assert p.next_fire_at == u(2030, 1, 1, 6)


@pytest.mark.parametrize(
    ("misfire", "expected"),
    [
        (Misfire.SKIP, []),
        (Misfire.LATEST, [u(2030, 1, 1, 9)]),
        (Misfire.ALL, [u(2030, 1, 1, h) for h in (7, 8, 9)]),
    ],
)
def test_misfire_policies_after_an_outage(misfire: Misfire, expected: list[datetime]) -> None:
    # Down from 04:30 to 09:30: fire times 05:00 to 09:00 were missed.
    p = plan(HOURLY, u(2030, 1, 1, 5), u(2030, 1, 1, 9, 30), misfire=misfire, max_catch_up=3)
    assert [f.at for f in p.fires] == expected
    assert all(f.catch_up for f in p.fires)
    assert p.next_fire_at == u(2030, 1, 1, 10)
    assert p.missed == 5 - len(expected)


def test_within_grace_a_late_fire_is_on_time_not_a_catch_up() -> None:
    p = plan(
        HOURLY, u(2030, 1, 1, 5), u(2030, 1, 1, 5, 0, 59), misfire=Misfire.SKIP, max_catch_up=1
    )
    assert p.fires == (Fire(u(2030, 1, 1, 5), catch_up=False),)


def test_a_year_of_missed_seconds_plans_in_milliseconds() -> None:
    every_second = EveryTimes(timedelta(seconds=1))
    started = time.perf_counter()
    p = plan(every_second, u(2029, 1, 1), u(2030, 1, 1), misfire=Misfire.ALL, max_catch_up=100)
    assert time.perf_counter() - started < 0.5
    assert len([f for f in p.fires if f.catch_up]) == 100
    assert p.next_fire_at == u(2030, 1, 1, 0, 0, 1)


# -- from any moment of a night the clocks change -------------------------------------------------

#: The four 2026 transitions of Berlin and New York: (zone, the instant the clocks change).
CHANGES = [
    pytest.param("Europe/Berlin", u(2026, 3, 29, 1), id="berlin-spring-forward"),
    pytest.param("Europe/Berlin", u(2026, 10, 25, 1), id="berlin-fall-back"),
    pytest.param("America/New_York", u(2026, 3, 8, 7), id="new-york-spring-forward"),
    pytest.param("America/New_York", u(2026, 11, 1, 6), id="new-york-fall-back"),
]
#: Fixed times in and just after either zone's changed hour, quarter-hours, minutes,
#: and half a minute past every tenth (a six-field expression).
EXPRESSIONS = [
    "0 3 * * *",
    "30 2 * * *",
    "0,30 1-3 * * *",
    "*/15 * * * *",
    "* * * * *",
    "30 */10 * * * *",
]


def day_around(change: datetime) -> list[datetime]:
    """Every minute from 12 hours before ``change`` to 12 hours after."""
    return [change + timedelta(minutes=m) for m in range(-12 * 60, 12 * 60 + 1)]


def sequence(times: CronTimes, change: datetime) -> list[datetime]:
    """The fire times around ``change``, walked from two days before it."""
    return fires(times, change - timedelta(days=2), change + timedelta(days=2))


@pytest.mark.parametrize(("zone", "change"), CHANGES)
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_from_any_moment_of_the_day_the_next_fire_is_the_next_in_the_sequence(
    zone: str, change: datetime, expression: str
) -> None:
    """What adding, syncing, resuming and changing the times of a schedule compute at
    ``now``: the first fire time after it, whichever pass of a repeated hour it is in;
    and the fire times before it, which a misfire's catch-up reads."""
    times = cron_times(expression, zone)
    full = sequence(times, change)
    wrong = []
    for start in day_around(change):
        expected = full[bisect.bisect_right(full, start)]
        got = times.next_after(start)
        if got != expected:
            wrong.append((start, got, expected))
        if abs(start - change) <= timedelta(hours=3):  # what a misfire reads (slower)
            i = bisect.bisect_left(full, start)
            assert times.latest_before(start, full[0], 2) == full[max(0, i - 2) : i], start
    assert wrong == [], f"{len(wrong)} wrong, the first (start, got, expected): {wrong[:3]}"


@pytest.mark.parametrize(("zone", "change"), CHANGES)
@pytest.mark.parametrize("expression", ["0,30 1-3 * * *", "*/15 * * * *", "0 3 * * *"])
def test_a_restart_at_any_moment_of_the_day_fires_the_missed_then_the_next_on_time(
    zone: str, change: datetime, expression: str
) -> None:
    """A worker stopped, then started at ``now`` (``misfire="all"``): every fire time of
    the sequence since the stop, those more than grace ago as catch-ups, and then the
    first fire time after now."""
    times = cron_times(expression, zone)
    full = sequence(times, change)
    grace = timedelta(seconds=60)
    for i, now in enumerate(day_around(change)):
        stopped = now - timedelta(minutes=1 + (i * 37) % 150)  # down from 1 to 150 minutes
        first = bisect.bisect_right(full, stopped)
        due = full[first : bisect.bisect_right(full, now)]
        p = plan(times, full[first], now, misfire=Misfire.ALL, max_catch_up=1000, grace=grace)
        expected = [Fire(t, catch_up=t < now - grace) for t in due]
        assert list(p.fires) == expected, (stopped, now)
        assert p.next_fire_at == full[first + len(due)], (stopped, now)


@pytest.mark.parametrize(
    ("expression", "start", "expected"),
    [
        # Added at 02:20 CET (the second pass): today's 03:00 CET, not tomorrow's.
        ("0 3 * * *", u(2026, 10, 25, 1, 20), u(2026, 10, 25, 2)),
        # Added at 02:20 CET: 03:00 CET, not 03:30.
        ("*/15 * * * *", u(2026, 10, 25, 1, 20), u(2026, 10, 25, 2)),
        # Added at 02:59:59 CET: 03:00 CET, a second later.
        ("*/15 * * * *", u(2026, 10, 25, 1, 59, 59), u(2026, 10, 25, 2)),
        # Added at 02:40 CEST (the first pass): 02:45 CEST, in the first pass.
        ("*/15 * * * *", u(2026, 10, 25, 0, 40), u(2026, 10, 25, 0, 45)),
    ],
)
def test_in_the_second_pass_of_the_repeated_hour_the_next_fire_is_the_first_after_it(
    expression: str, start: datetime, expected: datetime
) -> None:
    assert cron_times(expression, "Europe/Berlin").next_after(start) == expected


def test_stopped_in_the_first_pass_restarted_in_the_second_catches_up_then_fires_on_time() -> None:
    times = cron_times("*/15 * * * *", "Europe/Berlin")
    # Stopped at 02:40 CEST, due at 02:45 CEST; restarted at 02:50 CET.
    p = plan(times, u(2026, 10, 25, 0, 45), u(2026, 10, 25, 1, 50), misfire=Misfire.LATEST,
             max_catch_up=1)  # fmt: skip
    assert p.fires == (Fire(u(2026, 10, 25, 0, 45), catch_up=True),)
    assert p.next_fire_at == u(2026, 10, 25, 2)  # 03:00 CET


@pytest.mark.parametrize(
    ("zone", "change"),
    [
        pytest.param("Australia/Lord_Howe", u(2026, 4, 4, 15), id="lord-howe-back-half-an-hour"),
        pytest.param("Antarctica/Troll", u(2026, 10, 25, 1), id="troll-back-two-hours"),
    ],
)
def test_a_repeated_half_hour_or_two_hours_the_same(zone: str, change: datetime) -> None:
    """Not every repeated stretch is an hour: the next fire from any minute of it and
    around it is still the next of the sequence."""
    times = cron_times("*/15 * * * *", zone)
    full = sequence(times, change)
    for start in [change + timedelta(minutes=m) for m in range(-3 * 60, 3 * 60 + 1)]:
        assert times.next_after(start) == full[bisect.bisect_right(full, start)], start
