"""``durablesched check``: is the database sound, at this release's schema, and served?"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from durablesched.cli.database import check_db, readable
from durablesched.cli.errors import EXIT_OK, EXIT_REFUSED
from durablesched.cli.options import Commands, option
from durablesched.cli.output import print_json, table
from durablesched.cli.values import parse_duration
from durablesched.clock import SystemClock


def register(commands: Commands) -> None:
    p = commands.add(
        "check",
        cmd_check,
        "check the database: integrity, schema revision, expired leases, overdue tasks "
        "(exit 0 only if all is well)",
    )
    option(
        p,
        "--overdue-after",
        help="report claimable tasks due longer ago than this",
    )


def cmd_check(args: argparse.Namespace) -> int:
    from durablesched.store.health import check_database

    overdue_after = parse_duration(args.overdue_after, "--overdue-after")
    db = check_db(args.db)
    with readable(db):
        report = check_database(db, SystemClock().now(), overdue_after=overdue_after)
    if args.json:
        print_json(
            {
                "healthy": report.healthy,
                "revision": report.revision,
                "head": report.head,
                "findings": [asdict(f) for f in report.findings],
            }
        )
    elif report.healthy:
        print(f"all is well (schema at revision {report.revision})")
    else:
        rows = [
            [f.check, f.problem, f.advice, " ".join(map(str, f.task_ids)) or None]
            for f in report.findings
        ]
        print(table(["check", "problem", "what to do", "tasks"], rows))
    return EXIT_OK if report.healthy else EXIT_REFUSED
