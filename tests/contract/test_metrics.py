"""The Prometheus metrics read from every backend: what each metric counts, that the
counters never go back, and that the text parses as Prometheus' own format and types."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
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
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, clock=ManualClock(at(now)), **kwargs))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
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
    # Finished tasks are counted by the attempt counters, not here.
    assert ("durablesched_tasks", (("queue", "mail"), ("state", "FAILED"))) not in got
    # flaky has been due since 21 and nobody claimed it: it waits 39 s at 60.
    assert value("durablesched_queue_oldest_waiting_seconds", queue="mail") == 39
    assert value("durablesched_queue_oldest_waiting_seconds", queue="default") == 0
    assert value("durablesched_queue_paused", queue="mail") == 0
    assert value("durablesched_queue_keys_at_limit", queue="mail") == 0
    attempts = "durablesched_attempts_total"
    assert value(attempts, queue="default", task="ok", outcome="succeeded") == 2
    assert value(attempts, queue="default", task="ok", outcome="failed") == 0  # listed, 0
    assert value(attempts, queue="mail", task="flaky", outcome="retried") == 1
    assert value(attempts, queue="mail", task="lost", outcome="reclaimed") == 1
    assert value(attempts, queue="mail", task="lost", outcome="failed") == 0  # once: reclaimed
    # Durations per queue and task; the reclaimed attempt (lost) is not one.
    duration = "durablesched_attempt_duration_seconds"
    assert value(f"{duration}_count", queue="default", task="ok") == 2
    assert value(f"{duration}_sum", queue="default", task="ok") == pytest.approx(2.2)
    assert value(f"{duration}_bucket", queue="default", task="ok", le="0.25") == 1
    assert value(f"{duration}_bucket", queue="default", task="ok", le="2.5") == 2
    assert value(f"{duration}_bucket", queue="mail", task="flaky", le="+Inf") == 1
    assert (f"{duration}_count", (("queue", "mail"), ("task", "lost"))) not in got
    # w1 was last seen at 0 (gone at 60), w2 at 45.
    assert value("durablesched_workers_alive") == 1
    assert value("durablesched_workers_gone") == 1
    # The counters never go back: a later scrape, after a purge, counts the same.
    purge = getattr(store, "purge", None)
    if purge is not None:
        assert purge(at(10_000)) > 0
    later = samples(store, 10_000)
    assert later[(attempts, (("outcome", "succeeded"), ("queue", "default"), ("task", "ok")))] == 2


def test_the_types_are_prometheus_types(store: BackendStore) -> None:
    store.submit([NewTask("ok", {}, at(10), 3)], T0)
    (claim,) = store.claim("w1", 1, at(10), LEASE)
    assert store.complete(claim, None, at(10.5))
    text = metrics_text(store, clock=ManualClock(at(20))).decode()
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types == {
        "durablesched_tasks": "gauge",
        "durablesched_queue_oldest_waiting_seconds": "gauge",
        "durablesched_queue_paused": "gauge",
        "durablesched_queue_keys_at_limit": "gauge",
        "durablesched_tasks_claimed_ahead": "gauge",
        "durablesched_attempts": "counter",
        "durablesched_attempt_duration_seconds": "histogram",
        "durablesched_workers_alive": "gauge",
        "durablesched_workers_gone": "gauge",
    }
    assert "# TYPE durablesched_attempts counter" in text or (
        "# TYPE durablesched_attempts_total counter" in text
    )
    # Fewer buckets, all among the stored bounds: each counts what ran at most that long.
    fewer = samples(store, 20, buckets=[0.1, 1.0])
    bucket = "durablesched_attempt_duration_seconds_bucket"
    labels = (("queue", "default"), ("task", "ok"))
    assert fewer[(bucket, (("le", "0.1"), *labels))] == 0
    assert fewer[(bucket, (("le", "1.0"), *labels))] == 1
    assert (bucket, (("le", "0.5"), *labels)) not in fewer


def test_an_empty_store_has_every_family_and_no_samples_to_invent(store: BackendStore) -> None:
    got = samples(store, 10)
    assert got[("durablesched_tasks", (("queue", "default"), ("state", "PENDING")))] == 0
    assert got[("durablesched_workers_alive", ())] == 0
    assert not any(name.startswith("durablesched_attempt") for name, _ in got)


def test_bad_settings_are_refused(store: BackendStore) -> None:
    with pytest.raises(ConfigurationError, match="buckets"):
        StoreCollector(store, buckets=[1.0, 0.5])
    with pytest.raises(ConfigurationError, match="some of the bounds"):
        StoreCollector(store, buckets=[0.3])


def test_importing_durablesched_loads_no_prometheus_client() -> None:
    probe = "import sys, durablesched; print('prometheus_client' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
