"""Prometheus metrics read from the database at scrape time, so that any process can serve them.

Needs the ``metrics`` extra (``pip install 'durablesched[metrics]'``, which brings
``prometheus_client``); ``import durablesched`` never imports this module. Each
scrape reads, through the :class:`~durablesched.store.protocol.Store` protocol:

* the queues now (``queue_info``): tasks per queue and state, the oldest wait;
* the history of the last ``window`` (``recent_events``, through an index on the
  history's times): attempts started and ended, reclaims, lease losses, and how
  long each attempt ran;
* the workers (``list_workers``): how many are alive and gone.

What happened is counted over the window, not over the whole history: a count
over a 1,000,000-task history costs seconds, the window's only what it holds,
and purging old tasks would make whole-history counts go backwards anyway. So
those metrics are gauges ("how many in the last hour"), the same from every
process that serves them, and the duration histogram is the window's
(``histogram_quantile`` on its buckets directly, without ``rate()``).
docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from durablesched.errors import ConfigurationError
from durablesched.records import ACTIVITY_KINDS, Activity
from durablesched.scheduler import default_clock

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
except ImportError:  # pragma: no cover - the extra is installed wherever tests run
    raise ConfigurationError(
        "durablesched.metrics needs prometheus_client: pip install 'durablesched[metrics]'"
    ) from None

if TYPE_CHECKING:
    from durablesched.clock import Clock
    from durablesched.store.protocol import Store

#: How far back what happened is counted, by default.
DEFAULT_WINDOW = timedelta(hours=1)
#: The duration histogram's upper bounds, in seconds (+Inf is added).
DURATION_BUCKETS: tuple[float, ...] = (
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
#: The text exposition's content type, for a server of :func:`metrics_text`.
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: What each per-queue count of :data:`~durablesched.records.ACTIVITY_KINDS` says.
_KINDS = {
    "started": ("durablesched_attempts_started", "Attempts started (claimed)"),
    "succeeded": ("durablesched_attempts_succeeded", "Attempts that succeeded"),
    "failed": (
        "durablesched_attempts_failed",
        "Attempts that ended in an error, retried or not (reclaimed ones included)",
    ),
    "retried": (
        "durablesched_attempts_retried",
        "Attempts that ended in an error with a retry to come",
    ),
    "cancelled": ("durablesched_attempts_cancelled", "Running attempts that ended cancelled"),
    "reclaimed": (
        "durablesched_reclaims",
        "Running attempts whose lease expired, reclaimed",
    ),
}


class StoreCollector:
    """A ``prometheus_client`` collector reading ``store`` at each scrape.

    Register it in a registry of your own (``registry.register(StoreCollector(store))``)
    to serve it beside your metrics, or call :func:`metrics_text`. ``window`` is
    how far back attempts, reclaims and durations are counted; ``clock`` the time
    of a scrape (by default the store's lease clock: PostgreSQL's server time).
    """

    def __init__(
        self,
        store: Store,
        *,
        window: timedelta = DEFAULT_WINDOW,
        clock: Clock | None = None,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        if not isinstance(window, timedelta) or window <= timedelta(0):
            raise ConfigurationError(f"window must be a positive timedelta, got {window!r}")
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] <= 0:
            raise ConfigurationError(
                f"buckets must be increasing positive seconds, got {buckets!r}"
            )
        self.store = store
        self.window = window
        self.clock: Clock = clock if clock is not None else default_clock(store)
        self.buckets = tuple(float(b) for b in buckets)

    def describe(self) -> Iterable[Metric]:
        """Nothing: the registry must not scrape the database when this is registered."""
        return ()

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        yield from self._queues(now)
        bounds = [timedelta(seconds=b) for b in self.buckets]
        activity = self.store.activity(now - self.window, now, bounds)
        yield from self._attempts(activity)
        yield from self._durations(activity)
        yield from self._workers(now)
        window = GaugeMetricFamily(
            "durablesched_metrics_window_seconds",
            "How far back the attempt, reclaim, lease loss and duration metrics count.",
        )
        window.add_metric([], self.window.total_seconds())
        yield window

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
        for info in self.store.queue_info(now, finished=False):
            for state, count in info["counts"].items():
                tasks.add_metric([info["name"], state], count)
            oldest.add_metric([info["name"]], info["oldest_waiting_seconds"] or 0.0)
            paused.add_metric([info["name"]], float(info["paused"]))
        yield from (tasks, oldest, paused)

    def _attempts(self, activity: Activity) -> Iterator[Metric]:
        seconds = f"{self.window.total_seconds():g}"
        queues = sorted({queue for queue, _ in activity.attempts})
        for kind in ACTIVITY_KINDS:
            name, what = _KINDS[kind]
            family = GaugeMetricFamily(
                name, f"{what}, in the last {seconds}s, per queue.", labels=["queue"]
            )
            for queue in queues:
                family.add_metric([queue], activity.attempts.get((queue, kind), 0))
            yield family
        lost = GaugeMetricFamily(
            "durablesched_lease_losses",
            f"Leases that expired in a worker's hands (reclaimed), in the last {seconds}s, "
            "per worker id.",
            labels=["worker"],
        )
        for owner in sorted(activity.lease_losses):
            lost.add_metric([owner], activity.lease_losses[owner])
        yield lost

    def _durations(self, activity: Activity) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "durablesched_task_duration_seconds",
            f"How long attempts that ended in the last {self.window.total_seconds():g}s ran "
            "(claim to outcome; reclaimed ones left out), per task name.",
            labels=["name"],
        )
        for name in sorted(activity.durations):
            runs = activity.durations[name]
            buckets = [(_bound(b), n) for b, n in zip(self.buckets, runs.at_most, strict=True)]
            buckets.append(("+Inf", runs.runs))
            family.add_metric([name], buckets, runs.total_us / 1_000_000)
        yield family

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


def metrics_text(
    store: Store, *, window: timedelta = DEFAULT_WINDOW, clock: Clock | None = None
) -> bytes:
    """Every metric of ``store`` now, in Prometheus' text exposition format
    (:data:`CONTENT_TYPE`): what a ``/metrics`` endpoint answers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, window=window, clock=clock))
    return generate_latest(registry)


def _bound(seconds: float) -> str:
    """A bucket's ``le`` label as Prometheus clients write it (``1.0``, ``0.25``)."""
    return repr(float(seconds))
