"""``manage.py durablesched_worker``: durablesched's worker running the project's tasks.

A thin wrapper over :class:`durablesched.Worker`, as ``durablesched worker``
builds one: the same signal handling (SIGTERM or SIGINT lets running tasks
finish within ``--grace``, a second one exits at once), the same ``--burst``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from durablesched.cli.errors import EXIT_OK, UsageError
from durablesched.cli.options import DEFAULTS
from durablesched.cli.worker import SignalStop, report_remaining, run_worker, served_queues
from durablesched.contrib.django.backend import DurableSchedBackend
from durablesched.contrib.django.database import close_stores
from durablesched.contrib.django.running import DjangoTasks
from durablesched.worker.options import UNKNOWN_TASKS

log = logging.getLogger("durablesched.cli")


class Command(BaseCommand):
    help = "Run the project's tasks with durablesched's worker until a signal (or idle, --burst)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias to serve")
        parser.add_argument(
            "--queue",
            action="append",
            metavar="NAME[=SLOTS]",
            help="serve this queue (with SLOTS slots of its own, default --concurrency); "
            "repeat for more; without: every queue of the backend, sharing --concurrency",
        )
        parser.add_argument(
            "--concurrency", type=int, default=int(DEFAULTS["concurrency"]),
            help="how many tasks run at once",
        )  # fmt: skip
        parser.add_argument(
            "--lease", type=float, default=float(DEFAULTS["lease"]),
            help="lease length in seconds; heartbeats renew it",
        )  # fmt: skip
        parser.add_argument(
            "--grace", type=float, default=float(DEFAULTS["grace"]),
            help="seconds running tasks get to finish after SIGTERM",
        )  # fmt: skip
        parser.add_argument(
            "--unknown-tasks", choices=UNKNOWN_TASKS, default="fail",
            help="a row naming no task of the project: fail it at once (the default), "
            "or skip it (leave it for a worker of another project or version)",
        )  # fmt: skip
        parser.add_argument(
            "--burst", action="store_true",
            help="exit once nothing can be claimed now or within --burst-wait seconds",
        )  # fmt: skip
        parser.add_argument(
            "--burst-wait", type=float, default=float(DEFAULTS["burst_wait"]),
            help="with --burst: how far ahead a retry due or a lease lapsing is waited for",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as e:
            raise CommandError(str(e)) from None
        if not isinstance(backend, DurableSchedBackend):
            raise CommandError(f"task backend {options['backend']!r} is not a DurableSchedBackend")
        if options["concurrency"] < 1:
            raise CommandError(f"--concurrency must be at least 1, got {options['concurrency']}")
        queues = self._queues(backend, options["queue"] or [], options["concurrency"])
        _show_worker_lines()
        tasks = DjangoTasks(backend)
        try:
            worker = tasks.worker(
                concurrency=options["concurrency"],
                lease=options["lease"],
                queues=queues,
                unknown_tasks=options["unknown_tasks"],
            )
        except ValueError as e:
            raise CommandError(str(e)) from None
        stop = SignalStop(worker, options["grace"])
        stop.install()
        log.info(
            "worker %s: database %r, %s slots, queues %s, tasks %s",
            worker.owner,
            backend.database,
            options["concurrency"],
            ", ".join(sorted(queues)) if queues else "all",
            ", ".join(tasks.registry) or "(none)",
        )
        try:
            code = run_worker(
                worker, stop, burst=options["burst"], burst_wait=options["burst_wait"]
            )
            if code == EXIT_OK and options["burst"]:
                report_remaining(worker.scheduler.store, worker.owner, as_json=False)  # type: ignore[arg-type]
        finally:
            stop.restore()
            close_stores()
        if code != EXIT_OK:
            raise CommandError("the worker stopped on a database error", returncode=code)

    @staticmethod
    def _queues(
        backend: DurableSchedBackend, asked: list[str], concurrency: int
    ) -> dict[str, int] | None:
        """``--queue`` as the worker's queues (None: every queue, sharing the slots)."""
        if not asked:
            return None
        names = [item if "=" in item else f"{item}={concurrency}" for item in asked]
        try:
            queues = served_queues(",".join(names))
        except UsageError as e:
            raise CommandError(str(e)) from None
        unknown = sorted(set(queues or ()) - backend.queues) if backend.queues else []
        if unknown:
            raise CommandError(
                f"--queue {', '.join(unknown)}: not in TASKS[{backend.alias!r}]['QUEUES'] "
                f"({', '.join(sorted(backend.queues))})"
            )
        return queues


def _show_worker_lines() -> None:
    """The worker's lines (a line per task start and outcome) on stderr, as ``durablesched
    worker`` prints them, unless the project's LOGGING says where they go."""
    ours = logging.getLogger("durablesched")
    if ours.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)
