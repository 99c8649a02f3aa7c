"""`move`: live tasks move between databases, at most once, and survive a move cut short."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from durablesched import ConfigurationError, ErrorInfo, QueueLimits, TaskState
from durablesched.records import NewTask
from durablesched.store.move import move_live_tasks
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLiteStore
from durablesched.store.sql.store import SQLStore
from durablesched.submission import build_many
from durablesched.tracing import with_trace

from ..conftest import T0, at

LEASE = timedelta(seconds=30)
PAIRS = ["sqlite->postgres", "postgres->sqlite", "sqlite->sqlite"]
TRACED = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def _open(kind: str, path: Path, request: pytest.FixtureRequest) -> SQLStore:
    if kind == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"))
    return SQLiteStore(path)


@pytest.fixture(params=PAIRS)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[SQLStore, SQLStore]:
    source_kind, destination_kind = str(request.param).split("->")
    source = _open(source_kind, tmp_path / "source.db", request)
    destination = _open(destination_kind, tmp_path / "destination.db", request)
    request.addfinalizer(source.close)
    request.addfinalizer(destination.close)
    return source, destination


def _fill(source: SQLStore) -> dict[str, int]:
    """A pending, a delayed, a keyed, a retry-waiting, a running and a finished task."""
    made = source.submit(
        [
            with_trace(NewTask("plain", {"n": 1}, at(10), 3), TRACED),
            NewTask("later", {"n": 2}, at(500), 3),
            NewTask("keyed", {"n": 3}, at(10), 3, "key-1"),
            NewTask("flaky", {"n": 4}, at(10), 3),
            NewTask("busy", {"n": 5}, at(10), 3),
            NewTask("done", {"n": 6}, at(10), 3),
        ],
        T0,
    )
    names = ["plain", "later", "keyed", "flaky", "busy", "done"]
    ids = dict(zip(names, [m.task_id for m in made], strict=True))
    claims = {
        c.name: c for c in source.claim("w", 10, at(10), LEASE, names={"flaky", "busy", "done"})
    }
    source.fail(claims["flaky"], ErrorInfo("E", "try again", ""), at(60), at(11))
    source.complete(claims["done"], "ok", at(11))
    return ids


def test_live_tasks_move_once_and_keep_what_they_were(pair: tuple[SQLStore, SQLStore]) -> None:
    source, destination = pair
    ids = _fill(source)
    report = move_live_tasks(source, destination, lambda: at(20))
    assert (report.copied, report.already, report.by_key) == (4, 0, 0)
    moved = {ids[n] for n in ("plain", "later", "keyed", "flaky")}
    assert set(report.mapping) == moved
    for source_id, new_id in report.mapping.items():
        before, after = source.get(source_id), destination.get(new_id)
        assert before is not None and after is not None
        assert (after.name, after.args, after.due_at, after.idempotency_key, after.trace) == (
            before.name,
            before.args,
            before.due_at,
            before.idempotency_key,
            before.trace,  # the submit's trace context (docs/tracing.md) moves with it
        )
        assert after.attempts == before.attempts and after.max_attempts == before.max_attempts
        assert before.state is TaskState.CANCELLED  # it can never run in the source again
        assert source.history(source_id)[-1].detail == (
            f"moved to database {report.destination} as task {new_id} (was {after.state.value})"
        )
        # There, its story starts with its submission (when and where it happened),
        # then its arrival.
        first, arrival = destination.history(new_id)
        assert (first.at, first.state, first.attempt, first.detail) == (
            before.created_at,
            TaskState.PENDING,
            0,
            f"submitted to database {report.source} as task {source_id}",
        )
        assert (arrival.state, arrival.detail) == (
            after.state,
            f"copied from database {report.source} task {source_id}",
        )
    plain = destination.get(report.mapping[ids["plain"]])
    assert plain is not None and (plain.args, plain.trace) == ({"n": 1}, TRACED)
    flaky = destination.get(report.mapping[ids["flaky"]])
    assert flaky is not None and flaky.state is TaskState.RETRY_WAIT and flaky.attempts == 1
    assert flaky.last_error is not None and flaky.last_error.message == "try again"
    # Running and finished tasks stay where they are.
    assert [source.get(ids[n]).state for n in ("busy", "done")] == [  # type: ignore[union-attr]
        TaskState.RUNNING,
        TaskState.SUCCEEDED,
    ]
    # The destination runs them, in (due_at, seq) order.
    claimed = destination.claim("w2", 10, at(100), LEASE)
    assert [c.name for c in claimed] == ["plain", "keyed", "flaky"]
    again = move_live_tasks(source, destination, lambda: at(30))
    assert again.moved == 0
    assert len(destination.list_tasks()) == 4


def test_a_copy_cut_short_is_finished_by_the_next_and_nothing_doubles(
    pair: tuple[SQLStore, SQLStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, destination = pair
    ids = _fill(source)
    real_receive = destination.receive
    calls = 0

    def receive_then_die(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyboardInterrupt  # killed between leaving the source and arriving
        if calls == 2:
            real_receive(*args, **kwargs)  # type: ignore[arg-type]
            raise KeyboardInterrupt  # killed after arriving, before the source heard
        return real_receive(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(destination, "receive", receive_then_die)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            move_live_tasks(source, destination, lambda: at(20), batch=2)
    report = move_live_tasks(source, destination, lambda: at(20), batch=2)
    live = {ids[n] for n in ("plain", "later", "keyed", "flaky")}
    assert set(report.mapping) == live  # all four delivered, none lost
    assert report.already >= 1  # the second run's delivery was recognised, not repeated
    assert len(destination.list_tasks()) == 4  # nothing doubled
    assert sorted(t.name for t in destination.list_tasks()) == ["flaky", "keyed", "later", "plain"]


def test_a_key_already_held_in_the_destination_is_not_copied_again(
    pair: tuple[SQLStore, SQLStore],
) -> None:
    source, destination = pair
    [held] = destination.submit([NewTask("keyed", {"n": 0}, at(10), 3, "key-1")], T0)
    source.submit([NewTask("keyed", {"n": 3}, at(10), 3, "key-1")], T0)
    report = move_live_tasks(source, destination, lambda: at(20))
    assert (report.copied, report.by_key) == (0, 1)
    assert list(report.mapping.values()) == [held.task_id]
    assert len(destination.list_tasks()) == 1


def test_copying_a_database_onto_itself_is_refused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "one.db")
    same = SQLiteStore(tmp_path / "one.db")
    with pytest.raises(ConfigurationError, match="same database"):
        move_live_tasks(store, same, lambda: T0)
    store.close()
    same.close()


def test_the_old_name_still_moves_and_warns(tmp_path: Path) -> None:
    from durablesched.store.move import copy_live_tasks  # noqa: PLC0415 - the deprecated name

    source, destination = SQLiteStore(tmp_path / "a.db"), SQLiteStore(tmp_path / "b.db")
    try:
        source.submit(build_many("t", [{"n": 1}], now=T0), T0)
        with pytest.warns(DeprecationWarning, match="move_live_tasks"):
            report = copy_live_tasks(source, destination, lambda: T0)
        assert report.copied == 1
    finally:
        source.close()
        destination.close()


def test_moved_tasks_keep_their_limit_and_debounce_keys(pair: tuple[SQLStore, SQLStore]) -> None:
    source, destination = pair
    for store in (source, destination):
        store.put_queue(QueueLimits("sync", concurrency_per_key=1), T0)
    made = source.submit(
        [
            NewTask("keyed", {"n": 1}, at(10), 3, queue="sync", limit_key="a"),
            NewTask("keyed", {"n": 2}, at(10), 3, queue="sync", limit_key="a"),
            NewTask("quiet", {"n": 3}, at(50), 3, debounce_key="d", debounce_until=at(60)),
        ],
        T0,
    )
    report = move_live_tasks(source, destination, lambda: at(20))
    first, second, quiet = (report.mapping[m.task_id] for m in made)
    keys = [destination.get(i) for i in (first, second, quiet)]
    assert [(t.limit_key, t.debounce_key) for t in keys if t is not None] == [
        ("a", None),
        ("a", None),
        (None, "d"),
    ]
    # Its key's limit holds there: one of key a at a time.
    assert [c.task_id for c in destination.claim("w", 10, at(20), LEASE, names={"keyed"})] == [
        first
    ]
    # A submit there with the debounce key debounces the moved task.
    (again,) = destination.submit(
        [NewTask("quiet", {"n": 4}, at(40), 3, debounce_key="d", debounce_until=at(70))], at(21)
    )
    assert again.task_id == quiet
    moved = destination.get(quiet)
    assert moved is not None and moved.args == {"n": 4} and moved.due_at == at(40)


def test_a_debounce_key_held_in_the_destination_stays_with_its_task(
    pair: tuple[SQLStore, SQLStore],
) -> None:
    source, destination = pair
    (mine,) = destination.submit([NewTask("quiet", {"n": 1}, at(50), 3, debounce_key="d")], T0)
    (theirs,) = source.submit([NewTask("quiet", {"n": 2}, at(50), 3, debounce_key="d")], T0)
    report = move_live_tasks(source, destination, lambda: at(20))
    arrived = destination.get(report.mapping[theirs.task_id])
    assert arrived is not None and (arrived.args, arrived.debounce_key) == ({"n": 2}, None)
    held = destination.get(mine.task_id)
    assert held is not None and held.debounce_key == "d"


@pytest.mark.parametrize("until", [at(60), None], ids=["max-wait", "no-max-wait"])
def test_a_moved_debounced_task_keeps_its_window(
    pair: tuple[SQLStore, SQLStore], until: object
) -> None:
    """Its debounce window's end moves with it: a later submit with the key there may put
    it off up to that end (no further; without a ``max_wait``, as far as it asks)."""
    source, destination = pair
    assert until is None or isinstance(until, type(T0))
    (made,) = source.submit(
        [NewTask("quiet", {"n": 1}, at(50), 3, debounce_key="d", debounce_until=until)], T0
    )
    report = move_live_tasks(source, destination, lambda: at(20))
    moved = destination.get(report.mapping[made.task_id])
    assert moved is not None and (moved.debounce_key, moved.debounce_until) == ("d", until)
    destination.submit([NewTask("quiet", {"n": 2}, at(70), 3, debounce_key="d")], at(21))
    moved = destination.get(report.mapping[made.task_id])
    assert moved is not None and moved.args == {"n": 2}
    assert moved.due_at == (at(70) if until is None else until)


def test_a_move_cut_short_hands_over_the_debounce_key_when_it_resumes(
    pair: tuple[SQLStore, SQLStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handed over, the task gave its debounce key up in the source (CANCELLED there): the
    run that finishes the move reads it from the hand-over line."""
    source, destination = pair
    (made,) = source.submit(
        [NewTask("quiet", {"n": 1}, at(50), 3, debounce_key="d", debounce_until=at(60))], T0
    )
    real_receive = destination.receive

    def die(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt  # killed between leaving the source and arriving

    monkeypatch.setattr(destination, "receive", die)
    with pytest.raises(KeyboardInterrupt):
        move_live_tasks(source, destination, lambda: at(20))
    left = source.get(made.task_id)
    assert left is not None and left.debounce_key is None  # given up in the source
    monkeypatch.setattr(destination, "receive", real_receive)
    report = move_live_tasks(source, destination, lambda: at(21))
    assert report.copied == 1
    moved = destination.get(report.mapping[made.task_id])
    assert moved is not None and (moved.debounce_key, moved.debounce_until) == ("d", at(60))
    (again,) = destination.submit([NewTask("quiet", {"n": 2}, at(40), 3, debounce_key="d")], at(22))
    assert again.task_id == moved.id  # debounced onto the moved task
    events = [e.detail for e in source.history(made.task_id)]
    assert f"moved to database {destination.instance()} as task {moved.id} (was PENDING)" in events
