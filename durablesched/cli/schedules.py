"""``durablesched schedule ls|add|pause|resume|remove|run-now``: schedules at run time.

Schedules declared in code are synced by the workers of that code when they
start; these commands manage schedules in the database directly. A bad
setting, an unknown task or a name taken with other settings is a usage error
(exit 2) and stores nothing; an unknown schedule is exit 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from durablesched.cli.app import load_registry
from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, Refused, UsageError
from durablesched.cli.options import Commands, env_name, option
from durablesched.cli.output import print_json, table, when
from durablesched.cli.tasks import _json_object
from durablesched.cli.values import parse_duration, positive_int
from durablesched.errors import InvalidScheduleError, InvalidTaskError, ScheduleNotFoundError
from durablesched.schedules.declaration import ScheduleInfo

#: What ``schedule`` does; all but ``ls`` take a schedule's name.
ACTIONS = ("ls", "add", "pause", "resume", "remove", "run-now")


def register(commands: Commands) -> None:
    p = commands.add(
        "schedule",
        cmd_schedule,
        "periodic tasks: ls, add NAME, pause NAME, resume NAME, remove NAME, run-now NAME",
    )
    p.add_argument("action", choices=ACTIONS, help="what to do")
    p.add_argument("name", nargs="?", help="the schedule's name (all but ls)")
    option(p, "--app", help="add: the task registry to check the task against (MODULE[:ATTR])")
    option(p, "--task", help="add: the task to run (default: the schedule's name)")
    option(p, "--cron", help="add: a cron expression, 5 fields or 6 with seconds first")
    option(p, "--every", help="add: an interval instead of --cron: 30s, 5m, 2h, 1d")
    option(p, "--timezone", help="add: the time zone --cron is read in")
    option(p, "--args", help="add: the task's arguments as a JSON object")
    option(p, "--misfire", help="add: skip, latest or all: what to fire of times missed")
    option(p, "--max-catch-up", help="add: with --misfire all, the most missed fires made")
    option(p, "--misfire-grace", help="add: how late a fire is still on time, not missed")
    option(p, "--overlap", help="add: skip (not while the last fire's task is live) or allow")
    option(p, "--max-attempts", help="add: attempts each task gets (default: the task's policy)")
    option(p, "--queue", help="add: the queue its tasks go to (default: the task's)")
    option(p, "--priority", help="add: their priority, -100 to 100 (default: the task's)")


def cmd_schedule(args: argparse.Namespace) -> int:
    action: str = args.action
    if action == "ls":
        if args.name:
            raise UsageError("schedule ls takes no name")
        return _ls(args)
    if not args.name:
        raise UsageError(f"schedule {action} needs the schedule's name")
    if action == "add":
        return _add(args)
    result = _change(args)
    if args.json:
        print_json(result)
    elif action == "remove":
        print(f"schedule {args.name}: removed (its tasks stay)")
    elif action == "run-now":
        print(f"schedule {args.name}: task {result['task_id']} made now")
    elif result["status"] == "active":
        print(f"schedule {args.name}: active, next fire {when(result['next_fire_at'])}")
    else:  # as `schedule ls` shows it: no next fire while it is paused
        print(f"schedule {args.name}: {result['status']}, no fire until it is resumed")
    return EXIT_OK


def _change(args: argparse.Namespace) -> dict[str, Any]:
    """Pause, resume, remove or run-now: what it did, as ``--json`` prints it."""
    from durablesched.scheduler import Scheduler

    store = open_db(args)
    try:
        scheduler = Scheduler(store)
        name: str = args.name
        if args.action == "pause":
            return _info(scheduler.pause_schedule(name))
        if args.action == "resume":
            return _info(scheduler.resume_schedule(name))
        if args.action == "remove":
            scheduler.remove_schedule(name)
            return {"name": name, "removed": True}
        return {"name": name, "task_id": scheduler.run_schedule_now(name)}
    except ScheduleNotFoundError as e:
        raise Refused(str(e)) from None
    finally:
        store.close()


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The add options as ``Scheduler.add_schedule``'s settings; only those given."""
    settings: dict[str, Any] = {}
    if args.cron is not None:
        settings["cron"] = args.cron
    if args.every is not None:
        every = parse_duration(args.every, "--every")
        settings["every"] = every
    if args.timezone is not None:
        settings["timezone"] = args.timezone
    if args.args is not None:
        settings["args"] = _json_object(args.args)
    if args.misfire is not None:
        settings["misfire"] = args.misfire
    if args.max_catch_up is not None:
        settings["max_catch_up"] = positive_int("--max-catch-up", args.max_catch_up)
    if args.misfire_grace is not None:
        settings["misfire_grace"] = parse_duration(args.misfire_grace, "--misfire-grace")
    if args.overlap is not None:
        settings["overlap"] = args.overlap
    if args.max_attempts is not None:
        settings["max_attempts"] = positive_int("--max-attempts", args.max_attempts)
    if args.queue is not None:
        settings["queue"] = args.queue
    if args.priority is not None:
        try:
            settings["priority"] = int(args.priority)
        except ValueError:
            raise UsageError(f"--priority must be a whole number, got {args.priority!r}") from None
    return settings


def _add(args: argparse.Namespace) -> int:
    from durablesched.schedules.declaration import checked_schedule

    if args.app is None:
        raise UsageError(
            f"schedule add needs --app (or {env_name('app')}): the task is checked against it"
        )
    if (args.every is None) == (args.cron is None):
        raise UsageError("schedule add needs either --cron or --every (one of them, not both)")
    if args.every is not None and args.timezone not in (None, "UTC"):
        # Said in the command's words, not the API's (every=, timezone=).
        raise UsageError(
            "--every is elapsed time, the same in every time zone: drop "
            f"--timezone {args.timezone} (or give --cron, which runs in a time zone)"
        )
    registry = load_registry(args.app)
    task = args.task or args.name
    settings = _settings(args)
    try:
        # Checked before the database is opened: a refused add creates nothing.
        checked_schedule(registry, task, name=args.name, **settings)
    except (InvalidScheduleError, InvalidTaskError) as e:
        raise UsageError(str(e)) from None
    from durablesched.scheduler import Scheduler

    store = open_db(args)
    try:
        scheduler = Scheduler(store, registry=registry)
        try:
            added = scheduler.add_schedule(task, name=args.name, **settings)
        except InvalidScheduleError as e:  # the name is taken with other settings
            raise UsageError(str(e)) from None
        (info,) = [i for i in scheduler.schedules() if i.schedule.name == args.name]
    finally:
        store.close()
    if args.json:
        print_json({**_info(info), "added": added})
    else:
        verb = "added" if added else "already there, the same"
        print(f"schedule {args.name}: {verb}; next fire {when(info.next_fire_at)}")
    return EXIT_OK


def _ls(args: argparse.Namespace) -> int:
    store = open_db(args, readonly=True)
    try:
        infos = store.list_schedules()
    finally:
        store.close()
    if args.json:
        print_json([_info(i) for i in infos])
        return EXIT_OK
    rows = [
        [
            i.schedule.name,
            i.schedule.task,
            i.schedule.expression,
            i.schedule.timezone,
            i.status,
            when(i.next_fire_at) if i.status == "active" else "-",
            when(i.last_fire_at),
            _last_task(i),
        ]
        for i in infos
    ]
    headers = ["name", "task", "when", "timezone", "status", "next fire", "last fire", "last task"]
    print(table(headers, rows))
    return EXIT_OK


def _last_task(info: ScheduleInfo) -> str:
    if info.last_skip is not None:
        return f"skipped ({info.last_skip})"
    if info.last_task_id is None:
        return "-"
    return f"{info.last_task_id} {info.last_task_state or '(purged)'}"


def _info(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as ``--json`` prints it."""
    s = info.schedule
    return {
        "name": s.name,
        "task": s.task,
        "args": s.args,
        "cron": s.cron,
        "every_seconds": None if s.every is None else s.every.total_seconds(),
        "timezone": s.timezone,
        "misfire": s.misfire,
        "max_catch_up": s.max_catch_up,
        "misfire_grace_seconds": s.misfire_grace.total_seconds(),
        "overlap": s.overlap,
        "max_attempts": s.max_attempts,
        "queue": s.queue,
        "priority": s.priority,
        "status": info.status,
        "origin": info.origin,
        "next_fire_at": info.next_fire_at,
        "last_fire_at": info.last_fire_at,
        "last_task_id": info.last_task_id,
        "last_task_state": info.last_task_state,
        "last_skip": info.last_skip,
    }
