"""Issue 18: a queue's concurrency and rate limits hold across worker processes."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from durablesched import Scheduler
from durablesched.store.sql.codec import from_db_time

from .conftest import Workers, count, query, wait_for

pytestmark = pytest.mark.processes


def test_four_processes_of_eight_slots_never_run_more_than_the_limit(
    db: str, workers: Workers, scheduler: Scheduler
) -> None:
    scheduler.set_queue("api", concurrency=3)
    scheduler.submit_many("slow", [{"seconds": 0.05}] * 40, queue="api")
    scheduler.submit_many("slow", [{"seconds": 0.0}] * 20)  # another queue: no limit
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(count(db, "state = 'RUNNING' AND queue = 'api'"))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        procs = [workers.start("--burst", concurrency=8, lease=5) for _ in range(4)]
        for proc in procs:
            assert proc.wait(120) == 0
    finally:
        done.set()
        sampler.join()
    assert count(db, "state = 'SUCCEEDED'") == 60
    assert len(seen) > 20, "the sampler looked too rarely to mean anything"
    assert max(seen) <= 3, f"up to {max(seen)} ran at once"
    assert max(seen) == 3  # and the limit was used, not undershot


def test_a_rate_limit_of_10_per_second_holds_in_every_window(
    db: str, workers: Workers, scheduler: Scheduler
) -> None:
    scheduler.set_queue("api", rate="10/s")
    scheduler.submit_many("slow", [{"seconds": 0.0}] * 45, queue="api")
    for _ in range(3):
        workers.start(concurrency=4, lease=5)
    # Idle workers sleep until the window admits a start again (next_wakeup says when).
    wait_for(lambda: count(db, "state = 'SUCCEEDED'") == 45, "45 tasks at 10/s", timeout=60)
    rows = query(
        db,
        "SELECT e.at FROM task_events e JOIN tasks t ON t.id = e.task_id "
        "WHERE e.state = 'RUNNING' AND t.queue = 'api' ORDER BY e.at",
    )
    starts: list[datetime] = [
        r[0] if isinstance(r[0], datetime) else from_db_time(r[0]) for r in rows
    ]
    assert len(starts) == 45
    window = timedelta(seconds=1)
    busiest = max(sum(1 for s in starts if t - window < s <= t) for t in starts)
    assert busiest <= 10, f"{busiest} starts in one second"
    # 45 starts at 10 a second take at least 4 s (the first ten start at once).
    assert starts[-1] - starts[0] >= timedelta(seconds=4)
