"""Commands on single tasks: ``submit``, ``ls``, ``show``, ``cancel``, ``retry``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from durablesched.cli.app import load_registry
from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, EXIT_REFUSED, Refused, UsageError
from durablesched.cli.listing import FINISHED_WINDOW, live_first
from durablesched.cli.options import Commands, option, switch
from durablesched.cli.output import print_json, record_dict, table, when
from durablesched.cli.values import parse_duration, positive_int, task_id
from durablesched.cli.workflows import print_workflow, step_position, workflow_of
from durablesched.clock import SystemClock
from durablesched.errors import InvalidTaskError, InvalidTransitionError, TaskNotFoundError
from durablesched.queues import check_queue
from durablesched.records import CancelOutcome, NewTask, TaskEvent, TaskRecord
from durablesched.registry import TaskRegistry
from durablesched.retry import DEFAULT_RETRY
from durablesched.states import TaskState
from durablesched.submission import API_NAMES, MAX_ARGS_DEPTH, MAX_ATTEMPTS, build_task, check_name
from durablesched.workflows.waits import waiting_for

#: What a cancel achieved, in words; ``--json`` gives the outcome's name instead.
CANCEL_MESSAGES = {
    CancelOutcome.CANCELLED: "cancelled: it had not started and never will",
    CancelOutcome.REQUESTED: "requested: it is running; it was asked to stop "
    "(cooperative: it may still finish)",
    CancelOutcome.ENFORCED: "enforced: it is running in a process; it was asked to stop "
    "and will be terminated if it has not after the worker's grace period",
    CancelOutcome.TOO_LATE: "too late: it had already finished; nothing changed",
}

#: How submit's errors name what was wrong: the command's own options.
CLI_NAMES = {
    **API_NAMES,
    "args": "--args for task {name!r}",
    "at": "--at",
    "delay": "--delay",
    "max_attempts": "--max-attempts",
    "key": "--key",
    "queue": "--queue",
    "priority": "--priority",
}

#: The states ``retry`` takes a task from.
RETRYABLE = (TaskState.FAILED, TaskState.CANCELLED)


def register(commands: Commands) -> None:
    p = commands.add("submit", cmd_submit, "submit a task and print its id")
    p.add_argument("name", help="the task name")
    option(
        p,
        "--app",
        help="check the name and arguments against this task registry (MODULE[:ATTR]) "
        "and use its retry policy",
    )
    option(p, "--args", help="arguments as a JSON object")
    due = p.add_mutually_exclusive_group()
    option(due, "--delay", help="due after this long: 30s, 5m, 2h, 1d, 1h30m or seconds")
    option(due, "--at", help="due at this ISO 8601 time with a time zone")
    option(
        p,
        "--max-attempts",
        help="attempts allowed (default: the task's retry policy with --app, else "
        f"{DEFAULT_RETRY.max_attempts})",
    )
    option(p, "--key", help="idempotency key: a live or succeeded task with it is reused")
    option(
        p, "--queue", help="the queue it waits in (default: the task's with --app, else default)"
    )
    option(
        p,
        "--priority",
        help="-100 to 100, higher runs first in its queue (default: the task's with --app, else 0)",
    )

    p = commands.add(
        "ls", cmd_ls, "list tasks: running, then waiting by due time, then finished, newest first"
    )
    option(p, "--state", help="only tasks in this state")
    option(p, "--name", help="only tasks of this name")
    option(p, "--queue", help="only tasks of this queue")
    option(p, "--limit", help="at most this many")

    commands.add(
        "show", cmd_show, "show one task: everything, with its history (and its workflow)"
    ).add_argument("id", help="task id")
    p = commands.add("cancel", cmd_cancel, "cancel a task and say what that achieved")
    p.add_argument("id", help="task id")
    switch(
        p,
        "--keep-children",
        help="a workflow: leave the children it spawned running (they are cancelled with it)",
    )
    p = commands.add("retry", cmd_retry, "put a FAILED or CANCELLED task back to PENDING, due now")
    p.add_argument("id", help="task id")
    option(
        p,
        "--from-step",
        help="a workflow: run its steps from this position (0, 1, ...) again, keeping those before",
    )


_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
               str: "a string", list: "an array"}  # fmt: skip


def _json_object(value: str) -> dict[str, Any]:
    """``--args`` as a dict: a JSON object, parsed without running out of stack."""
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise UsageError(f"--args must be nested at most {MAX_ARGS_DEPTH} levels deep") from None
    except ValueError as e:  # JSONDecodeError, or a number too long to convert
        raise UsageError(f"--args is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise UsageError(
            f"--args must be a JSON object such as '{{\"n\": 1}}', "
            f"got {_JSON_KINDS.get(type(parsed), type(parsed).__name__)}"
        )
    return parsed


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


def _submission(
    args: argparse.Namespace,
) -> tuple[TaskRegistry | None, Callable[[datetime], NewTask]]:
    """The registry (with --app) and a function that builds the task at a given time.

    Every option is checked here, before the database is opened: a refused
    submit leaves the file as it was.
    """
    task_args = _json_object(args.args)
    at = _at(args.at)
    delay: timedelta | None = None
    if args.delay is not None:
        delay = parse_duration(args.delay, "--delay")
    if at is not None and delay is not None:
        raise UsageError(
            "give --delay or --at, not both (DURABLESCHED_DELAY or DURABLESCHED_AT may set one)"
        )
    max_attempts = None
    if args.max_attempts:
        max_attempts = positive_int("--max-attempts", args.max_attempts, maximum=MAX_ATTEMPTS)
    # With the app's registry the name and the arguments are checked against the
    # task's function, and its own retry policy sets its attempts, as for a
    # submit from the app itself.
    registry = load_registry(args.app) if args.app else None
    priority = None
    if args.priority is not None:
        try:
            priority = int(args.priority)
        except ValueError:
            raise UsageError(f"--priority must be a whole number, got {args.priority!r}") from None

    def build(now: datetime) -> NewTask:
        try:
            return build_task(
                args.name,
                task_args,
                now=now,
                at=at,
                delay=delay,
                max_attempts=max_attempts,
                key=args.key,
                registry=registry,
                names=CLI_NAMES,
                queue=args.queue,
                priority=priority,
            )
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None

    build(SystemClock().now())
    return registry, build


def cmd_submit(args: argparse.Namespace) -> int:
    from durablesched.scheduler import Scheduler

    registry, build = _submission(args)
    store = open_db(args)
    try:
        scheduler = Scheduler(store, registry=registry)
        now = scheduler.clock.now()
        (submitted,) = store.submit([build(now)], now)
        task = scheduler.get(submitted.task_id)
    finally:
        store.close()
    if args.json:
        print_json(
            {
                "id": task.id,
                "state": task.state,
                "due_at": task.due_at,
                "created": submitted.created,
            }
        )
        return EXIT_OK
    print(task.id)
    if not submitted.created:
        print(
            f"durablesched: --key {args.key!r} is held by task {task.id} ({task.state}): "
            "no new task was submitted",
            file=sys.stderr,
        )
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
    if args.name:
        try:
            check_name(args.name, "--name")
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None
    if args.queue:
        try:
            check_queue(args.queue, "--queue")
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None
    store = open_db(args)
    now = SystemClock().now()
    try:
        listing = live_first(
            store,
            state=state,
            name=args.name or None,
            limit=limit,
            now=now,
            queue=args.queue or None,
        )
        waits = waiting_for(store, listing.tasks, now, when)
    finally:
        store.close()
    if args.json:
        print_json([{**record_dict(t), "waits_for": waits.get(t.id)} for t in listing.tasks])
        return EXIT_OK
    rows = [
        [
            t.id,
            t.name,
            t.queue,
            t.priority,
            t.state,
            when(t.due_at),
            f"{t.attempts}/{t.max_attempts}",
            t.lease_owner,
            waits.get(t.id),
        ]
        for t in listing.tasks
    ]
    headers = [
        "id", "name", "queue", "priority", "state", "due_at", "attempts", "lease_owner",
        "waits_for",
    ]  # fmt: skip
    print(table(headers, rows))
    if listing.left_out or listing.more_than:
        count = f"{'at least ' if listing.more_than else ''}{listing.left_out:,}"
        print(
            f"\n{count} more task(s) not shown: raise --limit, "
            "or narrow with --state, --name or --queue"
        )
    if listing.window_full:
        print(
            f"finished tasks are the most recent of the first {FINISHED_WINDOW:,} per state "
            "by due time: purge old ones for the newest"
        )
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    wanted = task_id(args.id)
    store = open_db(args)
    try:
        task = store.get(wanted)
        history = store.history(wanted)
        flow = workflow_of(store, wanted)
    finally:
        store.close()
    if task is None:
        raise Refused(f"no task with id {wanted}")
    if args.json:
        print_json({**record_dict(task), "history": [asdict(e) for e in history], **flow})
    else:
        _print_task(task, history)
        print_workflow(flow)
    return EXIT_OK


def _print_task(task: TaskRecord, history: list[TaskEvent]) -> None:
    """One field a line, the last error with its traceback, then the history as a table."""
    record = record_dict(task)
    error = record.pop("last_error")
    for key, value in record.items():
        shown = when(value) if isinstance(value, datetime) else value
        if key in ("args", "result") or (key == "trace" and value is not None):
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
    ended: TaskState | None = None
    try:
        outcome = Scheduler(store).cancel(wanted, children=not args.keep_children)
        if outcome is CancelOutcome.TOO_LATE:  # say how it ended: cancelled already?
            record = store.get(wanted)
            ended = None if record is None else record.state
    except TaskNotFoundError as e:
        raise Refused(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json({"id": wanted, "outcome": outcome})
    elif ended is TaskState.CANCELLED:
        print(f"task {wanted}: already cancelled; nothing changed")
    elif ended is not None:
        print(f"task {wanted}: too late: it had already finished ({ended}); nothing changed")
    else:
        print(f"task {wanted}: {CANCEL_MESSAGES[outcome]}")
    return EXIT_REFUSED if outcome is CancelOutcome.TOO_LATE else EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    wanted = task_id(args.id)
    from_step = None if args.from_step is None else step_position(args.from_step)
    store = open_db(args)
    try:
        try:
            store.requeue(wanted, SystemClock().now(), from_step)
        except TaskNotFoundError as e:
            raise Refused(str(e)) from None
        except InvalidTransitionError as e:
            task = store.get(wanted)
            if task is not None and task.state not in RETRYABLE:
                raise Refused(
                    f"task {wanted} is {task.state}: only FAILED or CANCELLED tasks can be retried"
                ) from None
            raise Refused(str(e)) from None  # its idempotency key is held by another task
    finally:
        store.close()
    if args.json:
        print_json({"id": wanted, "state": TaskState.PENDING, "from_step": from_step})
    elif from_step is not None:
        print(f"task {wanted}: PENDING, due now; its steps from {from_step} on run again")
    else:
        print(f"task {wanted}: PENDING, due now")
    return EXIT_OK
