"""Chaos: worker processes killed with SIGKILL at random until every task is finished."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from durablesched import Scheduler

from .conftest import Workers, count, query, wait_for

pytestmark = pytest.mark.processes

SOAK = os.environ.get("DURABLESCHED_SOAK", "") not in ("", "0")
TASKS = 10_000 if SOAK else 2_000
WORKERS = 4
#: Claims ahead on, whatever the recent rate: SIGKILL finds tasks waiting in workers too
#: (reclaimed after their lease, as running ones are).
AHEAD = ("--ahead", "8", "--ahead-window", "10")


def test_chaos_kills_lose_nothing_and_repeat_no_database_effect(
    db: str, workers: Workers, scheduler: Scheduler, tmp_path: Path
) -> None:
    rng = random.Random(20261201)
    fails = {n for n in range(TASKS) if n % 97 == 0}
    ids = scheduler.submit_many("chaos", [{"n": n, "fail": n in fails} for n in range(TASKS)])
    n_of = {task_id: n for n, task_id in enumerate(ids)}
    started = time.monotonic()
    live = [workers.start(*AHEAD, concurrency=4, lease=1) for _ in range(WORKERS)]
    kills = 0

    def finished() -> int:
        return count(db, "state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')")

    def waiting() -> int:
        return count(db, "state = 'RUNNING' AND started_at IS NULL")

    deadline = time.monotonic() + 240
    ahead_seen = 0  # kills with claims ahead held somewhere, waiting for a slot
    while finished() < TASKS:
        assert time.monotonic() < deadline, f"only {finished()} of {TASKS} finished"
        ahead_seen += waiting() > 0
        victim = live.pop(rng.randrange(len(live)))
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        kills += 1
        before = finished()
        replacement = workers.start(*AHEAD, concurrency=4, lease=1)
        live.append(replacement)
        # The next kill waits for an observable event, not for time: the queue has
        # moved on by a few tasks (a starting replacement may be the next victim).
        wait_for(reached(finished, min(before + rng.randrange(5, 60), TASKS)), "progress")
    wall = time.monotonic() - started
    for proc in live:
        workers.wait_started(proc)
        proc.send_signal(signal.SIGTERM)
    for proc in live:
        assert proc.wait(30) == 0

    duplicates, reclaims = verify(db, ids, {t for t in ids if n_of[t] in fails}, tmp_path)
    print(
        f"\nchaos: {TASKS} tasks, {kills} kills, {reclaims} reclaims, "
        f"{duplicates} duplicate external effects, {wall:.1f}s wall time"
    )
    assert kills >= 3
    assert ahead_seen >= 1, "no kill found a claim ahead held: claim-ahead was not exercised"


def reached(counter: Callable[[], int], target: int) -> Callable[[], bool]:
    return lambda: counter() >= target


def verify(db: str, ids: list[int], must_fail: set[int], out: Path) -> tuple[int, int]:
    """Check the outcome; return (duplicate external effects, reclaims)."""
    states = dict(query(db, "SELECT id, state FROM tasks WHERE name = 'chaos'"))
    ledger = Counter(r[0] for r in query(db, "SELECT task_id FROM ledger"))
    reclaimed_attempts = defaultdict(set)
    for task_id, attempt in query(
        db,
        "SELECT task_id, attempt FROM task_events "
        "WHERE state IN ('RETRY_WAIT', 'FAILED', 'CANCELLED') AND detail LIKE 'lease of %'",
    ):
        reclaimed_attempts[task_id].add(attempt)
    gave_back = defaultdict(int)
    for task_id, n in query(
        db,
        "SELECT task_id, count(*) FROM task_events WHERE detail LIKE 'given back%' "
        "GROUP BY task_id",
    ):
        gave_back[task_id] = n
    # No task lost: SUCCEEDED, or FAILED only where written to fail.
    assert sorted(states) == sorted(ids)
    for task_id, state in states.items():
        expected = "FAILED" if task_id in must_fail else "SUCCEEDED"
        assert state == expected, f"task {task_id} ended {state}"
    # Every database effect exactly once, and only for successes.
    assert all(ledger[t] == 1 for t in ids if t not in must_fail)
    assert not any(ledger[t] for t in must_fail)
    # Every external key at least once; each duplicate explained by a lost attempt.
    lines: dict[int, list[int]] = defaultdict(list)
    for line in (out / "external").read_text().splitlines():
        key, task_id, attempt, _pid = line.split()
        assert key == f"durablesched-task-{task_id}"
        lines[int(task_id)].append(int(attempt))
    duplicates = 0
    for task_id in ids:
        attempts = lines[task_id]
        assert attempts, f"task {task_id} never ran its external effect"
        if task_id in must_fail:
            continue
        extra = len(attempts) - 1
        duplicates += extra
        # Every attempt but the successful one must be a recorded lost lease
        # (or a give-back, whose attempt is not counted and may repeat its number).
        lost = [a for a in attempts if a != max(attempts)]
        for attempt in lost:
            assert attempt in reclaimed_attempts[task_id] or gave_back[task_id], (
                f"task {task_id}: attempt {attempt} ran again without a recorded reclaim"
            )
    return duplicates, sum(len(v) for v in reclaimed_attempts.values())
