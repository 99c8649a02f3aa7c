"""Issue 17 item 2: a worker on a damaged SQLite file stops with exit 1 and one line, at once."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durablesched.records import NewTask
from durablesched.store.sql.sqlite import SQLiteStore

from .conftest import DEADLINE, ROOT

pytestmark = pytest.mark.processes

PAGE = 4096


def _database(path: Path) -> None:
    """Tasks the worker runs, between rows of a name it does not (which take up pages)."""
    store = SQLiteStore(path)
    now = datetime.now(UTC)
    for _ in range(30):
        store.submit([NewTask("slow", {"seconds": 0}, now, 3)], now)
        store.submit([NewTask("filler", {"pad": "x" * 3000}, now, 3) for _ in range(10)], now)
    store.close()


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "middle":  # garbage over pages in the middle, the header page intact
        start = len(data) // 3 // PAGE * PAGE
        data[start : start + 8 * PAGE] = b"\x5a" * (8 * PAGE)
    else:  # truncated
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["middle", "truncated"])
def test_a_burst_worker_on_a_damaged_file_exits_1_in_one_line(tmp_path: Path, how: str) -> None:
    db = tmp_path / "jobs.db"
    _database(db)
    _damage(db, how)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "durablesched",
            "worker",
            "--db",
            str(db),
            "--app",
            "tests.processes.app:registry",
            "--burst",
        ],
        check=False,
        cwd=ROOT,
        env={**os.environ, "DS_TEST_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=DEADLINE,  # a worker that retried for ever would not end
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    damaged = [line for line in result.stderr.splitlines() if "file is damaged" in line]
    assert len(damaged) == 1, result.stderr
    assert damaged[0].startswith("durablesched: ")
    assert "run `durablesched check`; restore from a backup" in damaged[0]
    assert "burst done" not in result.stdout
