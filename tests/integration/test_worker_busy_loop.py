"""A busy worker's claim loop sleeps: the group commit claims into the slots it frees, and
wakes the loop only if one is still free (a pass that claims nothing would take the
interpreter from the running tasks)."""

from __future__ import annotations

from pathlib import Path

from durablesched import Scheduler, SQLiteStore, TaskRegistry, TaskState, Worker


def test_a_backlog_runs_with_a_few_passes_of_the_loop_not_one_per_group_commit(
    tmp_path: Path,
) -> None:
    """Without claims ahead: 3 or 4 passes; 201 with the wake-up made unconditional.

    With claims ahead the count rests on which thread wins each race (6 to 57 passes
    seen, 37 to 53 with the guard broken), so its half of the guard (a claim waiting
    here fills a freed slot) is tested in tests/unit/test_worker_ahead.py instead."""
    # A real file: each group commit lets go of the interpreter while SQLite writes,
    # which is when a woken loop would run its pass.
    registry = TaskRegistry()
    registry.task("noop")(lambda: None)
    scheduler = Scheduler(SQLiteStore(tmp_path / "jobs.db"), registry=registry)
    ids = scheduler.submit_many("noop", [{} for _ in range(400)])
    worker = Worker(scheduler, concurrency=4, commit_delay=0.0, ahead=0)
    passes = 0
    run_once = worker.run_once

    def counted(now: object = None) -> int:
        nonlocal passes
        passes += 1
        return run_once(now)  # type: ignore[arg-type]

    worker.run_once = counted  # type: ignore[method-assign]
    worker.run(burst=True, burst_wait=0)

    assert all(scheduler.get(i).state is TaskState.SUCCEEDED for i in ids)
    scheduler.store.close()
    # At most 4 outcomes share a group commit here, so a pass per commit would be 100
    # or more; the loop runs one to start, one when the backlog runs dry, and a few
    # more where a commit found nothing due yet for a freed slot.
    assert passes < 25, f"{passes} passes of the claim loop for 400 tasks in 4 slots"
