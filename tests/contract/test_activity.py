"""``activity``: what a window of history says happened, as metrics count it, on every
backend: the same counts, and run times exact to the microsecond at a bound."""

from __future__ import annotations

from datetime import timedelta

from durablesched import ErrorInfo
from durablesched.records import Activity, DurationCounts, NewTask

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "")
BOUNDS = [timedelta(seconds=1), timedelta(seconds=2)]


def test_a_window_counts_claims_ends_reclaims_and_run_times(store: BackendStore) -> None:
    ok, exact, flaky, _lost, waiting = (
        s.task_id
        for s in store.submit(
            [
                NewTask("ok", {}, at(10), 3),
                NewTask("ok", {}, at(10), 3),
                NewTask("flaky", {}, at(10), 3, None, None, "mail"),
                NewTask("lost", {}, at(10), 1, None, None, "mail"),
                NewTask("later", {}, at(100), 3),
            ],
            T0,
        )
    )
    claims = {c.task_id: c for c in store.claim("w1", 4, at(20), LEASE)}
    assert store.complete(claims[ok], None, at(20.000001))
    assert store.complete(claims[exact], None, at(21))  # exactly 1 s: at most the 1 s bound
    store.fail(claims[flaky], ERR, at(30), at(22.5))
    (again,) = store.claim("w2", 1, at(40), LEASE)
    store.request_cancel(flaky, at(41))
    store.acknowledge_cancel(again, at(43))
    store.request_cancel(waiting, at(44))  # cancelled while waiting: no attempt ended
    store.reclaim_expired(at(50), lambda name, attempt: timedelta(0))  # lost: FAILED

    assert store.activity(at(20) - timedelta(microseconds=1), at(60), BOUNDS) == Activity(
        attempts={
            ("default", "started"): 2,
            ("default", "succeeded"): 2,
            ("mail", "started"): 3,
            ("mail", "failed"): 2,
            ("mail", "retried"): 1,
            ("mail", "cancelled"): 1,
            ("mail", "reclaimed"): 1,
        },
        lease_losses={"w1": 1},
        durations={
            "ok": DurationCounts(2, 1_000_001, (2, 2)),
            "flaky": DurationCounts(2, 5_500_000, (0, 0)),
        },
    )
    # The window's start is excluded and its end included.
    assert store.activity(at(40), at(43), BOUNDS) == Activity(
        attempts={("mail", "cancelled"): 1},
        lease_losses={},
        durations={"flaky": DurationCounts(1, 3_000_000, (0, 0))},
    )
    assert store.activity(at(60), at(120), BOUNDS) == Activity({}, {}, {})
    # No bounds: counts and totals only.
    assert store.activity(at(0), at(21), []).durations["ok"] == DurationCounts(2, 1_000_001, ())
