"""benchmarks/tracing.py runs end to end at a small size, so it never rots: every set-up
runs its tasks, the traced one records two spans per task, and only the instrumented
set-ups import OpenTelemetry. Not a timed test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.tracing import SETUPS, compare, report

ROOT = Path(__file__).resolve().parents[2]


def test_every_set_up_runs_and_is_reported() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the tracing benchmark's base set-up is exported from git")
    commit, medians = compare(tasks=20, rounds=1, concurrency=2)
    assert set(medians) == set(SETUPS)
    assert [medians[s]["spans"] for s in SETUPS] == [0, 0, 0, 40]
    assert [medians[s]["imports_opentelemetry"] for s in SETUPS] == [0, 0, 1, 1]
    text = report(commit, medians, 20, 1)
    assert all(f"| {setup} |" in text for setup in SETUPS)
