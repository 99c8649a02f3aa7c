"""Opening a store on a file this process already has open keeps every connection's locks.

POSIX drops every lock a process holds on a file when the process closes any descriptor
of that file. A header check by open/read/close beside a live connection (ours, Django's,
the caller's own ``sqlite3``) would release that connection's SHARED lock, and another
process could then take EXCLUSIVE and, as the last connection, delete the WAL under the
first: SQLite's documented way to corrupt a database. Its later commits went to a deleted
file, seen by no other process.
"""

from __future__ import annotations

import sqlite3
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


#: Another process opens the file, reads and closes: the last connection, if it can lock.
VISIT = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
print(connection.execute("SELECT count(*) FROM orders").fetchone()[0])
connection.close()
"""


def _visit(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", VISIT, str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("store_left_open", [False, True])
def test_a_callers_own_connection_keeps_its_commits_when_a_store_opens_the_file(
    tmp_path: Path, store_left_open: bool
) -> None:
    path = tmp_path / "shop.db"
    SQLiteStore(path).close()  # the schema, as an application's first run leaves it
    mine = sqlite3.connect(path, isolation_level=None)
    try:
        mine.execute("PRAGMA journal_mode = WAL")
        mine.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        mine.execute("INSERT INTO orders VALUES (1)")
        store = SQLiteStore(path)  # the first enqueue of a web process
        if not store_left_open:
            store.close()
        assert _visit(path) == "1"  # a burst worker, say: the last connection elsewhere
        assert Path(f"{path}-wal").exists()
        mine.execute("INSERT INTO orders VALUES (2)")
        assert _visit(path) == "2"  # the second order is in the file others read
        store.close()
    finally:
        mine.close()


def test_a_file_that_is_not_sqlite_is_still_refused_after_a_store_let_go_of_its_path(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    SQLiteStore(path).close()
    path.unlink()
    path.write_bytes(b"not a database at all, but long enough to have a header")
    with pytest.raises(SchemaError, match="is not a SQLite database"):
        SQLiteStore(path)
