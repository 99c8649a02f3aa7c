"""The worker's row in the live workers table: written when its loop starts, marked
seen by every heartbeat (:mod:`.leases`), removed when it stops cleanly.

Runs on the claim loop's thread (registration, from :meth:`Worker.run`) or on the
caller's (``Worker.shutdown``, ``Worker.stop``); owns no thread and no lock of the
worker's. A worker killed outright leaves its row: listed as gone once its lease
passes unseen, deleted a day after (``WORKER_FORGET_AFTER``).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from durablesched.errors import DurableSchedError
from durablesched.records import WorkerInfo
from durablesched.scheduler import Scheduler
from durablesched.worker.options import WorkerOptions

# The logger name the worker's lines have always carried, whichever module
# logs them: people filter logs by it.
log = logging.getLogger("durablesched.worker")


def durablesched_version() -> str:
    """The installed distribution's version ("unknown" when run from a bare checkout)."""
    try:
        return package_version("durablesched")
    except PackageNotFoundError:
        return "unknown"


class Presence:
    """Whether (and as what) this worker is registered in the store."""

    def __init__(self, scheduler: Scheduler, options: WorkerOptions) -> None:
        self._scheduler = scheduler
        self._options = options
        #: True from a registration until the row is removed: heartbeats then run
        #: even while no task is held, to keep the row alive.
        self.registered = False

    def info(self, now: datetime) -> WorkerInfo:
        """This worker as it registers at ``now``."""
        options = self._options
        return WorkerInfo(
            id=options.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=None if options.queues is None else dict(options.queues),
            concurrency=options.concurrency,
            version=durablesched_version(),
            started_at=now,
            last_seen=now,
            lease=options.lease,
        )

    def register(self, now: datetime) -> None:
        """Write this worker's row (a store error propagates: the loop backs off from it)."""
        self._scheduler.store.register_worker(self.info(now), now)
        self.registered = True

    def deregister(self) -> None:
        """Remove this worker's row, once; a store error is logged (the row will show
        the worker as gone after a lease)."""
        if not self.registered:
            return
        self.registered = False
        try:
            self._scheduler.store.deregister_worker(self._options.owner)
        except DurableSchedError as e:
            log.warning("could not remove this worker from the workers table: %s", e)
