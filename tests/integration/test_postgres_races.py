"""PostgreSQL races, made to happen every time: two stores (two processes' worth of
connections) in two threads, one stopped by an event at the moment the other must
find the guard in its way.

Sampling from outside (a process test counting what runs) cannot see these: the
window is a few statements wide. Here the first thread is held inside the window
while the second runs; the second either finishes or waits on a row lock, which
the test reads from ``pg_stat_activity``. Each test fails with its guard removed
(docs/reliability.md, "Every guard and the test that fails without it").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, text

from durablesched import QueueLimits, Rate, TaskState
from durablesched.records import Claim, ErrorInfo, NewTask, Outcome
from durablesched.schedules import firing, sync
from durablesched.schedules.declaration import schedule
from durablesched.store.sql import claiming, scheduling
from durablesched.store.sql.postgres import PostgresStore

from ..conftest import T0, WAIT, at
from .gates import Gate, Run

LEASE = timedelta(seconds=30)
MINUTE = timedelta(minutes=1)
#: Midnight: the schedules here fire on whole minutes and hours after it.
START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def stores(pg_url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one database: two workers, each with its own write connection."""
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    yield first, second
    first.close()
    second.close()


@pytest.fixture
def watcher(stores: tuple[PostgresStore, PostgresStore]) -> Iterator[Connection]:
    """A connection of its own, to see who waits on a lock."""
    with stores[0].engine.connect() as conn:
        yield conn


def finishes_or_blocks(run: Run, watcher: Connection) -> bool:
    """True once ``run`` has finished, False once it waits on a lock (it may not
    finish before the gate opens). Polls the server every 10 ms, at most WAIT."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if run.done.wait(0.01):
            return True
        waiting = watcher.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
        watcher.rollback()  # a fresh snapshot for the next look
        if waiting:
            return False
    raise AssertionError("the second call neither finished nor waited on a lock")


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(QueueLimits("q", concurrency=1), id="concurrency"),
        pytest.param(QueueLimits("q", rate=Rate(1, MINUTE)), id="rate"),
    ],
)
def test_two_hosts_claiming_at_once_start_no_more_than_a_queues_limit(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
    limits: QueueLimits,
) -> None:
    a, b = stores
    a.submit([NewTask("t", {}, at(10), 3, None, queue="q") for _ in range(4)], T0)
    a.put_queue(limits, T0)
    gate = Gate()
    allowances = claiming._allowances

    def counted_then_held(*args: Any, **kwargs: Any) -> dict[str, int]:
        allowed = allowances(*args, **kwargs)
        gate()  # the first claim has counted what runs and what started; hold it there
        return allowed

    monkeypatch.setattr(claiming, "_allowances", counted_then_held)
    first = Run(lambda: a.claim("a", 4, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    second = Run(lambda: b.claim("b", 4, at(10), LEASE))
    # With the queue's row locked by the first claim, the second waits for it.
    finished_early = finishes_or_blocks(second, watcher)
    gate.released.set()
    claims: list[Claim] = first.answer() + second.answer()
    assert len(claims) == 1, f"{len(claims)} started in a queue limited to 1"
    assert not finished_early or second.result == []


def test_concurrent_claims_skip_each_others_rows_and_never_claim_one_twice(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = stores
    ids = [s.task_id for s in a.submit([NewTask("t", {}, at(10), 3, None)] * 4, T0)]
    gate = Gate()
    claim_rows = claiming.claim_rows  # as claim_with_ahead calls it

    def claimed_then_held(*args: Any, **kwargs: Any) -> list[Any]:
        rows = claim_rows(*args, **kwargs)
        gate()  # the first claim's rows are locked, its transaction still open
        return rows

    monkeypatch.setattr(claiming, "claim_rows", claimed_then_held)
    first = Run(lambda: a.claim("a", 2, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    second = Run(lambda: b.claim("b", 2, at(10), LEASE))
    # SKIP LOCKED: the second claim takes the next rows at once, without waiting.
    finished_early = finishes_or_blocks(second, watcher)
    gate.released.set()
    taken_a = [c.task_id for c in first.answer()]
    taken_b = [c.task_id for c in second.answer()]
    assert finished_early, "the second claim waited for the first one's rows"
    assert sorted(taken_a + taken_b) == ids, (taken_a, taken_b)
    for task_id in ids:
        task = a.get(task_id)
        assert task is not None and (task.attempts, task.fence) == (1, 1)


def held_after_planning(monkeypatch: pytest.MonkeyPatch) -> Gate:
    """A gate in ``fire_schedules``, after the due schedules are read and their fires
    planned, before the next fire time is advanced."""
    gate = Gate()
    due_fires = firing.due_fires  # as scheduling.py imported it

    def planned_then_held(*args: Any, **kwargs: Any) -> Any:
        planned = due_fires(*args, **kwargs)
        gate()
        return planned

    monkeypatch.setattr(scheduling, "due_fires", planned_then_held)
    return gate


def test_two_schedulers_firing_at_once_fire_once_and_never_move_the_next_fire_back(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = stores
    a.add_schedule(schedule("t", name="tick", every=60, overlap="allow"), START)
    gate = held_after_planning(monkeypatch)
    # The first read the schedule due at 00:01 and stalls; the second, a minute on,
    # fires 00:01 and 00:02 and advances to 00:03.
    first = Run(lambda: a.fire_schedules(START + MINUTE + timedelta(seconds=10)))
    assert gate.reached.wait(WAIT)
    second = Run(lambda: b.fire_schedules(START + 2 * MINUTE + timedelta(seconds=10)))
    assert finishes_or_blocks(second, watcher)
    gate.released.set()
    assert first.answer() == []
    assert [f.fire_at for f in second.answer()] == [START + MINUTE, START + 2 * MINUTE]
    assert a.next_fire_time() == START + 3 * MINUTE
    assert len(a.list_tasks()) == 2


def test_a_firing_step_that_read_old_times_does_not_undo_a_change_of_times(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = stores
    a.sync_schedules([schedule("t", name="s", every=60)], START, {"t"})
    gate = held_after_planning(monkeypatch)
    now = START + MINUTE + timedelta(seconds=10)
    first = Run(lambda: a.fire_schedules(now))
    assert gate.reached.wait(WAIT)
    # A deploy changes the schedule to hourly meanwhile: its next fire is 01:00.
    second = Run(lambda: b.sync_schedules([schedule("t", name="s", every=3600)], now, {"t"}))
    assert finishes_or_blocks(second, watcher)
    gate.released.set()
    assert second.answer() == {"s": "updated"}
    assert first.answer() == []
    assert a.next_fire_time() == START + timedelta(hours=1)
    assert a.list_tasks() == []


def test_a_reclaim_never_overwrites_a_completion_that_landed_after_its_read(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    reaper, worker = stores
    worker.submit([NewTask("t", {}, at(10), 3, None)], T0)
    (claim,) = worker.claim("w", 1, at(10), LEASE)
    gate = Gate()

    def delay(name: str, attempt: int) -> timedelta:
        gate()  # the reaper has read the expired lease; hold it before its UPDATE
        return timedelta(0)

    reclaim = Run(lambda: reaper.reclaim_expired(at(40), delay))
    assert gate.reached.wait(WAIT)
    # The worker's clock is a second behind: to it the lease is still valid.
    assert worker.complete(claim, "done", at(39))
    gate.released.set()
    assert reclaim.answer() == []
    task = worker.get(claim.task_id)
    assert task is not None and (task.state, task.result) == (TaskState.SUCCEEDED, "done")


def test_a_reclaim_never_takes_a_lease_a_heartbeat_renewed_after_its_read(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    reaper, worker = stores
    worker.submit([NewTask("t", {}, at(10), 3, None)], T0)
    (claim,) = worker.claim("w", 1, at(10), LEASE)
    gate = Gate()

    def delay(name: str, attempt: int) -> timedelta:
        gate()
        return timedelta(0)

    reclaim = Run(lambda: reaper.reclaim_expired(at(40), delay))
    assert gate.reached.wait(WAIT)
    assert [s.task_id for s in worker.heartbeat("w", [claim], at(39), LEASE)] == [claim.task_id]
    gate.released.set()
    assert reclaim.answer() == []
    task = worker.get(claim.task_id)
    assert task is not None
    assert (task.state, task.lease_expires_at) == (TaskState.RUNNING, at(39) + LEASE)
    assert worker.complete(claim, "done", at(41))


def test_two_workers_starting_together_store_a_declared_schedule_once(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every worker syncs the schedules declared in code as it starts: the first read
    # no row of that name and stalls while the second stores it.
    a, b = stores
    gate = Gate()
    sync_plan = sync.sync_plan

    def planned_then_held(*args: Any, **kwargs: Any) -> Any:
        plan = sync_plan(*args, **kwargs)
        gate()
        return plan

    monkeypatch.setattr(scheduling, "sync_plan", planned_then_held)
    declared = [schedule("t", name="s", every=60)]
    first = Run(lambda: a.sync_schedules(declared, START, {"t"}))
    assert gate.reached.wait(WAIT)
    second = Run(lambda: b.sync_schedules(declared, START, {"t"}))
    assert finishes_or_blocks(second, watcher)
    gate.released.set()
    assert second.answer() == {"s": "added"}
    first.answer()  # no error: the name taken meanwhile is left to its first writer
    (info,) = a.list_schedules()
    assert info.next_fire_at == START + MINUTE
    # Adding by hand at the same moment: one says it added, the other finds it there.
    gate = Gate()
    params = scheduling._params

    def read_then_held(*args: Any, **kwargs: Any) -> dict[str, Any]:
        gate()  # the first found no row of that name and is about to insert one
        return params(*args, **kwargs)

    monkeypatch.setattr(scheduling, "_params", read_then_held)
    extra = schedule("t", name="ops", every=300)
    first = Run(lambda: a.add_schedule(extra, START))
    assert gate.reached.wait(WAIT)
    second = Run(lambda: b.add_schedule(extra, START))
    assert finishes_or_blocks(second, watcher)
    gate.released.set()
    assert sorted([first.answer(), second.answer()]) == [False, True]


# -- limits per key (issue 32) ---------------------------------------------------------------


def keyed(n: int, key: str = "k") -> list[NewTask]:
    return [NewTask("t", {}, at(10), 3, None, queue="q", limit_key=key) for _ in range(n)]


def test_a_key_freed_while_its_next_task_is_submitted_gets_a_head(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race a per-key head can lose: an outcome frees the key while another
    transaction submits the key's next task. Each alone sees the other's row as it was:
    the outcome finds no task to promote, the submit finds the key full. The triggers
    take the queue's row first, so the second waits for the first and sees its change."""
    a, b = stores
    a.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
    (first,) = [s.task_id for s in a.submit(keyed(1), T0)]
    (claim,) = a.claim("a", 1, at(10), LEASE)
    gate = Gate()
    claim_rows = claiming.claim_rows  # as claim_with_ahead calls it

    def recorded_then_held(*args: Any, **kwargs: Any) -> list[Any]:
        gate()  # the outcome is written (its trigger ran), its transaction still open
        return claim_rows(*args, **kwargs)

    monkeypatch.setattr(claiming, "claim_rows", recorded_then_held)

    done = Run(
        lambda: a.record_and_claim([Outcome(claim)], at(11), owner="a", limit=1, lease=LEASE)
    )
    assert gate.reached.wait(WAIT)
    submitted = Run(lambda: b.submit(keyed(1), at(11)))
    # The submit's trigger waits for the queue's row, which the outcome's trigger holds.
    finished_early = finishes_or_blocks(submitted, watcher)
    gate.released.set()
    done.answer()
    (second,) = [s.task_id for s in submitted.answer()]
    assert not finished_early, "the submit did not wait for the outcome's key"
    task = a.get(first)
    assert task is not None and task.state is TaskState.SUCCEEDED
    # The key is free and its new task is its head: the next claim takes it.
    assert [c.task_id for c in b.claim("b", 5, at(12), LEASE)] == [second]


def test_two_hosts_claiming_one_key_at_once_start_one(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = stores
    a.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
    a.submit(keyed(4) + keyed(1, "other"), T0)
    gate = Gate()
    claim_rows = claiming.claim_rows

    def claimed_then_held(*args: Any, **kwargs: Any) -> list[Any]:
        rows = claim_rows(*args, **kwargs)
        gate()  # the first claim took k's head, its transaction still open
        return rows

    monkeypatch.setattr(claiming, "claim_rows", claimed_then_held)
    first = Run(lambda: a.claim("a", 1, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    second = Run(lambda: b.claim("b", 4, at(10), LEASE))
    finishes_or_blocks(second, watcher)
    gate.released.set()
    claims: list[Claim] = first.answer() + second.answer()
    running = [t for t in a.list_tasks(state=TaskState.RUNNING) if t.limit_key == "k"]
    assert len(running) == 1, f"{len(running)} of key k running, its limit is 1"
    assert len(claims) == 2  # k's head, and other's


def test_an_outcome_of_a_key_while_a_claim_takes_its_head_waits_for_the_claim(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim statement counts its start on the key's row, its queue's row taken in the
    statement itself (migration 0018). An outcome of the key that did not wait for it
    would count the key's RUNNING tasks without the claimed one (not committed) and make
    the key's next task its head: one more of the key would run than its limit."""
    a, b = stores
    a.put_queue(QueueLimits("q", concurrency_per_key=2), T0)
    ids = [s.task_id for s in a.submit(keyed(4), T0)]
    (first,) = a.claim("a", 1, at(10), LEASE)
    gate = Gate()
    claim_rows = claiming.claim_rows

    def claimed_then_held(*args: Any, **kwargs: Any) -> list[Any]:
        rows = claim_rows(*args, **kwargs)
        gate()  # the claim took the key's head, its transaction still open
        return rows

    monkeypatch.setattr(claiming, "claim_rows", claimed_then_held)
    second = Run(lambda: a.claim("a", 1, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    done = Run(
        lambda: b.record_and_claim([Outcome(first)], at(11), owner="a", limit=0, lease=LEASE)
    )
    finished_early = finishes_or_blocks(done, watcher)
    gate.released.set()
    assert [c.task_id for c in second.answer()] == [ids[1]]
    done.answer()
    assert not finished_early, "the outcome did not wait for the claim's key"
    # One of the key runs: one more may start, then none.
    assert [c.task_id for c in b.claim("b", 5, at(12), LEASE)] == [ids[2]]
    assert b.claim("b", 5, at(13), LEASE) == []


def running_of(store: PostgresStore, key: str) -> int | None:
    """The count of RUNNING tasks that key ``key`` of queue q's row holds (None: no row)."""
    with store.engine.connect() as conn:
        sql = "SELECT running FROM durablesched_limit_keys WHERE queue = 'q' AND limit_key = :k"
        return conn.execute(text(sql), {"k": key}).scalar()


def held_before_commit(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> Gate:
    """A gate that holds ``store``'s change of a queue's limits done, not yet committed."""
    gate = Gate()
    wake = store._wake_others

    def held(conn: Connection) -> None:
        gate()
        wake(conn)

    monkeypatch.setattr(store, "_wake_others", held)
    return gate


def test_a_key_submitted_to_while_its_queue_gets_a_limit_per_key_keeps_the_limit(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The change of limits chooses each key's head from what has committed; a submit of
    the key under way saw no limit per key and would leave its task claimable beside the
    head (two of the key running). Its bookkeeping takes the queue's row, shared, so it
    waits for the change and then sees it (migration 0018)."""
    a, b = stores
    (first,) = [s.task_id for s in a.submit(keyed(1), T0)]
    gate = held_before_commit(a, monkeypatch)
    setting = Run(lambda: a.put_queue(QueueLimits("q", concurrency_per_key=1), at(5)))
    assert gate.reached.wait(WAIT)
    submitted = Run(lambda: b.submit(keyed(1), at(6)))
    finished_early = finishes_or_blocks(submitted, watcher)
    gate.released.set()
    setting.answer()
    submitted.answer()
    assert not finished_early, "the submit did not wait for the change of limits"
    assert [c.task_id for c in b.claim("b", 5, at(10), LEASE)] == [first]
    assert running_of(b, "k") == 1


def test_an_outcome_of_a_key_while_its_queue_gets_a_limit_per_key_is_counted(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The change of limits counts a key's RUNNING tasks from what has committed; a failed
    attempt of the key recorded meanwhile saw no limit per key: its retry stayed claimable
    and the key's count one too many after the next claim, until the key's next change.
    The change of limits takes the key's live tasks first: the outcome commits before it
    counts, or waits for it (migration 0018)."""
    a, b = stores
    _later, soon = [
        s.task_id
        for s in a.submit(
            [*keyed(1), NewTask("t", {}, at(1), 3, None, queue="q", limit_key="k")], T0
        )
    ]
    (claim,) = a.claim("a", 5, at(2), LEASE)
    assert claim.task_id == soon
    gate = held_before_commit(a, monkeypatch)
    setting = Run(lambda: a.put_queue(QueueLimits("q", concurrency_per_key=1), at(5)))
    assert gate.reached.wait(WAIT)
    failed = Run(
        lambda: b.record_and_claim(
            [Outcome(claim, error=ErrorInfo("E", "boom", ""), retry_at=at(6))],
            at(6),
            owner="a",
            limit=0,
            lease=LEASE,
        )
    )
    finished_early = finishes_or_blocks(failed, watcher)
    gate.released.set()
    setting.answer()
    failed.answer()
    assert not finished_early, "the outcome did not wait for the change of limits"
    assert len(b.claim("b", 5, at(20), LEASE)) == 1  # one of key k at a time
    assert running_of(b, "k") == 1


def test_a_claim_under_way_when_its_queue_gets_a_limit_per_key_is_counted_without_deadlock(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim read the queue as not limited per key and took a task of key k; its
    bookkeeping (after the statement) waits for a change of limits holding the queue's
    row. Had that change taken the queue's row before the claimed task's, each would
    wait for the other (PostgreSQL ends one with a deadlock error): it takes the keyed
    tasks first, waits for the claim, and counts its task."""
    a, b = stores
    first, _ = [s.task_id for s in a.submit(keyed(2), T0)]
    gate = Gate()
    sync_keys = claiming._sync_keys

    def claimed_then_held(*args: Any, **kwargs: Any) -> None:
        gate()  # the task is RUNNING in the claim's open transaction, its key not synced
        sync_keys(*args, **kwargs)

    monkeypatch.setattr(claiming, "_sync_keys", claimed_then_held)
    claimed = Run(lambda: a.claim("a", 1, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    setting = Run(lambda: b.put_queue(QueueLimits("q", concurrency_per_key=1), at(11)))
    assert not finishes_or_blocks(setting, watcher), "the change of limits did not wait"
    gate.released.set()
    assert [c.task_id for c in claimed.answer()] == [first]
    setting.answer()
    assert b.claim("b", 5, at(12), LEASE) == []  # k is at its limit
    assert running_of(b, "k") == 1


def test_a_claim_that_read_the_limits_before_they_changed_counts_its_start(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim read the queue as not limited per key; the limit was set and committed
    before its statement ran, which took the key's new head without counting it (no
    trigger counts a claim since migration 0018). Its key is brought up to date after
    the statement, from the limits as they are then."""
    a, b = stores
    first, _ = [s.task_id for s in a.submit(keyed(2), T0)]
    gate = Gate()
    allowances = claiming._allowances

    def read_then_held(*args: Any, **kwargs: Any) -> dict[str, int]:
        gate()  # the claim has read the limits: none per key
        return allowances(*args, **kwargs)

    monkeypatch.setattr(claiming, "_allowances", read_then_held)
    claimed = Run(lambda: a.claim("a", 5, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    b.put_queue(QueueLimits("q", concurrency_per_key=1), at(9))
    gate.released.set()
    assert [c.task_id for c in claimed.answer()] == [first]
    assert running_of(b, "k") == 1
    assert b.claim("b", 5, at(12), LEASE) == []


def test_a_debounced_submit_while_its_task_is_claimed_makes_a_new_task(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upsert meets the pending task's row locked by a claim: it waits, then finds the
    key given up (the task started) and stores a new task, never rewriting the arguments
    of an attempt that already started."""
    a, b = stores

    def debounced(doc: int) -> NewTask:
        return NewTask("t", {"doc": doc}, at(10), 3, None, debounce_key="doc:7")

    (first,) = [s.task_id for s in a.submit([debounced(1)], T0)]
    gate = Gate()
    claim_rows = claiming.claim_rows

    def claimed_then_held(*args: Any, **kwargs: Any) -> list[Any]:
        rows = claim_rows(*args, **kwargs)
        gate()  # the task is RUNNING in the claim's open transaction
        return rows

    monkeypatch.setattr(claiming, "claim_rows", claimed_then_held)
    claimed = Run(lambda: a.claim("a", 1, at(10), LEASE))
    assert gate.reached.wait(WAIT)
    submitted = Run(lambda: b.submit([debounced(2)], at(11)))
    finished_early = finishes_or_blocks(submitted, watcher)
    gate.released.set()
    (claim,) = claimed.answer()
    (second,) = submitted.answer()
    assert not finished_early, "the upsert did not wait for the claimed row"
    assert claim.task_id == first and claim.args == {"doc": 1}
    assert second.created and second.task_id != first
    task = a.get(first)
    assert task is not None and task.args == {"doc": 1} and task.debounce_key is None


def test_a_claim_passes_over_rows_locked_elsewhere_to_lower_priorities(
    stores: tuple[PostgresStore, PostgresStore], watcher: Connection
) -> None:
    # Each priority's rows are read and locked a priority at a time: rows another
    # transaction holds are passed over to the next of their priority, then of the next
    # priority, and the claim takes every row claimable and free, best first.
    a, _ = stores
    spec = [(5, 10), (5, 11), (5, 90), (1, 10), (1, 12), (1, 95), (0, 10)]
    ids = [
        s.task_id
        for s in a.submit([NewTask("t", {}, at(d), 3, None, None, "q", p) for p, d in spec], T0)
    ]
    watcher.execute(
        text("SELECT id FROM tasks WHERE id IN (:x, :y) FOR UPDATE"), {"x": ids[0], "y": ids[3]}
    )
    assert [c.task_id for c in a.claim("a", 4, at(20), LEASE)] == [ids[1], ids[4], ids[6]]
    watcher.rollback()
    assert [c.task_id for c in a.claim("a", 4, at(20), LEASE)] == [ids[0], ids[3]]


def test_a_task_that_comes_first_takes_no_head_held_elsewhere_and_waits_for_none(
    stores: tuple[PostgresStore, PostgresStore],
    watcher: Connection,
) -> None:
    """A task submitted due sooner than its key's head takes the head's place (migration
    0022) only if it can take the head's row at once: a transaction holding that row
    (here a bare lock) is not waited for, as no change of a key's bookkeeping waits for
    another task's row (two such waits, each holding what the other needs, deadlock).
    The head stays; the key's next change gives the head to its first task."""
    a, b = stores
    a.put_queue(QueueLimits("q", concurrency_per_key=1), T0)
    later = NewTask("t", {}, at(100), 3, None, queue="q", limit_key="k")
    (head,) = [s.task_id for s in a.submit([later], T0)]
    with a.engine.connect() as holder:
        holder.execute(text("SELECT id FROM tasks WHERE id = :id FOR UPDATE"), {"id": head})
        sooner = later._replace(due_at=at(5))
        submitted = Run(lambda: b.submit([sooner], T0))
        assert finishes_or_blocks(submitted, watcher), "the submit waited for the head's row"
        (first,) = [s.task_id for s in submitted.answer()]
        holder.rollback()
    assert b.claim("b", 5, at(10), LEASE) == []  # the head (due at 100) kept its place
    b.submit([later._replace(due_at=at(50))], at(1))  # the key's next change
    assert [c.task_id for c in b.claim("b", 5, at(10), LEASE)] == [first]
