"""Limits per key (``limit_key``, a queue's ``concurrency_per_key``), on every backend."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from durablesched import InvalidTaskError, ManualClock, QueueLimits, Rate, Scheduler, TaskRegistry
from durablesched.metrics import metrics_text
from durablesched.records import Claim, ErrorInfo, NewTask, Outcome
from durablesched.states import TaskState
from durablesched.store.sql.store import SQLStore

from ..conftest import T0, BackendStore, at, make_store

LEASE = timedelta(seconds=30)


def new(key: str | None, due: float = 10, *, queue: str = "sync", priority: int = 0) -> NewTask:
    return NewTask("t", {}, at(due), 3, None, None, queue, priority, key)


def ids_of(store: BackendStore, tasks: list[NewTask]) -> list[int]:
    return [s.task_id for s in store.submit(tasks, T0)]


def claimed(store: BackendStore, n: int = 10, when: float = 20, owner: str = "w") -> list[int]:
    return [c.task_id for c in store.claim(owner, n, at(when), LEASE)]


def finish(store: BackendStore, task_id: int, when: float = 21) -> None:
    task = store.get(task_id)
    assert task is not None
    claim = [c for c in _claims[id(store)] if c.task_id == task_id][-1]  # this test's
    results, _ = store.record_and_claim(
        [Outcome(claim, result=None)], at(when), owner=claim.owner, limit=0, lease=LEASE
    )
    assert results != [None]


#: Claims taken, by store: an id may be reused by a later test's store, whose claims then
#: come last.
_claims: dict[int, list[Claim]] = {}


def take(store: BackendStore, n: int = 10, when: float = 20) -> list[int]:
    claims = store.claim("w", n, at(when), LEASE)
    _claims.setdefault(id(store), []).extend(claims)
    return [c.task_id for c in claims]


def test_one_at_a_time_per_key_and_other_keys_are_not_held_up(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    a1, a2, a3 = ids_of(store, [new("a"), new("a"), new("a")])
    b1, b2 = ids_of(store, [new("b", due=11), new("b", due=11)])
    (plain,) = ids_of(store, [new(None, due=12)])
    # Busy key a's backlog comes first in the queue's order: the claim takes one of a,
    # then b's head and the plain task, never a second of a.
    assert take(store) == [a1, b1, plain]
    assert take(store) == []  # both keys at their limit
    finish(store, a1)
    assert take(store, when=22) == [a2]
    finish(store, b1)
    finish(store, a2)
    assert sorted(take(store, when=23)) == [a3, b2]


def test_concurrency_per_key_of_two_and_the_global_limit_on_top(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency=3, concurrency_per_key=2), T0)
    a = ids_of(store, [new("a") for _ in range(4)])
    b = ids_of(store, [new("b", due=11) for _ in range(4)])
    # One claim takes at most one of a key (its head); the next takes the next head.
    assert take(store) == [a[0], b[0]]
    assert take(store) == [a[1]]  # the global limit of 3
    finish(store, a[0])
    assert take(store, when=22) == [a[2]]  # a's next head comes first in the queue's order
    assert take(store, when=22) == []  # a: 2 running + b: 1 running = 3


def test_one_claim_counts_each_key_it_takes_and_gives_each_its_next_head(
    store: BackendStore,
) -> None:
    # One claim takes heads of several keys in two queues (one key name in both, counted
    # apart); a key with room gets its next head at once, a key at its limit none.
    store.put_queue(QueueLimits("sync", concurrency_per_key=2), T0)
    store.put_queue(QueueLimits("other", concurrency_per_key=1), T0)
    a = ids_of(store, [new("a") for _ in range(3)])
    b = ids_of(store, [new("b", due=11) for _ in range(3)])
    c = ids_of(store, [new("c", due=12) for _ in range(3)])
    o = ids_of(store, [new("a", due=13, queue="other") for _ in range(2)])
    assert sorted(take(store)) == [a[0], b[0], c[0], o[0]]
    assert sorted(take(store)) == [a[1], b[1], c[1]]
    assert take(store) == []  # every key at its limit
    keys_at_limit = {q["name"]: q["keys_at_limit"] for q in store.queue_info(at(20))}
    assert (keys_at_limit["sync"], keys_at_limit["other"]) == (3, 1)
    finish(store, a[0])
    finish(store, o[0])
    assert sorted(take(store, when=22)) == [a[2], o[1]]
    assert take(store, when=22) == []


def test_a_failed_attempt_frees_its_key_and_its_retry_waits_its_turn(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    first, second = ids_of(store, [new("a"), new("a", due=15)])
    (claim,) = store.claim("w", 10, at(20), LEASE)
    assert claim.task_id == first
    error = ErrorInfo("E", "boom", "")
    store.record_and_claim(
        [Outcome(claim, error=error, retry_at=at(40))], at(21), owner="w", limit=0, lease=LEASE
    )
    # The key is free: its next task (due first now) runs; the retry waits behind it.
    assert claimed(store, when=22) == [second]
    assert claimed(store, when=50) == []


def test_an_expired_lease_frees_the_key(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    first, second = ids_of(store, [new("a"), new("a")])
    assert claimed(store) == [first]
    assert claimed(store, when=20 + 29) == []
    store.reclaim_expired(at(20) + LEASE, lambda name, attempt: timedelta(hours=1))
    assert claimed(store, when=20 + 30) == [second]


def test_a_cancelled_head_passes_the_turn(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    first, second = ids_of(store, [new("a"), new("a")])
    store.request_cancel(first, at(15))
    assert claimed(store) == [second]


def test_a_task_due_sooner_takes_the_head_of_one_due_later(store: BackendStore) -> None:
    # A head is the key's first claimable task: one due in an hour does not hold up a
    # task of its key submitted later and due now.
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    (later,) = ids_of(store, [new("a", due=3600)])
    (sooner,) = ids_of(store, [new("a", due=5)])
    (higher,) = ids_of(store, [new("a", due=5, priority=9)])
    assert take(store) == [higher]
    finish(store, higher)
    assert take(store, when=22) == [sooner]
    finish(store, sooner, when=23)
    assert take(store, when=24) == []
    assert take(store, when=3600) == [later]


def test_a_batch_gives_its_key_its_first_task_whatever_order_its_rows_went_in(
    store: BackendStore,
) -> None:
    # Tasks with an idempotency key go in after the others on PostgreSQL: the key's head
    # is still its first in (due_at, priority desc, seq).
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    keyed = new("a")._replace(idempotency_key="k")
    first, second = ids_of(store, [keyed, new("a")])
    assert take(store) == [first]
    finish(store, first)
    assert take(store, when=22) == [second]


def test_a_head_moved_later_gives_way_to_the_first_waiting_task(store: BackendStore) -> None:
    # A debounced head pushed back: the waiting task now first takes its place.
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    debounced = new("a", due=5)._replace(debounce_key="d")
    (head,) = ids_of(store, [debounced])
    (waiting,) = ids_of(store, [new("a", due=10)])
    pushed = debounced._replace(due_at=at(100))
    assert [s.task_id for s in store.submit([pushed], at(1))] == [head]
    assert take(store) == [waiting]
    finish(store, waiting)
    assert take(store, when=100) == [head]


def test_setting_and_removing_the_limit_applies_to_tasks_already_waiting(
    store: BackendStore,
) -> None:
    a = ids_of(store, [new("a") for _ in range(3)])
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    assert claimed(store) == [a[0]]
    assert claimed(store) == []
    store.put_queue(QueueLimits("sync"), T0)
    assert claimed(store) == a[1:]


def test_a_queue_without_a_limit_per_key_ignores_keys(store: BackendStore) -> None:
    a = ids_of(store, [new("a") for _ in range(3)])
    assert claimed(store) == a


def test_queue_info_counts_keys_at_their_limit(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    ids_of(store, [new("a"), new("a"), new("b"), new("c")])
    take(store, n=2)
    (info,) = [q for q in store.queue_info(at(20)) if q["name"] == "sync"]
    assert info["concurrency_per_key"] == 1
    assert info["keys_at_limit"] == 2
    assert [q.concurrency_per_key for q in store.queue_limits() if q.name == "sync"] == [1]


def test_a_task_keeps_its_limit_key(store: BackendStore) -> None:
    (task_id,) = ids_of(store, [new("customer:42")])
    task = store.get(task_id)
    assert task is not None and task.limit_key == "customer:42"


def test_the_scheduler_takes_limit_keys_from_submit_options_and_definitions(
    store: BackendStore,
) -> None:
    registry = TaskRegistry()

    @registry.task(
        name="sync", queue="sync", limit_key=lambda order, customer: f"customer:{customer}"
    )
    def sync(order: int, customer: int) -> None: ...

    scheduler = Scheduler(store, registry=registry)
    scheduler.set_queue("sync", concurrency_per_key=1)
    by_definition = scheduler.enqueue(sync, order=1, customer=7)
    by_option = scheduler.enqueue(sync.options(limit_key="vip"), order=2, customer=7)
    by_submit = scheduler.submit("sync", {"order": 3, "customer": 7}, limit_key="other")
    assert scheduler.get(by_definition.id).limit_key == "customer:7"
    assert scheduler.get(by_option.id).limit_key == "vip"
    assert scheduler.get(by_submit).limit_key == "other"
    # Each call of a batch gets its own key from the definition, or the options' one.
    many = scheduler.enqueue_many(
        [sync.bind(order=4, customer=8), sync.bind(order=5, customer=9)]
        + [sync.options(limit_key="vip").bind(order=6, customer=1)] * 2
    )
    assert [scheduler.get(h.id).limit_key for h in many] == [
        "customer:8",
        "customer:9",
        "vip",
        "vip",
    ]
    batch = scheduler.submit_many(
        "sync", [{"order": 7, "customer": 3}, {"order": 8, "customer": 4}]
    )
    assert [scheduler.get(i).limit_key for i in batch] == ["customer:3", "customer:4"]
    assert [q.concurrency_per_key for q in scheduler.queues() if q.name == "sync"] == [1]
    # Called as the function is: positional arguments positionally (stored apart from
    # the keyword ones, they are not a keyword of the call).
    positional = [
        scheduler.enqueue(sync, 9, 5),
        *scheduler.enqueue_many([sync.bind(10, customer=6), sync.bind(11, 7)]),
    ]
    by_positional = scheduler.submit("sync", {"customer": 8}, positional=[12])
    assert [scheduler.get(h.id).limit_key for h in positional] + [
        scheduler.get(by_positional).limit_key
    ] == ["customer:5", "customer:6", "customer:7", "customer:8"]
    with pytest.raises(InvalidTaskError, match="limit_key must be a non-empty string"):
        scheduler.submit("sync", {"order": 3, "customer": 7}, limit_key="")
    with pytest.raises(InvalidTaskError, match="concurrency per key must be a positive"):
        scheduler.set_queue("sync", concurrency_per_key=0)


def test_metrics_count_keys_at_their_limit_per_queue(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    ids_of(store, [new("a"), new("a"), new("b"), new(None)])
    take(store)
    text = metrics_text(store, clock=ManualClock(at(20))).decode()
    samples = [
        s
        for f in text_string_to_metric_families(text)
        if f.name == "durablesched_queue_keys_at_limit"
        for s in f.samples
    ]
    assert {s.labels["queue"]: s.value for s in samples} == {"default": 0, "sync": 2}


# -- rate per key ----------------------------------------------------------------------------


def test_a_rate_per_key_holds_back_a_key_until_its_window_passes(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", rate_per_key=Rate(2, timedelta(seconds=10))), T0)
    a = ids_of(store, [new("a") for _ in range(4)])
    (b,) = ids_of(store, [new("b", due=11)])
    assert claimed(store, when=20) == [a[0], b]  # one of a key per claim
    assert claimed(store, when=21) == [a[1]]  # a's second start in its window: now full
    assert claimed(store, when=25) == []
    assert store.next_wakeup(at(25)) == at(30)  # a's first start leaves the window
    (info,) = [q for q in store.queue_info(at(25)) if q["name"] == "sync"]
    assert (info["rate_per_key"], info["keys_at_limit"]) == ("2/10s", 1)
    assert claimed(store, when=30) == [a[2]]
    assert claimed(store, when=30) == []  # starts at 21 and 30: full until 31
    assert claimed(store, when=31) == [a[3]]


def test_a_rate_per_key_with_a_concurrency_per_key(store: BackendStore) -> None:
    store.put_queue(
        QueueLimits("sync", concurrency_per_key=1, rate_per_key=Rate(1, timedelta(seconds=60))),
        T0,
    )
    a = ids_of(store, [new("a") for _ in range(2)])
    take(store, when=20)
    finish(store, a[0], when=21)
    assert take(store, when=22) == []  # free to run, but its window is full
    assert take(store, when=80) == [a[1]]


def test_a_rate_per_key_counts_starts_committed_by_claims_with_later_times(
    store: BackendStore,
) -> None:
    """Claims read their clock before they wait for the write lock, so they commit with
    times out of order: a claim counts every start of its key after its own time minus
    the window, those committed with later times too (the process test's sequence)."""
    store.put_queue(QueueLimits("sync", rate_per_key=Rate(3, timedelta(seconds=1))), T0)
    a = ids_of(store, [new("a") for _ in range(6)])
    assert claimed(store, when=13.100) == [a[0]]
    assert claimed(store, when=13.090) == [a[1]]
    assert claimed(store, when=13.252) == [a[2]]  # full until 14.090
    assert claimed(store, when=14.108) == [a[3]]  # (13.108, 14.108]: 13.252 and this one
    # At 13.990 the window (12.990, ...) holds 13.100, 13.090, 13.252 and 14.108: full.
    assert claimed(store, when=13.990) == []
    assert claimed(store, when=14.099) == []  # 13.100 is still in its window
    assert claimed(store, when=14.100) == [a[4]]  # (13.100, ...): 13.252, 14.108, this
    assert claimed(store, when=14.200) == []  # (13.200, ...): full until 14.252
    assert claimed(store, when=14.252) == [a[5]]


def test_a_late_claim_takes_another_key_instead_of_a_full_one(store: BackendStore) -> None:
    store.put_queue(QueueLimits("sync", rate_per_key=Rate(2, timedelta(seconds=1))), T0)
    a = ids_of(store, [new("a") for _ in range(4)])
    (b,) = ids_of(store, [new("b", due=11)])
    (plain,) = ids_of(store, [new(None, due=12)])
    assert claimed(store, n=1, when=15.0) == [a[0]]
    assert claimed(store, n=1, when=15.1) == [a[1]]  # full until 16.0
    assert claimed(store, n=1, when=16.5) == [a[2]]  # (15.5, 16.5]: room for one more
    # A claim read at 15.8: a's window (14.8, ...) holds 15.0, 15.1 and 16.5, so b and
    # the plain task are taken, not a.
    assert claimed(store, n=3, when=15.8) == [b, plain]
    assert claimed(store, n=3, when=16.1) == [a[3]]  # (15.1, ...): 16.5 alone


def test_a_queue_rate_counts_starts_committed_by_claims_with_later_times(
    store: BackendStore,
) -> None:
    """The queue's own rate: the same out-of-order claims never start more than it."""
    store.put_queue(QueueLimits("sync", rate=Rate(3, timedelta(seconds=1))), T0)
    tasks = ids_of(store, [new(None) for _ in range(6)])
    assert len(claimed(store, n=1, when=13.100)) == 1
    assert len(claimed(store, n=1, when=13.090)) == 1
    assert len(claimed(store, n=1, when=13.252)) == 1
    assert len(claimed(store, n=3, when=14.108)) == 2  # 14.100 frees one: 13.252, 2 here
    assert claimed(store, n=3, when=13.990) == []
    # (13.095, 14.095] holds 13.100 and 13.252 alone, but the two at 14.108 count too.
    assert claimed(store, n=3, when=14.095) == []
    assert claimed(store, n=3, when=14.200) == []  # 13.252 and two at 14.108: full
    assert len(claimed(store, n=3, when=14.252)) == 1
    assert len(tasks) == 6


def key_counts_agree(store: SQLStore) -> dict[tuple[str, str], int]:
    """Each key's ``durablesched_limit_keys.running`` (what a claim reads and adds its
    starts to) against a count of the key's RUNNING tasks: equal for every row, and a
    key with a task RUNNING in a queue limited per key has its row. The rows, by key."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT queue, limit_key, running FROM durablesched_limit_keys")
        ).all()
        conn.rollback()
    counted = {(r.queue, r.limit_key): r.running for r in rows}
    running: dict[tuple[str, str], int] = {}
    for t in store.list_tasks(state=TaskState.RUNNING, limit=1_000):
        if t.limit_key is not None:
            running[(t.queue, t.limit_key)] = running.get((t.queue, t.limit_key), 0) + 1
    keyed = {q.name for q in store.queue_limits() if q.key_cap is not None}
    assert {k: n for k, n in counted.items() if n or k in running} == {
        k: n for k, n in running.items() if k[0] in keyed
    }
    assert key_findings(store) == []  # and the check sees nothing out of step
    return counted


def key_findings(store: SQLStore) -> list[str]:
    """What ``check`` finds of limit keys out of step with their tasks."""
    return [f.problem for f in store.check(at(20)).findings if f.check == "keys"]


@pytest.mark.parametrize("sql_backend", ["sqlite", "postgres"])
@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(
            "UPDATE durablesched_limit_keys SET running = 2 WHERE limit_key = 'a'", id="count"
        ),
        pytest.param("DELETE FROM durablesched_limit_keys WHERE limit_key = 'a'", id="row"),
        pytest.param(
            "UPDATE durablesched_limit_keys SET head_id = :third WHERE limit_key = 'a'; "
            "UPDATE tasks SET key_waiting = 1 WHERE id = :second; "
            "UPDATE tasks SET key_waiting = 0 WHERE id = :third",
            id="head",
        ),
        pytest.param(
            "UPDATE durablesched_limit_keys SET head_id = NULL WHERE limit_key = 'a'; "
            "UPDATE tasks SET key_waiting = 1 WHERE id = :second",
            id="headless",
        ),
        pytest.param(
            "UPDATE durablesched_limit_keys SET head_id = :first WHERE limit_key = 'a'; "
            "UPDATE tasks SET key_waiting = 1 WHERE id = :second",
            id="head-gone",
        ),
        pytest.param("UPDATE tasks SET key_waiting = 0 WHERE id = :third", id="waiting"),
    ],
)
def test_check_finds_a_key_out_of_step_and_its_limit_set_again_mends_it(
    sql_backend: str, corrupt: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Bookkeeping a bug (or a hand) left wrong, each kind alone: a key's count of RUNNING,
    its row gone, a head that is not its first claimable task (another is, none is while
    one waits, or the head is not claimable), a waiting task marked as a head. ``check``
    names the key (only it); the limit set off and on counts afresh."""
    store = make_store(sql_backend, tmp_path, request)
    assert isinstance(store, SQLStore)
    try:
        store.put_queue(QueueLimits("sync", concurrency_per_key=2), T0)
        first, second, third = ids_of(store, [new("a"), new("a", due=11), new("a", due=12)])
        ids_of(store, [new("b")])
        assert sorted(claimed(store)) == [first, first + 3]  # a's and b's heads
        assert key_findings(store) == []
        with store.engine.begin() as conn:
            for statement in corrupt.split("; "):
                conn.execute(text(statement), {"first": first, "second": second, "third": third})
        (problem,) = key_findings(store)
        assert "sync/a" in problem and "sync/b" not in problem, problem
        store.put_queue(QueueLimits("sync"), at(21))
        store.put_queue(QueueLimits("sync", concurrency_per_key=2), at(21))
        assert key_findings(store) == []
        assert claimed(store, when=22) == [second]
    finally:
        store.close()


@pytest.mark.parametrize("sql_backend", ["sqlite", "postgres"])
def test_each_keys_running_count_stays_exact_on_every_path(
    sql_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A claim adds its starts to the key's row; every other change of a keyed task
    (outcome, retry, cancel, give-back, reclaim, suspend, requeue, purge, a new limit)
    leaves the row's count equal to the key's RUNNING tasks. (The memory store keeps no
    count: it counts a key's RUNNING tasks each time.)"""
    store = make_store(sql_backend, tmp_path, request)
    assert isinstance(store, SQLStore)
    store.put_queue(QueueLimits("sync", concurrency_per_key=2), T0)
    ids_of(store, [new(k, due=10 + i) for i in range(5) for k in ("a", "b", "c", "d")])
    key_counts_agree(store)
    claims = store.claim("w", 10, at(20), LEASE)  # one of each key
    assert key_counts_agree(store)[("sync", "a")] == 1
    claims += store.claim("w", 10, at(20), LEASE)  # the second of each key
    counted = key_counts_agree(store)
    assert all(counted[("sync", k)] == 2 for k in "abcd")
    by_key = {k: [c for c in claims if store_key(store, c) == k] for k in "abcd"}
    # a: one succeeds, the other fails with a retry; in the same step a claim takes a's next
    (a1, a2) = by_key["a"]
    error = ErrorInfo("E", "boom", "")
    _, more = store.record_and_claim(
        [Outcome(a1, result=None), Outcome(a2, error=error, retry_at=at(25))],
        at(21),
        owner="w",
        limit=1,
        lease=LEASE,
    )
    assert key_counts_agree(store)[("sync", "a")] == len(more) == 1
    # b: one cancelled while running, the other given back at shutdown
    (b1, b2) = by_key["b"]
    store.request_cancel(b1.task_id, at(22))
    assert store.acknowledge_cancel(b1, at(22))
    key_counts_agree(store)
    assert store.release([b2], at(22)) == 1
    assert key_counts_agree(store).get(("sync", "b"), 0) == 0
    # c: one fails for good (then requeued), the other suspends as a workflow's wait
    (c1, c2) = by_key["c"]
    store.record_and_claim([Outcome(c1, error=error)], at(23), owner="w", limit=0, lease=LEASE)
    key_counts_agree(store)
    store.requeue(c1.task_id, at(23))
    key_counts_agree(store)
    store.suspend(c2, at(60), at(23), detail="sleeping")
    key_counts_agree(store)
    # d: both leases expire: each lost attempt retries later
    store.reclaim_expired(at(20) + LEASE, lambda name, attempt: timedelta(hours=1))
    key_counts_agree(store)
    # New claims, a lower limit under them, a purge of what finished, the limit lifted.
    store.claim("w", 10, at(20) + LEASE, LEASE)
    key_counts_agree(store)
    store.put_queue(QueueLimits("sync", concurrency_per_key=1), at(20) + LEASE)
    key_counts_agree(store)
    store.purge(at(20) + 2 * LEASE)
    key_counts_agree(store)
    store.put_queue(QueueLimits("sync"), at(20) + LEASE)
    key_counts_agree(store)
    store.close()


def store_key(store: SQLStore, claim: Claim) -> str | None:
    task = store.get(claim.task_id)
    assert task is not None
    return task.limit_key
