"""``durablesched workers``, purge's forgetting of workers and ``durablesched metrics``:
in process, on a SQLite file whose workers are registered by hand at real times (the
commands read the system clock)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durablesched import SQLiteStore, WorkerInfo
from durablesched.records import WORKER_FORGET_AFTER

from .test_cli_edges import Run

LEASE = timedelta(seconds=30)


def _register(db: Path, *workers: WorkerInfo) -> None:
    store = SQLiteStore(db)
    try:
        for worker in workers:
            store.register_worker(worker, worker.last_seen)
    finally:
        store.close()


def _worker(worker_id: str, seen_ago: timedelta, **changes: object) -> WorkerInfo:
    now = datetime.now(UTC)
    fields: dict[str, object] = {
        "id": worker_id,
        "host": "box",
        "pid": 42,
        "queues": None,
        "concurrency": 4,
        "version": "0.1.0",
        "started_at": now - seen_ago - timedelta(minutes=1),
        "last_seen": now - seen_ago,
        "lease": LEASE,
        **changes,
    }
    return WorkerInfo(**fields)  # type: ignore[arg-type]


def test_workers_lists_the_alive_ones_and_all_of_them_with_all(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    assert run("workers").out.splitlines()[0].split() == [
        "id",
        "host",
        "pid",
        "queues",
        "running",
        "ahead",
        "started",
        "last",
        "seen",
        "state",
    ]
    _register(
        db,
        _worker("alive-1", timedelta(seconds=1), queues={"mail": 2, "default": 1}),
        _worker("gone-1", timedelta(minutes=5)),
    )
    lines = run("workers").out.splitlines()
    assert len(lines) == 3 and lines[2].split()[:4] == ["alive-1", "box", "42", "mail=2,default=1"]
    assert lines[2].split()[-1] == "alive"
    everyone = run("workers", "--all").out.splitlines()[2:]
    assert [(line.split()[0], line.split()[-1]) for line in everyone] == [
        ("gone-1", "gone"),
        ("alive-1", "alive"),
    ]
    assert "all (4 slots)" in everyone[0]
    listed = json.loads(run("--json", "workers", "--all").out)
    assert [(w["id"], w["state"], w["queues"], w["lease_seconds"]) for w in listed] == [
        ("gone-1", "gone", None, 30.0),
        ("alive-1", "alive", {"mail": 2, "default": 1}, 30.0),
    ]
    assert set(listed[0]) == {
        "id",
        "host",
        "pid",
        "queues",
        "concurrency",
        "version",
        "started_at",
        "last_seen",
        "lease_seconds",
        "state",
        "running",
        "claimed_ahead",
    }
    assert json.loads(run("--json", "workers").out)[0]["id"] == "alive-1"


def test_workers_reads_without_creating_the_database(run: Run, db: Path) -> None:
    result = run("workers")
    assert result.code == 2
    assert not db.exists()


def test_purge_forgets_workers_gone_for_more_than_a_day(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    _register(
        db,
        _worker("long-gone", WORKER_FORGET_AFTER + LEASE + timedelta(minutes=1)),
        _worker("recently-gone", timedelta(hours=1)),
    )
    assert [w["id"] for w in json.loads(run("--json", "workers", "--all").out)] == ["recently-gone"]
    purged = run("purge", "--older-than", "1d")
    assert purged.out.splitlines() == [
        "deleted 0 finished task(s) older than 1d",
        "forgot 1 worker(s) gone for more than a day",
    ]
    assert json.loads(run("--json", "purge", "--older-than", "1d").out) == {
        "deleted": 0,
        "workers_forgotten": 0,
    }


def test_metrics_prints_the_text_format_and_refuses_bad_options(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    _register(db, _worker("alive-1", timedelta(seconds=1)))
    printed = run("metrics")
    assert printed.code == 0, printed
    lines = printed.out.splitlines()
    assert "durablesched_workers_alive 1.0" in lines
    assert "# TYPE durablesched_attempts_total counter" in lines
    assert 'durablesched_tasks{queue="default",state="PENDING"} 0.0' in lines
    for bad, message in [
        (["--window", "10m"], "unrecognized arguments: --window"),
        (["--serve", "host:port"], "--serve's port must be a whole number"),
        (["--serve", "70000"], "--serve's port"),
    ]:
        refused = run("metrics", *bad)
        assert refused.code == 2 and message in refused.err, refused
