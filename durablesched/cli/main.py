"""The ``durablesched`` command: migrate, run workers, operate the queue.

Every option can also come from an environment variable ``DURABLESCHED_<OPTION>``;
``--help`` names it. Exit codes: 0 success, 1 not found or refused, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import FrameType
from typing import Any, NoReturn

from durablesched.clock import SystemClock
from durablesched.errors import (
    ConfigurationError,
    DurableSchedError,
    InvalidTaskError,
    InvalidTransitionError,
    TaskNotFoundError,
)
from durablesched.records import (
    ENVIRONMENT_CHOICES,
    CancelOutcome,
    Environment,
    ErrorInfo,
    TaskRecord,
)
from durablesched.registry import TaskRegistry
from durablesched.retry import DEFAULT_RETRY
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState
from durablesched.store.durability import Durability, durability
from durablesched.store.move import move_live_tasks
from durablesched.store.opening import create_engine_for, open_store
from durablesched.store.sql.migrate import upgrade
from durablesched.store.sql.store import SQLStore
from durablesched.worker.loop import Worker

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
COMMANDS = (
    "migrate",
    "worker",
    "submit",
    "ls",
    "show",
    "cancel",
    "retry",
    "stats",
    "purge",
    "copy",
)
ENV_PREFIX = "DURABLESCHED_"

#: Defaults, in one place.
DEFAULTS: dict[str, str] = {
    "db": "./durablesched.db",
    "durability": "full",
    "concurrency": "4",
    "lease": "30",
    "grace": "30",
    "log_level": "info",
    "environment": Environment.THREAD.value,
    "cancel_grace": "5",
}
#: --log-level names; per-task lines are INFO, so "warning" keeps only trouble.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

log = logging.getLogger("durablesched.cli.main")


class UsageError(Exception):
    """A bad argument: exit 2 with a one-line message naming it."""


class Refused(Exception):
    """Not found or not allowed: exit 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _env(option: str) -> str:
    return ENV_PREFIX + option.upper().replace("-", "_")


def _option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    default: str | None = None,
    suppress: bool = False,
    **kw: Any,
) -> None:
    """Add ``--flag`` whose default comes from DURABLESCHED_FLAG, then ``default``.

    With ``suppress``, an absent flag sets nothing, so that the same option
    given before the subcommand is kept.
    """
    name = flag.lstrip("-")
    env = _env(name)
    fallback = DEFAULTS.get(name.replace("-", "_"), default)
    value: Any = argparse.SUPPRESS if suppress else os.environ.get(env, fallback)
    shown = f" (default: {fallback})" if fallback is not None else ""
    parser.add_argument(flag, default=value, help=f"{help}{shown} (env: {env})", **kw)


def _positive_int(what: str, value: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a whole number, got {value!r}") from None
    if number < 1:
        raise UsageError(f"{what} must be at least 1, got {number}")
    return number


def _positive_float(what: str, value: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number of seconds, got {value!r}") from None
    if not number > 0:
        raise UsageError(f"{what} must be positive, got {value}")
    return number


def _durability(value: str) -> Durability:
    try:
        return durability(value)
    except ConfigurationError as e:
        raise UsageError(f"--{e}") from None


def load_registry(spec: str) -> TaskRegistry:
    """Import ``MODULE[:ATTR]`` and return the TaskRegistry it names.

    Without ``:ATTR``, the module's ``registry`` attribute, or its only TaskRegistry.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"--app must be MODULE[:ATTR], got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise UsageError(f"--app: cannot import module {module_name!r} ({e})") from None
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, TaskRegistry):
            raise UsageError(f"--app: {module_name}.{attr} is not a durablesched TaskRegistry")
        return found
    registries = [v for v in vars(module).values() if isinstance(v, TaskRegistry)]
    named = getattr(module, "registry", None)
    if isinstance(named, TaskRegistry):
        return named
    if len(registries) == 1:
        return registries[0]
    raise UsageError(
        f"--app: module {module_name!r} has {len(registries)} TaskRegistry objects; "
        "name one as MODULE:ATTR"
    )


# -- commands ----------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    engine = create_engine_for(args.db, durability=_durability(args.durability))
    try:
        revision = upgrade(engine)
    finally:
        engine.dispose()
    print(f"schema at revision {revision}")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    concurrency = _positive_int("--concurrency", args.concurrency)
    lease = _positive_float("--lease", args.lease)
    grace = _positive_float("--grace", args.grace)
    level = LOG_LEVELS.get(str(args.log_level).lower())
    if level is None:
        raise UsageError(
            f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {args.log_level!r}"
        )
    logging.getLogger("durablesched").setLevel(level)
    if args.environment not in set(Environment):
        raise UsageError(f"--environment must be {ENVIRONMENT_CHOICES}, got {args.environment!r}")
    cancel_grace = _positive_float("--cancel-grace", args.cancel_grace)
    store = open_store(args.db, durability=_durability(args.durability))
    scheduler = Scheduler(store, registry=registry)
    worker = Worker(
        scheduler,
        concurrency=concurrency,
        lease=lease,
        environment=args.environment,
        cancel_grace=cancel_grace,
    )
    signals_seen = 0

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal: exiting at once; held leases will expire and be reclaimed")
            os._exit(128 + signum)
        log.info("signal %s: no new claims; waiting up to %ss for running tasks", signum, grace)
        worker.request_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info(
        "worker %s: %s slots, lease %ss, tasks %s",
        worker.owner,
        concurrency,
        lease,
        ", ".join(registry) or "(none)",
    )
    code = EXIT_OK
    try:
        try:
            worker.run(burst=args.burst)
        except DurableSchedError as e:
            # The database went away or broke under us: stop, loudly, rather than spin.
            log.error("worker stopping: %s", e)
            print(f"durablesched: {type(e).__name__}: {e}", file=sys.stderr)
            code = EXIT_REFUSED
            grace = 0.0
        try:
            released = worker.shutdown(grace)
            if released:
                log.warning("gave back %s unfinished task(s) as PENDING", released)
        except DurableSchedError as e:
            log.error("could not give back unfinished tasks: %s", e)
            code = EXIT_REFUSED
        log.log(
            logging.WARNING if store.busy_retries else logging.INFO,
            "stopped; transactions retried on a busy database: %s",
            store.busy_retries,
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()
    if worker.active_count:
        # Task threads that outlived the grace period cannot be interrupted, and
        # their outcomes would be refused anyway: do not wait for them.
        logging.shutdown()
        os._exit(code)
    return code


def _open(args: argparse.Namespace) -> SQLStore:
    return open_store(args.db, durability=_durability(args.durability))


def _task_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"task id must be a whole number, got {value!r}") from None


def parse_duration(value: str, what: str) -> timedelta:
    """``30s``, ``5m``, ``2h``, ``7d``, ``1h30m`` or a number of seconds."""
    text_value = value.strip().lower()
    try:
        seconds = float(text_value)
    except ValueError:
        parts = _DURATION.findall(text_value)
        if not parts or "".join(n + u for n, u in parts) != text_value:
            raise UsageError(
                f"{what} must be a duration like 30s, 5m, 2h, 7d or 1h30m, got {value!r}"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"{what} must be a non-negative duration, got {value!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise UsageError(f"{what} is too long: {value!r}") from None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, ErrorInfo):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_jsonable(value), indent=2, ensure_ascii=False))


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _record_dict(task: TaskRecord) -> dict[str, Any]:
    return {f.name: getattr(task, f.name) for f in fields(task)}


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        task_args = json.loads(args.args)
    except json.JSONDecodeError as e:
        raise UsageError(f"--args is not valid JSON: {e}") from None
    at = None
    if args.at is not None:
        try:
            at = datetime.fromisoformat(args.at)
        except ValueError:
            raise UsageError(f"--at must be an ISO 8601 time, got {args.at!r}") from None
        if at.tzinfo is None:
            raise UsageError(f"--at needs a time zone, for example {args.at}+00:00")
    delay = parse_duration(args.delay, "--delay") if args.delay is not None else None
    max_attempts = _positive_int("--max-attempts", args.max_attempts) if args.max_attempts else None
    # With the app's registry the name is checked and the task's own retry
    # policy sets its attempts, as for a submit from the app itself.
    registry = load_registry(args.app) if args.app else None
    store = _open(args)
    try:
        scheduler = Scheduler(store, registry=registry)
        try:
            task_id = scheduler.submit(
                args.name, task_args, at=at, delay=delay, max_attempts=max_attempts, key=args.key
            )
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None
        task = scheduler.get(task_id)
    finally:
        store.close()
    if args.json:
        _print_json({"id": task_id, "state": task.state, "due_at": task.due_at})
    else:
        print(task_id)
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    state = None
    if args.state:
        try:
            state = TaskState(args.state.upper())
        except ValueError:
            names = ", ".join(s.value for s in TaskState)
            raise UsageError(f"--state must be one of {names}, got {args.state!r}") from None
    limit = _positive_int("--limit", args.limit)
    store = _open(args)
    try:
        tasks = store.list_tasks(state=state, name=args.name or None, limit=limit)
    finally:
        store.close()
    if args.json:
        _print_json([_record_dict(t) for t in tasks])
        return EXIT_OK
    print(
        _table(
            ["id", "name", "state", "due_at", "attempts", "lease_owner"],
            [
                [
                    t.id,
                    t.name,
                    t.state,
                    _when(t.due_at),
                    f"{t.attempts}/{t.max_attempts}",
                    t.lease_owner,
                ]
                for t in tasks
            ],
        )
    )
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    task_id = _task_id(args.id)
    store = _open(args)
    try:
        task = store.get(task_id)
        history = store.history(task_id)
    finally:
        store.close()
    if task is None:
        raise Refused(f"no task with id {task_id}")
    if args.json:
        _print_json({**_record_dict(task), "history": [asdict(e) for e in history]})
        return EXIT_OK
    record = _record_dict(task)
    error = record.pop("last_error")
    for key, value in record.items():
        shown = _when(value) if isinstance(value, datetime) else value
        if key in ("args", "result"):
            shown = json.dumps(value, ensure_ascii=False)
        print(f"{key:>20}: {'-' if shown is None else shown}")
    if error is not None:
        print(f"{'last_error':>20}: {error.type}: {error.message}")
        if error.traceback:
            print(error.traceback.rstrip())
    print("\nhistory:")
    print(
        _table(
            ["at", "state", "attempt", "detail"],
            [[_when(e.at), e.state, e.attempt, e.detail] for e in history],
        )
    )
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    task_id = _task_id(args.id)
    store = _open(args)
    try:
        try:
            outcome = Scheduler(store).cancel(task_id)
        except TaskNotFoundError as e:
            raise Refused(str(e)) from None
    finally:
        store.close()
    messages = {
        CancelOutcome.CANCELLED: "cancelled: it had not started and never will",
        CancelOutcome.REQUESTED: "requested: it is running; it was asked to stop "
        "(cooperative: it may still finish)",
        CancelOutcome.ENFORCED: "enforced: it is running in a process; it was asked to stop "
        "and will be terminated if it has not after the worker's grace period",
        CancelOutcome.TOO_LATE: "too late: it had already finished; nothing changed",
    }
    if args.json:
        _print_json({"id": task_id, "outcome": outcome})
    else:
        print(f"task {task_id}: {messages[outcome]}")
    return EXIT_REFUSED if outcome is CancelOutcome.TOO_LATE else EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    task_id = _task_id(args.id)
    store = _open(args)
    try:
        try:
            store.requeue(task_id, SystemClock().now())
        except (TaskNotFoundError, InvalidTransitionError) as e:
            raise Refused(str(e)) from None
    finally:
        store.close()
    if args.json:
        _print_json({"id": task_id, "state": TaskState.PENDING})
    else:
        print(f"task {task_id}: PENDING, due now")
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        now = SystemClock().now()
        stats = store.stats(now)
    finally:
        store.close()
    if args.json:
        _print_json(stats)
        return EXIT_OK
    print(_table(["state", "tasks"], list(stats["counts"].items())))
    oldest = stats["oldest_overdue"]
    if oldest is None:
        print("\nno overdue task is waiting")
    else:
        print(
            f"\noldest overdue: task {oldest['id']} ({oldest['name']}), due "
            f"{_when(oldest['due_at'])}, waiting {oldest['lag_seconds']:.1f}s"
        )
        print(
            _table(
                ["overdue name", "tasks", "oldest due_at"],
                [
                    [o["name"], o["tasks"], _when(o["oldest_due_at"])]
                    for o in stats["overdue_by_name"]
                ],
            )
        )
    print(f"\nrunning: {len(stats['running'])}")
    if stats["running"]:
        print(
            _table(
                ["id", "name", "attempt", "lease_owner", "lease_expires_at"],
                [
                    [
                        r["id"],
                        r["name"],
                        r["attempt"],
                        r["lease_owner"],
                        _when(r["lease_expires_at"]),
                    ]
                    for r in stats["running"]
                ],
            )
        )
    print(f"\nfailures in the last hour: {len(stats['failures_last_hour'])}")
    if stats["failures_last_hour"]:
        print(
            _table(
                ["id", "name", "attempts", "finished_at", "error"],
                [
                    [
                        f["id"],
                        f["name"],
                        f["attempts"],
                        _when(f["finished_at"]),
                        f"{f['error'].type}: {f['error'].message}" if f["error"] else "-",
                    ]
                    for f in stats["failures_last_hour"]
                ],
            )
        )
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    age = parse_duration(args.older_than, "--older-than")
    batch = _positive_int("--batch", args.batch)
    store = _open(args)
    try:
        try:
            before = SystemClock().now() - age
        except OverflowError:  # older than the calendar: nothing can be that old
            before = datetime.min.replace(tzinfo=UTC)
        deleted = store.purge(before, batch=batch)
    finally:
        store.close()
    if args.json:
        _print_json({"deleted": deleted})
    else:
        print(f"deleted {deleted} finished task(s) older than {args.older_than}")
    return EXIT_OK


def cmd_copy(args: argparse.Namespace) -> int:
    batch = _positive_int("--batch", args.batch)
    if not args.source or not args.to:
        raise UsageError("copy needs --from URL and --to URL")
    durability = _durability(args.durability)
    source = open_store(args.source, durability=durability)
    try:
        destination = open_store(args.to, durability=durability)
        try:
            report = move_live_tasks(source, destination, SystemClock().now, batch=batch)
        finally:
            destination.close()
    finally:
        source.close()
    if args.json:
        _print_json(
            {
                "copied": report.copied,
                "already_copied": report.already,
                "deduplicated_by_key": report.by_key,
                "mapping": {str(k): v for k, v in report.mapping.items()},
            }
        )
    else:
        print(
            f"moved {report.moved} live task(s): {report.copied} copied, "
            f"{report.already} copied by an earlier run, "
            f"{report.by_key} already present by idempotency key"
        )
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------------


def _common(*, suppress: bool) -> _Parser:
    """The options every command takes, before or after the subcommand's name."""
    common = _Parser(add_help=False)
    _option(
        common,
        "--db",
        help="SQLite file path or sqlite:/// URL, or a postgresql:// URL",
        suppress=suppress,
    )
    _option(
        common,
        "--durability",
        help="'full' survives power loss; 'normal' survives crashes and is faster",
        suppress=suppress,
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else _flag_env("json"),
        help=f"print JSON for scripts instead of tables (env: {_env('json')})",
    )
    return common


def _flag_env(name: str) -> bool:
    return os.environ.get(_env(name), "").lower() not in ("", "0", "false", "no")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="durablesched",
        description="A durable job queue in one SQLite file. Exit codes: 0 success, "
        "1 not found or refused, 2 usage error.",
        parents=[_common(suppress=False)],
    )
    common = _common(suppress=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, func: Callable[[argparse.Namespace], int], help: str) -> Any:
        p = sub.add_parser(name, help=help, description=help, parents=[common])
        p.set_defaults(func=func)
        return p

    command("migrate", cmd_migrate, "create or upgrade the schema and print its revision")

    p = command("worker", cmd_worker, "run a worker process")
    _option(p, "--app", help="the task registry to run, as MODULE[:ATTR]")
    _option(p, "--concurrency", help="how many tasks run at once")
    _option(p, "--lease", help="lease length in seconds; heartbeats renew it")
    _option(p, "--grace", help="seconds running tasks get to finish after SIGTERM")
    _option(
        p,
        "--environment",
        help="where tasks that do not say run: thread, or process (cancel and timeout enforced)",
    )
    _option(
        p,
        "--cancel-grace",
        help="seconds a task in a process has to stop when cancelled before it is terminated",
    )
    _option(
        p,
        "--log-level",
        help="debug, info (a line per task start and outcome), warning or error",
    )
    p.add_argument(
        "--burst",
        action="store_true",
        default=_flag_env("burst"),
        help=f"exit 0 once nothing is due or running (env: {_env('burst')})",
    )

    p = command("submit", cmd_submit, "submit a task and print its id")
    p.add_argument("name", help="the task name")
    _option(
        p,
        "--app",
        help="check the name against this task registry (MODULE[:ATTR]) and use its retry policy",
    )
    _option(p, "--args", help="arguments as a JSON object", default="{}")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", help="due after this long: 30s, 5m, 2h, 1d, 1h30m or seconds")
    when.add_argument("--at", help="due at this ISO 8601 time with a time zone")
    p.add_argument(
        "--max-attempts",
        help="attempts allowed (default: the task's retry policy with --app, else "
        f"{DEFAULT_RETRY.max_attempts})",
    )
    p.add_argument("--key", help="idempotency key: a live or succeeded task with it is reused")

    p = command("ls", cmd_ls, "list tasks in (due_at, seq) order")
    _option(p, "--state", help="only tasks in this state")
    _option(p, "--name", help="only tasks of this name")
    _option(p, "--limit", help="at most this many", default="50")

    p = command("show", cmd_show, "show one task: everything, with its history")
    p.add_argument("id", help="task id")

    p = command("cancel", cmd_cancel, "cancel a task and say what that achieved")
    p.add_argument("id", help="task id")

    p = command("retry", cmd_retry, "put a FAILED or CANCELLED task back to PENDING, due now")
    p.add_argument("id", help="task id")

    command("stats", cmd_stats, "counts, overdue work, running leases, recent failures")

    p = command("purge", cmd_purge, "delete finished tasks older than a duration")
    p.add_argument("--older-than", required=True, help="for example 7d, 24h, 90m")
    p.add_argument("--batch", default="10000", help="rows per transaction (default 10000)")
    p = command("copy", cmd_copy, "move live tasks to another database, safely repeatable")
    p.add_argument("--from", dest="source", help="the database the tasks leave")
    p.add_argument("--to", help="the database they go to (created if new)")
    p.add_argument("--batch", default="500", help="tasks per transaction (default 500)")
    return parser


def argv_command(argv: Sequence[str] | None) -> str | None:
    """The subcommand named in ``argv``, before parsing (it sets the log level)."""
    words = list(sys.argv[1:] if argv is None else argv)
    return next((w for w in words if w in COMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO if argv_command(argv) == "worker" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        if args.command == "worker" and args.app is None:
            raise UsageError("--app is required (or set DURABLESCHED_APP)")
        return func(args)
    except BrokenPipeError:
        return EXIT_OK
    except UsageError as e:
        print(f"durablesched: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as e:
        print(f"durablesched: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except DurableSchedError as e:
        print(f"durablesched: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_REFUSED
