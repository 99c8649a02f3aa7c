"""Model-based differential test of schedules: the SQL backends against the in-memory one.

Hypothesis drives random interleavings of schedule declarations (added by an
operator or synced from code), pauses, resumes, removals, run-now, clock
advances across misfires and daylight-saving nights, fires, and claims and
completions of the tasks made (which decide overlap skips), against both stores
in lockstep. Every call must answer alike, and after every step the stored
schedules, the next fire time and every task must be identical; no (schedule,
fire time) may ever make two tasks. As both stores work out fire times with the
same code, the machine also keeps, for each schedule, the moment its next fire
time was last worked out (added, its times changed, resumed, fired), and checks
it is the first fire time after that moment, walked from days before: from the
second pass of a repeated hour too. It starts shortly before one of the 2026
clock changes of Berlin or New York, either way.

Apart from ``test_differential.py`` (the tasks' machine), whose helpers it uses.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

from durablesched import (
    ManualClock,
    MemoryStore,
    ScheduleConflictError,
    ScheduleNotFoundError,
    SQLiteStore,
)
from durablesched.schedules.declaration import Schedule, ScheduleInfo, ScheduleStatus, schedule
from durablesched.schedules.timing import CronTimes, iter_fires
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.store import SQLStore

from .test_differential import SOAK, _fresh_db

LEASE = timedelta(seconds=30)
#: The 2026 clock changes of Berlin and New York, back and forward.
CHANGES = [
    datetime(2026, 10, 25, 1, 0, tzinfo=UTC),  # Berlin, back: 03:00 CEST is 02:00 CET
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # Berlin, forward: 02:00 CET is 03:00 CEST
    datetime(2026, 11, 1, 6, 0, tzinfo=UTC),  # New York, back: 02:00 EDT is 01:00 EST
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # New York, forward: 02:00 EST is 03:00 EDT
]
#: Where a run starts: an hour before a change, or 20 minutes after it (in the second
#: pass of a repeated hour, or just after a skipped one).
STARTS = [c + timedelta(minutes=m) for c in CHANGES for m in (-60, 20)]

NAMES = ["a", "b", "c"]
TIMINGS: list[dict[str, Any]] = [
    {"every": 60},
    {"every": 900},
    {"cron": "*/20 * * * *", "timezone": "Europe/Berlin"},
    {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
    {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
    {"cron": "0 * * * *", "timezone": "America/New_York"},
    {"cron": "*/15 * * * *", "timezone": "America/New_York"},
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
        self.clock = ManualClock(STARTS[0])
        self.memory = MemoryStore(compact_min=4)
        self.sql = self.make_sql()
        #: Per schedule, the moment its next fire time was last worked out.
        self.worked_out: dict[str, datetime] = {}

    @initialize(start=st.sampled_from(STARTS))
    def start(self, start: datetime) -> None:
        self.clock = ManualClock(start)

    def make_sql(self) -> SQLStore:
        self.path = _fresh_db()
        return SQLiteStore(self.path)

    def teardown(self) -> None:
        self.sql.close()
        shutil.rmtree(self.path.parent, ignore_errors=True)

    def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        before = {i.schedule.name: i for i in self.memory.list_schedules()}
        a = outcome(lambda: getattr(self.memory, method)(*args, **kwargs))
        b = outcome(lambda: getattr(self.sql, method)(*args, **kwargs))
        assert a == b, f"{method}{args}: memory {a!r} != {self.sql.dialect.name} {b!r}"
        self.note_worked_out(method, before)
        return a

    def note_worked_out(self, method: str, before: dict[str, ScheduleInfo]) -> None:
        """The schedules whose next fire time ``method`` worked out now, by
        docs/schedules.md: one added, one whose times changed, one resumed, one fired."""
        now = self.clock.now()
        for info in self.memory.list_schedules():
            old = before.get(info.schedule.name)
            if old is None or not info.schedule.same_timing(old.schedule):
                worked_out = True  # added (or added again after a removal), times changed
            elif method == "pause_schedule":
                worked_out = old.status != ScheduleStatus.ACTIVE == info.status  # resumed
            elif method == "fire_schedules":
                worked_out = info.next_fire_at != old.next_fire_at  # fired: always moves on
            else:
                worked_out = False
            if worked_out:
                self.worked_out[info.schedule.name] = now

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
    def next_fire_is_the_first_after_it_was_worked_out(self) -> None:
        for info in self.memory.list_schedules():
            since = self.worked_out[info.schedule.name]
            times = info.schedule.times()
            if isinstance(times, CronTimes):  # walked from days before: no clock change near
                walked = iter_fires(times, since - timedelta(days=3), since + timedelta(days=3))
                expected = next(t for t in walked if t > since)
            else:
                expected = times.next_after(since)
            assert info.next_fire_at == expected, (info.schedule.name, since, info)

    @invariant()
    def one_task_per_fire(self) -> None:
        keys = Counter(t.idempotency_key for t in self.memory.list_tasks(limit=10_000))
        assert all(n == 1 for n in keys.values()), keys


SchedulesAgree.TestCase.settings = settings(
    max_examples=300 if SOAK else 40,
    stateful_step_count=50 if SOAK else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # Fresh examples in CI too (hypothesis's ci profile would draw the same ones each run).
    derandomize=False,
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
            conn.execute(text("ALTER SEQUENCE durablesched_task_seq RESTART WITH 1"))
        return store

    def teardown(self) -> None:
        self.sql.close()


def test_postgres_agrees_with_memory(pg_url: str) -> None:
    PostgresSchedulesAgree.url = pg_url
    run_state_machine_as_test(PostgresSchedulesAgree, settings=SchedulesAgree.TestCase.settings)
