"""``durablesched workers``: the worker processes on this database, alive (and gone)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING

from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK
from durablesched.cli.options import Commands, switch
from durablesched.cli.output import print_json, table, when
from durablesched.clock import SystemClock

if TYPE_CHECKING:
    from durablesched.records import WorkerInfo


def register(commands: Commands) -> None:
    p = commands.add("workers", cmd_workers, "list the worker processes seen on this database")
    switch(p, "--all", help="also list workers gone (not seen within their lease)")


def cmd_workers(args: argparse.Namespace) -> int:
    store = open_db(args, readonly=True)
    try:
        now = SystemClock().now()
        listed = [w for w in store.list_workers(now) if args.all or w.alive(now)]
    finally:
        store.close()
    if args.json:
        print_json([worker_dict(w, now) for w in listed])
        return EXIT_OK
    rows = [
        [
            w.id,
            w.host,
            w.pid,
            _queues(w),
            w.running,
            w.waiting,
            when(w.started_at),
            when(w.last_seen),
            w.state(now),
        ]
        for w in listed
    ]
    headers = ["id", "host", "pid", "queues", "running", "ahead", "started", "last seen"]
    print(table([*headers, "state"], rows))
    return EXIT_OK


def worker_dict(worker: WorkerInfo, now: datetime) -> dict[str, object]:
    """A worker as ``--json`` prints it (and the dashboard serves it): its record, the
    lease in seconds, and its state at ``now``."""
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": None if worker.queues is None else dict(worker.queues),
        "concurrency": worker.concurrency,
        "version": worker.version,
        "started_at": worker.started_at,
        "last_seen": worker.last_seen,
        "lease_seconds": worker.lease.total_seconds(),
        "state": worker.state(now),
        "running": worker.running,
        "claimed_ahead": worker.waiting,
    }


def _queues(worker: WorkerInfo) -> str:
    """``mail=2,default=1``, or ``all (N slots)`` for a worker serving every queue."""
    if worker.queues is None:
        return f"all ({worker.concurrency} slots)"
    return ",".join(f"{q}={n}" for q, n in worker.queues.items())
