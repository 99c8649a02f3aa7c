"""The worked example on the in-memory backend, printed as a timeline.

At time 10, tasks A and B are due at 12 and C at 20; one worker slot. A fails
once and retries at a later due time while B runs; C runs at 20.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from durablesched import MemoryStore, RetryPolicy, Scheduler, TaskRegistry, TaskState, Worker
from durablesched.testing import ManualClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def main() -> None:
    logging.getLogger("durablesched").setLevel(logging.ERROR)
    tasks = TaskRegistry()
    failures = {"A": 1}

    @tasks.task("job", retry=RetryPolicy(max_attempts=3, initial=timedelta(seconds=3), jitter=0))
    def job(label: str) -> str:
        if failures.get(label, 0):
            failures[label] -= 1
            raise RuntimeError(f"{label} failed explicitly")
        return f"{label} done"

    clock = ManualClock(t(10))
    scheduler = Scheduler(MemoryStore(), registry=tasks, clock=clock)
    labels = {
        scheduler.submit("job", {"label": "A"}, at=t(12)): "A",
        scheduler.submit("job", {"label": "B"}, at=t(12)): "B",
        scheduler.submit("job", {"label": "C"}, at=t(20)): "C",
    }

    worker = Worker(scheduler, concurrency=1, owner="worker-1")
    print("time  task  event")
    while True:
        worker.run_due()
        nxt = scheduler.store.next_wakeup(clock.now())
        if nxt is None:
            break
        clock.set(nxt)

    events = sorted(
        (e for task_id in labels for e in scheduler.history(task_id)),
        key=lambda e: (e.at, e.task_id, e.state != TaskState.PENDING),
    )
    for e in events:
        seconds = (e.at - T0).total_seconds()
        detail = f"  ({e.detail})" if e.detail else ""
        print(f"{seconds:>4.0f}  {labels[e.task_id]:<4}  {e.state} attempt {e.attempt}{detail}")
    print()
    for task_id, label in labels.items():
        task = scheduler.get(task_id)
        print(f"{label}: {task.state}, attempts {task.attempts}, result {task.result!r}")
    print("\nThe in-memory backend keeps nothing: these tasks are gone when the process exits.")


if __name__ == "__main__":
    main()
