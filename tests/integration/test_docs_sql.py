"""Every query in docs/sql.md runs against a populated queue file, and its answer is checked.

The queue has a task for each path through the state machine (one name each):
a success, a retry then a success, retries then a failure, a cancel before
start, a cancel while waiting for a retry, a reclaimed lease then a success, a
requeued failure then a success, a task due later, an overdue one, a stuck one
and one waiting for its retry.
"""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from durablesched import ErrorInfo, SQLiteStore, TaskState, WorkerInfo
from durablesched.records import NewTask
from durablesched.store.sql.codec import to_db_time

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
LONG = timedelta(minutes=30)
SHORT = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "")


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


@pytest.fixture
def queue(tmp_path: Path) -> tuple[Path, datetime, dict[str, int]]:
    """The populated file, the base time B (an hour ago) and each name's task id."""
    now = datetime.now(UTC)
    b = now - timedelta(hours=1)
    store = SQLiteStore(tmp_path / "q.db")
    names = "abcdefgijk"
    made = store.submit([NewTask(n, {}, b, 3) for n in names], b)
    made += store.submit([NewTask("h", {}, now + timedelta(days=1), 3)], b)
    ids = dict(zip([*names, "h"], [m.task_id for m in made], strict=True))

    def claim(name: str, when: datetime, lease: timedelta = LONG) -> object:
        (c,) = store.claim("w", 1, when, lease, names={name})
        return c

    first = {n: claim(n, b + minutes(1), SHORT if n == "f" else LONG) for n in "abcefgk"}
    store.complete(first["a"], 1, b + minutes(2))  # type: ignore[arg-type]
    store.fail(first["b"], ERR, b + minutes(10), b + minutes(2))  # type: ignore[arg-type]
    store.fail(first["c"], ERR, b + minutes(5), b + minutes(2))  # type: ignore[arg-type]
    store.fail(first["e"], ERR, b + minutes(30), b + minutes(2))  # type: ignore[arg-type]
    store.fail(first["g"], ERR, None, b + minutes(2))  # type: ignore[arg-type]
    store.fail(first["k"], ERR, now + timedelta(hours=1), b + minutes(2))  # type: ignore[arg-type]
    store.request_cancel(ids["d"], b + minutes(1))
    store.request_cancel(ids["e"], b + minutes(3))
    store.reclaim_expired(b + minutes(5), lambda name, attempt: timedelta(0))  # f: due B+5
    store.fail(claim("c", b + minutes(6)), ERR, None, b + minutes(7))  # type: ignore[arg-type]
    store.complete(claim("f", b + minutes(8)), 1, b + minutes(9))  # type: ignore[arg-type]
    store.complete(claim("b", b + minutes(13)), 1, b + minutes(14))  # type: ignore[arg-type]
    store.requeue(ids["g"], b + minutes(20))
    store.complete(claim("g", b + minutes(21)), 1, b + minutes(23))  # type: ignore[arg-type]
    claim("j", b + minutes(40), SHORT)  # its worker is gone: the lease is long expired
    # Worker w is alive (seen now); an older one, seen last at B, is gone.
    for worker_id, seen in (("w", now), ("old", b)):
        store.register_worker(
            WorkerInfo(worker_id, "box", 1, None, 4, "0.1.0", seen, seen, SHORT), seen
        )
    history = store.history(ids["a"])
    store.close()
    assert ids["a"] == 1 and [e.state for e in history] == [
        TaskState.PENDING,
        TaskState.RUNNING,
        TaskState.SUCCEEDED,
    ]
    return tmp_path / "q.db", b, ids


def test_every_query_in_the_docs_answers_sensibly(
    queue: tuple[Path, datetime, dict[str, int]],
) -> None:
    path, b, ids = queue
    queries = re.findall(r"```sql\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(queries) == 12
    with sqlite3.connect(path) as conn:
        r = [conn.execute(q).fetchall() for q in queries]
        story = conn.execute(
            "SELECT at, state, attempt, detail FROM task_events WHERE task_id = 1 ORDER BY id"
        ).fetchall()
    # 1. counts per state
    assert dict(r[0]) == {
        "SUCCEEDED": 4,  # a, b, f, g
        "FAILED": 1,  # c
        "CANCELLED": 2,  # d, e
        "PENDING": 2,  # h, i
        "RETRY_WAIT": 1,  # k
        "RUNNING": 1,  # j
    }
    # 2. what runs next: claimable, by due time
    assert [row[1] for row in r[1]] == ["i", "k", "h"]
    # 3. waiting although due: i, for about an hour (never negative)
    assert [row[1] for row in r[2]] == ["i"]
    assert 3500 < r[2][0][2] < 3700
    # 4. stuck on an expired lease: j
    assert [row[1] for row in r[3]] == ["j"]
    # 5. failed today (c, unless it failed before midnight UTC)
    finished_c = b + minutes(7)
    today = datetime.now(UTC).date()
    assert [row[1] for row in r[4]] == (["c"] if finished_c.date() == today else [])
    # 6. names that fail most
    assert r[5] == [("c", 1)]
    # 7. the wait before each task's latest start: exactly as scheduled, never
    # negative, one start per task, and none for a task that waits for a retry (e, k)
    waits = {name: (avg, worst, starts) for name, avg, worst, starts in r[6]}
    assert waits == {
        "a": (60.0, 60.0, 1),
        "b": (180.0, 180.0, 1),  # its retry was due at B+10, it started at B+13
        "c": (60.0, 60.0, 1),
        "f": (180.0, 180.0, 1),  # reclaimed at B+5, due then, started at B+8
        "g": (60.0, 60.0, 1),  # requeued at B+20, started at B+21
        "j": (2400.0, 2400.0, 1),
    }
    # 8. how long successes ran: the successful attempt, one per task
    assert r[7] == [("a", 60.0, 1), ("b", 60.0, 1), ("f", 60.0, 1), ("g", 120.0, 1)]
    # 9. rescued from a dead worker: f (j's lease has not been reclaimed yet)
    assert [row[0] for row in r[8]] == [ids["f"]]
    assert r[8][0][2].startswith("lease of w expired")
    # 10. the story of task 1 starts with its submission
    assert r[9] == story
    assert [row[1:] for row in r[9]] == [
        ("PENDING", 0, "submitted"),
        ("RUNNING", 1, "claimed by w from queue default"),
        ("SUCCEEDED", 1, None),
    ]
    # 11. the attempts of task 3 (c): two failures, each with its error
    assert ids["c"] == 3
    assert [(row[0], row[1], row[4], row[5], row[6]) for row in r[10]] == [
        (1, "w", "FAILED", "builtins.ValueError", "bad"),
        (2, "w", "FAILED", "builtins.ValueError", "bad"),
    ]
    assert [(row[2], row[3]) for row in r[10]] == [
        (to_db_time(b + minutes(start)), to_db_time(b + minutes(end)))
        for start, end in ((1, 2), (6, 7))
    ]
    # 12. the workers: the old one gone (an hour unseen), w alive and holding j
    assert [(row[0], row[1], row[3]) for row in r[11]] == [("old", "gone", 0), ("w", "alive", 1)]
    assert 3500 < r[11][0][2] < 3700 and 0 <= r[11][1][2] < 60
