"""Tasks the process tests run in real worker processes (imported as tests.processes.app)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Connection, text

from durablesched import RetryPolicy, TaskContext, TaskRegistry

registry = TaskRegistry(
    default_retry=RetryPolicy(max_attempts=5, initial=timedelta(milliseconds=50), jitter=0)
)
OUT = Path(os.environ.get("DS_TEST_DIR", "."))


def _append(name: str, line: str) -> None:
    # O_APPEND: one short write per line, so concurrent processes never interleave.
    fd = os.open(OUT / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _ledger(task_id: int, attempt: int) -> Callable[[Connection], None]:
    def effect(conn: Connection) -> None:
        conn.execute(
            text("INSERT INTO ledger (task_id, attempt, pid) VALUES (:t, :a, :p)"),
            {"t": task_id, "a": attempt, "p": os.getpid()},
        )

    return effect


@registry.task("record", pass_context=True)
def record(ctx: TaskContext, n: int) -> int:
    """A database effect through the success transaction and an external one in a file."""
    _append("executions", f"{ctx.task_id} {ctx.attempt} {os.getpid()} {ctx.idempotency_key}")
    ctx.on_success(_ledger(ctx.task_id, ctx.attempt))
    return n


@registry.task("slow")
def slow(seconds: float) -> str:
    threading.Event().wait(seconds)
    return "slept"


@registry.task(
    "chaos",
    pass_context=True,
    retry=RetryPolicy(max_attempts=8, initial=timedelta(milliseconds=20), jitter=0.5),
)
def chaos(ctx: TaskContext, n: int, fail: bool) -> int:
    """A database effect with the success, an external effect before it; some fail for good."""
    _append("external", f"{ctx.idempotency_key} {ctx.task_id} {ctx.attempt} {os.getpid()}")
    threading.Event().wait(0.002)  # long enough to be caught mid-task by a kill
    if fail:
        raise ValueError(f"task {n} is written to fail")
    ctx.on_success(_ledger(ctx.task_id, ctx.attempt))
    return n


@registry.task("zombie", pass_context=True)
def zombie(ctx: TaskContext, mode: str) -> dict[str, int]:
    """Runs its body, then (first attempt only) waits for the test to kill or pause us,
    and ends as `mode` says once released: succeed, fail, or acknowledge cancellation."""
    ctx.on_success(_ledger(ctx.task_id, ctx.attempt))
    ctx.submit("record", {"n": -ctx.attempt})
    _append("bodies", f"{ctx.task_id} {ctx.attempt} {os.getpid()}")
    if ctx.attempt == 1:
        release = OUT / "release"
        waited = threading.Event()
        saw_cancel = False
        for _ in range(3000):  # at most 30 s, bounded
            if release.exists():
                break
            if ctx.cancel_requested and not saw_cancel:
                saw_cancel = True
                _append("saw-cancel", str(ctx.task_id))
            waited.wait(0.01)
        if mode == "fail":
            raise RuntimeError("the zombie fails late")
        if mode == "cancel":
            ctx.raise_if_cancelled()
    return {"attempt": ctx.attempt, "pid": os.getpid()}


@registry.task("spin", environment="process")
def spin(seconds: float) -> str:
    """Records its process id, then burns CPU without ever looking at cancellation."""
    _append("spinners", str(os.getpid()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


@registry.task("until_go", pass_context=True)
def until_go(ctx: TaskContext) -> int:
    """Notes its start, then runs until the test creates the file ``go`` (at most a minute)."""
    _append("executions", f"{ctx.task_id} {ctx.attempt} {os.getpid()}")
    deadline = time.monotonic() + 60
    while not (OUT / "go").exists() and time.monotonic() < deadline:
        threading.Event().wait(0.02)
    return ctx.attempt


def _step_effect(task_id: int, step: int, attempt: int) -> Callable[[Connection, object], None]:
    def effect(conn: Connection, _result: object) -> None:
        conn.execute(
            text("INSERT INTO step_ledger (task_id, step, attempt) VALUES (:t, :s, :a)"),
            {"t": task_id, "s": step, "a": attempt},
        )

    return effect


@registry.task(
    "wf_chaos",
    pass_context=True,
    retry=RetryPolicy(max_attempts=50, initial=timedelta(milliseconds=20), jitter=0.5),
)
def wf_chaos(ctx: TaskContext, steps: int, pause: float = 0.002) -> int:
    """A workflow of ``steps`` steps, each appending a line to a file (external), pausing
    ``pause`` seconds (long enough to be caught mid-step by a kill), and writing a
    database effect in its checkpoint's transaction."""
    total = 0

    def run(step: int) -> int:
        _append("steps", f"{ctx.task_id} {step} {ctx.attempt} {os.getpid()}")
        threading.Event().wait(pause)
        return step

    for step in range(steps):
        total += ctx.step(
            f"s{step}", run, step, effect=_step_effect(ctx.task_id, step, ctx.attempt)
        )
    return total


@registry.task("wf_zombie", pass_context=True)
def wf_zombie(ctx: TaskContext) -> str:
    """Step a, then step b, whose body (in each of the first two attempts) waits for the
    test to release it: the first attempt's checkpoint, written after the second claimed
    the task, is a zombie's."""

    def b() -> str:
        _append("steps", f"{ctx.task_id} 1 {ctx.attempt} {os.getpid()}")
        if ctx.attempt <= 2:  # each of the first two attempts waits for its own release
            _append(f"paused{ctx.attempt}", str(os.getpid()))
            release = OUT / f"release{ctx.attempt}"
            for _ in range(3000):  # at most 30 s, bounded
                if release.exists():
                    break
                threading.Event().wait(0.01)
        return f"b by attempt {ctx.attempt}"

    ctx.step("a", lambda: "a", effect=_step_effect(ctx.task_id, 0, ctx.attempt))
    result: str = ctx.step("b", b, effect=_step_effect(ctx.task_id, 1, ctx.attempt))
    return result


@registry.task("wf_sleeper", pass_context=True)
def wf_sleeper(ctx: TaskContext, seconds: float) -> float:
    """Sleeps durably on the real clock; returns how long from its first start."""
    started: float = ctx.step("start", time.time)
    ctx.sleep_for(timedelta(seconds=seconds))
    return time.time() - started
