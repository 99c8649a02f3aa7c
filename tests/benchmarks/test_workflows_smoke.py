"""benchmarks/workflows.py runs end to end at small sizes on SQLite: every figure is
produced. Not timed."""

from __future__ import annotations

from pathlib import Path

from benchmarks import workflows


def test_the_workflows_benchmark_runs(tmp_path: Path) -> None:
    figures = workflows.run(
        {"sqlite": str(tmp_path / "w.db")},
        workflows=6,
        steps=3,
        sleeping=50,
        rounds=4,
        recorded=20,
    )["sqlite"]
    assert figures["steps"]["steps_per_s"] > 0 and figures["steps"]["step_cost_ratio"] > 0
    assert figures["signal"]["p50_ms"] > 0
    assert figures["replay"]["steps"] == 20 and figures["replay"]["replay_ms"] > 0
    assert figures["sleeping"]["ratio"] > 0
