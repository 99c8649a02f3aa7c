"""A running task hears that its worker is stopping: ``ctx.shutdown_requested``, ``ctx.wait``."""

from __future__ import annotations

import threading

from durablesched import (
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.context import AttemptSignals

from ..conftest import T0, WAIT


def _worker() -> tuple[Scheduler, Worker, dict[str, object], threading.Event]:
    seen: dict[str, object] = {}
    started = threading.Event()
    registry = TaskRegistry()

    @registry.task("long", pass_context=True)
    def long(ctx: TaskContext) -> str:
        started.set()
        seen["woken"] = ctx.wait(30)
        seen["shutdown"] = ctx.shutdown_requested
        seen["cancel"] = ctx.cancel_requested
        return "checkpointed"

    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))
    return scheduler, Worker(scheduler, owner="w"), seen, started


def test_request_stop_wakes_a_task_waiting_in_ctx_wait() -> None:
    scheduler, worker, seen, started = _worker()
    task_id = scheduler.submit("long")
    thread = worker.start()
    assert started.wait(WAIT)
    worker.request_stop()  # as the CLI's signal handler does: the loop tells the task
    thread.join(WAIT)
    assert not thread.is_alive()
    assert worker.wait_idle(WAIT)  # well before the task's 30 s wait would end
    assert worker.stop(WAIT)
    assert seen == {"woken": True, "shutdown": True, "cancel": False}
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED


def test_shutdown_wakes_a_task_waiting_in_ctx_wait() -> None:
    scheduler, worker, seen, started = _worker()
    task_id = scheduler.submit("long")
    assert worker.run_once() == 1
    assert started.wait(WAIT)
    assert worker.shutdown(WAIT) == 0  # it finished within the grace: nothing given back
    assert seen == {"woken": True, "shutdown": True, "cancel": False}
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED


def test_wait_returns_false_when_its_time_runs_out_and_wait_for_cancel_ignores_shutdown() -> None:
    signals = AttemptSignals()
    assert signals.wait(0) is False
    signals.request_shutdown()
    assert signals.wait(WAIT) is True
    assert signals.wait_for_cancel(0) is False  # unchanged: only a cancel ends it
    signals.request_cancel()
    assert signals.wait_for_cancel(WAIT) is True
