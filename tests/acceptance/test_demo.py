"""The README's demo runs, recovers the killed worker's task, and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..processes.conftest import ROOT

pytestmark = pytest.mark.processes


def test_demo_runs_and_the_killed_task_is_finished_by_the_other_worker(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "SIGKILL worker pid" in out
    assert "lease of" in out and "expired" in out
    assert "finished by the surviving worker: SUCCEEDED" in out
    assert "sqlite> SELECT state, tasks FROM queue_summary" in out
    # Each query is shown as it would be typed: no placeholder left in it.
    queries = [line for line in out.splitlines() if line.startswith("sqlite> ")]
    assert queries and not [q for q in queries if "?" in q], queries
    # Nothing left running: no worker process of this demo survives.
    db = str(tmp_path / "durablesched-demo.db").encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert db not in cmdline.read_bytes(), f"a demo process survives: {cmdline}"
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited while we looked
