"""``attempt_totals``: every ended attempt counted once, in its outcome's transaction, the
same on every backend; a give-back, a refused outcome or a purge changes nothing."""

from __future__ import annotations

from datetime import timedelta

from durablesched import ErrorInfo
from durablesched.records import NewTask, Outcome
from durablesched.totals import DURATION_BOUNDS, NO_DURATION, AttemptTotal, bucket_of

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "")
#: 0.3 s runs in the 0.5 s bucket; exactly 1 s in the 1 s one (at most the bound).
HALF = DURATION_BOUNDS.index(0.5)
ONE = DURATION_BOUNDS.index(1.0)


def test_each_outcome_is_counted_once_by_queue_name_outcome_and_bucket(
    store: BackendStore,
) -> None:
    ok, flaky, doomed, _lost, given_back = (
        s.task_id
        for s in store.submit(
            [
                NewTask("ok", {}, at(10), 3),
                NewTask("flaky", {}, at(10), 3, None, None, "mail"),
                NewTask("doomed", {}, at(10), 1, None, None, "mail"),
                NewTask("lost", {}, at(10), 1),
                NewTask("ok", {}, at(10), 3),
            ],
            T0,
        )
    )
    claims = {c.task_id: c for c in store.claim("w1", 5, at(20), LEASE)}
    assert store.attempt_totals() == []
    assert store.complete(claims[ok], None, at(20.3))
    assert not store.complete(claims[ok], None, at(20.4))  # refused: not counted again
    store.fail(claims[flaky], ERR, at(30), at(21))  # retried, after exactly 1 s
    store.fail(claims[doomed], ERR, None, at(20))  # failed, at once
    assert store.release([claims[given_back]], at(22)) == 1  # no outcome: not counted
    (again,) = store.claim("w2", 1, at(40), LEASE)  # flaky's retry (given_back was first)
    store.request_cancel(again.task_id, at(41))
    assert store.acknowledge_cancel(again, at(41))
    store.reclaim_expired(at(60), lambda name, attempt: timedelta(0))  # lost: its lease lapsed
    assert again.task_id == given_back
    expected = [
        AttemptTotal("default", "lost", "reclaimed", NO_DURATION, 1, 0),
        AttemptTotal("default", "ok", "cancelled", ONE, 1, 1_000_000),
        AttemptTotal("default", "ok", "succeeded", HALF, 1, 300_000),
        AttemptTotal("mail", "doomed", "failed", 0, 1, 0),
        AttemptTotal("mail", "flaky", "retried", ONE, 1, 1_000_000),
    ]
    assert store.attempt_totals() == expected
    purged = getattr(store, "purge", None)
    if purged is not None:  # the SQL stores: the totals never go back
        assert purged(at(10_000)) > 0
        assert store.attempt_totals() == expected


def test_a_group_commit_counts_what_it_recorded_and_adds_to_earlier_totals(
    store: BackendStore,
) -> None:
    store.submit([NewTask("ok", {}, at(10), 3) for _ in range(3)], T0)
    first, second, third = store.claim("w1", 3, at(10), LEASE)
    stale = first
    store.record_and_claim(
        [Outcome(first, result=1), Outcome(second, error=ERR, retry_at=at(11))],
        at(10.004),
        owner="w1",
        limit=0,
        lease=LEASE,
    )
    store.record_and_claim(
        [Outcome(third, result=3), Outcome(stale, result=1)],  # the stale one is refused
        at(10.004),
        owner="w1",
        limit=0,
        lease=LEASE,
    )
    assert store.attempt_totals() == [
        AttemptTotal("default", "ok", "retried", bucket_of(4_000), 1, 4_000),
        AttemptTotal("default", "ok", "succeeded", bucket_of(4_000), 2, 8_000),
    ]
