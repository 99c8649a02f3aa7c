"""Positional arguments read back exactly as submitted, claimed with the task, on every
backend (they are part of the stored JSON arguments: no backend treats them apart)."""

from __future__ import annotations

from datetime import timedelta

from durablesched import ManualClock, Scheduler
from durablesched.records import call_args

from ..conftest import BackendStore


def test_positional_arguments_round_trip(store: BackendStore, clock: ManualClock) -> None:
    scheduler = Scheduler(store, clock=clock)
    values = [1, "two", [3.5, None], {"four": True}, "é\u2603"]
    task_id = scheduler.submit("t", {"k": 0}, positional=values)
    assert scheduler.get(task_id).args == {"*args": values, "k": 0}
    (claim,) = store.claim("w", 1, clock.now(), timedelta(seconds=30))
    assert call_args(claim.args) == (values, {"k": 0})
