"""Reading commands create nothing, and read where they cannot write.

``ls``, ``show``, ``stats`` and ``check`` open the database read-only: a missing
file is "no such database" (exit 2), a database without the schema says to run
``durablesched migrate`` (exit 2), and neither gets a file or a schema made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect

from durablesched import DatabaseNotFoundError, SchemaMissingError, SQLiteStore, StoreError
from durablesched.records import NewTask
from durablesched.store.opening import open_store
from durablesched.store.sql.postgres import PostgresStore, create_postgres_engine

from ..conftest import T0, WAIT

ROOT = Path(__file__).resolve().parents[2]
READERS = [["ls"], ["show", "1"], ["stats"], ["check"]]


def cli(*args: str, user: int | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m durablesched ARGS``, as ``user`` (a uid) if given."""
    command = [sys.executable, "-m", "durablesched", *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_missing_file_is_no_such_database_and_stays_missing(
    command: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "missing.db"
    result = cli(*command, "--db", str(path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"durablesched: error: no such database: {path}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", READERS[:3], ids=lambda c: c[0])
def test_a_file_without_the_schema_says_to_migrate_and_gets_none(
    command: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    result = cli(*command, "--db", str(path))
    assert result.returncode == 2, result.stderr
    assert "run `durablesched migrate`" in result.stderr and len(result.stderr.splitlines()) == 1
    assert path.stat().st_size == 0


@pytest.mark.parametrize("command", READERS[:3], ids=lambda c: c[0])
def test_postgres_without_the_schema_says_to_migrate_and_gets_none(
    command: list[str], pg_url: str
) -> None:
    result = cli(*command, "--db", pg_url)
    assert result.returncode == 2, result.stderr
    assert "has no durablesched schema: run `durablesched migrate`" in result.stderr
    engine = create_postgres_engine(pg_url)
    with engine.connect() as conn:
        assert inspect(conn).get_table_names() == []
    engine.dispose()


def test_the_store_opens_without_creating_when_told(tmp_path: Path, pg_url: str) -> None:
    with pytest.raises(DatabaseNotFoundError, match="no such database"):
        SQLiteStore(tmp_path / "missing.db", create=False)
    with pytest.raises(DatabaseNotFoundError):
        open_store(tmp_path / "missing.db", readonly=True)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "empty.db").touch()
    with pytest.raises(SchemaMissingError, match="durablesched migrate"):
        SQLiteStore(tmp_path / "empty.db", create=False)
    with pytest.raises(SchemaMissingError, match="durablesched migrate"):
        PostgresStore(pg_url, readonly=True)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_read_only_store_reads_and_refuses_writes(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = str(tmp_path / "q.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    writer = open_store(db)
    writer.submit([NewTask("t", {}, T0, 1)], T0)
    reader = open_store(db, readonly=True)
    try:
        assert [t.name for t in reader.list_tasks()] == ["t"]
        with pytest.raises(StoreError, match=r"read-only|readonly"):
            reader.submit([NewTask("u", {}, T0, 1)], T0)
        assert [t.name for t in writer.list_tasks()] == ["t"]
    finally:
        reader.close()
        writer.close()


@pytest.fixture
def unwritable() -> Iterator[tuple[Path, int | None]]:
    """A directory this test's CLI cannot write to, and the uid to run the CLI as.

    As root (who writes anywhere) the CLI runs as ``nobody`` under ``setpriv``; as
    anyone else the directory is made read-only.
    """
    directory = Path(tempfile.mkdtemp(prefix="durablesched-ro-"))
    directory.chmod(0o755)
    user: int | None = None
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.fail("setpriv (util-linux) is needed to test as a user other than root")
        user = 65534  # nobody
        probe = cli("--help", user=user, cwd=directory)
        assert probe.returncode == 0, f"the CLI cannot run as nobody: {probe.stderr}"
    try:
        yield directory, user
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)


def test_reading_commands_work_in_a_directory_the_user_cannot_write(
    unwritable: tuple[Path, int | None],
) -> None:
    directory, user = unwritable
    path = directory / "q.db"
    store = SQLiteStore(path, file_mode=0o644)
    store.submit([NewTask("first", {}, T0, 1)], T0)
    store.close()  # the last connection: SQLite removes the -wal and -shm files
    if user is None:
        directory.chmod(0o555)
    before = sorted(p.name for p in directory.iterdir())
    assert before == ["q.db"]
    # No -shm can be made here, and there is no WAL: read as the file is (immutable).
    for command in (["ls"], ["show", "1"], ["stats"], ["check", "--overdue-after", "1000d"]):
        result = cli(*command, "--db", str(path), user=user, cwd=directory)
        assert result.returncode == 0, (command, result.stderr)
    assert "first" in cli("ls", "--db", str(path), user=user, cwd=directory).stdout
    assert sorted(p.name for p in directory.iterdir()) == before
    # With a writer connected, its -wal and -shm exist: read through them (mode=ro),
    # commits not yet checkpointed included.
    if user is None:
        directory.chmod(0o755)
    writer = SQLiteStore(path, file_mode=0o644)
    writer.submit([NewTask("second", {}, T0, 1)], T0)
    if user is None:
        directory.chmod(0o555)
    try:
        listed = cli("ls", "--db", str(path), user=user, cwd=directory)
        assert listed.returncode == 0, listed.stderr
        assert "first" in listed.stdout and "second" in listed.stdout
    finally:
        writer.close()
