"""Time, injected: every component asks a :class:`Clock`, never ``datetime.now``.

Tests drive a :class:`ManualClock`; advancing it wakes anything waiting on it,
so no test has to sleep for a due time to arrive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from durablesched.errors import ConfigurationError

#: The longest a :class:`SystemClock` wait blocks in one go, so a wait whose
#: deadline moved (a new, earlier task) is never stuck on a stale timeout.
MAX_SYSTEM_WAIT = timedelta(seconds=60)


def thread_timeout(seconds: float) -> float:
    """``seconds`` as a thread's wait (a lock's, an event's) takes it: no more than
    ``threading.TIMEOUT_MAX``, which it refuses with an ``OverflowError`` (``math.inf``
    included: a wait with no bound is one of that many seconds)."""
    return min(seconds, threading.TIMEOUT_MAX)


@runtime_checkable
class Clock(Protocol):
    """Where time comes from. ``now()`` is always timezone-aware UTC."""

    def now(self) -> datetime: ...

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        """Block until ``event`` is set, the clock reaches ``until``, or ``max_wait`` real seconds.

        Returns True if the event was set. Spurious early returns are allowed:
        callers re-check their own conditions after every wake-up.
        """
        ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        timeout = MAX_SYSTEM_WAIT.total_seconds()
        if until is not None:
            timeout = min((until - self.now()).total_seconds(), timeout)
        if max_wait is not None:
            timeout = min(max_wait, timeout)
        if timeout <= 0:
            return event.is_set()
        return event.wait(timeout)


class ServerClock(SystemClock):
    """Another machine's clock (a database server's), read now and then, advanced locally.

    Workers on several hosts judge lease expiry by one clock, whatever their
    own say: each reads the server's time every ``resync`` seconds (placing
    the reading at the midpoint of the round trip) and adds its own monotonic
    time since. The error is at most half a round trip plus the drift of the
    local monotonic clock over ``resync`` seconds. If a reading fails, the
    last offset stands and the next call tries again.
    """

    def __init__(self, read: Callable[[], datetime], *, resync: float = 60.0) -> None:
        self._read = read
        self._resync = resync
        self._lock = threading.Lock()
        self._base: datetime | None = None
        self._base_mono = 0.0
        self._next_sync = 0.0
        self._sync()  # the first reading must work: its error goes to the caller

    def _sync(self) -> None:
        before = time.monotonic()
        try:
            server = self._read()
        except Exception:
            if self._base is None:
                raise
            self._next_sync = time.monotonic() + min(self._resync, 1.0)
            return
        after = time.monotonic()
        self._base, self._base_mono = server.astimezone(UTC), (before + after) / 2
        self._next_sync = after + self._resync

    def now(self) -> datetime:
        with self._lock:
            if time.monotonic() >= self._next_sync:
                self._sync()
            assert self._base is not None
            return self._base + timedelta(seconds=time.monotonic() - self._base_mono)

    @property
    def offset(self) -> timedelta:
        """Server time minus this host's wall clock, as last measured."""
        return self.now() - datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to; waiters wake when it moves."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start if start is not None else datetime(2030, 1, 1, tzinfo=UTC)
        _require_aware(start)
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()
        self._waiters: set[threading.Event] = set()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by ``delta`` (a timedelta or seconds) and wake waiters."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError(f"a manual clock only moves forward, got advance({step})")
        with self._lock:
            self._now += step
            now = self._now
        self._wake()
        return now

    def set(self, when: datetime) -> datetime:
        """Jump to ``when`` (not earlier than now) and wake waiters."""
        _require_aware(when)
        with self._lock:
            if when < self._now:
                raise ValueError(f"a manual clock only moves forward: {when} < {self._now}")
            self._now = when.astimezone(UTC)
            now = self._now
        self._wake()
        return now

    def wait(
        self, event: threading.Event, until: datetime | None, max_wait: float | None = None
    ) -> bool:
        with self._lock:
            if until is not None and self._now >= until:
                return event.is_set()
            self._waiters.add(event)
        try:
            # Woken either by the caller's own signal or by advance()/set(),
            # which sets the same event: the caller re-checks either way.
            return event.wait(max_wait)
        finally:
            with self._lock:
                self._waiters.discard(event)

    def _wake(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for event in waiters:
            event.set()


#: The longest lease, heartbeat interval or timeout accepted: a lease added to
#: any date a database holds must still be a date.
MAX_DURATION = timedelta(days=3650)


def positive_duration(value: timedelta | float, what: str) -> timedelta:
    """``value`` (a timedelta or seconds) as a positive timedelta, or a ConfigurationError."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ConfigurationError(f"{what} must be a timedelta or seconds, got {value!r}")
    step: timedelta | None
    try:
        step = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except (OverflowError, ValueError):  # inf, nan, 1e300
        step = None
    if step is None or step > MAX_DURATION:
        raise ConfigurationError(
            f"{what} must be a finite duration of at most {MAX_DURATION.days} days, got {value!r}"
        )
    if step <= timedelta(0):
        raise ConfigurationError(f"{what} must be positive, got {value!r}")
    return step


def _require_aware(when: datetime) -> None:
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"a naive datetime has no time zone: {when!r}; pass an aware one")
