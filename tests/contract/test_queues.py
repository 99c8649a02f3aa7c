"""Named queues, priorities and the limits stored for a queue, on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablesched import InvalidTaskError, QueueLimits, Rate, Scheduler, TaskRegistry, TaskState
from durablesched.records import NewTask, Outcome

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)


def new(name: str = "t", due: float = 10, *, queue: str = "default", priority: int = 0) -> NewTask:
    return NewTask(name, {}, at(due), 3, None, None, queue, priority)


def ids_of(store: BackendStore, tasks: list[NewTask]) -> list[int]:
    return [s.task_id for s in store.submit(tasks, T0)]


def test_higher_priority_runs_first_then_due_time_then_submission(store: BackendStore) -> None:
    low, high, early, tie = ids_of(
        store, [new(due=10), new(due=12, priority=5), new(due=9), new(due=12, priority=5)]
    )
    claims = store.claim("w", 10, at(20), LEASE)
    assert [c.task_id for c in claims] == [high, tie, early, low]


def test_a_priority_does_not_make_a_task_due_early(store: BackendStore) -> None:
    (later,) = ids_of(store, [new(due=30, priority=100)])
    (now,) = ids_of(store, [new(due=10, priority=-100)])
    assert [c.task_id for c in store.claim("w", 10, at(20), LEASE)] == [now]
    assert [c.task_id for c in store.claim("w", 10, at(30), LEASE)] == [later]


def test_a_claim_takes_each_queue_up_to_its_own_count(store: BackendStore) -> None:
    mail = ids_of(store, [new(queue="mail") for _ in range(5)])
    reports = ids_of(store, [new(queue="reports") for _ in range(5)])
    claims = store.claim("w", 10, at(20), LEASE, queues={"mail": 2, "reports": 1})
    assert sorted(c.task_id for c in claims) == sorted(mail[:2] + reports[:1])
    assert {c.task_id: c.queue for c in claims} == {
        **dict.fromkeys(mail[:2], "mail"),
        reports[0]: "reports",
    }
    # A queue not asked for is never claimed from; a full one never blocks another.
    assert [c.queue for c in store.claim("w", 10, at(20), LEASE, queues={"other": 3})] == []
    claims = store.claim("w", 10, at(20), LEASE, queues={"mail": 0, "reports": 9})
    assert sorted(c.task_id for c in claims) == reports[1:]


def test_without_queues_a_claim_takes_the_best_of_every_queue(store: BackendStore) -> None:
    a, b, c = ids_of(
        store, [new(queue="a", due=11), new(queue="b", due=10), new(queue="c", priority=1)]
    )
    assert [x.task_id for x in store.claim("w", 2, at(20), LEASE)] == [c, b]
    assert [x.task_id for x in store.claim("w", 2, at(20), LEASE)] == [a]


def test_a_concurrency_limit_counts_what_runs_anywhere(store: BackendStore) -> None:
    store.put_queue(QueueLimits("api", concurrency=2), T0)
    ids_of(store, [new(queue="api") for _ in range(5)])
    assert len(store.claim("w1", 10, at(20), LEASE)) == 2
    assert store.claim("w2", 10, at(20), LEASE) == []  # another worker: still two at most
    # A killed worker's slots stay taken until its leases are reclaimed, not before.
    assert store.claim("w2", 10, at(20) + LEASE - timedelta(seconds=1), LEASE) == []
    store.reclaim_expired(at(20) + LEASE, lambda name, attempt: timedelta(hours=1))
    assert len(store.claim("w2", 10, at(20) + LEASE, LEASE)) == 2


def test_a_paused_queue_starts_nothing_and_resumes(store: BackendStore) -> None:
    store.put_queue(QueueLimits("reports", paused=True), T0)
    (report,) = ids_of(store, [new(queue="reports")])
    (mail,) = ids_of(store, [new(queue="mail")])
    assert [c.task_id for c in store.claim("w", 10, at(20), LEASE)] == [mail]
    store.put_queue(QueueLimits("reports"), T0)
    assert [c.task_id for c in store.claim("w", 10, at(20), LEASE)] == [report]


def test_a_rate_limit_counts_starts_in_any_window(store: BackendStore) -> None:
    store.put_queue(QueueLimits("api", rate=Rate(2, timedelta(seconds=10))), T0)
    ids_of(store, [new(queue="api") for _ in range(6)])
    assert len(store.claim("w", 10, at(20), LEASE)) == 2
    assert store.claim("w", 10, at(25), LEASE) == []
    # The window admits a start again once the first start is 10 s old, and says when.
    assert store.next_wakeup(at(25)) == at(30)
    assert len(store.claim("w", 10, at(30), LEASE)) == 2
    assert len(store.claim("w2", 10, at(39.999), LEASE)) == 0
    assert len(store.claim("w2", 10, at(40), LEASE)) == 2


def test_a_claim_whose_time_is_behind_another_claims_still_sees_its_window(
    store: BackendStore,
) -> None:
    # A worker reads its clock, then waits for the write lock while another worker
    # with a later time claims first: the first must still count every start its own
    # window holds, though they are older than the other's window needs.
    store.put_queue(QueueLimits("api", rate=Rate(2, timedelta(seconds=10))), T0)
    ids_of(store, [new(queue="api") for _ in range(6)])
    assert len(store.claim("w", 2, at(20), LEASE)) == 2
    assert len(store.claim("w2", 1, at(30.5), LEASE)) == 1  # its window: (20.5, 30.5]
    # Behind it: its window (20, 30] holds the two starts at 20, so nothing starts.
    assert store.claim("w3", 1, at(29.5), LEASE) == []


def test_next_wakeup_sees_only_the_queues_asked_for(store: BackendStore) -> None:
    ids_of(store, [new(queue="reports", due=50), new(queue="mail", due=60)])
    assert store.next_wakeup(at(20), queues=["mail"]) == at(60)
    assert store.next_wakeup(at(20), queues=["reports", "mail"]) == at(50)
    assert store.next_wakeup(at(20), queues=["other"]) is None


def test_queue_limits_and_info(store: BackendStore) -> None:
    store.put_queue(QueueLimits("api", concurrency=3, rate=Rate.parse("10/s")), T0)
    ids_of(store, [new(queue="api", due=5), new(queue="api", due=100), new(queue="mail", due=1)])
    store.claim("w", 1, at(20), LEASE, queues={"mail": 1})
    limits = {q.name: q for q in store.queue_limits()}
    assert set(limits) == {"default", "api", "mail"}
    assert limits["api"] == QueueLimits("api", 3, Rate(10, timedelta(seconds=1)))
    info = {q["name"]: q for q in store.queue_info(at(20))}
    assert info["api"]["counts"]["PENDING"] == 2
    assert info["api"]["oldest_waiting_seconds"] == 15.0
    assert (info["api"]["concurrency"], info["api"]["rate"]) == (3, "10/s")
    assert (info["mail"]["running"], info["mail"]["oldest_waiting_seconds"]) == (1, None)
    assert info["default"]["counts"] == dict.fromkeys((s.value for s in TaskState), 0)


def test_a_task_keeps_its_queue_and_priority(store: BackendStore) -> None:
    (task_id,) = ids_of(store, [new(queue="reports", priority=-7)])
    task = store.get(task_id)
    assert task is not None and (task.queue, task.priority) == ("reports", -7)


def test_definitions_and_submits_place_tasks(store: BackendStore) -> None:
    registry = TaskRegistry()
    registry.task("report", queue="reports", priority=10)(lambda: None)
    registry.task("plain")(lambda: None)
    scheduler = Scheduler(store, registry=registry)
    placed = {
        "definition": scheduler.submit("report"),
        "override": scheduler.submit("report", queue="urgent", priority=-3),
        "plain": scheduler.submit("plain"),
    }
    many = scheduler.submit_many("report", [{}, {}], priority=1)
    got = {k: (t.queue, t.priority) for k, v in placed.items() if (t := store.get(v))}
    assert got == {
        "definition": ("reports", 10),
        "override": ("urgent", -3),
        "plain": ("default", 0),
    }
    tasks = [store.get(i) for i in many]
    assert {(t.queue, t.priority) for t in tasks if t is not None} == {("reports", 1)}


@pytest.mark.parametrize(
    ("queue", "priority", "message"),
    [
        ("", 0, "queue must be letters"),
        ("has space", 0, "queue must be letters"),
        ("x" * 101, 0, "longer than 100"),
        ("-lead", 0, "queue must be letters"),
        ("ok", 101, "priority must be from -100 to 100"),
        ("ok", True, "priority must be an integer"),
        ("ok", 1.5, "priority must be an integer"),
    ],
)
def test_bad_queues_and_priorities_are_refused_and_nothing_is_stored(
    store: BackendStore, queue: str, priority: int, message: str
) -> None:
    scheduler = Scheduler(store)
    with pytest.raises(InvalidTaskError, match=message):
        scheduler.submit("t", queue=queue, priority=priority)
    assert store.list_tasks() == []


def test_set_queue_keeps_what_it_is_not_told(store: BackendStore) -> None:
    scheduler = Scheduler(store)
    scheduler.set_queue("api", concurrency=4)
    scheduler.set_queue("api", rate="5/m")
    paused = scheduler.pause_queue("api")
    assert paused == QueueLimits("api", 4, Rate(5, timedelta(minutes=1)), paused=True)
    assert scheduler.resume_queue("api").paused is False
    assert scheduler.set_queue("api", concurrency=None).concurrency is None
    with pytest.raises(InvalidTaskError, match="a rate is COUNT/WINDOW"):
        scheduler.set_queue("api", rate="10/x")
    with pytest.raises(InvalidTaskError, match="concurrency must be a positive"):
        scheduler.set_queue("api", concurrency=0)
    assert {q.name: q for q in scheduler.queues()}["api"].rate == Rate(5, timedelta(minutes=1))


@pytest.mark.parametrize(
    ("text", "count", "seconds", "shown"),
    [
        ("10/s", 10, 1, "10/s"),
        ("100/m", 100, 60, "100/m"),
        ("5/10s", 5, 10, "5/10s"),
        ("1000/h", 1000, 3600, "1000/h"),
        (" 3 / 2min ", 3, 120, "3/2m"),
    ],
)
def test_rates_read_and_print(text: str, count: int, seconds: int, shown: str) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.per, str(rate)) == (count, timedelta(seconds=seconds), shown)


@pytest.mark.parametrize("text", ["10/x", "0/s", "-1/s", "10", "/s", "10/0s", "10/2d", "a/s"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(InvalidTaskError):
        Rate.parse(text)


def test_queue_info_without_finished_counts_the_live_states_only(store: BackendStore) -> None:
    done, waiting = ids_of(store, [new(queue="mail"), new(queue="mail", due=30)])
    (claim,) = store.claim("w", 1, at(20), LEASE)
    assert claim.task_id == done
    store.complete(claim, None, at(21))
    (full,) = [q for q in store.queue_info(at(40)) if q["name"] == "mail"]
    (live,) = [q for q in store.queue_info(at(40), finished=False) if q["name"] == "mail"]
    assert full["counts"]["SUCCEEDED"] == 1
    assert live["counts"] == {"PENDING": 1, "RUNNING": 0, "RETRY_WAIT": 0}
    assert live["oldest_waiting_seconds"] == full["oldest_waiting_seconds"] == 10
    assert {k: v for k, v in full.items() if k != "counts"} == {
        k: v for k, v in live.items() if k != "counts"
    }
    assert waiting != done


def test_a_claim_ahead_comes_after_the_claim_and_never_from_a_limited_queue(
    store: BackendStore,
) -> None:
    """``ahead`` claims wait in a worker: their start is not their claim, so a queue
    with a concurrency or rate limit (or paused) gives none ahead, only into slots.
    Fails with the unlimited-only filter dropped from the claim ahead."""
    store.put_queue(QueueLimits("capped", concurrency=5), T0)
    store.put_queue(QueueLimits("rated", rate=Rate.parse("100/s")), T0)
    capped = ids_of(store, [new(queue="capped", priority=9) for _ in range(3)])
    rated = ids_of(store, [new(queue="rated", priority=8) for _ in range(3)])
    free = ids_of(store, [new(priority=i) for i in range(3)])
    claims = store.claim("w", 1, at(20), LEASE, ahead=5)
    # The one slot: the best task; then ahead, only the unlimited queue's, best first.
    assert [c.task_id for c in claims] == [capped[0], free[2], free[1], free[0]]
    assert [c.started_at for c in claims] == [at(20), None, None, None]
    assert all(c.claimed_at == at(20) for c in claims)
    rated_task = store.get(rated[0])
    assert rated_task is not None and rated_task.state is TaskState.PENDING
    # With a worker's queues: ahead only from those asked for (up to ``ahead`` of each).
    more = ids_of(store, [new(queue="mail") for _ in range(3)])
    claims = store.claim("w", 0, at(20), LEASE, queues={"mail": 0, "rated": 0}, ahead=2)
    assert [(c.task_id, c.started_at) for c in claims] == [(more[0], None), (more[1], None)]


def test_a_claim_short_of_its_slots_still_claims_ahead_from_a_queue_not_drained(
    store: BackendStore,
) -> None:
    """A claim that took fewer than its slots skips the claim ahead only where every queue
    that claim would ask was drained: a queue whose own share was filled, or that was given
    no share, still gives claims ahead. Fails with the short claim alone taken as drained."""
    mail = ids_of(store, [new(queue="mail") for _ in range(3)])
    claims = store.claim("w", 2, at(20), LEASE, queues={"mail": 1, "jobs": 1}, ahead=2)
    # One of two slots filled (jobs is empty), but mail's share was full: it has more.
    assert [(c.task_id, c.started_at) for c in claims] == [
        (mail[0], at(20)),
        (mail[1], None),
        (mail[2], None),
    ]
    more = ids_of(store, [new(queue="mail") for _ in range(2)])
    claims = store.claim("w", 1, at(20), LEASE, queues={"mail": 0, "jobs": 1}, ahead=2)
    # The slot's queue is empty; mail had no share of the slot, and gives both ahead.
    assert [(c.task_id, c.started_at) for c in claims] == [(more[0], None), (more[1], None)]
    # Nothing left anywhere: a short claim, and none ahead.
    assert store.claim("w", 1, at(20), LEASE, ahead=2) == []


def test_a_group_commit_claims_ahead_in_its_transaction(store: BackendStore) -> None:
    first, *rest = ids_of(store, [new() for _ in range(4)])
    (claim,) = store.claim("w", 1, at(20), LEASE)
    results, claims = store.record_and_claim(
        [Outcome(claim, result=1)], at(21), owner="w", limit=1, lease=LEASE, ahead=2
    )
    assert results == [TaskState.SUCCEEDED]
    assert [(c.task_id, c.started_at) for c in claims] == [
        (rest[0], at(21)),
        (rest[1], None),
        (rest[2], None),
    ]
    assert claim.task_id == first


def test_a_claim_takes_due_tasks_across_priorities_past_those_due_later(
    store: BackendStore,
) -> None:
    # Each priority has tasks due later (sleeping, delayed, waiting to retry) ahead of or
    # among its due ones, and one priority has none due: a claim asking for more than is
    # due takes every due task, best first, and none due later.
    spec = [
        (9, 50), (9, 60), (5, 12), (5, 70), (5, 11), (3, 80), (3, 90),
        (1, 95), (1, 10), (1, 13), (1, 99), (1, 10), (-2, 14), (-2, 85),
    ]  # fmt: skip
    ids = ids_of(store, [new(due=due, priority=p) for p, due in spec])
    due = sorted(
        (-p, d, i) for i, (p, d) in zip(ids, spec, strict=True) if d <= 20
    )  # (priority desc, due_at, seq): seq follows the ids here
    expected = [i for _, _, i in due]
    taken: list[int] = []
    for ask in (1, 2, 4, 10):
        taken += [c.task_id for c in store.claim("w", ask, at(20), LEASE)]
    assert taken == expected
    assert store.claim("w", 10, at(40), LEASE) == []
    assert [c.task_id for c in store.claim("w", 10, at(60), LEASE)] == [ids[0], ids[1]]


def test_a_claim_by_name_across_priorities_takes_only_its_names(store: BackendStore) -> None:
    spec = [("a", 9, 50), ("b", 9, 10), ("a", 5, 11), ("b", 5, 10), ("a", 5, 80), ("a", 0, 10)]
    ids = ids_of(store, [new(name, due=due, priority=p) for name, p, due in spec])
    claims = store.claim("w", 5, at(20), LEASE, ["a"])
    assert [c.task_id for c in claims] == [ids[2], ids[5]]
    assert [c.task_id for c in store.claim("w", 5, at(20), LEASE)] == [ids[1], ids[3]]


def test_a_claim_of_several_queues_walks_each_queues_priorities(store: BackendStore) -> None:
    mail = ids_of(
        store,
        [new(queue="mail", due=d, priority=p) for p, d in [(7, 90), (7, 12), (2, 10), (2, 95)]],
    )
    reports = ids_of(
        store,
        [new(queue="reports", due=d, priority=p) for p, d in [(8, 99), (4, 11), (1, 10), (1, 11)]],
    )
    claims = store.claim("w", 10, at(20), LEASE, queues={"mail": 3, "reports": 2})
    assert [c.task_id for c in claims] == [mail[1], reports[1], mail[2], reports[2]]
