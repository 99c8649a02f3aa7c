"""benchmarks/handles.py runs end to end at small sizes on SQLite (and PostgreSQL where
the tests have one): every figure is produced and every result arrives. Not timed."""

from __future__ import annotations

from pathlib import Path

from benchmarks import handles


def test_the_handles_benchmark_runs(tmp_path: Path) -> None:
    figures = handles.run({"sqlite": str(tmp_path / "h.db")}, tasks=40, rounds=5)
    sqlite = figures["sqlite"]
    assert set(sqlite) == {"wakeup", "many", "enqueue"}
    assert sqlite["wakeup"]["p50_ms"] > 0
    assert sqlite["many"]["cores"] >= 0 and sqlite["many"]["reads"] >= 1
    assert {"single_ratio", "batch_ratio"} <= set(sqlite["enqueue"])
