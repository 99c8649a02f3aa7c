"""A running task hears that its worker is stopping: ``ctx.shutdown_requested``, ``ctx.wait``."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from durablesched import (
    ManualClock,
    MemoryStore,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
)
from durablesched.cli.worker import Countdown, SignalStop
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


def test_shutdown_tells_on_wait_how_many_run_and_how_long_is_left() -> None:
    registry = TaskRegistry()
    release = threading.Event()
    started = threading.Event()

    @registry.task("held")
    def held() -> None:
        started.set()
        release.wait(WAIT)

    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(T0))
    task_id = scheduler.submit("held")
    worker = Worker(scheduler, owner="w")
    assert worker.run_once() == 1 and started.wait(WAIT)
    told: list[tuple[int, float]] = []

    def on_wait(running: int, left: float) -> None:
        told.append((running, left))
        release.set()  # the task finishes once the countdown has begun

    assert worker.shutdown(600, on_wait=on_wait) == 0
    assert told and told[0][0] == 1 and 590 < told[0][1] <= 600
    assert scheduler.get(task_id).state is TaskState.SUCCEEDED


def test_the_cli_counts_down_every_five_seconds_and_names_the_second_ctrl_c(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="durablesched.worker")
    countdown = Countdown()
    for left in (30.0, 29.0, 26.0, 25.0, 24.0, 20.0, 3.0):
        countdown(2, left)
    assert [r.getMessage() for r in caplog.records] == [
        "still waiting for 2 running task(s): 25s left (a second Ctrl-C exits at once)",
        "still waiting for 2 running task(s): 20s left (a second Ctrl-C exits at once)",
        "still waiting for 2 running task(s): 3s left (a second Ctrl-C exits at once)",
    ]
    caplog.clear()
    scheduler = Scheduler(MemoryStore(), registry=TaskRegistry(), clock=ManualClock(T0))
    stop = SignalStop(Worker(scheduler, owner="w"), 30)
    stop(signal.SIGINT, None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        "SIGINT: no new claims; running tasks get up to 30s to finish "
        "(a second Ctrl-C exits at once)"
    )
