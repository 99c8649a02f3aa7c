"""benchmarks/ahead.py's cases run end to end at tiny sizes, on both sides (``--ahead 0``
and the default): every figure is produced. Not timed; the full run is
``python -m benchmarks.ahead`` (its ``--smoke`` adds the CPU-bound cases and huey)."""

from __future__ import annotations

import threading
from pathlib import Path

from benchmarks import ahead


def test_the_claim_ahead_benchmark_runs(tmp_path: Path) -> None:
    size = ahead.Sizes(smoke=True)
    size.noop, size.samples = 100, 2
    for side, options in ahead.SIDES.items():
        assert ahead.noop_burst(tmp_path / f"n-{side}.db", size.noop, options) > 0
        long = ahead.long_tasks(tmp_path / f"l-{side}.db", size, options)
        assert long["makespan_s"] >= size.long_seconds
        mixed = ahead.mixed(tmp_path / f"m-{side}.db", size, options)
        assert mixed["makespan_s"] >= size.long_seconds
        assert "last_long_start_after_short_end_ms" in mixed
        latency = ahead.latency(tmp_path / f"t-{side}.db", size.samples, options)
        assert latency["samples"] == size.samples and latency["p50_ms"] >= 0


def test_the_latency_part_runs_alone_in_turn(tmp_path: Path) -> None:
    """Each run leaves no thread behind: a finish watcher left running watched the
    directory and woke at every write of the next run's database, the other side's."""
    size = ahead.Sizes(smoke=True, rounds=2, samples=2)
    before = set(threading.enumerate())
    figures = ahead.latency_rounds(tmp_path, size)
    assert set(threading.enumerate()) <= before
    assert all(len(p50s) == 2 for p50s in figures["latency_p50_ms_rounds"].values())
    assert len(figures["ratios_per_round"]) == 2
    assert figures["latency_p50_default_over_ahead0"] > 0
