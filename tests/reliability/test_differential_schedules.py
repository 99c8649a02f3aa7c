"""Model-based differential test of schedules: the SQL backends against the in-memory one.

Hypothesis drives random interleavings of schedule declarations (added by an
operator or synced from code), pauses, resumes, removals, run-now, clock
advances across misfires and daylight-saving nights, fires, and claims and
completions of the tasks made (which decide overlap skips), against both stores
in lockstep. Every call must answer alike, and after every step the stored
schedules, the next fire time and every task must be identical; no (schedule,
fire time) may ever make two tasks.

Apart from ``test_differential.py`` (the tasks' machine), whose helpers it uses.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import text

from durablesched import (
    ManualClock,
    MemoryStore,
    ScheduleConflictError,
    ScheduleNotFoundError,
    SQLiteStore,
)
from durablesched.schedules.declaration import Schedule, schedule
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.store import SQLStore

from .test_differential import SOAK, _fresh_db

LEASE = timedelta(seconds=30)
#: Just before the Berlin fall-back night of 2026: cron schedules cross it.
START = datetime(2026, 10, 24, 23, 0, tzinfo=UTC)

NAMES = ["a", "b", "c"]
TIMINGS: list[dict[str, Any]] = [
    {"every": 60},
    {"every": 900},
    {"cron": "*/20 * * * *", "timezone": "Europe/Berlin"},
    {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
    {"cron": "0 * * * *", "timezone": "America/New_York"},
]


def declared(name: str, timing: int, misfire: str, overlap: str, n: int) -> Schedule:
    return schedule(
        "t",
        name=name,
        args={"n": n},
        misfire=misfire,
        overlap=overlap,
        max_catch_up=3,
        **TIMINGS[timing],
    )


SCHEDULES = st.builds(
    declared,
    st.sampled_from(NAMES),
    st.integers(0, len(TIMINGS) - 1),
    st.sampled_from(["skip", "latest", "all"]),
    st.sampled_from(["skip", "allow"]),
    st.integers(0, 1),
)


def outcome(call: Any) -> Any:
    """The call's result, or the type of the schedule error it raised."""
    try:
        return call()
    except (ScheduleConflictError, ScheduleNotFoundError) as e:
        return type(e)


class SchedulesAgree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(START)
        self.memory = MemoryStore(compact_min=4)
        self.sql = self.make_sql()

    def make_sql(self) -> SQLStore:
        self.path = _fresh_db()
        return SQLiteStore(self.path)

    def teardown(self) -> None:
        self.sql.close()
        shutil.rmtree(self.path.parent, ignore_errors=True)

    def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        a = outcome(lambda: getattr(self.memory, method)(*args, **kwargs))
        b = outcome(lambda: getattr(self.sql, method)(*args, **kwargs))
        assert a == b, f"{method}{args}: memory {a!r} != {self.sql.dialect.name} {b!r}"
        return a

    # -- rules ----------------------------------------------------------------------------------

    @rule(s=SCHEDULES)
    def add(self, s: Schedule) -> None:
        self.both("add_schedule", s, self.clock.now())

    @rule(schedules=st.lists(SCHEDULES, max_size=3, unique_by=lambda s: s.name))
    def sync(self, schedules: list[Schedule]) -> None:
        self.both("sync_schedules", schedules, self.clock.now(), {"t"})

    @rule(name=st.sampled_from(NAMES), paused=st.booleans())
    def pause(self, name: str, paused: bool) -> None:
        self.both("pause_schedule", name, paused, self.clock.now())

    @rule(name=st.sampled_from(NAMES))
    def remove(self, name: str) -> None:
        self.both("remove_schedule", name)

    @rule(name=st.sampled_from(NAMES))
    def run_now(self, name: str) -> None:
        self.both("fire_schedule_now", name, self.clock.now())

    @rule(seconds=st.sampled_from([1, 30, 59, 60, 61, 600, 1200, 3600, 4 * 3600, 86400]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(limit=st.sampled_from([1, 2, 100]))
    def fire(self, limit: int) -> None:
        self.both("fire_schedules", self.clock.now(), limit=limit)

    @rule(after=st.sampled_from([0, 60, 300, 3600]))
    def check(self, after: int) -> None:
        """Overdue schedules (and tasks): the same findings on both."""
        now = self.clock.now()
        model = self.memory.check(now, overdue_after=timedelta(seconds=after))
        sql = self.sql.check(now, overdue_after=timedelta(seconds=after))
        assert model.findings == sql.findings, f"check: memory {model} != {sql}"

    @rule(count=st.integers(1, 4), finish=st.booleans())
    def work(self, count: int, finish: bool) -> None:
        """A worker claims some of the tasks made, and maybe finishes them."""
        now = self.clock.now()
        claims = self.both("claim", "w", count, now, LEASE)
        if finish:
            for claim in claims:
                self.both("complete", claim, None, now)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def same_schedules_and_tasks(self) -> None:
        assert self.memory.list_schedules() == self.sql.list_schedules()
        assert self.memory.next_fire_time() == self.sql.next_fire_time()
        assert self.memory.list_tasks(limit=10_000) == self.sql.list_tasks(limit=10_000)

    @invariant()
    def one_task_per_fire(self) -> None:
        keys = Counter(t.idempotency_key for t in self.memory.list_tasks(limit=10_000))
        assert all(n == 1 for n in keys.values()), keys


SchedulesAgree.TestCase.settings = settings(
    max_examples=300 if SOAK else 40,
    stateful_step_count=50 if SOAK else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

#: Runs the state machine under pytest.
TestSchedulesAgree = SchedulesAgree.TestCase


class PostgresSchedulesAgree(SchedulesAgree):
    """The same machine with PostgreSQL as the SQL side, in the test's own schema."""

    url = ""

    def make_sql(self) -> SQLStore:
        store = PostgresStore(self.url)
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "TRUNCATE schedule_fires, schedules, tasks, task_events, idempotency_keys "
                    "CASCADE"
                )
            )
            conn.execute(text("UPDATE durablesched_counters SET value = 0"))
        return store

    def teardown(self) -> None:
        self.sql.close()


def test_postgres_agrees_with_memory(pg_url: str) -> None:
    PostgresSchedulesAgree.url = pg_url
    run_state_machine_as_test(PostgresSchedulesAgree, settings=SchedulesAgree.TestCase.settings)
