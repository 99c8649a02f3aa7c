"""The SQLite schema: migrations equal the metadata, the claim uses its index, files are checked."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config

from durablesched import SchemaError, SQLiteStore, StoreError
from durablesched.records import NewTask
from durablesched.store.sql.codec import to_db_time
from durablesched.store.sql.migrate import head_revision, upgrade
from durablesched.store.sql.sqlite import SQLITE, create_sqlite_engine

from ..conftest import T0, at, schema_diff


def test_migrations_on_an_empty_file_match_the_metadata(tmp_path: Path) -> None:
    engine = create_sqlite_engine(tmp_path / "m.db")
    try:
        assert upgrade(engine) == head_revision()
        with engine.connect() as conn:
            diff = schema_diff(conn)
            conn.rollback()
        assert diff == []
    finally:
        engine.dispose()


def test_alembic_command_line_config_upgrades_a_file(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    config = Config(str(root / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", f"sqlite:///{tmp_path / 'cli.db'}")
    command.upgrade(config, "head")
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert version == head_revision()


def test_a_new_file_is_created_at_head_and_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    store = SQLiteStore(path)
    store.close()
    assert store.schema_revision == head_revision()
    assert path.stat().st_mode & 0o777 == 0o600


def _explain(statement: str, store: SQLiteStore, **params: object) -> list[str]:
    """The plan SQLite makes for ``statement``, given to the driver as the store does."""
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params).all()
        conn.rollback()
    return [str(row[-1]) for row in rows]


@pytest.mark.parametrize("finished", [0, 1500])
@pytest.mark.parametrize(
    "statement",
    [
        SQLITE.claim_for(1, 0),
        SQLITE.claim_for(1, 2),
        SQLITE.claim_for(3, 0),
        SQLITE.claim_for(2, 2),
    ],
)
def test_claim_plan_uses_the_partial_index_without_scan_or_sort(
    tmp_path: Path, statement: str, finished: int
) -> None:
    path = tmp_path / "plan.db"
    store = SQLiteStore(path)
    store.submit([NewTask(f"t{i % 3}", {}, at(10 + i % 50), 3) for i in range(2000)], T0)
    for claim in store.claim("w", finished, at(60), timedelta(seconds=30)):
        store.complete(claim, None, at(60))
    # Statistics gathered while the store's connections are open tempt the planner
    # towards (state, name) and a sort; the claim must not follow.
    with sqlite3.connect(path) as conn:
        conn.execute("ANALYZE")
    plan = _explain(
        statement,
        store,
        owner="w",
        lease_expires_at=to_db_time(at(100)),
        now=to_db_time(at(30)),
        started=None,
        limit=8,
        n0="t1",
        n1="t2",
        q0="default",
        q1="reports",
        q2="mail",
        l0=8,
        l1=8,
        l2=8,
    )
    store.close()
    joined = "\n".join(plan)
    assert "ix_tasks_queue_claimable" in joined, joined
    # Each queue's arm walks the index in order; several arms are merged by one
    # sort of the few rows they return (at most the limit each), never of the table.
    sorts = [line for line in plan if "TEMP B-TREE" in line]
    # (Each arm's walk of its priorities is a UNION ALL of its own, with no sort.)
    merged = " UNION ALL SELECT * FROM (" in statement
    assert len(sorts) == (1 if merged else 0), joined
    assert not any(line.startswith("SCAN tasks") for line in plan), joined


def test_times_are_readable_utc_text_in_plain_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    store.submit([NewTask("b", {}, at(12), 1), NewTask("a", {}, at(11), 1)], T0)
    store.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("select name, state, due_at from tasks order by due_at, seq").fetchall()
    assert rows == [
        ("a", "PENDING", "2030-01-01 00:00:11.000000"),
        ("b", "PENDING", "2030-01-01 00:00:12.000000"),
    ]


def test_pragmas_wal_busy_timeout_foreign_keys_and_durability(tmp_path: Path) -> None:
    for durability, expected in (("full", 2), ("normal", 1)):
        store = SQLiteStore(tmp_path / f"{durability}.db", durability=durability)  # type: ignore[arg-type]
        try:
            with store.engine.connect() as conn:
                pragma = {
                    name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                    for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
                }
                conn.rollback()
        finally:
            store.close()
        assert pragma == {
            "journal_mode": "wal",
            "synchronous": expected,
            "foreign_keys": 1,
            "busy_timeout": 5000,
        }


def test_state_check_constraint_refuses_unknown_states(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    SQLiteStore(path).close()
    with (
        sqlite3.connect(path) as conn,
        pytest.raises(sqlite3.IntegrityError, match="ck_tasks_state"),
    ):
        conn.execute(
            "INSERT INTO tasks (id, seq, name, args, state, due_at, max_attempts, created_at,"
            " updated_at) VALUES (1, 1, 'x', '{}', 'DONE', 'x', 1, 'x', 'x')"
        )


def test_newer_schema_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    with pytest.raises(SchemaError, match="newer than this version"):
        SQLiteStore(path)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        SQLiteStore(tmp_path)


def test_a_path_the_system_refuses_is_a_store_error_naming_why(tmp_path: Path) -> None:
    """A name too long, a path through a file: found by the fuzzed CLI (an OSError
    escaped as a traceback)."""
    with pytest.raises(StoreError, match="File name too long"):
        SQLiteStore(tmp_path / ("[" * 300))
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="Not a directory"):
        SQLiteStore(tmp_path / "file" / "jobs.db")


def test_a_file_that_is_not_a_database_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("my precious notes\n" * 10)
    with pytest.raises(SchemaError, match="not a SQLite database"):
        SQLiteStore(path)
    assert path.read_text() == "my precious notes\n" * 10


def test_a_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaError, match="not a durablesched database"):
        SQLiteStore(path)


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        SQLiteStore(tmp_path / "nope" / "x.db")
