"""The Prometheus metrics read from every backend: what each metric counts, over which
window, and that the text parses as Prometheus' own format."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from durablesched import ConfigurationError, ErrorInfo, ManualClock, WorkerInfo
from durablesched.metrics import StoreCollector, metrics_text
from durablesched.records import NewTask

from ..conftest import T0, BackendStore, at

LEASE = timedelta(seconds=30)
ERR = ErrorInfo("builtins.ValueError", "bad", "")


def samples(
    store: BackendStore, now: float, **kwargs: object
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics_text(store, clock=ManualClock(at(now)), **kwargs).decode()  # type: ignore[arg-type]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_what_each_metric_counts(store: BackendStore) -> None:
    ids = [
        s.task_id
        for s in store.submit(
            [
                NewTask("ok", {}, at(10), 3),
                NewTask("ok", {}, at(10), 3),
                NewTask("flaky", {}, at(10), 3, None, None, "mail"),
                NewTask("lost", {}, at(10), 1, None, None, "mail"),
                NewTask("later", {}, at(100), 3),
            ],
            T0,
        )
    ]
    claims = {c.task_id: c for c in store.claim("w1", 4, at(20), LEASE)}
    assert store.complete(claims[ids[0]], None, at(20.2))
    assert store.complete(claims[ids[1]], None, at(22))
    store.fail(claims[ids[2]], ERR, at(21), at(21))
    store.reclaim_expired(at(50), lambda name, attempt: timedelta(0))  # lost: FAILED
    store.register_worker(WorkerInfo("w1", "h", 1, None, 4, "0", at(0), at(0), LEASE), at(0))
    store.register_worker(
        WorkerInfo("w2", "h", 2, {"mail": 1}, 1, "0", at(45), at(45), LEASE), at(45)
    )
    got = samples(store, 60)

    def value(metric: str, /, **labels: str) -> float:
        return got[(metric, tuple(sorted(labels.items())))]

    assert value("durablesched_tasks", queue="default", state="PENDING") == 1
    assert value("durablesched_tasks", queue="default", state="RUNNING") == 0
    assert value("durablesched_tasks", queue="mail", state="RETRY_WAIT") == 1
    # Finished tasks are history, counted over the window below, not here.
    assert ("durablesched_tasks", (("queue", "mail"), ("state", "FAILED"))) not in got
    # flaky has been due since 21 and nobody claimed it: it waits 39 s at 60.
    assert value("durablesched_queue_oldest_waiting_seconds", queue="mail") == 39
    assert value("durablesched_queue_oldest_waiting_seconds", queue="default") == 0
    assert value("durablesched_queue_paused", queue="mail") == 0
    assert value("durablesched_attempts_started", queue="default") == 2
    assert value("durablesched_attempts_started", queue="mail") == 2
    assert value("durablesched_attempts_succeeded", queue="default") == 2
    assert value("durablesched_attempts_failed", queue="mail") == 2  # flaky's, and lost's
    assert value("durablesched_attempts_retried", queue="mail") == 1
    assert value("durablesched_attempts_cancelled", queue="mail") == 0
    assert value("durablesched_reclaims", queue="mail") == 1
    assert value("durablesched_lease_losses", worker="w1") == 1
    # Durations per name; the reclaimed attempt (lost) is not one.
    assert value("durablesched_task_duration_seconds_count", name="ok") == 2
    assert value("durablesched_task_duration_seconds_sum", name="ok") == pytest.approx(2.2)
    assert value("durablesched_task_duration_seconds_bucket", name="ok", le="0.25") == 1
    assert value("durablesched_task_duration_seconds_bucket", name="ok", le="2.5") == 2
    assert value("durablesched_task_duration_seconds_bucket", name="flaky", le="+Inf") == 1
    assert ("durablesched_task_duration_seconds_count", (("name", "lost"),)) not in got
    # w1 was last seen at 0 (gone at 60), w2 at 45.
    assert value("durablesched_workers_alive") == 1
    assert value("durablesched_workers_gone") == 1
    assert value("durablesched_metrics_window_seconds") == 3600

    # A window that ends before the reclaim and starts after the first claims: only
    # what happened in it counts.
    narrow = samples(store, 40, window=timedelta(seconds=19))
    assert narrow[("durablesched_attempts_started", (("queue", "default"),))] == 0
    assert narrow[("durablesched_attempts_succeeded", (("queue", "default"),))] == 1
    assert narrow[("durablesched_metrics_window_seconds", ())] == 19


def test_an_empty_store_has_every_family_and_no_samples_to_invent(store: BackendStore) -> None:
    got = samples(store, 10)
    assert got[("durablesched_tasks", (("queue", "default"), ("state", "PENDING")))] == 0
    assert got[("durablesched_workers_alive", ())] == 0
    assert not any(name.startswith("durablesched_attempts_") for name, _ in got)


def test_bad_settings_are_refused(store: BackendStore) -> None:
    with pytest.raises(ConfigurationError, match="window"):
        StoreCollector(store, window=timedelta(0))
    with pytest.raises(ConfigurationError, match="buckets"):
        StoreCollector(store, buckets=[1.0, 0.5])


def test_importing_durablesched_loads_no_prometheus_client() -> None:
    probe = "import sys, durablesched; print('prometheus_client' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
