"""Prometheus metrics read from the database at scrape time, so that any process can serve them.

Needs the ``metrics`` extra (``pip install 'durablesched[metrics]'``, which brings
``prometheus_client``); ``import durablesched`` never imports this module. Each
scrape reads, through the :class:`~durablesched.store.protocol.Store` protocol:

* the queues now (``queue_info``): tasks per queue and state, the oldest wait;
  gauges;
* the attempt totals (``attempt_totals``): every attempt that ever ended, by
  queue, task name and outcome, and how long each ran, added by each outcome's
  own transaction: counters (``durablesched_attempts_total``) and a histogram
  (``durablesched_attempt_duration_seconds``), monotonic, so ``rate()`` and
  ``increase()`` apply; a read of a few rows per task name, whatever the size of
  the history;
* the workers (``list_workers``): how many are alive and gone; gauges.

docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from durablesched.errors import ConfigurationError
from durablesched.scheduler import default_clock
from durablesched.totals import ATTEMPT_OUTCOMES, DURATION_BOUNDS, NO_DURATION, AttemptTotal

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError:  # pragma: no cover - the extra is installed wherever tests run
    raise ConfigurationError(
        "durablesched.metrics needs prometheus_client: pip install 'durablesched[metrics]'"
    ) from None

if TYPE_CHECKING:
    from durablesched.clock import Clock
    from durablesched.store.protocol import Store

#: The duration histogram's upper bounds, in seconds (+Inf is added): the ones the stores
#: keep (:data:`durablesched.totals.DURATION_BOUNDS`); a collector may serve fewer.
DURATION_BUCKETS: tuple[float, ...] = DURATION_BOUNDS
#: The text exposition's content type, for a server of :func:`metrics_text`.
CONTENT_TYPE = CONTENT_TYPE_LATEST


class StoreCollector:
    """A ``prometheus_client`` collector reading ``store`` at each scrape.

    Register it in a registry of your own (``registry.register(StoreCollector(store))``)
    to serve it beside your metrics, or call :func:`metrics_text`. ``clock`` is the
    time of a scrape (by default the store's lease clock: PostgreSQL's server time);
    ``buckets``, the duration histogram's bounds: some of :data:`DURATION_BUCKETS`.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] <= 0:
            raise ConfigurationError(
                f"buckets must be increasing positive seconds, got {buckets!r}"
            )
        unknown = [b for b in buckets if float(b) not in DURATION_BOUNDS]
        if unknown:
            raise ConfigurationError(
                f"buckets must be some of the bounds the stores keep, {DURATION_BOUNDS}: "
                f"{unknown} are not"
            )
        self.store = store
        self.clock: Clock = clock if clock is not None else default_clock(store)
        self.buckets = tuple(float(b) for b in buckets)

    def describe(self) -> Iterable[Metric]:
        """Nothing: the registry must not scrape the database when this is registered."""
        return ()

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        yield from self._queues(now)
        totals = self.store.attempt_totals()
        yield from self._attempts(totals)
        yield self._durations(totals)
        yield from self._workers(now)

    def _queues(self, now: datetime) -> Iterator[Metric]:
        tasks = GaugeMetricFamily(
            "durablesched_tasks",
            "Live tasks now (PENDING, RUNNING, RETRY_WAIT), per queue and state.",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "durablesched_queue_oldest_waiting_seconds",
            "How long the queue's oldest due, unclaimed task has waited (0: none waits).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "durablesched_queue_paused", "1 if the queue is paused, else 0.", labels=["queue"]
        )
        ahead = GaugeMetricFamily(
            "durablesched_tasks_claimed_ahead",
            "RUNNING tasks claimed ahead, waiting in a worker for a slot (not started), "
            "per queue; the started ones are durablesched_tasks{state=RUNNING} minus these.",
            labels=["queue"],
        )
        at_limit = GaugeMetricFamily(
            "durablesched_queue_keys_at_limit",
            "Limit keys of the queue with as many tasks RUNNING as its concurrency per key "
            "allows (0 without a limit per key).",
            labels=["queue"],
        )
        for info in self.store.queue_info(now, finished=False):
            for state, count in info["counts"].items():
                tasks.add_metric([info["name"], state], count)
            oldest.add_metric([info["name"]], info["oldest_waiting_seconds"] or 0.0)
            paused.add_metric([info["name"]], float(info["paused"]))
            ahead.add_metric([info["name"]], info["waiting"])
            at_limit.add_metric([info["name"]], float(info["keys_at_limit"]))
        yield from (tasks, oldest, paused, ahead, at_limit)

    def _attempts(self, totals: list[AttemptTotal]) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "durablesched_attempts",
            "Attempts that ended, per queue, task name and outcome: succeeded, failed (no "
            "retry left), retried, reclaimed (its lease lapsed) or cancelled.",
            labels=["queue", "task", "outcome"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for t in totals:
            key = (t.queue, t.name, t.outcome)
            counts[key] = counts.get(key, 0) + t.attempts
        for queue, name in sorted({(q, n) for q, n, _ in counts}):
            for outcome in ATTEMPT_OUTCOMES:  # every outcome of a task: rate() sees zeros
                family.add_metric([queue, name, outcome], counts.get((queue, name, outcome), 0))
        yield family

    def _durations(self, totals: list[AttemptTotal]) -> Metric:
        family = HistogramMetricFamily(
            "durablesched_attempt_duration_seconds",
            "How long attempts ran, claim to outcome, per queue and task name (reclaimed "
            "ones left out: their end is not known).",
            labels=["queue", "task"],
        )
        # (queue, name) -> (per stored bucket count, total count, summed microseconds)
        runs: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        for t in totals:
            if t.bucket == NO_DURATION:
                continue
            per_bucket, sums = runs.setdefault(
                (t.queue, t.name), ([0] * (len(DURATION_BOUNDS) + 1), [0, 0])
            )
            per_bucket[t.bucket] += t.attempts
            sums[0] += t.attempts
            sums[1] += t.duration_us
        for queue, name in sorted(runs):
            per_bucket, (count, total_us) = runs[queue, name]
            buckets = []
            for bound in self.buckets:
                upto = DURATION_BOUNDS.index(bound)
                buckets.append((_bound(bound), sum(per_bucket[: upto + 1])))
            buckets.append(("+Inf", count))
            family.add_metric([queue, name], buckets, total_us / 1_000_000)
        return family

    def _workers(self, now: datetime) -> Iterator[Metric]:
        workers = self.store.list_workers(now)
        alive = GaugeMetricFamily(
            "durablesched_workers_alive", "Worker processes seen within their lease."
        )
        alive.add_metric([], sum(1 for w in workers if w.alive(now)))
        gone = GaugeMetricFamily(
            "durablesched_workers_gone",
            "Worker processes not seen within their lease (killed, frozen or cut off), "
            "until forgotten a day later.",
        )
        gone.add_metric([], sum(1 for w in workers if not w.alive(now)))
        yield from (alive, gone)


def metrics_text(store: Store, *, clock: Clock | None = None) -> bytes:
    """Every metric of ``store`` now, in Prometheus' text exposition format
    (:data:`CONTENT_TYPE`): what a ``/metrics`` endpoint answers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, clock=clock))
    return generate_latest(registry)


def _bound(seconds: float) -> str:
    """A bucket's ``le`` label as Prometheus clients write it (``1.0``, ``0.25``)."""
    return repr(float(seconds))
