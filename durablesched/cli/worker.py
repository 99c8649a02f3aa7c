"""``durablesched worker``: run the app's tasks until a signal, or until idle with ``--burst``.

The steps: check the options, build the worker, install the signal handlers,
run, give back unfinished claims, report how the database behaved.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING, Any

from durablesched.cli.app import load_registry
from durablesched.cli.database import check_db, display_db, open_db
from durablesched.cli.errors import EXIT_OK, EXIT_REFUSED, UsageError, error_line
from durablesched.cli.options import Commands, Repeated, env_name, option, switch
from durablesched.cli.output import jsonable, when
from durablesched.cli.values import positive_float, positive_int, seconds
from durablesched.errors import CorruptDatabase, DurableSchedError, InvalidTaskError
from durablesched.queues import check_queue
from durablesched.records import ENVIRONMENT_CHOICES, Environment
from durablesched.registry import TaskRegistry
from durablesched.states import TaskState
from durablesched.worker.options import UNKNOWN_TASKS

if TYPE_CHECKING:
    from durablesched.store.protocol import DurableStore
    from durablesched.worker.loop import Worker

#: --log-level names; per-task lines are INFO, so "warning" keeps only trouble.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

#: What ``signal.signal`` takes and gives back.
SignalHandler = Callable[[int, FrameType | None], Any] | int | None

# The logger name the command's own lines have always carried: people filter logs by it.
log = logging.getLogger("durablesched.cli")


def register(commands: Commands) -> None:
    p = commands.add("worker", cmd_worker, "run a worker process")
    option(p, "--app", help="the task registry to run, as MODULE[:ATTR]")
    option(p, "--concurrency", help="how many tasks run at once")
    option(p, "--lease", help="lease length in seconds; heartbeats renew it")
    option(p, "--grace", help="seconds running tasks get to finish after SIGTERM")
    option(
        p,
        "--environment",
        help="where tasks that do not say run: thread, or process (cancel and timeout enforced)",
    )
    option(
        p,
        "--cancel-grace",
        help="seconds a task in a process has to stop when cancelled before it is terminated",
    )
    option(
        p,
        "--unknown-tasks",
        help="a task whose name --app lacks: skip (leave it for a worker that has it) "
        "or fail (claim it and fail it at once, not retried)",
    )
    option(
        p,
        "--log-level",
        help="debug, info (a line per task start and outcome), warning or error",
    )
    option(
        p,
        "--ahead",
        help="at most how many tasks to claim beyond the slots, waiting for one to free "
        "(default 8; 0: claim only into free slots)",
    )
    option(
        p,
        "--ahead-window",
        help="claim ahead only what starts within this many seconds at the recent rate",
    )
    option(
        p,
        "--give-up-after",
        help="seconds of database errors in a row the worker backs off from before it exits 1",
    )
    switch(
        p,
        "--burst",
        help="exit 0 once nothing can be claimed now or within --burst-wait seconds",
    )
    option(
        p,
        "--burst-wait",
        help="with --burst: how far ahead a retry due or another worker's lease lapsing "
        "is waited for",
    )
    option(
        p,
        "--queue",
        # Not DURABLESCHED_QUEUE: that is the queue `submit` puts a task in.
        variable="worker-queues",
        action=Repeated,
        metavar="NAME=SLOTS",
        help="serve this queue with slots of its own; repeat for more queues "
        "(without: every queue, sharing --concurrency)",
    )


@dataclass(frozen=True)
class WorkerOptions:
    """The worker's options, checked before anything is opened."""

    registry: TaskRegistry
    concurrency: int
    lease: float
    grace: float
    log_level: int
    environment: Environment
    cancel_grace: float
    give_up_after: float
    burst_wait: float
    queues: dict[str, int] | None = None
    unknown_tasks: str = "skip"
    ahead: int = 8
    ahead_window: float = 0.05


def worker_options(args: argparse.Namespace) -> WorkerOptions:
    """The options from ``args``, or a UsageError naming the first bad one."""
    if args.app is None:
        raise UsageError(f"--app is required (or set {env_name('app')})")
    registry = load_registry(args.app)
    concurrency = positive_int("--concurrency", args.concurrency)
    lease = positive_float("--lease", args.lease)
    grace = positive_float("--grace", args.grace)
    level = LOG_LEVELS.get(str(args.log_level).lower())
    if level is None:
        raise UsageError(
            f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {args.log_level!r}"
        )
    if args.environment not in set(Environment):
        raise UsageError(f"--environment must be {ENVIRONMENT_CHOICES}, got {args.environment!r}")
    cancel_grace = positive_float("--cancel-grace", args.cancel_grace)
    if args.unknown_tasks not in UNKNOWN_TASKS:
        raise UsageError(
            f"--unknown-tasks must be {' or '.join(UNKNOWN_TASKS)}, got {args.unknown_tasks!r}"
        )
    return WorkerOptions(
        registry,
        concurrency,
        lease,
        grace,
        level,
        Environment(args.environment),
        cancel_grace,
        give_up_after=seconds("--give-up-after", args.give_up_after),
        burst_wait=seconds("--burst-wait", args.burst_wait),
        queues=served_queues(args.queue),
        unknown_tasks=args.unknown_tasks,
        ahead=0
        if str(args.ahead).strip() == "0"
        else positive_int("--ahead", args.ahead, maximum=10_000),
        ahead_window=seconds("--ahead-window", args.ahead_window),
    )


def served_queues(text: str | None) -> dict[str, int] | None:
    """``--queue NAME=SLOTS`` (repeated, or comma-joined in the variable) as a mapping."""
    if not text:
        return None
    queues: dict[str, int] = {}
    for item in text.split(","):
        name, sep, slots = item.strip().partition("=")
        if not sep:
            raise UsageError(f"--queue takes NAME=SLOTS, such as default=8, got {item!r}")
        try:
            check_queue(name, "--queue's name")
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None
        if name in queues:
            raise UsageError(f"--queue names {name!r} twice")
        queues[name] = positive_int(f"--queue {name}", slots, maximum=10_000)
    return queues


def build_worker(options: WorkerOptions, args: argparse.Namespace) -> tuple[DurableStore, Worker]:
    """The store the options name, and a worker over it (the caller closes the store)."""
    from durablesched.scheduler import Scheduler
    from durablesched.worker.loop import Worker

    store = open_db(args)
    worker = Worker(
        Scheduler(store, registry=options.registry),
        concurrency=options.concurrency,
        lease=options.lease,
        environment=options.environment,
        cancel_grace=options.cancel_grace,
        queues=options.queues,
        give_up_after=options.give_up_after,
        unknown_tasks=options.unknown_tasks,
        ahead=options.ahead,
        ahead_window=options.ahead_window,
    )
    return store, worker


class SignalStop:
    """SIGTERM or SIGINT: the first stops claiming and lets running tasks finish
    within ``grace``; a second exits at once (held leases expire and are reclaimed)."""

    def __init__(self, worker: Worker, grace: float) -> None:
        self.worker = worker
        #: Seconds running tasks get once stopped; 0 when the database failed.
        self.grace = grace
        self._seen = 0
        self._previous: dict[int, SignalHandler] = {}

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self._seen += 1
        if self._seen > 1:
            log.warning("second signal: exiting at once; held leases will expire and be reclaimed")
            os._exit(128 + signum)
        # No lock may be taken here (the interrupted thread may hold it): the running
        # count comes with the countdown, from the shutdown.
        name = signal.Signals(signum).name if signum in signal.valid_signals() else signum
        log.warning(
            "%s: no new claims; running tasks get up to %gs to finish "
            "(a second Ctrl-C exits at once)",
            name,
            self.grace,
        )
        self.worker.request_stop()

    def install(self) -> None:
        self._previous = {s: signal.signal(s, self) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Countdown:
    """While a stopping worker waits for its running tasks: a line every ``every``
    seconds with how many still run and how long is left (``Worker.shutdown(on_wait=)``)."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self._last: float | None = None

    def __call__(self, running: int, left: float) -> None:
        if self._last is None:  # the signal's own line said it just now
            self._last = left
            return
        if self._last - left < self.every:
            return
        self._last = left
        log.warning(
            "still waiting for %s running task(s): %.0fs left (a second Ctrl-C exits at once)",
            running,
            left,
        )


#: The interpreter's thread switch interval while a worker command runs (seconds).
#: Python's 5 ms default makes a thread woken from I/O (the committer after its
#: fsync, the claim loop) wait up to 5 ms for the interpreter behind a CPU-bound
#: task thread, at every hand-off: docs/performance.md, "Claiming ahead".
SWITCH_INTERVAL = 0.0005


def run_worker(worker: Worker, stop: SignalStop, *, burst: bool, burst_wait: float) -> int:
    """Run until stopped (or idle, with ``burst``), then give back unfinished claims.

    The process is the worker's: its thread switch interval is at most
    :data:`SWITCH_INTERVAL` meanwhile, restored after.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, SWITCH_INTERVAL))
    try:
        return _run_worker(worker, stop, burst=burst, burst_wait=burst_wait)
    finally:
        sys.setswitchinterval(previous)


def _run_worker(worker: Worker, stop: SignalStop, *, burst: bool, burst_wait: float) -> int:
    code = EXIT_OK
    try:
        worker.run(burst=burst, burst_wait=burst_wait)
    except DurableSchedError as e:
        # The database went away or broke under us: stop, loudly, rather than spin.
        # One line; the worker logged each distinct error as it met it.
        print(f"durablesched: worker stopped: {error_line(e)}", file=sys.stderr)
        stop.grace = 0.0
        if isinstance(e, CorruptDatabase):
            # Nothing more can be written: held leases lapse and a worker on a
            # healthy (restored) database reclaims their tasks.
            worker.request_stop()
            return EXIT_REFUSED
        code = EXIT_REFUSED
    try:
        released = worker.shutdown(stop.grace, on_wait=Countdown())
        if released:
            log.warning("gave back %s unfinished task(s) as PENDING", released)
    except DurableSchedError as e:
        log.error("could not give back unfinished tasks (their leases will lapse): %s", e)
        code = EXIT_REFUSED
    return code


def remaining(store: DurableStore, owner: str, now: datetime) -> Remaining:
    """What a burst worker leaves: tasks due later, tasks running under other workers'
    leases, tasks due now that it does not run (their names are not in its app), and
    tasks a paused queue holds (never overdue: ``stats`` leaves them out)."""
    stats = store.stats(now)
    counts = stats["counts"]
    due_now = sum(o["tasks"] for o in stats["overdue_by_name"])
    queues = store.queue_info(now, finished=False)
    waiting = (TaskState.PENDING.value, TaskState.RETRY_WAIT.value)
    held = sum(q["counts"].get(s, 0) for q in queues if q["paused"] for s in waiting)
    later = counts[TaskState.PENDING.value] + counts[TaskState.RETRY_WAIT.value] - due_now - held
    next_due: datetime | None = None
    if later > 0:
        # Per queue that runs, in (due_at, seq) order: past the ones due now (at most
        # due_now in any queue), the first is that queue's earliest later one.
        for queue in (q["name"] for q in queues if not q["paused"]):
            for state in (TaskState.PENDING, TaskState.RETRY_WAIT):
                for task in store.list_tasks(state=state, queue=queue, limit=due_now + 1):
                    if task.due_at > now and (next_due is None or task.due_at < next_due):
                        next_due = task.due_at
                        break
    running = [r for r in stats["running"] if r["lease_owner"] != owner]
    return Remaining(
        due_later=later,
        next_due_at=next_due,
        running_elsewhere=len(running),
        next_lease_expiry=min((r["lease_expires_at"] for r in running), default=None),
        due_now_not_run=due_now,
        held_in_paused_queues=held,
    )


@dataclass(frozen=True)
class Remaining:
    """What a burst worker leaves behind, for its last line."""

    due_later: int
    next_due_at: datetime | None
    running_elsewhere: int
    next_lease_expiry: datetime | None
    due_now_not_run: int
    held_in_paused_queues: int = 0

    def line(self) -> str:
        parts = []
        if self.due_later:
            parts.append(f"{self.due_later} due later (the first at {when(self.next_due_at)})")
        if self.running_elsewhere:
            parts.append(
                f"{self.running_elsewhere} running under another worker's lease "
                f"(the first expires at {when(self.next_lease_expiry)})"
            )
        if self.due_now_not_run:
            parts.append(f"{self.due_now_not_run} due now that this worker does not run")
        if self.held_in_paused_queues:
            parts.append(f"{self.held_in_paused_queues} held in paused queues")
        return "burst done: " + ("; ".join(parts) if parts else "nothing remains")


def report_remaining(store: DurableStore, owner: str, *, as_json: bool) -> None:
    """The burst's last line, on stdout: what is left for other workers, or later."""
    from durablesched.clock import SystemClock

    left = remaining(store, owner, SystemClock().now())
    if as_json:
        print(json.dumps(jsonable(asdict(left))))
    else:
        print(left.line())


def report_stop(store: DurableStore) -> None:
    """The stop line: how often the database was busy (a sign of contention)."""
    log.log(
        logging.WARNING if store.busy_retries else logging.INFO,
        "stopped; transactions retried on a busy database: %s",
        store.busy_retries,
    )


def set_log_level(level: int) -> None:
    """Our lines at ``level``; Alembic's (a new database's schema, step by step) only at
    debug: at info, a worker's first start printed some twenty of them."""
    logging.getLogger("durablesched").setLevel(level)
    logging.getLogger("alembic").setLevel(level if level <= logging.DEBUG else logging.WARNING)


def cmd_worker(args: argparse.Namespace) -> int:
    options = worker_options(args)
    check_db(args.db)
    set_log_level(options.log_level)
    store, worker = build_worker(options, args)
    stop = SignalStop(worker, options.grace)
    stop.install()
    log.info(
        "worker %s: database %s, app %s, %s slots, lease %ss, tasks %s",
        worker.owner,
        display_db(args.db),
        args.app,
        options.concurrency,
        options.lease,
        ", ".join(options.registry) or "(none)",
    )
    try:
        code = run_worker(worker, stop, burst=args.burst, burst_wait=options.burst_wait)
        if code == EXIT_OK:
            report_stop(store)
            if args.burst:
                report_remaining(store, worker.owner, as_json=args.json)
    finally:
        stop.restore()
        store.close()
    if worker.active_count:
        # Task threads that outlived the grace period cannot be interrupted, and
        # their outcomes would be refused anyway: do not wait for them.
        logging.shutdown()
        os._exit(code)
    return code
