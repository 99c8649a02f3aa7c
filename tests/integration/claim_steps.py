"""What a claim costs SQLite's virtual machine: the plan tests' shared measure."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.sqlite import SQLITE

from ..conftest import at


def sqlite_claim(path: Path, ask: int) -> tuple[int, list[Any]]:
    """The claim of queue q asking for ``ask`` at ``at(10)``, rolled back: its virtual
    machine steps (in units of the progress handler's 100) and the rows it returned."""
    conn = sqlite3.connect(path, isolation_level=None)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    now = to_db_time(at(10))
    params: dict[str, Any] = {
        "q0": "q",
        "l0": ask,
        "limit": ask,
        "owner": "w2",
        "now": now,
        "started": now,
        "lease_expires_at": to_db_time(at(40)),
    }
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.set_progress_handler(count, 100)
        rows = conn.execute(SQLITE.claim_for(1, 0), params).fetchall()
        conn.set_progress_handler(None, 100)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return steps, rows
