"""``Console``: what a dashboard reads and deletes, the same on every backend: a page
of a filtered task list newest first with a keyset cursor, per-minute counts of
ended attempts, and deleting a finished task (live ones refused)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durablesched import ErrorInfo, InvalidTransitionError, TaskNotFoundError, TaskState
from durablesched.records import OLDEST, MinuteCounts, NewTask, TaskQuery
from durablesched.schedules.declaration import schedule
from durablesched.store.protocol import Console

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "trace")


def test_every_backend_is_a_console(store: BackendStore) -> None:
    console: Console = store
    assert console.find_tasks(TaskQuery(), 10) == []


def _submit(store: BackendStore) -> list[int]:
    """Six tasks over three instants: two names, two queues, a key; one finished."""
    ids = []
    for second, (name, queue, key) in enumerate(
        [
            ("mail", "default", None),
            ("mail", "bulk", "k1"),
            ("report", "default", None),
            ("report", "bulk", None),
            ("mail", "default", "k2"),
            ("report", "default", None),
        ]
    ):
        (s,) = store.submit(
            [NewTask(name, {"n": second}, at(10), 3, key, None, queue)], at(10 + second // 2)
        )
        ids.append(s.task_id)
    (claim,) = store.claim("w1", 1, at(20), LEASE)
    assert store.complete(claim, "done", at(21))
    return ids


def test_the_list_is_newest_first_and_filters_exactly(store: BackendStore) -> None:
    ids = _submit(store)
    everything = store.find_tasks(TaskQuery(), 100)
    assert [t.id for t in everything] == ids[::-1]
    assert [t.id for t in store.find_tasks(TaskQuery(name="mail"), 100)] == [ids[4], ids[1], ids[0]]
    assert [t.id for t in store.find_tasks(TaskQuery(queue="bulk"), 100)] == [ids[3], ids[1]]
    assert [t.id for t in store.find_tasks(TaskQuery(key="k2"), 100)] == [ids[4]]
    assert [t.id for t in store.find_tasks(TaskQuery(state=TaskState.SUCCEEDED), 100)] == [ids[0]]
    both = TaskQuery(name="report", queue="default", state=TaskState.PENDING)
    assert [t.id for t in store.find_tasks(both, 100)] == [ids[5], ids[2]]
    # Created from (inclusive) until (exclusive): the second instant only.
    window = TaskQuery(created_from=at(11), created_until=at(12))
    assert [t.id for t in store.find_tasks(window, 100)] == [ids[3], ids[2]]
    assert store.find_tasks(TaskQuery(name="nothing"), 100) == []
    assert store.find_tasks(TaskQuery(), 0) == []
    assert everything[-1] == store.get(ids[0])  # whole records, as get reads them


def test_pages_follow_the_keyset_cursor_through_equal_times(store: BackendStore) -> None:
    ids = _submit(store)
    seen: list[int] = []
    query = TaskQuery()
    while True:
        page = store.find_tasks(query, 2)
        if not page:
            break
        seen.extend(t.id for t in page)
        last = page[-1]
        query = TaskQuery(before=(last.created_at, last.id))
    assert seen == ids[::-1]
    # The cursor with a filter: the page after the newest mail.
    newest = store.find_tasks(TaskQuery(name="mail"), 1)[0]
    after = TaskQuery(name="mail", before=(newest.created_at, newest.id))
    assert [t.id for t in store.find_tasks(after, 5)] == [ids[1], ids[0]]


def test_pages_go_back_towards_the_newest_and_start_from_the_oldest(
    store: BackendStore,
) -> None:
    ids = _submit(store)
    # The last page, read from the oldest end: the oldest tasks, newest first.
    assert [t.id for t in store.find_tasks(TaskQuery(after=OLDEST), 2)] == [ids[1], ids[0]]
    seen: list[int] = []
    query = TaskQuery(after=OLDEST)
    while page := store.find_tasks(query, 2):
        assert [(t.created_at, t.id) for t in page] == sorted(
            ((t.created_at, t.id) for t in page), reverse=True
        )
        seen = [t.id for t in page] + seen
        query = TaskQuery(after=(page[0].created_at, page[0].id))
    assert seen == ids[::-1]
    # Both cursors: what lies between them, the oldest first taken.
    first, last = store.get(ids[0]), store.get(ids[-1])
    assert first is not None and last is not None
    both = TaskQuery(after=(first.created_at, first.id), before=(last.created_at, last.id))
    assert [t.id for t in store.find_tasks(both, 100)] == ids[-2:0:-1]
    assert [t.id for t in store.find_tasks(both, 1)] == [ids[1]]
    # With a filter: a state of ix_tasks_state_created's, and SUCCEEDED (none of its own).
    pending = [t.id for t in store.find_tasks(TaskQuery(state=TaskState.PENDING), 100)]
    done = TaskQuery(state=TaskState.SUCCEEDED, after=OLDEST)
    assert [t.id for t in store.find_tasks(done, 100)] == [i for i in ids if i not in pending]
    oldest_pending = store.find_tasks(TaskQuery(state=TaskState.PENDING, after=OLDEST), 2)
    assert [t.id for t in oldest_pending] == pending[-2:]


def test_minute_counts_count_ended_attempts_per_minute(store: BackendStore) -> None:
    minute = datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    store.submit([NewTask("t", {}, T0, 2) for _ in range(4)], T0)
    first = store.claim("w1", 4, minute, timedelta(seconds=100))
    assert store.complete(first[0], None, minute + timedelta(seconds=5))
    store.fail(first[1], ERR, minute + timedelta(seconds=70), minute + timedelta(seconds=6))
    store.fail(first[2], ERR, None, minute + timedelta(seconds=61))
    store.request_cancel(first[3].task_id, minute + timedelta(seconds=62))
    assert store.acknowledge_cancel(first[3], minute + timedelta(seconds=62))  # not counted
    # A lease lost: the reclaim's line ends that attempt in an error.
    (again,) = store.claim("w2", 1, minute + timedelta(seconds=70), LEASE)
    store.reclaim_expired(minute + timedelta(seconds=125), lambda name, attempt: timedelta(0))
    assert store.minute_counts(T0, minute + timedelta(seconds=200)) == [
        MinuteCounts(minute, 1, 1),
        MinuteCounts(minute + timedelta(minutes=1), 0, 1),
        MinuteCounts(minute + timedelta(minutes=2), 0, 1),
    ]
    assert again.attempt == 2
    # The window's start is excluded, its end included.
    assert store.minute_counts(minute + timedelta(seconds=5), minute + timedelta(seconds=61)) == [
        MinuteCounts(minute, 0, 1),
        MinuteCounts(minute + timedelta(minutes=1), 0, 1),
    ]
    assert store.minute_counts(minute + timedelta(hours=1), minute + timedelta(hours=2)) == []


def test_delete_takes_a_finished_task_with_its_history_and_key(store: BackendStore) -> None:
    keyed, waiting = store.submit([NewTask("t", {}, T0, 1, "k"), NewTask("t", {}, at(100), 1)], T0)
    task_id, live = keyed.task_id, waiting.task_id
    (claim,) = store.claim("w1", 1, at(20), LEASE)
    assert store.complete(claim, 7, at(21))
    store.delete_task(task_id)
    assert store.get(task_id) is None
    assert store.history(task_id) == []
    assert store.find_tasks(TaskQuery(key="k"), 10) == []
    # Its key is free again, as after a purge.
    (again,) = store.submit([NewTask("t", {}, at(30), 1, "k")], at(30))
    assert again.created and again.task_id != task_id
    with pytest.raises(InvalidTransitionError, match="PENDING"):
        store.delete_task(live)
    assert store.get(live) is not None
    with pytest.raises(TaskNotFoundError):
        store.delete_task(task_id)
    with pytest.raises(TaskNotFoundError):
        store.delete_task(10_000)


def test_a_deleted_task_leaves_its_schedule_fire_naming_none(store: BackendStore) -> None:
    store.add_schedule(schedule("t", name="tick", every=60), T0)
    fired = store.fire_schedule_now("tick", at(20))
    assert fired.task_id is not None
    (claim,) = store.claim("w1", 1, at(20), LEASE)
    assert store.complete(claim, None, at(21))
    store.delete_task(fired.task_id)
    (info,) = store.list_schedules()
    assert info.last_fire_at == at(20)
    assert info.last_task_id is None
    assert info.last_task_state is None
    # The schedule fires on as before (no live task of it to skip for).
    assert store.fire_schedule_now("tick", at(30)).task_id is not None
