"""When a schedule fires: pure time arithmetic on plain datetimes, no I/O.

A cron expression names wall-clock times in a time zone; :class:`CronTimes`
turns them into instants by two rules, for the nights the clocks change:

- a wall-clock time that occurs twice (clocks go back) fires once, at its
  first occurrence;
- a wall-clock time that does not exist (clocks go forward) fires once, at the
  first instant after it, the moment the clocks jump (every missing time maps
  to that one instant, so it fires once however many of them the expression
  names).

``cronsim`` reads the expression and walks the calendar in naive wall-clock
time, where it is exact; the two rules are applied here, by ``zoneinfo``. The
mapping from wall-clock time to instant never goes backwards, which is what
lets :meth:`CronTimes.next_after` start from the latest wall-clock time that
fired by an instant (its reading; in the second pass of a repeated hour, that
hour's last second) and skip what has already fired.

:class:`EveryTimes` is exact elapsed time: ``epoch + k * interval`` in UTC,
so every worker computes the same fire times and no clock change moves them.

:func:`plan` decides, from the schedule's next fire time and now, which fire
times to fire and whether each is a catch-up, by the misfire policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol
from zoneinfo import ZoneInfo

from cronsim import CronSim


class Misfire(StrEnum):
    """What to do with fire times missed while no worker ran (deploys, outages)."""

    #: Fire none of them: the next fire is the next one on time.
    SKIP = "skip"
    #: One run for the most recent missed fire time (the default).
    LATEST = "latest"
    #: One run for each missed fire time, the most recent ``max_catch_up`` of them.
    ALL = "all"


class Overlap(StrEnum):
    """Whether a fire may start while the previous fire's task is still live."""

    #: Do not make a task while the previous fire's task is PENDING, RUNNING or
    #: RETRY_WAIT; the skip is recorded (the default).
    SKIP = "skip"
    #: Make the task regardless.
    ALLOW = "allow"


class FireTimes(Protocol):
    """A schedule's fire times, as instants in UTC."""

    def next_after(self, instant: datetime) -> datetime:
        """The first fire time strictly after ``instant``."""
        ...

    def latest_before(self, instant: datetime, floor: datetime, count: int) -> list[datetime]:
        """Up to ``count`` fire times ``t`` with ``floor <= t < instant``, the latest ones,
        oldest first."""
        ...


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class EveryTimes:
    """Fire times ``epoch + k * interval``: exact elapsed time, the same on every host."""

    interval: timedelta

    def next_after(self, instant: datetime) -> datetime:
        step = self.interval
        k = (instant - _EPOCH) // step + 1
        return _EPOCH + k * step

    def latest_before(self, instant: datetime, floor: datetime, count: int) -> list[datetime]:
        step = self.interval
        # The last k with epoch + k * step < instant.
        k = -((_EPOCH - instant) // step) - 1
        times: list[datetime] = []
        while len(times) < count:
            t = _EPOCH + k * step
            if t < floor:
                break
            times.append(t)
            k -= 1
        times.reverse()
        return times


@dataclass(frozen=True)
class CronTimes:
    """The instants a cron expression names in ``zone``, by the two rules of this module."""

    expression: str
    zone: ZoneInfo

    def next_after(self, instant: datetime) -> datetime:
        return next(self.walk(instant))

    def walk(self, instant: datetime) -> Iterator[datetime]:
        """Every fire time after ``instant``, in order, from one pass of the calendar."""
        last = instant
        for wall in CronSim(self.expression, self._last_wall(instant)):
            fire = self.instant(wall)
            # Skipped: a time of a repeated hour that fired the first time round,
            # and a missing time after the first (they share the jump's instant).
            if fire > last:
                last = fire
                yield fire

    def latest_before(self, instant: datetime, floor: datetime, count: int) -> list[datetime]:
        times: list[datetime] = []
        # Reverse iteration skips its start: begin a second after the latest
        # wall-clock time whose instant is before ``instant``.
        start = self._last_wall(instant) + timedelta(seconds=1)
        for wall in CronSim(self.expression, start, reverse=True):
            fire = self.instant(wall)
            if fire >= instant:
                continue
            if fire < floor or len(times) == count:
                break
            if not times or fire != times[-1]:  # missing times share one instant
                times.append(fire)
        times.reverse()
        return times

    def _last_wall(self, instant: datetime) -> datetime:
        """The latest wall-clock time that fires at or before ``instant``.

        Its own reading, except in the second pass of a repeated hour: there
        every time of that hour fired the first time round and none after it
        has, so it is the hour's last second, read before the clocks went back.
        """
        local = instant.astimezone(self.zone)
        wall = local.replace(tzinfo=None, fold=0)
        if not local.fold:
            return wall
        # The clocks went back between this reading's first occurrence and ``instant``.
        back = self._change(local.replace(fold=0).astimezone(UTC), instant)
        return (back - timedelta(seconds=1)).astimezone(self.zone).replace(tzinfo=None)

    def instant(self, wall: datetime) -> datetime:
        """The instant a naive wall-clock time in the zone fires at."""
        first = wall.replace(tzinfo=self.zone, fold=0)
        utc = first.astimezone(UTC)
        if utc.astimezone(self.zone).replace(tzinfo=None) == wall:
            return utc  # exists; if it occurs twice, fold=0 is its first occurrence
        return self._jump(wall)

    def _jump(self, wall: datetime) -> datetime:
        """The instant the clocks jumped over the missing time ``wall``, to the second."""
        # Read with the offset after the jump it is before the jump, with the
        # offset before it after: the jump lies between.
        low = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        high = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        return self._change(min(low, high), max(low, high))

    def _change(self, low: datetime, high: datetime) -> datetime:
        """The instant the zone's offset changed, once, after ``low`` and by ``high``.

        To the second, by bisection: ``zoneinfo`` answers offsets, not transitions.
        """
        offset = low.astimezone(self.zone).utcoffset()
        lo, hi = math.floor(low.timestamp()), math.ceil(high.timestamp())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, self.zone).utcoffset() == offset:
                lo = mid
            else:
                hi = mid
        return datetime.fromtimestamp(hi, UTC)


def cron_times(expression: str, zone: str) -> CronTimes:
    """:class:`CronTimes` for an expression and a zone name (checked by the declaration)."""
    return CronTimes(expression, ZoneInfo(zone))


@dataclass(frozen=True)
class Fire:
    """One fire time to make a task for."""

    at: datetime
    #: Missed while no worker ran, fired late by the misfire policy.
    catch_up: bool


@dataclass(frozen=True)
class Plan:
    """What one step does for one schedule: the fires to make and the next fire time."""

    fires: tuple[Fire, ...]
    next_fire_at: datetime
    #: Missed fire times left unfired by the policy (counted up to a bound: see :func:`plan`).
    missed: int


#: A fire time is on time until this long after it; later, it was missed.
DEFAULT_GRACE = timedelta(seconds=60)
#: The most fire times :func:`plan` counts as dropped (a year of seconds is not walked).
MISSED_COUNT_LIMIT = 1000


def plan(
    times: FireTimes,
    next_fire_at: datetime,
    now: datetime,
    *,
    misfire: Misfire,
    max_catch_up: int,
    grace: timedelta = DEFAULT_GRACE,
) -> Plan:
    """The fires due at ``now`` for a schedule whose next fire time is ``next_fire_at``.

    A fire time is *on time* while ``now < fire + grace``: those all fire (at
    most ``grace`` worth of them). Earlier ones were *missed*: ``SKIP`` fires
    none, ``LATEST`` the most recent, ``ALL`` the most recent ``max_catch_up``,
    each marked as a catch-up. The next fire time is the first after ``now``.
    """
    if next_fire_at > now:
        return Plan((), next_fire_at, 0)
    cutoff = now - grace
    fires: list[Fire] = []
    missed = 0
    if next_fire_at < cutoff:
        keep = {Misfire.SKIP: 0, Misfire.LATEST: 1, Misfire.ALL: max_catch_up}[misfire]
        window = times.latest_before(cutoff, next_fire_at, keep + MISSED_COUNT_LIMIT)
        kept = window[len(window) - keep :] if keep else []
        missed = len(window) - len(kept)
        fires.extend(Fire(t, catch_up=True) for t in kept)
        on_time = times.next_after(cutoff - timedelta(microseconds=1))
    else:
        on_time = next_fire_at
    while on_time <= now:
        fires.append(Fire(on_time, catch_up=False))
        on_time = times.next_after(on_time)
    return Plan(tuple(fires), on_time, missed)


def iter_fires(times: FireTimes, after: datetime, until: datetime) -> Iterator[datetime]:
    """Every fire time in ``(after, until]``, in order (for tests and ``schedule ls``)."""
    if isinstance(times, CronTimes):
        for t in times.walk(after):
            if t > until:
                return
            yield t
        return
    t = times.next_after(after)
    while t <= until:
        yield t
        t = times.next_after(t)
