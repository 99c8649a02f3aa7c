"""Execution environments: a child process per attempt (cancel and timeout enforced),
threads (cooperative), and async tasks cancelled at their next await.

Real child processes: each test waits for an observable state with a bounded poll.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from durablesched import (
    CancelOutcome,
    RetryPolicy,
    Scheduler,
    SQLiteStore,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
    open_store,
)

from .conftest import Workers, query, wait_for

pytestmark = pytest.mark.processes

GRACE = 0.5
registry = TaskRegistry(
    default_retry=RetryPolicy(max_attempts=2, initial=timedelta(milliseconds=10), jitter=0)
)


def _spin(seconds: float) -> str:
    """Burn CPU without ever looking at cancellation."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


@registry.task("spin.process", environment="process")
def spin_process(seconds: float) -> str:
    return _spin(seconds)


@registry.task("spin.thread", environment="thread")
def spin_thread(seconds: float) -> str:
    return _spin(seconds)


@registry.task("hog", environment="process", timeout=0.3)
def hog() -> str:
    return _spin(60)


@registry.task("polite", pass_context=True, timeout=0.2)
def polite(ctx: TaskContext) -> str:
    while True:
        ctx.raise_if_cancelled()  # raises TaskTimeout once the time is up
        _spin(0.01)


@registry.task("polite.process", environment="process", pass_context=True)
def polite_process(ctx: TaskContext) -> str:
    while True:
        ctx.raise_if_cancelled()  # the worker's SIGUSR1 sets this in the child
        _spin(0.01)


@registry.task("die", environment="process", retry=RetryPolicy(max_attempts=1))
def die() -> None:
    os._exit(1)


@registry.task("side.child", queue="side", priority=7)
def side_child() -> None:
    return None


@registry.task("double", environment="process", pass_context=True)
def double(ctx: TaskContext, n: int) -> int:
    ctx.submit("side.child")  # its queue and priority come back from the process too
    return n * 2


@registry.task("effectful", environment="process", pass_context=True)
def effectful(ctx: TaskContext) -> None:
    ctx.on_success(lambda conn: None)


@registry.task("waiter")
async def waiter() -> str:
    await asyncio.sleep(60)
    return "woke"


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    store = SQLiteStore(tmp_path / "env.db")
    yield Scheduler(store, registry=registry)
    store.close()


@pytest.fixture
def worker(scheduler: Scheduler) -> Iterator[Worker]:
    w = Worker(scheduler, concurrency=4, lease=5, cancel_grace=GRACE)
    w.start()
    yield w
    w.request_stop()
    w.shutdown(grace=0)


def state(scheduler: Scheduler, task_id: int) -> TaskState:
    return scheduler.get(task_id).state


def reaches(scheduler: Scheduler, task_id: int, *states: TaskState, timeout: float = 30) -> None:
    wait_for(
        lambda: state(scheduler, task_id) in states, f"task {task_id} to reach {states}", timeout
    )


def test_a_cpu_loop_in_a_process_is_terminated_within_the_grace_period(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("spin.process", {"seconds": 60})
    reaches(scheduler, task_id, TaskState.RUNNING)
    asked = time.monotonic()
    assert scheduler.cancel(task_id) is CancelOutcome.ENFORCED
    reaches(scheduler, task_id, TaskState.CANCELLED, timeout=GRACE + 10)
    took = time.monotonic() - asked
    history = scheduler.history(task_id)
    assert "cancellation enforced" in (history[-1].detail or "")
    assert took < GRACE + 5, f"stopped {took:.1f}s after the request"
    assert scheduler.get(task_id).environment == "process"
    # Its process is gone and the worker is free for the next task.
    next_id = scheduler.submit("spin.thread", {"seconds": 0})
    reaches(scheduler, next_id, TaskState.SUCCEEDED)


def test_a_process_task_that_listens_stops_itself_before_the_grace(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("polite.process")
    reaches(scheduler, task_id, TaskState.RUNNING)
    assert scheduler.cancel(task_id) is CancelOutcome.ENFORCED
    reaches(scheduler, task_id, TaskState.CANCELLED, timeout=GRACE + 10)
    assert scheduler.history(task_id)[-1].detail == "cancellation acknowledged"


def test_the_same_loop_in_a_thread_is_only_asked_and_runs_to_its_end(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("spin.thread", {"seconds": 1.5})
    reaches(scheduler, task_id, TaskState.RUNNING)
    assert scheduler.cancel(task_id) is CancelOutcome.REQUESTED
    reaches(scheduler, task_id, TaskState.SUCCEEDED, TaskState.CANCELLED)
    task = scheduler.get(task_id)
    assert (task.state, task.result) == (TaskState.SUCCEEDED, "spun")
    assert task.environment is None


def test_a_timed_out_process_is_killed_retried_and_finally_failed(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("hog")
    reaches(scheduler, task_id, TaskState.FAILED)
    task = scheduler.get(task_id)
    assert task.attempts == 2
    assert task.last_error is not None
    assert task.last_error.type == "durablesched.errors.TaskTimeout"
    assert "timed out" in task.last_error.message
    states = [e.state for e in scheduler.history(task_id)]
    assert TaskState.RETRY_WAIT in states


def test_a_thread_task_is_told_of_its_timeout_and_its_attempt_fails(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("polite", max_attempts=1)
    reaches(scheduler, task_id, TaskState.FAILED)
    error = scheduler.get(task_id).last_error
    assert error is not None and error.type == "durablesched.errors.TaskTimeout"


def test_a_child_that_exits_fails_its_attempt_and_the_worker_goes_on(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("die")
    reaches(scheduler, task_id, TaskState.FAILED)
    error = scheduler.get(task_id).last_error
    assert error is not None and error.type == "durablesched.ProcessCrashed"
    assert "exited with code 1" in error.message
    survivor = scheduler.submit("double", {"n": 21})
    reaches(scheduler, survivor, TaskState.SUCCEEDED)
    assert scheduler.get(survivor).result == 42
    # Its child task came back from the process and was stored with the success.
    children = scheduler.list_tasks(name="side.child")
    assert [(c.queue, c.priority) for c in children] == [("side", 7)]


def test_database_effects_are_refused_in_a_process_with_a_clear_error(
    scheduler: Scheduler, worker: Worker
) -> None:
    task_id = scheduler.submit("effectful", max_attempts=1)
    reaches(scheduler, task_id, TaskState.FAILED)
    error = scheduler.get(task_id).last_error
    assert error is not None and "process environment" in error.message


def test_an_async_task_is_cancelled_at_its_next_await(scheduler: Scheduler, worker: Worker) -> None:
    task_id = scheduler.submit("waiter")
    reaches(scheduler, task_id, TaskState.RUNNING)
    assert scheduler.cancel(task_id) is CancelOutcome.REQUESTED
    reaches(scheduler, task_id, TaskState.CANCELLED, timeout=10)
    assert scheduler.history(task_id)[-1].detail == "cancellation acknowledged"


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for init to reap it counts)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


def test_a_killed_worker_takes_its_task_processes_with_it(db: str, tmp_path: Path) -> None:
    store = open_store(db)
    task_id = Scheduler(store).submit("spin", {"seconds": 120})
    store.close()
    workers = Workers(db, tmp_path)
    try:
        proc = workers.start(concurrency=1, lease=2)
        spinners = tmp_path / "spinners"
        wait_for(lambda: spinners.exists() and spinners.read_text().strip() != "", "the child")
        child = int(spinners.read_text().split()[0])
        assert not _gone(child)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_for(lambda: _gone(child), f"the task's process {child} to die with its worker")
        # Its lease lapses and another worker reclaims the task.
        rescuer = workers.start("--burst", concurrency=1, lease=2)
        wait_for(lambda: _reclaimed(db, task_id), "the reclaim", 60)
        rescuer.kill()
    finally:
        workers.stop_all()


def _reclaimed(db: str, task_id: int) -> bool:
    rows = query(
        db,
        "SELECT count(*) FROM task_events WHERE task_id = ? AND detail LIKE 'lease of %'",
        task_id,
    )
    return int(rows[0][0]) >= 1
