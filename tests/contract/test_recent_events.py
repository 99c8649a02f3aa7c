"""``recent_events``: the history of a window, as metrics count it, on every backend."""

from __future__ import annotations

from datetime import timedelta

from durablesched import ErrorInfo, TaskState
from durablesched.records import NewTask, RecentEvent

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "")


def test_the_window_holds_starts_and_ends_with_when_each_attempt_started(
    store: BackendStore,
) -> None:
    ok, flaky, lost = (
        s.task_id
        for s in store.submit(
            [
                NewTask("ok", {}, at(10), 3),
                NewTask("flaky", {}, at(10), 3, None, None, "mail"),
                NewTask("lost", {}, at(10), 1),
            ],
            T0,
        )
    )
    claims = {c.task_id: c for c in store.claim("w", 3, at(20), LEASE)}
    assert store.complete(claims[ok], None, at(21.5))
    store.fail(claims[flaky], ERR, at(30), at(22))
    (again,) = store.claim("w2", 1, at(40), LEASE)
    store.request_cancel(flaky, at(41))
    store.acknowledge_cancel(again, at(42))
    store.reclaim_expired(at(50), lambda name, attempt: timedelta(0))

    events = store.recent_events(at(20), at(60))
    claimed, reclaimed = events[2].detail, events[4].detail
    assert events == [
        RecentEvent(ok, "ok", "default", TaskState.SUCCEEDED, 1, at(21.5), None, at(20)),
        RecentEvent(flaky, "flaky", "mail", TaskState.RETRY_WAIT, 1, at(22), ERR.message, at(20)),
        RecentEvent(flaky, "flaky", "mail", TaskState.RUNNING, 2, at(40), claimed, None),
        RecentEvent(
            flaky,
            "flaky",
            "mail",
            TaskState.CANCELLED,
            2,
            at(42),
            "cancellation acknowledged",
            at(40),
        ),
        RecentEvent(lost, "lost", "default", TaskState.FAILED, 1, at(50), reclaimed, at(20)),
    ]
    assert claimed is not None and claimed.startswith("claimed by w2")
    assert reclaimed is not None and reclaimed.startswith("lease of w expired")
    # The window's start is excluded, its end included; submissions are left out.
    earlier = store.recent_events(T0, at(22))
    assert [(e.task_id, e.state, e.started_at) for e in earlier] == [
        (ok, TaskState.RUNNING, None),
        (flaky, TaskState.RUNNING, None),
        (lost, TaskState.RUNNING, None),
        (ok, TaskState.SUCCEEDED, at(20)),
        (flaky, TaskState.RETRY_WAIT, at(20)),
    ]
    assert store.recent_events(at(60), at(120)) == []
