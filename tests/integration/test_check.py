"""``durablesched check`` on real files: healthy, stale schema, damaged, not a database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from durablesched import SQLiteStore
from durablesched.records import NewTask
from durablesched.store.health import check_database
from durablesched.store.sql.migrate import head_revision
from durablesched.store.sql.postgres import PostgresStore

from ..conftest import T0, WAIT

ROOT = Path(__file__).resolve().parents[2]


def check(db: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durablesched", "check", "--db", str(db), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=False,
    )


def test_a_healthy_database_exits_0(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "q.db").close()
    result = check(tmp_path / "q.db")
    assert (result.returncode, result.stdout.strip(), result.stderr) == (
        0,
        f"all is well (schema at revision {head_revision()})",
        "",
    )


def test_an_expired_lease_exits_1_and_says_a_worker_should_reclaim_it(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "q.db")
    now = datetime.now(UTC)
    (s,) = store.submit([NewTask("t", {}, now - timedelta(minutes=2), 3)], now)
    store.claim("gone", 1, now - timedelta(minutes=1), timedelta(seconds=30))
    store.close()
    result = check(tmp_path / "q.db", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["healthy"] is False
    (finding,) = report["findings"]
    assert (finding["check"], finding["task_ids"]) == ("leases", [s.task_id])
    assert "a running worker reclaims them" in finding["advice"]


def test_a_stale_schema_exits_1_and_says_to_migrate(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "q.db")
    with store.engine.begin() as conn:  # as a database the last release made and left
        conn.execute(text("UPDATE alembic_version SET version_num = '0003'"))
    store.close()
    result = check(tmp_path / "q.db")
    assert result.returncode == 1, result.stderr
    assert f"the schema is at revision 0003; this release needs {head_revision()}" in result.stdout
    assert "run `durablesched migrate`" in result.stdout
    assert (tmp_path / "q.db").exists()


def test_random_bytes_are_not_a_database_in_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "random.db"
    path.write_bytes(os.urandom(8192))
    result = check(path, "--json")
    assert result.returncode == 1 and result.stderr == ""
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["check"] == "database"
    assert finding["problem"] == f"not a database: {path} is not a SQLite database"
    assert "\n" not in finding["problem"] and "restore" in finding["advice"]


def test_a_damaged_file_is_malformed_in_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    store = SQLiteStore(path)
    store.submit(
        [NewTask("t", {"pad": "x" * 3000}, datetime.now(UTC), 3) for _ in range(50)],
        datetime.now(UTC),
    )
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    data[page : len(data)] = os.urandom(len(data) - page)  # every page but the header's
    path.write_bytes(bytes(data))
    report = check_database(path, datetime.now(UTC))
    assert not report.healthy
    finding = report.findings[0]
    assert finding.check in ("database", "integrity")
    assert "malformed" in finding.problem or "integrity_check found" in finding.problem
    assert "\n" not in finding.problem and "recover" in finding.advice
    result = check(path)
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_postgres_healthy_then_a_missing_index_is_a_finding(pg_url: str) -> None:
    PostgresStore(pg_url).close()
    assert check(pg_url).returncode == 0
    store = PostgresStore(pg_url)
    with store.engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_tasks_running_lease"))
    store.close()
    result = check(pg_url, "--json")
    assert result.returncode == 1, result.stderr
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["check"], finding["problem"]) == (
        "integrity",
        "index ix_tasks_running_lease is missing",
    )


def test_postgres_a_missing_task_sequence_is_a_finding_saying_where_to_restart_it(
    pg_url: str,
) -> None:
    store = PostgresStore(pg_url)
    store.submit([NewTask("t", {}, T0, 1) for _ in range(3)], T0)
    with store.engine.begin() as conn:
        conn.execute(text("DROP SEQUENCE durablesched_task_seq"))
    store.close()
    result = check(pg_url, "--json")
    assert result.returncode == 1, result.stderr
    (finding,) = json.loads(result.stdout)["findings"]
    assert (
        finding["problem"] == "sequence durablesched_task_seq is missing: no task can be submitted"
    )
    assert finding["advice"].endswith(
        "CREATE SEQUENCE durablesched_task_seq AS bigint START WITH 4"
    )
