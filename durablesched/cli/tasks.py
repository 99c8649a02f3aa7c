"""Commands on single tasks: ``submit``, ``ls``, ``show``, ``cancel``, ``retry``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from durablesched.cli.app import load_registry
from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, EXIT_REFUSED, Refused, UsageError
from durablesched.cli.options import Commands, option
from durablesched.cli.output import print_json, record_dict, table, when
from durablesched.cli.values import parse_duration, positive_int, task_id
from durablesched.clock import SystemClock
from durablesched.errors import InvalidTaskError, InvalidTransitionError, TaskNotFoundError
from durablesched.records import CancelOutcome, TaskEvent, TaskRecord
from durablesched.retry import DEFAULT_RETRY
from durablesched.states import TaskState

#: What a cancel achieved, in words; ``--json`` gives the outcome's name instead.
CANCEL_MESSAGES = {
    CancelOutcome.CANCELLED: "cancelled: it had not started and never will",
    CancelOutcome.REQUESTED: "requested: it is running; it was asked to stop "
    "(cooperative: it may still finish)",
    CancelOutcome.ENFORCED: "enforced: it is running in a process; it was asked to stop "
    "and will be terminated if it has not after the worker's grace period",
    CancelOutcome.TOO_LATE: "too late: it had already finished; nothing changed",
}


def register(commands: Commands) -> None:
    p = commands.add("submit", cmd_submit, "submit a task and print its id")
    p.add_argument("name", help="the task name")
    option(
        p,
        "--app",
        help="check the name against this task registry (MODULE[:ATTR]) and use its retry policy",
    )
    option(p, "--args", help="arguments as a JSON object")
    due = p.add_mutually_exclusive_group()
    due.add_argument("--delay", help="due after this long: 30s, 5m, 2h, 1d, 1h30m or seconds")
    due.add_argument("--at", help="due at this ISO 8601 time with a time zone")
    p.add_argument(
        "--max-attempts",
        help="attempts allowed (default: the task's retry policy with --app, else "
        f"{DEFAULT_RETRY.max_attempts})",
    )
    p.add_argument("--key", help="idempotency key: a live or succeeded task with it is reused")

    p = commands.add("ls", cmd_ls, "list tasks in (due_at, seq) order")
    option(p, "--state", help="only tasks in this state")
    option(p, "--name", help="only tasks of this name")
    option(p, "--limit", help="at most this many")

    for name, func, help in (
        ("show", cmd_show, "show one task: everything, with its history"),
        ("cancel", cmd_cancel, "cancel a task and say what that achieved"),
        ("retry", cmd_retry, "put a FAILED or CANCELLED task back to PENDING, due now"),
    ):
        commands.add(name, func, help).add_argument("id", help="task id")


def _json_object(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise UsageError(f"--args is not valid JSON: {e}") from None


def _at(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"--at must be an ISO 8601 time, got {value!r}") from None
    if at.tzinfo is None:
        raise UsageError(f"--at needs a time zone, for example {value}+00:00")
    return at


def cmd_submit(args: argparse.Namespace) -> int:
    from durablesched.scheduler import Scheduler

    task_args = _json_object(args.args)
    at = _at(args.at)
    delay: timedelta | None = None
    if args.delay is not None:
        delay = parse_duration(args.delay, "--delay")
    max_attempts = positive_int("--max-attempts", args.max_attempts) if args.max_attempts else None
    # With the app's registry the name is checked and the task's own retry
    # policy sets its attempts, as for a submit from the app itself.
    registry = load_registry(args.app) if args.app else None
    store = open_db(args)
    try:
        scheduler = Scheduler(store, registry=registry)
        try:
            new_id = scheduler.submit(
                args.name, task_args, at=at, delay=delay, max_attempts=max_attempts, key=args.key
            )
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None
        task = scheduler.get(new_id)
    finally:
        store.close()
    if args.json:
        print_json({"id": new_id, "state": task.state, "due_at": task.due_at})
    else:
        print(new_id)
    return EXIT_OK


def _state(value: str | None) -> TaskState | None:
    if not value:
        return None
    try:
        return TaskState(value.upper())
    except ValueError:
        names = ", ".join(s.value for s in TaskState)
        raise UsageError(f"--state must be one of {names}, got {value!r}") from None


def cmd_ls(args: argparse.Namespace) -> int:
    state = _state(args.state)
    limit = positive_int("--limit", args.limit)
    store = open_db(args)
    try:
        tasks = store.list_tasks(state=state, name=args.name or None, limit=limit)
    finally:
        store.close()
    if args.json:
        print_json([record_dict(t) for t in tasks])
        return EXIT_OK
    rows = [
        [t.id, t.name, t.state, when(t.due_at), f"{t.attempts}/{t.max_attempts}", t.lease_owner]
        for t in tasks
    ]
    print(table(["id", "name", "state", "due_at", "attempts", "lease_owner"], rows))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    wanted = task_id(args.id)
    store = open_db(args)
    try:
        task = store.get(wanted)
        history = store.history(wanted)
    finally:
        store.close()
    if task is None:
        raise Refused(f"no task with id {wanted}")
    if args.json:
        print_json({**record_dict(task), "history": [asdict(e) for e in history]})
    else:
        _print_task(task, history)
    return EXIT_OK


def _print_task(task: TaskRecord, history: list[TaskEvent]) -> None:
    """One field a line, the last error with its traceback, then the history as a table."""
    record = record_dict(task)
    error = record.pop("last_error")
    for key, value in record.items():
        shown = when(value) if isinstance(value, datetime) else value
        if key in ("args", "result"):
            shown = json.dumps(value, ensure_ascii=False)
        print(f"{key:>20}: {'-' if shown is None else shown}")
    if error is not None:
        print(f"{'last_error':>20}: {error.type}: {error.message}")
        if error.traceback:
            print(error.traceback.rstrip())
    print("\nhistory:")
    print(
        table(
            ["at", "state", "attempt", "detail"],
            [[when(e.at), e.state, e.attempt, e.detail] for e in history],
        )
    )


def cmd_cancel(args: argparse.Namespace) -> int:
    from durablesched.scheduler import Scheduler

    wanted = task_id(args.id)
    store = open_db(args)
    try:
        outcome = Scheduler(store).cancel(wanted)
    except TaskNotFoundError as e:
        raise Refused(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json({"id": wanted, "outcome": outcome})
    else:
        print(f"task {wanted}: {CANCEL_MESSAGES[outcome]}")
    return EXIT_REFUSED if outcome is CancelOutcome.TOO_LATE else EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    wanted = task_id(args.id)
    store = open_db(args)
    try:
        store.requeue(wanted, SystemClock().now())
    except (TaskNotFoundError, InvalidTransitionError) as e:
        raise Refused(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json({"id": wanted, "state": TaskState.PENDING})
    else:
        print(f"task {wanted}: PENDING, due now")
    return EXIT_OK
