"""The overview's chart reads the whole hour once, then only what settled since: the
counts it shows are always those of a read of the whole hour."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from durablesched import MemoryStore
from durablesched.dashboard.chart import minutes
from durablesched.dashboard.reads import CHART_SPAN, MinuteCache
from durablesched.records import MinuteCounts, NewTask

from ..conftest import T0

LEASE = timedelta(seconds=30)


class Counting(MemoryStore):
    """Remembers each window the cache asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: list[timedelta] = []

    def minute_counts(self, since: datetime, now: datetime) -> list[MinuteCounts]:
        self.windows.append(now - since)
        return super().minute_counts(since, now)


def test_refreshes_read_only_the_last_minutes_and_count_the_same() -> None:
    store = Counting()
    cache = MinuteCache()
    rng = random.Random(3)
    now = T0
    for step in range(400):
        if step % 7:
            now += timedelta(seconds=rng.choice([0.5, 7, 20, 59.999999]))
        else:  # on a minute's first instant exactly, now and then
            now = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
        store.submit([NewTask("t", {}, now, 1)], now)
        for claim in store.claim("w", 5, now, LEASE):
            store.complete(claim, None, now)
        shown = minutes(now, 60)[0]  # the chart's first minute
        expected = [m for m in store.minute_counts(now - CHART_SPAN, now) if m.minute >= shown]
        store.windows.clear()
        got = [m for m in cache.last_hour(store, now) if m.minute >= shown]
        assert got == expected, step
    assert max(store.windows) < timedelta(minutes=2)  # a refresh, not the hour
