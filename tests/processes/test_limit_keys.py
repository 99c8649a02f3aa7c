"""Issue 32: a queue's concurrency per key holds across worker processes killed with
SIGKILL every 300 ms, and nothing is lost.

Counted from the history, not sampled: every change of a keyed task's state takes the
queue's lock (the claim before it picks, the triggers of migration 0013 for the rest)
before it writes its history line, so the lines' ids follow the order the changes
took effect in; replaying them, no key ever has two attempts running.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict

import pytest

from durablesched import Scheduler

from .conftest import Workers, query

pytestmark = pytest.mark.processes

KEYS = 200
PER_KEY = 3
WORKERS = 4
#: How long the kills go on; then the live workers finish what is left.
CHAOS_SECONDS = float(os.environ.get("DURABLESCHED_KEY_CHAOS_SECONDS", "8"))


def test_sigkill_every_300_ms_never_runs_two_of_a_key_and_loses_nothing(
    db: str, workers: Workers, scheduler: Scheduler
) -> None:
    rng = random.Random(20261204)
    scheduler.set_queue("keys", concurrency_per_key=1)
    ids: list[int] = []
    for round_ in range(PER_KEY):
        for key in range(KEYS):
            ids.append(
                scheduler.submit(
                    "slow", {"seconds": 0.02 * round_}, queue="keys", limit_key=f"key:{key}"
                )
            )
    live, kills = workers.chaos(
        "--queue", "keys=4", workers=WORKERS, seconds=CHAOS_SECONDS, rng=rng, least=10
    )
    workers.drain_and_stop(db, live, len(ids), 180)

    # Nothing lost: every task ended, and only a task whose leases all lapsed failed.
    states = dict(query(db, "SELECT id, state FROM tasks WHERE queue = 'keys'"))
    assert sorted(states) == sorted(ids)
    assert set(states.values()) <= {"SUCCEEDED", "FAILED"}
    succeeded = sum(1 for s in states.values() if s == "SUCCEEDED")
    # Never two of one key RUNNING, replaying the history in the order it was written.
    key_of = dict(query(db, "SELECT id, limit_key FROM tasks WHERE queue = 'keys'"))
    running: dict[str, int] = defaultdict(int)
    busiest = 0
    starts = 0
    attempt_running: set[int] = set()
    for task_id, state in query(
        db,
        "SELECT e.task_id, e.state FROM task_events e JOIN tasks t ON t.id = e.task_id "
        "WHERE t.queue = 'keys' ORDER BY e.id",
    ):
        key = key_of[task_id]
        if state == "RUNNING":
            assert task_id not in attempt_running, f"task {task_id} started twice at once"
            attempt_running.add(task_id)
            running[key] += 1
            starts += 1
            busiest = max(busiest, running[key])
            assert running[key] <= 1, f"two tasks of {key} running at once (task {task_id})"
        elif task_id in attempt_running:
            attempt_running.discard(task_id)
            running[key] -= 1
    assert attempt_running == set()
    print(
        f"\nlimit keys under SIGKILL: {len(ids)} tasks over {KEYS} keys, {kills} kills, "
        f"{starts} starts, {succeeded} succeeded, busiest key {busiest} at once"
    )
    assert kills >= 10
    assert starts >= len(ids)
