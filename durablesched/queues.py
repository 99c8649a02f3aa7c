"""Named queues: their names, task priorities, and the limits every worker obeys.

A queue's limits live in the database (the ``queues`` table, or the in-memory
store's dict) and are applied inside the claim's own transaction, so they hold
across every worker process and host. This module is the arithmetic both
backends share: what a name or a rate may be, and how many tasks of a queue a
claim may start now.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict

from durablesched.errors import InvalidTaskError
from durablesched.records import DEFAULT_QUEUE

__all__ = [
    "DEFAULT_QUEUE",
    "KEEP",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "Keep",
    "QueueInfo",
    "QueueLimits",
    "Rate",
    "check_priority",
    "check_queue",
]

#: Django's range: higher runs first.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
MAX_QUEUE_LENGTH = 100
_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_RATE = re.compile(r"\s*(\d{1,9})\s*/\s*(\d{0,9})\s*(s|sec|second|m|min|minute|h|hour)\s*")
_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def check_queue(name: object, what: str = "queue") -> str:
    """A queue name: 1 to 100 letters, digits, ``.``, ``_`` or ``-``, starting with a
    letter or digit (it shows in URLs, metrics labels and shell commands as it is)."""
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise InvalidTaskError(
            f"{what} must be letters, digits, '.', '_' or '-' (starting with a letter or "
            f"digit), got {name!r}"
        )
    if len(name) > MAX_QUEUE_LENGTH:
        raise InvalidTaskError(f"{what} is longer than {MAX_QUEUE_LENGTH} characters")
    return name


def check_priority(priority: object, what: str = "priority") -> int:
    """An integer from -100 to 100 (higher runs first)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidTaskError(f"{what} must be an integer, got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidTaskError(
            f"{what} must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority}"
        )
    return priority


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` attempts started in any window of ``per``, across every worker."""

    count: int
    per: timedelta

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise InvalidTaskError(f"a rate's count must be a positive integer, got {self.count!r}")
        if not isinstance(self.per, timedelta) or not (
            timedelta(0) < self.per <= timedelta(days=1)
        ):
            raise InvalidTaskError(f"a rate's window must be from 1 s to 1 day, got {self.per!r}")

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"10/s"``, ``"100/m"``, ``"5/10s"``, ``"1000/h"``."""
        match = _RATE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidTaskError(
                f"a rate is COUNT/WINDOW such as 10/s, 100/m, 5/10s or 1000/h, got {text!r}"
            )
        count, number, unit = match.groups()
        seconds = int(number or 1) * _UNITS[unit]
        if seconds == 0:
            raise InvalidTaskError(f"a rate's window must be from 1 s to 1 day, got {text!r}")
        return cls(int(count), timedelta(seconds=seconds))

    def forget_before(self, now: datetime) -> datetime:
        """Start times up to this one may be forgotten by a claim at ``now``: two windows
        back, not one, because a claim reads its clock before it waits for the write
        lock, so another with a later time may commit first; a claim up to a window
        behind that one must still count every start of its own window."""
        return now - 2 * self.per

    def __str__(self) -> str:
        seconds = int(self.per.total_seconds())
        for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
            if seconds % size == 0:
                n = seconds // size
                return f"{self.count}/{'' if n == 1 else n}{unit}"
        raise AssertionError(seconds)  # pragma: no cover - every whole second divides by 1


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """What is stored for one queue: its global limits and whether it is paused."""

    name: str
    concurrency: int | None = None
    rate: Rate | None = None
    paused: bool = False
    #: At most this many tasks of one ``limit_key`` RUNNING at once (None: no limit per key).
    concurrency_per_key: int | None = None
    #: At most ``count`` starts of one ``limit_key`` in any window of ``per``.
    rate_per_key: Rate | None = None

    def __post_init__(self) -> None:
        check_queue(self.name)
        for what, value in (
            ("concurrency", self.concurrency),
            ("concurrency per key", self.concurrency_per_key),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1
            ):
                raise InvalidTaskError(
                    f"a queue's {what} must be a positive integer, got {value!r}"
                )

    @property
    def limited(self) -> bool:
        """True if a claim must count (or, per key, take the queue's lock) before it starts
        anything of this queue."""
        return self.paused or self.concurrency is not None or self.rate is not None or self.keyed

    @property
    def keyed(self) -> bool:
        """True if this queue limits each ``limit_key``: its keys have heads."""
        return self.concurrency_per_key is not None or self.rate_per_key is not None

    @property
    def per_key_concurrency_only(self) -> bool:
        """True if a concurrency per key is all that limits this queue (a claim then has
        nothing of the queue's to count before it picks its tasks)."""
        return (
            self.concurrency_per_key is not None
            and self.rate_per_key is None
            and self.concurrency is None
            and self.rate is None
            and not self.paused
        )

    @property
    def key_cap(self) -> int | None:
        """How many of one key may run at once where the queue limits keys (a rate alone:
        no number), None where it does not (the triggers' ``cap``)."""
        if self.concurrency_per_key is not None:
            return self.concurrency_per_key
        return KEY_CAP_UNLIMITED if self.rate_per_key is not None else None

    def allowance(self, wanted: int, running: int, started: list[datetime], now: datetime) -> int:
        """How many of ``wanted`` tasks a claim at ``now`` may start: ``running`` are
        RUNNING anywhere, ``started`` are the start times the rate window remembers."""
        if self.paused:
            return 0
        n = wanted
        if self.concurrency is not None:
            n = min(n, self.concurrency - running)
        if self.rate is not None:
            since = now - self.rate.per
            n = min(n, self.rate.count - sum(1 for t in started if t > since))
        return max(n, 0)

    def rate_frees_at(self, started: list[datetime], now: datetime) -> datetime | None:
        """When the rate window next admits a start, if it is full at ``now``."""
        if self.rate is None or self.paused:
            return None
        since = now - self.rate.per
        recent = sorted(t for t in started if t > since)
        if len(recent) < self.rate.count:
            return None
        return recent[len(recent) - self.rate.count] + self.rate.per


#: The cap per key of a queue with a rate per key and no concurrency per key.
KEY_CAP_UNLIMITED = 2**31 - 1


def rate_frees_at(rate: Rate, started: list[datetime], now: datetime) -> datetime | None:
    """When ``rate``'s window next admits a start after ``started``, if it is full at
    ``now``: the start that must leave the window, plus the window."""
    since = now - rate.per
    recent = sorted(t for t in started if t > since)
    if len(recent) < rate.count:
        return None
    return recent[len(recent) - rate.count] + rate.per


class Keep:
    """The type of :data:`KEEP`: "leave this limit as it is" in ``Scheduler.set_queue``."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


class QueueInfo(TypedDict):
    """One queue as ``queue ls`` shows it."""

    name: str
    paused: bool
    concurrency: int | None
    rate: str | None
    concurrency_per_key: int | None
    rate_per_key: str | None
    #: Limit keys with as many tasks RUNNING as the queue's concurrency per key allows,
    #: or whose rate window is full.
    keys_at_limit: int
    counts: dict[str, int]
    #: RUNNING tasks whose attempts started.
    running: int
    oldest_waiting_seconds: float | None
    #: RUNNING tasks claimed ahead, waiting in a worker for a slot (not started): with
    #: ``running``, the RUNNING count.
    waiting: int
