"""benchmarks/handles.py runs end to end at small sizes on SQLite (and PostgreSQL where
the tests have one): every figure is produced and every result arrives. Not timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import handles
from durablesched import Scheduler, open_store


def test_the_handles_benchmark_runs(tmp_path: Path) -> None:
    figures = handles.run(
        {"sqlite": str(tmp_path / "h.db")}, tasks=40, rounds=5, drains=2, idle_seconds=0.2
    )
    sqlite = figures["sqlite"]
    assert set(sqlite) == {"wakeup", "many", "idle", "enqueue"}
    assert sqlite["wakeup"]["p50_ms"] > 0
    many = sqlite["many"]
    assert many["cores"] >= 0 and many["reads"] >= 1 and many["drains"] == 2
    low, high = many["cores_to_commit_range"]
    assert low <= many["cores_to_commit"] <= high
    assert many["results_per_s_at_5pct"] > 0
    together = many["agather"]
    assert together["drains"] == 2 and together["reads"] >= 1
    assert together["cores_to_commit_range"][0] <= together["cores_to_commit"]
    idle = sqlite["idle"]
    assert idle["cores"] >= 0 and idle["reads"] >= 1 and idle["seconds"] == 0.2
    assert {"single_ratio", "batch_ratio"} <= set(sqlite["enqueue"])


def test_the_handles_benchmark_refuses_a_database_with_tasks(tmp_path: Path) -> None:
    """A run leaves tasks pending (``enqueue``'s): the next run on that database would
    measure their backlog, so it is refused, before anything is measured."""
    db = str(tmp_path / "used.db")
    store = open_store(db)
    Scheduler(store).submit("bench.add", {"a": 1})
    store.close()
    with pytest.raises(SystemExit, match="needs an empty database"):
        handles.run({"sqlite": db}, tasks=1, rounds=1)
