"""Monotonic totals of ended attempts, per queue, task name, outcome and duration bucket.

Every store adds to them in the transaction that records the outcome (a worker's
group commit, a reclaim), so they never go backwards, purges included, and a
scrape reads a few hundred summed rows instead of a history of millions: what
``durablesched.metrics`` serves as Prometheus counters and a histogram
(docs/metrics.md). A SQL store keeps them in ``durablesched_attempt_totals``,
spread over :data:`SHARDS` rows per key by the worker's name, so that workers
ending attempts of one task at once do not all wait on one row (PostgreSQL).
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from durablesched.records import Claim
from durablesched.states import TaskState

#: How an attempt ended: one of these, exactly once per attempt.
ATTEMPT_OUTCOMES = ("succeeded", "failed", "retried", "reclaimed", "cancelled")
#: The final state an outcome left its task in, as the outcome it counts as.
_OUTCOME_OF = {
    TaskState.SUCCEEDED: "succeeded",
    TaskState.FAILED: "failed",
    TaskState.RETRY_WAIT: "retried",
    TaskState.CANCELLED: "cancelled",
}
#: The duration histogram's upper bounds, in seconds (Prometheus adds +Inf).
DURATION_BOUNDS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
_BOUNDS_US = tuple(round(b * 1_000_000) for b in DURATION_BOUNDS)
#: The bucket of an attempt whose time is not known (a reclaimed one: claim to lapse).
NO_DURATION = -1
#: Rows per key in a SQL store: the writers' names spread over them.
SHARDS = 4
_MICROSECOND = timedelta(microseconds=1)

#: (queue, task name, outcome, bucket) -> [attempts, summed duration in microseconds].
Tally = dict[tuple[str, str, str, int], list[int]]


@dataclass(frozen=True, slots=True)
class AttemptTotal:
    """Attempts of one task name in one queue that ended one way, with their durations
    in one bucket: ``bucket`` indexes :data:`DURATION_BOUNDS` (``len(DURATION_BOUNDS)``
    is +Inf; :data:`NO_DURATION` for reclaimed ones); ``duration_us`` sums them."""

    queue: str
    name: str
    outcome: str
    bucket: int
    attempts: int
    duration_us: int


def bucket_of(duration_us: int) -> int:
    """The index of the smallest bound an attempt of ``duration_us`` fits under."""
    return bisect.bisect_left(_BOUNDS_US, duration_us)


def shard_of(owner: str) -> int:
    """The row (of :data:`SHARDS`) a writer named ``owner`` adds to."""
    return zlib.crc32(owner.encode("utf-8", "backslashreplace")) % SHARDS


def ended(tally: Tally, claim: Claim, state: object, now: datetime) -> None:
    """Add the attempt of ``claim`` that an outcome left in ``state`` at ``now`` (not a
    state: the claim was not valid, nothing counts)."""
    outcome = _OUTCOME_OF.get(state) if isinstance(state, TaskState) else None
    if outcome is None:
        return
    start = claim.started_at or claim.claimed_at  # a claim ahead: from its start
    if start is None:
        add(tally, (claim.queue, claim.name, outcome, NO_DURATION), 0)
        return
    duration = max(0, (now - start) // _MICROSECOND)
    add(tally, (claim.queue, claim.name, outcome, bucket_of(duration)), duration)


def add(tally: Tally, key: tuple[str, str, str, int], duration_us: int) -> None:
    """One attempt of ``key`` (queue, task name, outcome, bucket) that ran ``duration_us``."""
    entry = tally.setdefault(key, [0, 0])
    entry[0] += 1
    entry[1] += duration_us


def totals_of(tally: Tally) -> list[AttemptTotal]:
    """A tally as totals, in key order."""
    return [AttemptTotal(*key, *tally[key]) for key in sorted(tally)]


def merge(into: Tally, rows: Iterable[AttemptTotal]) -> None:
    for r in rows:
        entry = into.setdefault((r.queue, r.name, r.outcome, r.bucket), [0, 0])
        entry[0] += r.attempts
        entry[1] += r.duration_us
