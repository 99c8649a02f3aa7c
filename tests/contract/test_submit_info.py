"""``submit_info``: the id, whether it was created, and the stored enqueue time, from the
one write, on every backend (with a key held, the holder's)."""

from __future__ import annotations

from datetime import timedelta

from durablesched import ManualClock, Scheduler, Submitted
from durablesched.records import NewTask

from ..conftest import T0, BackendStore, at


def test_the_enqueue_time_is_the_stored_one(store: BackendStore, clock: ManualClock) -> None:
    scheduler = Scheduler(store, clock=clock)
    clock.advance(timedelta(seconds=1.000123))
    made = scheduler.submit_info("t", {"n": 1}, key="k")
    assert made == Submitted(made.task_id, True, clock.now())
    assert scheduler.get(made.task_id).created_at == made.enqueued_at
    clock.advance(timedelta(seconds=5))
    again = scheduler.submit_info("t", {"n": 2}, key="k")
    assert again == Submitted(made.task_id, False, made.enqueued_at)  # the holder's time
    assert scheduler.submit("t") == made.task_id + 1


def test_a_batch_repeating_a_key_reports_the_first(store: BackendStore) -> None:
    first, repeat, other = store.submit(
        [
            NewTask("t", {}, at(10), 1, "k"),
            NewTask("t", {}, at(10), 1, "k"),
            NewTask("u", {}, at(10), 1),
        ],
        T0,
    )
    assert first == Submitted(first.task_id, True, T0)
    assert repeat == Submitted(first.task_id, False, T0)
    assert other == Submitted(first.task_id + 1, True, T0)
