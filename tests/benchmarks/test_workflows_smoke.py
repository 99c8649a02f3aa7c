"""benchmarks/workflows.py runs end to end at small sizes on SQLite: every figure is
produced, DBOS's side too where DBOS is installed (the bench extra has it), in two
rounds of alternating order. Not timed."""

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
        waiting=30,
        dbos_rounds=2,
    )["sqlite"]
    assert figures["steps"]["steps_per_s"] > 0 and figures["steps"]["step_cost_ratio"] > 0
    signal = figures["signal"]
    assert signal["p50_ms"] > 0 and signal["samples"] == 4 * workflows.SIGNAL_ROUNDS
    assert len(signal["rounds_p50_ms"]) == workflows.SIGNAL_ROUNDS
    assert signal["started"]["p50_ms"] <= signal["resumed"]["p50_ms"] <= signal["p50_ms"]
    assert figures["replay"]["steps"] == 20 and figures["replay"]["replay_ms"] > 0
    sleeping = figures["sleeping"]
    assert sleeping["ratio"] > 0 and sleeping["ask_ratio"] > 0
    assert sleeping["turn_ratio"] > 0 and sleeping["turn_ask_ratio"] > 0
    waiting = figures["waiting"]
    assert waiting["ratio"] > 0 and waiting["ratio_before_vacuum"] > 0
    assert waiting["ratio_before_vacuum_same_claims"] > 0 and waiting["ran_ratio_before_vacuum"] > 0
    assert len(waiting["rounds"]) == workflows.WAITING_ROUNDS
    if workflows.dbos_installed():
        dbos = figures["dbos"]
        assert dbos["defaults_steps_per_s"] > 0 and dbos["wal_steps_per_s"] > 0
        assert dbos["ratio_defaults"] > 0 and dbos["ratio_wal"] > 0
        # Two rounds, each side once per round, in alternating order.
        assert len(dbos["ours_per_round"]) == len(dbos["defaults_per_round"]) == 2
    else:
        assert "skipped" in figures["dbos"]


def test_only_the_signal_figure(tmp_path: Path) -> None:
    figures = workflows.run(
        {"sqlite": str(tmp_path / "w.db")},
        workflows=1,
        steps=1,
        sleeping=1,
        rounds=3,
        recorded=1,
        only="signal",
        signal_rounds=2,
    )["sqlite"]
    assert list(figures) == ["signal"]
    assert figures["signal"]["samples"] == 6 and len(figures["signal"]["rounds_p99_ms"]) == 2
