"""Model-based differential test: the SQL backends against the in-memory one, step by step.

Hypothesis drives random interleavings of submit (equal due times, idempotency
keys), cancel, clock advance, claim, heartbeat, lease check, complete, fail, acknowledge
cancellation, give-back and abandonment (lease expiry and reclaim) against both
stores in lockstep. After every step each task's full record and history must
be identical, and the invariants must hold.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import text

from durablesched import (
    ErrorInfo,
    InvalidTransitionError,
    ManualClock,
    MemoryStore,
    SQLiteStore,
    TaskNotFoundError,
    TaskState,
)
from durablesched.records import Claim, NewTask, Outcome
from durablesched.states import OPERATOR_TRANSITIONS, TRANSITIONS
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.store import SQLStore

from ..conftest import T0

LEASE = timedelta(seconds=30)
SOAK = os.environ.get("DURABLESCHED_SOAK", "") not in ("", "0")
_TEMPLATE: Path | None = None


def _fresh_db() -> Path:
    """A migrated database file, copied from one made once (migrations are slow-ish)."""
    global _TEMPLATE  # noqa: PLW0603 - a per-process cache of the template file
    if _TEMPLATE is None:
        _TEMPLATE = Path(tempfile.mkdtemp(prefix="ds-template-")) / "template.db"
        SQLiteStore(_TEMPLATE).close()
    target = Path(tempfile.mkdtemp(prefix="ds-diff-")) / "diff.db"
    shutil.copy(_TEMPLATE, target)
    return target


def retry_delay(name: str, attempt: int) -> timedelta:
    return timedelta(seconds=3 * attempt)


def _same(result: Any) -> Any:
    """Results compare by value; exceptions by type."""
    return type(result) if isinstance(result, Exception) else result


def outcome(call: Any) -> Any:
    """Run ``call`` and return its result, or the type of the library error it raised."""
    try:
        return call()
    except (InvalidTransitionError, TaskNotFoundError) as e:
        return type(e)


class StoresAgree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(T0)
        self.memory = MemoryStore(compact_min=4)
        self.sql = self.make_sql()
        self.ids: list[int] = []
        self.held: list[Claim] = []
        self.cancelled_before_start: set[int] = set()

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

    @rule(
        name=st.sampled_from(["a", "b", "c"]),
        due=st.integers(0, 20),
        key=st.sampled_from([None, None, "k1", "k2"]),
        attempts=st.integers(1, 3),
        count=st.integers(1, 3),
    )
    def submit(self, name: str, due: int, key: str | None, attempts: int, count: int) -> None:
        now = self.clock.now()
        tasks = [
            NewTask(name, {"i": i}, now + timedelta(seconds=due), attempts, key)
            for i in range(count)
        ]
        for s in self.both("submit", tasks, now):
            if s.created:
                self.ids.append(s.task_id)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from([*self.ids, 10_000]))
        before = self.memory.get(task_id)
        result = self.both("request_cancel", task_id, self.clock.now())
        if before is not None and before.state in (TaskState.PENDING, TaskState.RETRY_WAIT):
            self.cancelled_before_start.add(task_id)
            assert result == "CANCELLED"

    @rule(seconds=st.integers(0, 40))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(
        owner=st.sampled_from(["w1", "w2"]),
        limit=st.integers(1, 3),
        named=st.booleans(),
        in_process=st.sampled_from([(), ("a",), ("a", "c")]),
    )
    def claim(self, owner: str, limit: int, named: bool, in_process: tuple[str, ...]) -> None:
        now = self.clock.now()
        names = {"a", "b"} if named else None
        claims = self.both("claim", owner, limit, now, LEASE, names, process_names=in_process)
        keys = [(c.due_at, c.seq) for c in claims]
        assert keys == sorted(keys), "claims out of (due_at, seq) order"
        for c in claims:
            assert c.due_at <= now, "claimed before its due time"
            assert c.task_id not in self.cancelled_before_start, "a cancelled task started"
        if len(claims) < limit:
            left = [
                t
                for t in self.memory.list_tasks(limit=10_000)
                if t.state in (TaskState.PENDING, TaskState.RETRY_WAIT)
                and t.due_at <= now
                and (names is None or t.name in names)
            ]
            assert left == [], "a due task was left unclaimed with slots free"
        self.held.extend(claims)

    @precondition(lambda self: self.held)
    @rule(owner=st.sampled_from(["w1", "w2"]))
    def heartbeat(self, owner: str) -> None:
        mine = [c for c in self.held if c.owner == owner]
        statuses = self.both("heartbeat", owner, mine, self.clock.now(), LEASE)
        assert len({s.task_id for s in statuses}) == len(statuses)

    @precondition(lambda self: self.held)
    @rule(owner=st.sampled_from(["w1", "w2"]))
    def check_leases(self, owner: str) -> None:
        mine = [c for c in self.held if c.owner == owner]
        self.both("check_leases", owner, mine, self.clock.now())

    @precondition(lambda self: self.held)
    @rule(data=st.data(), result=st.integers(-5, 5))
    def complete(self, data: st.DataObject, result: int) -> None:
        claim = data.draw(st.sampled_from(self.held))
        self.both("complete", claim, {"r": result}, self.clock.now())

    @precondition(lambda self: self.held)
    @rule(data=st.data(), retry_in=st.one_of(st.none(), st.integers(0, 10)))
    def fail(self, data: st.DataObject, retry_in: int | None) -> None:
        claim = data.draw(st.sampled_from(self.held))
        now = self.clock.now()
        retry_at = None if retry_in is None else now + timedelta(seconds=retry_in)
        self.both("fail", claim, ErrorInfo("builtins.RuntimeError", "boom", ""), retry_at, now)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def acknowledge_cancel(self, data: st.DataObject) -> None:
        claim = data.draw(st.sampled_from(self.held))
        self.both("acknowledge_cancel", claim, self.clock.now())

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        claim = data.draw(st.sampled_from(self.held))
        self.both("release", [claim], self.clock.now())

    @rule(data=st.data(), owner=st.sampled_from(["w1", "w2"]), limit=st.integers(0, 3))
    def group_commit(self, data: st.DataObject, owner: str, limit: int) -> None:
        """A worker's flush: several outcomes and a claim in one step."""
        now = self.clock.now()
        picked = data.draw(st.lists(st.sampled_from(self.held), max_size=3)) if self.held else []
        outcomes = []
        for claim in picked:
            kind = data.draw(st.sampled_from(["ok", "fail", "retry", "cancel"]))
            outcomes.append(
                Outcome(
                    claim,
                    result={"r": claim.task_id} if kind == "ok" else None,
                    error=ErrorInfo("builtins.RuntimeError", "flush", "")
                    if kind in ("fail", "retry")
                    else None,
                    retry_at=now + timedelta(seconds=2) if kind == "retry" else None,
                    cancelled=kind == "cancel",
                )
            )
        extra = {"owner": owner, "limit": limit, "lease": LEASE, "process_names": ("b",)}
        a = self.memory.record_and_claim(outcomes, now, **extra)  # type: ignore[arg-type]
        b = self.sql.record_and_claim(outcomes, now, **extra)  # type: ignore[arg-type]
        assert [_same(r) for r in a[0]] == [_same(r) for r in b[0]]
        assert a[1] == b[1]
        self.held.extend(a[1])

    @rule()
    def abandon(self) -> None:
        """Workers vanish: leases run out and any worker reclaims."""
        self.clock.advance(LEASE)
        self.both("reclaim_expired", self.clock.now(), retry_delay)

    @rule()
    def next_wakeup(self) -> None:
        self.both("next_wakeup", self.clock.now())

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def records_and_histories_match(self) -> None:
        for task_id in self.ids:
            mem, sql = self.memory.get(task_id), self.sql.get(task_id)
            assert mem == sql, f"task {task_id}:\n memory {mem}\n sqlite {sql}"
            assert self.memory.history(task_id) == self.sql.history(task_id)

    @invariant()
    def only_legal_transitions(self) -> None:
        # Several changes can happen in one step (a reclaim, then nothing else), so
        # check every consecutive pair of the recorded history.
        allowed = TRANSITIONS | OPERATOR_TRANSITIONS
        for task_id in self.ids:
            states = [e.state for e in self.memory.history(task_id)]
            for a, b in itertools.pairwise(states):
                assert (a, b) in allowed, f"task {task_id}: {a} -> {b}"

    @invariant()
    def at_most_one_valid_claim_per_task(self) -> None:
        now = self.clock.now()
        valid: dict[int, int] = {}
        for c in self.held:
            t = self.memory.get(c.task_id)
            if (
                t is not None
                and t.state is TaskState.RUNNING
                and t.lease_owner == c.owner
                and t.fence == c.fence
                and t.lease_expires_at is not None
                and t.lease_expires_at > now
            ):
                valid[c.task_id] = valid.get(c.task_id, 0) + 1
        assert all(n == 1 for n in valid.values())


StoresAgree.TestCase.settings = settings(
    max_examples=400 if SOAK else 60,
    stateful_step_count=60 if SOAK else 35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


#: Runs the state machine under pytest.
TestStoresAgree = StoresAgree.TestCase


class PostgresAgrees(StoresAgree):
    """The same machine with PostgreSQL as the SQL side, in the test's own schema."""

    url = ""

    def make_sql(self) -> SQLStore:
        store = PostgresStore(self.url)
        with store.engine.begin() as conn:
            conn.execute(text("TRUNCATE tasks, task_events, idempotency_keys CASCADE"))
            conn.execute(text("UPDATE durablesched_counters SET value = 0"))
        return store

    def teardown(self) -> None:
        self.sql.close()


def test_postgres_agrees_with_memory(pg_url: str) -> None:
    PostgresAgrees.url = pg_url
    run_state_machine_as_test(PostgresAgrees, settings=StoresAgree.TestCase.settings)
