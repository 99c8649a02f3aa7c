"""The benchmark harness runs end to end at small sizes, so it never rots. Not a timed test:
it checks that every figure and every target ratio was produced, not their values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.run import main

pytestmark = pytest.mark.processes


def test_benchmark_smoke_produces_every_figure(tmp_path: Path) -> None:
    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "smoke.json").read_text())
    figures = report["figures"]
    for key in (
        "raw_1_per_tx_full",
        "raw_32_per_tx_normal",
        "raw_executemany",
        "submit_many",
        "e2e_1proc_32slots_full",
        "e2e_4proc_8slots_full",
        "claim_10000_finished",
        "pickup_idle",
        "memory_backend_bytes_per_task",
        "e2e_1proc_32slots_full_info_log",
        "e2e_1proc_8slots_full_process_env",
        "attempt_start_ms",
        "huey_consumer_8threads",
        "huey_consumer_32threads",
        "litequeue_full",
        "persistqueue_ackqueue",
    ):
        assert key in figures, key
    for processes in (1, 4):
        lock = figures[f"write_lock_{processes}proc_8slots"]
        assert lock["transactions"] > 0 and 0 < lock["lock_busy_pct"] <= 100
    assert figures["write_lock_1proc_8slots"]["same_process_next_pct"] == 100
    for key in ("pg_e2e_4proc_32slots", "pg_pgqueuer_4proc", "pg_procrastinate_1proc"):
        assert key in figures, key  # PostgreSQL is required where these tests run
    assert len(report["targets"]) == 15
    assert all(t["met"] is not None and math.isfinite(t["value"]) for t in report["targets"])
    assert (tmp_path / "smoke.md").read_text().count("|") > 50
    assert (tmp_path / "smoke.png").stat().st_size > 1000
