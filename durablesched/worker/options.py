"""A worker's options, checked once: what each part of the worker is built with.

No threads: read-only values, made in ``Worker.__init__`` and shared by
its parts, so that an option is checked, defaulted and documented in one place.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import MappingProxyType

from durablesched.clock import positive_duration
from durablesched.errors import ConfigurationError, InvalidTaskError
from durablesched.queues import check_queue
from durablesched.records import Environment
from durablesched.records import environment as parse_environment


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """The ``Worker`` constructor's options, checked; ``Worker`` documents them."""

    #: How many attempts run here at once: the slots (with ``queues``, their sum).
    concurrency: int
    #: How long a claim lasts without a heartbeat.
    lease: timedelta
    #: How often the held leases are renewed (shorter than the lease).
    heartbeat_interval: timedelta
    #: Whose claims these are, in the store: host, process and a random part by default.
    owner: str
    #: How often an idle worker looks for commits by other processes (seconds),
    #: where inotify cannot tell it at once.
    poll_interval: float
    #: How long a finished task's outcome may wait for others still running here,
    #: to share their commit (seconds). Trades a little latency for throughput.
    commit_delay: float
    #: Seconds of store errors in a row (by the scheduler's clock) that run()
    #: backs off from before it gives up with a StoreError.
    give_up_after: float
    #: Deprecated: how many failed passes in a row run() backs off from before it
    #: gives up (None: only ``give_up_after`` counts).
    max_store_failures: int | None
    #: Where a task that does not say runs its attempts (docs/execution.md).
    environment: Environment
    #: Seconds a task in the process environment has to stop by itself once
    #: asked, before its process is terminated.
    cancel_grace: float
    #: The queues served, each with slots of its own; None: every queue, sharing
    #: the ``concurrency`` slots.
    queues: Mapping[str, int] | None = None
    #: What to do with a task whose name the registry lacks: "skip" (never claim
    #: it: another worker may run it) or "fail" (claim it and fail it at once).
    unknown_tasks: str = "skip"
    #: At most how many claims beyond its slots the worker holds, waiting for a slot
    #: (0: a claim only into a free slot).
    ahead: int = 8
    #: The seconds of starts at its recent rate that the claims ahead may cover: a
    #: worker claims ahead only what it will start this soon (docs/performance.md).
    ahead_window: float = 0.05

    @classmethod
    def checked(
        cls,
        *,
        concurrency: int,
        lease: timedelta | float,
        heartbeat_interval: timedelta | float | None,
        owner: str | None,
        poll_interval: float,
        commit_delay: float,
        give_up_after: float,
        max_store_failures: int | None,
        environment: str | Environment,
        cancel_grace: float,
        queues: Mapping[str, int] | None = None,
        unknown_tasks: str = "skip",
        ahead: int = 8,
        ahead_window: float = 0.05,
    ) -> WorkerOptions:
        """The options as given to ``Worker``, defaulted, or a ConfigurationError."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        checked_lease = positive_duration(lease, "lease")
        served = _queues(queues)
        return cls(
            concurrency=concurrency if served is None else sum(served.values()),
            queues=served,
            lease=checked_lease,
            heartbeat_interval=_heartbeat_interval(heartbeat_interval, checked_lease),
            owner=owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            poll_interval=poll_interval,
            commit_delay=commit_delay,
            give_up_after=finite_seconds(give_up_after, "give_up_after"),
            max_store_failures=max_store_failures,
            environment=parse_environment(environment),
            cancel_grace=_cancel_grace(cancel_grace),
            unknown_tasks=_unknown_tasks(unknown_tasks),
            ahead=_ahead(ahead),
            ahead_window=finite_seconds(ahead_window, "ahead_window"),
        )


def _ahead(ahead: int) -> int:
    if isinstance(ahead, bool) or not isinstance(ahead, int) or not 0 <= ahead <= 10_000:
        raise ConfigurationError(f"ahead must be an integer from 0 to 10000, got {ahead!r}")
    return ahead


def _heartbeat_interval(interval: timedelta | float | None, lease: timedelta) -> timedelta:
    """A third of the lease unless given; shorter than the lease either way."""
    checked = lease / 3 if interval is None else positive_duration(interval, "heartbeat_interval")
    if checked >= lease:
        raise ConfigurationError("heartbeat_interval must be shorter than the lease")
    return checked


def _queues(queues: Mapping[str, int] | None) -> Mapping[str, int] | None:
    """Each queue named rightly, with at least one slot; a frozen copy."""
    if queues is None:
        return None
    if not isinstance(queues, Mapping) or not queues:
        raise ConfigurationError(f"queues must map queue names to slots, got {queues!r}")
    for name, slots in queues.items():
        try:
            check_queue(name, "a queue's name")
        except InvalidTaskError as e:
            raise ConfigurationError(str(e)) from None
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 10_000:
            raise ConfigurationError(f"queue {name!r} needs from 1 to 10000 slots, got {slots!r}")
    return MappingProxyType(dict(queues))


#: What a worker may do with a claimable task whose name its registry lacks.
UNKNOWN_TASKS = ("skip", "fail")


def _unknown_tasks(policy: str) -> str:
    if policy not in UNKNOWN_TASKS:
        raise ConfigurationError(
            f"unknown_tasks must be {' or '.join(repr(p) for p in UNKNOWN_TASKS)}, got {policy!r}"
        )
    return policy


def _cancel_grace(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"cancel_grace must be seconds, got {seconds!r}")
    if seconds < 0:
        raise ConfigurationError(f"cancel_grace must not be negative, got {seconds!r}")
    return float(seconds)


def finite_seconds(seconds: float, what: str) -> float:
    """``seconds`` as a float, finite and not negative, or a ConfigurationError."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{what} must be seconds, got {seconds!r}")
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what} must be finite, got {seconds!r}")
    if seconds < 0:
        raise ConfigurationError(f"{what} must not be negative, got {seconds!r}")
    return float(seconds)
