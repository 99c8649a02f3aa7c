"""Where an attempt runs: a worker thread, or a child process the worker can terminate.

In the **thread** environment cancellation and timeouts are cooperative: the
task is told (``ctx.cancel_requested``, ``ctx.timed_out``) and must stop by
itself. In the **process** environment each attempt runs in a child forked
from the worker; the worker can stop it at any instruction. The child never
touches the database: it sends its result (JSON, over a pipe) to the worker,
which records it under the claim, so a child the worker has given up on can
never commit anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durablesched.context import AttemptSignals, TaskContext
from durablesched.errors import InvalidTaskError, ProcessCrashed, TaskCancelled
from durablesched.readable import readable
from durablesched.records import ErrorInfo, NewTask, SignalSend, call_args
from durablesched.registry import TaskDefinition
from durablesched.submission import to_json


@dataclass(frozen=True, slots=True)
class ChildEnded:
    """How an attempt in a child process ended, as the worker saw it."""

    #: "result", "error", "cancelled", "timeout", "terminated" or "crashed".
    how: str
    result: Any = None
    children: tuple[NewTask, ...] = ()
    signals: tuple[SignalSend, ...] = ()
    error: ErrorInfo | None = None
    #: With an error: whether the task's retry policy retries it.
    retry: bool = True


#: How often the waiting worker thread looks at cancel requests and deadlines.
TICK = 0.02
#: prctl(2) option: the signal a child gets when the thread that forked it ends.
PR_SET_PDEATHSIG = 1
_FORK_LOCK = threading.Lock()


def run_in_child(
    definition: TaskDefinition,
    args: dict[str, Any],
    ctx: TaskContext,
    *,
    deadline: float | None,
    cancel_grace: float,
    on_enforce: Callable[[], None],
    signals: AttemptSignals | None = None,
) -> ChildEnded:
    """Run one attempt in a forked child and wait for it, on the calling worker thread.

    ``deadline`` is a ``time.monotonic()`` value; past it the child is killed
    (a timeout). A cancel request is passed to the child (SIGUSR1, which sets
    ``ctx.cancel_requested`` there); if the child has not ended ``cancel_grace``
    seconds later, ``on_enforce()`` is called (it invalidates the claim) and
    only then is the child killed. ``signals`` are the attempt's, those its
    context reads: the child's copy hears the request. Without them (a bare
    context, as in a benchmark) the child ignores the request and is killed
    when the grace is over.
    """
    # One fork at a time: a child forked while another child's pipe is still
    # open here would inherit its write end and hold back that pipe's EOF.
    with _FORK_LOCK:
        read_end, write_end = os.pipe()
        # SIGUSR1 (the cancel request) stays blocked until the child has its
        # handler: its default action would kill a child that had just started.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        pid = -1
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns about fork() in a threaded process: the child
                # runs only the task function and leaves with os._exit (execution.md).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(read_end)
                _child(definition, args, ctx, write_end, mask, signals=signals)
        finally:
            if pid != 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_end)
    try:
        return _wait(pid, read_end, ctx, _Limits(deadline, cancel_grace, on_enforce))
    finally:
        os.close(read_end)


@dataclass(frozen=True, slots=True)
class _Limits:
    deadline: float | None
    cancel_grace: float
    on_enforce: Callable[[], None]


def _wait(pid: int, fd: int, ctx: TaskContext, limits: _Limits) -> ChildEnded:
    data = bytearray()
    told_at: float | None = None
    ended: str | None = None
    while True:
        now = time.monotonic()
        if told_at is None and ctx.cancel_requested:
            told_at = now
            _signal(pid, signal.SIGUSR1)
        if told_at is not None and now >= told_at + limits.cancel_grace:
            limits.on_enforce()  # the claim is gone before the child is: nothing of it counts
            ended = "terminated"
            break
        if limits.deadline is not None and now >= limits.deadline:
            ended = "timeout"
            break
        if readable([fd], TICK):
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break  # the child closed its end: it is done (or dead)
            data += chunk
    if ended is not None:
        _signal(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if ended == "terminated":
        return ChildEnded("terminated")
    if ended == "timeout":
        return ChildEnded("timeout")
    try:
        report = json.loads(data) if data else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        return ChildEnded("crashed", error=_crash(status))
    return _ended(report)


def _ended(report: dict[str, Any]) -> ChildEnded:
    if "error" in report:
        e = report["error"]
        return ChildEnded("error", error=ErrorInfo.from_dict(e), retry=bool(report.get("retry")))
    if report.get("cancelled"):
        return ChildEnded("cancelled")
    children = tuple(
        NewTask(
            name=c["name"],
            args=c["args"],
            due_at=datetime.fromisoformat(c["due_at"]),
            max_attempts=int(c["max_attempts"]),
            idempotency_key=c["key"],
            queue=c["queue"],
            priority=int(c["priority"]),
        )
        for c in report.get("children", [])
    )
    signals = tuple(
        SignalSend(s["task_id"], s["name"], s["payload"]) for s in report.get("signals", [])
    )
    return ChildEnded("result", result=report.get("result"), children=children, signals=signals)


def _crash(status: int) -> ErrorInfo:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
        hint = " (out of memory?)" if number == signal.SIGKILL else ""
        message = f"the task's process was killed by signal {number} ({name}){hint}"
    else:
        message = f"the task's process exited with code {os.waitstatus_to_exitcode(status)}"
    return ErrorInfo.recorded(ProcessCrashed, message + " before reporting")


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.kill(pid, signum)


def _child(
    definition: TaskDefinition,
    args: dict[str, Any],
    ctx: TaskContext,
    fd: int,
    mask: Any,
    *,
    signals: AttemptSignals | None,
) -> None:
    """In the forked child: run the function, report as JSON, and leave without cleanup."""
    code = 0
    try:
        # Die with the worker thread that forked us: a child must not outlive
        # its worker (killed or exited) and run on with nobody to report to.
        _die_with_parent()
        # Objects inherited from the worker (its connections among them) must
        # never be finalised here: freeze them out of the collector's reach.
        gc.freeze()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if signals is None:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        else:
            request_cancel = signals.request_cancel
            signal.signal(signal.SIGUSR1, lambda _n, _f: request_cancel())
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a request sent meanwhile lands now
        report = _run(definition, args, ctx)
        payload = json.dumps(report, ensure_ascii=False, allow_nan=False).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:  # nothing may escape into the worker's copy of the stack
        code = 70
    finally:
        os._exit(code)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the forking thread ends (best effort elsewhere)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the worker died before prctl took effect
        os._exit(70)


def _run(definition: TaskDefinition, args: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    try:
        positional, keywords = call_args(args)
        value = (
            definition.fn(ctx, *positional, **keywords)
            if definition.pass_context
            else definition.fn(*positional, **keywords)
        )
        if definition.is_async:
            value = asyncio.run(value)
    except TaskCancelled as exc:
        if ctx.cancel_requested:
            return {"cancelled": True}
        return _failed(definition, exc)
    except BaseException as exc:
        return _failed(definition, exc)
    try:
        result = json.loads(to_json(value, f"the result of task {definition.name!r}"))
    except InvalidTaskError as exc:
        return {"error": _error(unstorable(exc)), "retry": False}
    return {
        "result": result,
        "children": [
            {
                "name": c.name,
                "args": c.args,
                "due_at": c.due_at.isoformat(),
                "max_attempts": c.max_attempts,
                "key": c.idempotency_key,
                "queue": c.queue,
                "priority": c.priority,
            }
            for c in ctx.children
        ],
        "signals": [
            {"task_id": s.task_id, "name": s.name, "payload": s.payload} for s in ctx.sent_signals
        ],
    }


def unstorable(exc: InvalidTaskError) -> InvalidTaskError:
    """The error of an attempt whose return value JSON cannot store: failed at once."""
    return InvalidTaskError(
        f"{exc} (failed at once, not retried: the body ran and its effects happened, "
        "and a retry would repeat them to return the same)"
    )


def _failed(definition: TaskDefinition, exc: BaseException) -> dict[str, Any]:
    """The report of an attempt that raised ``exc``, saying whether its policy retries it."""
    return {"error": _error(exc), "retry": definition.retry.retries(exc)}


def _error(exc: BaseException) -> dict[str, str]:
    return ErrorInfo.from_exception(exc).to_dict()
