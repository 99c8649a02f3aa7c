"""Opening a second store on a file this process already has open keeps the first's locks.

POSIX drops every lock a process holds on a file when the process closes any descriptor
of that file. A header check by open/read/close beside a live connection would release
that connection's SHARED lock, and another process could then take EXCLUSIVE (and, as
the last connection, delete the WAL under the first): SQLite's documented way to corrupt
a database.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durablesched import SQLiteStore
from durablesched.errors import SchemaError

#: Another process asks, without waiting, for SQLite's SHARED byte range exclusively.
PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 510, 0x40000002)
    print("free")
except OSError:
    print("held")
"""


def _shared_lock(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip()


def test_a_second_store_on_the_same_file_keeps_the_first_ones_lock(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    first = SQLiteStore(path)
    with first.engine.connect() as reading:
        reading.exec_driver_sql("SELECT count(*) FROM tasks").all()  # a read transaction
        assert _shared_lock(path) == "held"
        second = SQLiteStore(path)
        assert _shared_lock(path) == "held"
        second.close()
    first.close()


def test_a_file_that_is_not_sqlite_is_still_refused_after_a_store_let_go_of_its_path(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    SQLiteStore(path).close()
    path.unlink()
    path.write_bytes(b"not a database at all, but long enough to have a header")
    with pytest.raises(SchemaError, match="is not a SQLite database"):
        SQLiteStore(path)
