"""Commands on the whole queue: ``stats``, ``purge``, and ``move`` (deprecated name ``copy``)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from durablesched.cli.database import check_db, display_db, open_db
from durablesched.cli.errors import EXIT_OK, UsageError
from durablesched.cli.options import Commands, option
from durablesched.cli.output import print_json, table, when
from durablesched.cli.values import durability_of, parse_duration, positive_int
from durablesched.clock import SystemClock

if TYPE_CHECKING:
    from durablesched.records import OverdueName, OverdueTask, RecentFailure, RunningTask
    from durablesched.store.move import MoveReport

#: What ``copy`` says before it moves the tasks, until the name goes.
COPY_DEPRECATED = (
    "durablesched: 'copy' is deprecated, use 'move' (it moves the tasks); 'copy' goes in 0.3"
)


def register(commands: Commands) -> None:
    commands.add("stats", cmd_stats, "counts, overdue work, running leases, recent failures")

    p = commands.add("purge", cmd_purge, "delete finished tasks older than a duration")
    option(p, "--older-than", required=True, help="for example 7d, 24h, 90m")
    option(p, "--batch", default="purge_batch", help="rows per transaction")

    _move_options(
        commands.add("move", cmd_move, "move live tasks to another database, safely repeatable")
    )
    _move_options(commands.add("copy", cmd_copy, "deprecated name of move; goes in 0.3"))


def _move_options(p: argparse.ArgumentParser) -> None:
    required = p.add_argument_group("required arguments")
    option(required, "--from", dest="source", required=True, help="the database the tasks leave")
    option(required, "--to", required=True, help="the database they go to (created if new)")
    option(p, "--batch", default="move_batch", help="tasks per transaction")


def cmd_stats(args: argparse.Namespace) -> int:
    store = open_db(args)
    try:
        now = SystemClock().now()
        stats = store.stats(now)
    finally:
        store.close()
    if args.json:
        print_json(stats)
        return EXIT_OK
    print(table(["state", "tasks"], list(stats["counts"].items())))
    _print_overdue(stats["oldest_overdue"], stats["overdue_by_name"])
    _print_running(stats["running"])
    _print_failures(stats["failures_last_hour"])
    return EXIT_OK


def _print_overdue(oldest: OverdueTask | None, by_name: list[OverdueName]) -> None:
    if oldest is None:
        print("\nno overdue task is waiting")
        return
    print(
        f"\noldest overdue: task {oldest['id']} ({oldest['name']}), due "
        f"{when(oldest['due_at'])}, waiting {oldest['lag_seconds']:.1f}s"
    )
    rows = [[o["name"], o["tasks"], when(o["oldest_due_at"])] for o in by_name]
    print(table(["overdue name", "tasks", "oldest due_at"], rows))


def _print_running(running: list[RunningTask]) -> None:
    print(f"\nrunning: {len(running)}")
    if running:
        rows = [
            [r["id"], r["name"], r["attempt"], r["lease_owner"], when(r["lease_expires_at"])]
            for r in running
        ]
        print(table(["id", "name", "attempt", "lease_owner", "lease_expires_at"], rows))


def _print_failures(failures: list[RecentFailure]) -> None:
    print(f"\nfailures in the last hour: {len(failures)}")
    if failures:
        rows = [
            [
                f["id"],
                f["name"],
                f["attempts"],
                when(f["finished_at"]),
                f"{f['error'].type}: {f['error'].message}" if f["error"] else "-",
            ]
            for f in failures
        ]
        print(table(["id", "name", "attempts", "finished_at", "error"], rows))


def cmd_purge(args: argparse.Namespace) -> int:
    age = parse_duration(args.older_than, "--older-than")
    batch = positive_int("--batch", args.batch)
    store = open_db(args)
    try:
        try:
            before = SystemClock().now() - age
        except OverflowError:  # older than the calendar: nothing can be that old
            before = datetime.min.replace(tzinfo=UTC)
        deleted = store.purge(before, batch=batch)
        # Rows of workers gone for a day: purge is the operator's clean-up, and a
        # database whose workers no longer start would keep them otherwise.
        forgotten = store.prune_workers(SystemClock().now())
    finally:
        store.close()
    if args.json:
        print_json({"deleted": deleted, "workers_forgotten": forgotten})
    else:
        print(f"deleted {deleted} finished task(s) older than {args.older_than}")
        if forgotten:
            print(f"forgot {forgotten} worker(s) gone for more than a day")
    return EXIT_OK


def move_tasks(args: argparse.Namespace, command: str) -> MoveReport:
    """Move the live tasks from ``--from`` to ``--to``; ``command`` names itself in errors."""
    from durablesched.store.move import move_live_tasks

    batch = positive_int("--batch", args.batch)
    if not args.source or not args.to:
        raise UsageError(f"{command} needs --from URL and --to URL")
    # Both checked before either is opened (opening a new SQLite file creates it).
    check_db(args.source, "--from")
    check_db(args.to, "--to")
    durability_of(args.durability)
    source = open_db(args, args.source, "--from")
    try:
        destination = open_db(args, args.to, "--to")
        try:
            return move_live_tasks(source, destination, SystemClock().now, batch=batch)
        finally:
            destination.close()
    finally:
        source.close()


def print_move_report(
    report: MoveReport, args: argparse.Namespace, *, as_json: bool, verb: str
) -> None:
    """The counts, and the databases by the names given and by the numbers their
    tasks' history lines use; ``verb`` is what the text calls a task stored anew
    ("moved", "copied").

    The JSON keys are the same for ``move`` and ``copy``, so a script can switch names.
    """
    source, destination = display_db(args.source), display_db(args.to)
    if as_json:
        print_json(
            {
                "copied": report.copied,
                "already_copied": report.already,
                "deduplicated_by_key": report.by_key,
                "mapping": {str(k): v for k, v in report.mapping.items()},
                "source": {"database": source, "instance": report.source},
                "destination": {"database": destination, "instance": report.destination},
            }
        )
    else:
        print(
            f"moved {report.moved} live task(s) from {source} (database {report.source}) "
            f"to {destination} (database {report.destination}): {report.copied} {verb}, "
            f"{report.already} {verb} by an earlier run, "
            f"{report.by_key} already present by idempotency key"
        )


def cmd_move(args: argparse.Namespace) -> int:
    print_move_report(move_tasks(args, "move"), args, as_json=args.json, verb="moved")
    return EXIT_OK


def cmd_copy(args: argparse.Namespace) -> int:
    print(COPY_DEPRECATED, file=sys.stderr)
    print_move_report(move_tasks(args, "copy"), args, as_json=args.json, verb="copied")
    return EXIT_OK
