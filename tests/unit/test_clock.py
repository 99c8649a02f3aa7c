from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from durablesched import ManualClock, SystemClock

from ..conftest import WAIT

START = datetime(2030, 1, 1, tzinfo=UTC)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(START)
    assert clock.now() == START
    assert clock.advance(1.5) == START + timedelta(seconds=1.5)
    assert clock.set(START + timedelta(hours=1)) == START + timedelta(hours=1)
    with pytest.raises(ValueError, match="forward"):
        clock.set(START)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="naive"):
        ManualClock(datetime(2030, 1, 1))


class _Blocking(threading.Event):
    """An event that says when someone starts blocking on it.

    ``ManualClock.wait`` registers its waiter before it blocks on the event, so
    once :attr:`blocked` is set, advancing the clock must wake the waiter.
    """

    def __init__(self) -> None:
        super().__init__()
        self.blocked = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.blocked.set()
        return super().wait(timeout)


def test_advancing_wakes_a_waiter() -> None:
    clock = ManualClock(START)
    event = _Blocking()
    answers: list[bool] = []

    def waiter() -> None:
        # max_wait bounds the waiter itself: were advance() not to wake it, it
        # would answer False after WAIT seconds instead of hanging the suite.
        answers.append(clock.wait(event, START + timedelta(seconds=5), max_wait=WAIT))

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    assert event.blocked.wait(WAIT), "the waiter never blocked on the clock"
    clock.advance(5)
    t.join(WAIT)
    assert not t.is_alive(), f"advancing the clock did not wake the waiter within {WAIT} s"
    assert answers == [True], "the waiter returned without being woken by advance()"


def test_wait_past_deadline_returns_at_once() -> None:
    clock = ManualClock(START)
    assert clock.wait(threading.Event(), START) is False


def test_system_clock_is_aware_utc_and_wait_returns_on_event() -> None:
    clock = SystemClock()
    assert clock.now().tzinfo is UTC
    event = threading.Event()
    event.set()
    assert clock.wait(event, None) is True
    assert clock.wait(threading.Event(), clock.now() - timedelta(seconds=1)) is False


def test_system_clock_reads_the_wall_clock_as_freezegun_sets_it() -> None:
    from freezegun import freeze_time  # noqa: PLC0415 - freezegun patches on import use

    with freeze_time("2031-05-06 07:08:09", tz_offset=0) as frozen:
        clock = SystemClock()
        assert clock.now() == datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
        frozen.tick(timedelta(seconds=90))
        assert clock.now() == datetime(2031, 5, 6, 7, 9, 39, tzinfo=UTC)
