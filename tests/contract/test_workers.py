"""Live workers on every backend: registered, seen at heartbeats, gone after a lease,
forgotten a day later, removed at a clean exit."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from durablesched import TaskState
from durablesched.records import WORKER_FORGET_AFTER, NewTask, Outcome, WorkerInfo

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)


def info(worker_id: str = "host:1:ab", *, started: float = 10, **changes: object) -> WorkerInfo:
    fields: dict[str, object] = {
        "id": worker_id,
        "host": "host",
        "pid": 1,
        "queues": None,
        "concurrency": 4,
        "version": "1.2.3",
        "started_at": at(started),
        "last_seen": at(started),
        "lease": LEASE,
        **changes,
    }
    return WorkerInfo(**fields)  # type: ignore[arg-type]


def test_a_registered_worker_is_listed_as_it_registered(store: BackendStore) -> None:
    worker = info(queues={"mail": 2, "default": 3}, concurrency=5, lease=timedelta(seconds=2.5))
    store.register_worker(worker, at(10))
    assert store.list_workers(at(11)) == [worker]
    assert store.list_workers(at(11))[0].alive(at(11))


def test_registering_again_replaces_the_row(store: BackendStore) -> None:
    store.register_worker(info(pid=1), at(10))
    again = info(pid=2, started=20)
    store.register_worker(again, at(20))
    assert store.list_workers(at(20)) == [again]


def test_workers_are_listed_by_start_then_id(store: BackendStore) -> None:
    for worker_id, started in [("b", 10), ("c", 5), ("a", 10)]:
        store.register_worker(info(worker_id, started=started), at(10))
    assert [w.id for w in store.list_workers(at(10))] == ["c", "a", "b"]


def test_a_heartbeat_without_claims_marks_the_worker_seen(store: BackendStore) -> None:
    store.register_worker(info(), at(10))
    assert store.heartbeat("host:1:ab", [], at(35), LEASE) == []
    (seen,) = store.list_workers(at(60))
    assert seen.last_seen == at(35)
    assert seen.alive(at(65)) and not seen.alive(at(65.001))
    assert seen.state(at(66)) == "gone"


def test_a_heartbeat_with_claims_marks_the_worker_seen_in_the_same_step(
    store: BackendStore,
) -> None:
    store.submit([NewTask("t", {}, at(10), 3)], T0)
    store.register_worker(info(), at(10))
    claims = store.claim("host:1:ab", 1, at(10), LEASE)
    statuses = store.heartbeat("host:1:ab", claims, at(20), LEASE)
    assert [s.task_id for s in statuses] == [c.task_id for c in claims]
    assert store.list_workers(at(20))[0].last_seen == at(20)
    # Another owner's heartbeat marks only its own row (none here).
    store.heartbeat("someone else", claims, at(25), LEASE)
    assert store.list_workers(at(25))[0].last_seen == at(20)


def test_a_heartbeat_of_an_unregistered_owner_registers_nothing(store: BackendStore) -> None:
    store.heartbeat("nobody", [], at(10), LEASE)
    assert store.list_workers(at(10)) == []


def test_a_clean_exit_removes_the_row(store: BackendStore) -> None:
    store.register_worker(info(), at(10))
    assert store.deregister_worker("host:1:ab") is True
    assert store.list_workers(at(10)) == []
    assert store.deregister_worker("host:1:ab") is False


def test_a_gone_worker_is_listed_until_forgotten_then_pruned(store: BackendStore) -> None:
    store.register_worker(info("dead"), at(10))
    store.register_worker(info("live"), at(10))
    last = at(10) + LEASE + WORKER_FORGET_AFTER
    store.heartbeat("live", [], last, LEASE)
    # Gone, but listed for a day after its lease ran out...
    assert [(w.id, w.state(last)) for w in store.list_workers(last)] == [
        ("dead", "gone"),
        ("live", "alive"),
    ]
    assert store.prune_workers(last) == 0
    # ...and then neither listed nor kept.
    later = last + timedelta(microseconds=1)
    assert [w.id for w in store.list_workers(later)] == ["live"]
    assert store.prune_workers(later) == 1
    assert store.prune_workers(later) == 0
    assert store.deregister_worker("dead") is False


def test_a_registration_prunes_forgotten_workers(store: BackendStore) -> None:
    store.register_worker(info("dead", lease=timedelta(seconds=5)), at(10))
    now = at(16) + WORKER_FORGET_AFTER
    store.register_worker(info("new", started=0, last_seen=now), now)
    assert store.deregister_worker("dead") is False
    assert [w.id for w in store.list_workers(now)] == ["new"]


def test_claims_ahead_are_told_from_started_ones_until_their_start_is_recorded(
    store: BackendStore,
) -> None:
    """A claim ahead is RUNNING with no start (the task's ``started_at`` None; the
    worker's and the queue's ``waiting``) until a group commit records its start: then
    ``started_at`` and its claim's history line carry the real start, not the claim.
    Fails with the start marks left out of record_and_claim, or the history line not
    moved."""
    store.register_worker(info("w"), at(10))
    store.submit([NewTask("t", {}, at(10), 3) for _ in range(3)], T0)
    first, *ahead = store.claim("w", 1, at(20), LEASE, ahead=2)
    assert first.started_at == at(20) and [c.started_at for c in ahead] == [None, None]
    assert [store.get(c.task_id).started_at for c in (first, *ahead)] == [at(20), None, None]  # type: ignore[union-attr]
    (listed,) = store.list_workers(at(21))
    assert (listed.running, listed.waiting) == (1, 2)
    (queue,) = [q for q in store.queue_info(at(21)) if q["name"] == "default"]
    assert (queue["counts"]["RUNNING"], queue["running"], queue["waiting"]) == (3, 1, 2)
    # The first ends; the next claim ahead started at 22, recorded with its outcome.
    started = replace(ahead[0], started_at=at(22))
    results, _ = store.record_and_claim(
        [Outcome(first, result=1)], at(23), owner="w", limit=0, lease=LEASE, started=[started]
    )
    assert results == [TaskState.SUCCEEDED]
    task = store.get(started.task_id)
    assert task is not None and (task.state, task.started_at) == (TaskState.RUNNING, at(22))
    (line,) = [e for e in store.history(started.task_id) if e.state is TaskState.RUNNING]
    assert line.at == at(22)  # the attempt's start, not its claim at 20
    (listed,) = store.list_workers(at(23))
    assert (listed.running, listed.waiting) == (1, 1)
    # Recorded once: a second mark (or one of a claim no longer valid) changes nothing.
    store.record_and_claim(
        [], at(24), owner="w", limit=0, lease=LEASE, started=[replace(started, started_at=at(24))]
    )
    assert store.get(started.task_id).started_at == at(22)  # type: ignore[union-attr]


def test_starts_recorded_in_one_batch_move_only_their_own_valid_lines(
    store: BackendStore,
) -> None:
    """Several starts in one group commit: each valid claim ahead gets its start and its
    history line moved to it; a start already recorded keeps its line, and a claim no
    longer valid (another fence) changes neither its task nor its line. Fails with the
    line moved for every start of the batch (not only where the task's start is this
    one's)."""
    store.register_worker(info("w"), at(10))
    store.submit([NewTask("t", {}, at(10), 3) for _ in range(4)], T0)
    first, a, b, c = store.claim("w", 1, at(20), LEASE, ahead=3)

    def running_line(task_id: int) -> object:
        (line,) = [e for e in store.history(task_id) if e.state is TaskState.RUNNING]
        return line.at

    store.record_and_claim(
        [Outcome(first, result=1)],
        at(23),
        owner="w",
        limit=0,
        lease=LEASE,
        started=[replace(a, started_at=at(22))],
    )
    assert running_line(a.task_id) == at(22)
    store.record_and_claim(
        [],
        at(26),
        owner="w",
        limit=0,
        lease=LEASE,
        started=[
            replace(a, started_at=at(25)),  # recorded at 22 already
            replace(b, fence=b.fence + 1, started_at=at(25)),  # not this worker's claim
            replace(c, started_at=at(25)),
        ],
    )
    assert [store.get(t.task_id).started_at for t in (a, b, c)] == [at(22), None, at(25)]  # type: ignore[union-attr]
    assert [running_line(t.task_id) for t in (a, b, c)] == [at(22), at(20), at(25)]


def test_claims_ahead_given_back_at_shutdown_and_claimed_again_keep_their_old_lines(
    store: BackendStore,
) -> None:
    """Claims ahead given back at shutdown (a forged claim of one in the same batch,
    refused), then claimed afresh by a claim that starts them: each new claim writes a
    new RUNNING line at its start and the old claim's line stays where it was (histories
    are never rewritten), and the given-back attempt counts nothing. Fails with a claim
    of a task that never started moving its old RUNNING line instead of writing one."""
    store.register_worker(info("w"), at(10))
    store.submit([NewTask("t", {"i": i}, at(10), 3) for i in range(2)], T0)
    _, ahead = store.record_and_claim([], at(10), owner="w", limit=0, lease=LEASE, ahead=2)
    assert [c.started_at for c in ahead] == [None, None]
    forged = replace(ahead[0], fence=ahead[0].fence + 1)
    assert store.release([*ahead, forged], at(10), why="at shutdown") == 2
    _, again = store.record_and_claim([], at(40), owner="w", limit=4, lease=LEASE)
    assert [(c.task_id, c.attempt, c.started_at) for c in again] == [
        (c.task_id, 1, at(40)) for c in ahead
    ]
    for claim in ahead:
        lines = [(e.at, e.state, e.attempt) for e in store.history(claim.task_id)]
        assert lines == [
            (at(10), TaskState.PENDING, 0),
            (at(10), TaskState.RUNNING, 1),  # the claim ahead, as it was written
            (at(10), TaskState.PENDING, 0),  # given back uncounted
            (at(40), TaskState.RUNNING, 1),  # the new claim, started at once
        ]
        task = store.get(claim.task_id)
        assert task is not None and (task.attempts, task.started_at) == (1, at(40))
