"""Debouncing (``submit(..., debounce=(key, delay), max_wait=...)``), on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablesched import InvalidTaskError, ManualClock, Scheduler, TaskRegistry, TaskState
from durablesched.queues import QueueLimits
from durablesched.records import NewTask

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
WAIT = timedelta(seconds=30)


def debounced(doc: int, due: float, until: float | None = None) -> NewTask:
    return NewTask(
        "index", {"doc": doc}, at(due), 3, None, None, "default", 0, None, "doc:7",
        None if until is None else at(until),
    )  # fmt: skip


def test_a_pending_task_takes_the_last_arguments_and_the_later_due_time(
    store: BackendStore,
) -> None:
    (first,) = store.submit([debounced(1, due=30, until=60)], at(0))
    assert first.created
    (again,) = store.submit([debounced(2, due=40)], at(10))
    assert (again.task_id, again.created, again.enqueued_at) == (first.task_id, False, at(0))
    task = store.get(first.task_id)
    assert task is not None
    assert (task.args, task.due_at, task.debounce_key) == ({"doc": 2}, at(40), "doc:7")
    # Never past the first submit's time plus max_wait.
    store.submit([debounced(3, due=70)], at(40))
    task = store.get(first.task_id)
    assert task is not None and (task.args, task.due_at) == ({"doc": 3}, at(60))
    assert store.claim("w", 5, at(59), LEASE) == []
    (claim,) = store.claim("w", 5, at(60), LEASE)
    assert (claim.task_id, claim.args) == (first.task_id, {"doc": 3})


def test_a_debounced_task_with_a_limit_key_in_a_queue_limited_per_key(
    store: BackendStore,
) -> None:
    """The upsert of a debounced submit updates a task whose key's row exists: on SQLite
    it used to abort (the upsert's conflict algorithm overrode the triggers' OR IGNORE)."""
    keyed = debounced(1, due=30)._replace(limit_key="customer:1")
    (first,) = store.submit([keyed], at(0))
    store.put_queue(QueueLimits("default", concurrency_per_key=1), at(0))
    for doc in (2, 3):
        (again,) = store.submit([keyed._replace(args={"doc": doc})], at(doc))
        assert (again.task_id, again.created) == (first.task_id, False)
    (claim,) = store.claim("w", 5, at(30), LEASE)
    assert (claim.task_id, claim.args) == (first.task_id, {"doc": 3})


def test_once_started_the_next_submit_makes_a_new_task(store: BackendStore) -> None:
    (first,) = store.submit([debounced(1, due=30)], at(0))
    (claim,) = store.claim("w", 5, at(30), LEASE)
    started = store.get(first.task_id)
    assert started is not None and started.debounce_key is None
    (second,) = store.submit([debounced(2, due=50)], at(31))
    assert second.created and second.task_id != first.task_id
    # A cancelled pending task gives up its key too.
    store.request_cancel(second.task_id, at(32))
    (third,) = store.submit([debounced(3, due=60)], at(33))
    assert third.created and third.task_id not in (first.task_id, second.task_id)
    assert claim.args == {"doc": 1}


def test_the_scheduler_debounces_and_checks_what_it_is_given(store: BackendStore) -> None:
    registry = TaskRegistry()

    @registry.task(name="index")
    def index(doc: int) -> None: ...

    clock = ManualClock(T0)
    scheduler = Scheduler(store, registry=registry, clock=clock)
    ids = set()
    for doc in range(5):
        ids.add(scheduler.submit("index", {"doc": doc}, debounce=("doc:7", WAIT)))
        clock.advance(timedelta(seconds=1))
    handle = scheduler.enqueue(index.options(debounce=("doc:7", WAIT)), doc=9)
    (task_id,) = ids
    assert handle.id == task_id
    task = scheduler.get(task_id)
    assert (task.args, task.due_at, task.state) == (
        {"doc": 9},
        T0 + timedelta(seconds=35),
        TaskState.PENDING,
    )
    with pytest.raises(InvalidTaskError, match="give no at= or delay="):
        scheduler.submit("index", {"doc": 1}, debounce=("doc:7", WAIT), delay=5)
    with pytest.raises(InvalidTaskError, match="idempotency key or debounce="):
        scheduler.submit("index", {"doc": 1}, debounce=("doc:7", WAIT), key="k")
    with pytest.raises(InvalidTaskError, match="max_wait= is for a debounced submit"):
        scheduler.submit("index", {"doc": 1}, max_wait=60)
    with pytest.raises(InvalidTaskError, match="max_wait= must be at least"):
        scheduler.submit("index", {"doc": 1}, debounce=("doc:7", WAIT), max_wait=5)
    with pytest.raises(InvalidTaskError, match="debounce= must be"):
        scheduler.submit("index", {"doc": 1}, debounce="doc:7")  # type: ignore[arg-type]
