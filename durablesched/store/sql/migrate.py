"""Driving the Alembic migrations from the library (and the CLI).

Alembic is imported only to migrate or to read the scripts: opening a database that
is at the head revision reads the version table with plain SQL and compares it with
:data:`HEAD_REVISION` (which a test holds to the scripts' head), so a worker or a
reading command on an up-to-date database never loads Alembic.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from durablesched.errors import SchemaError, SchemaMissingError

if TYPE_CHECKING:
    from alembic.config import Config

#: The newest revision in ``migrations/versions``: the one this code needs.
HEAD_REVISION = "0022"


def migrations_dir() -> Path:
    """Where the migration scripts are: the checkout's migrations/ or the installed copy."""
    spec = importlib.util.find_spec("durablesched.migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config  # noqa: PLC0415 - Alembic only when migrating

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The scripts' head, as Alembic reads it (:data:`HEAD_REVISION` without Alembic)."""
    from alembic.script import ScriptDirectory  # noqa: PLC0415 - Alembic only when asked

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations have no head revision"
    return head


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory  # noqa: PLC0415 - Alembic only when asked

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The revision stored in the database, or None for a database without our schema
    (read as Alembic stores it, one row in ``alembic_version``, without Alembic)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    if len(rows) > 1:
        raise SchemaError(
            f"the database records {len(rows)} schema revisions at once "
            f"({', '.join(sorted(str(r[0]) for r in rows))}): it was not migrated by durablesched"
        )
    return str(rows[0][0]) if rows else None


def upgrade(engine: Engine) -> str:
    """Create or upgrade the schema to head; returns the revision now stored."""
    from alembic import command  # noqa: PLC0415 - Alembic only when migrating

    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
        revision = current_revision(conn)
    assert revision is not None
    return revision


def check_schema(engine: Engine, *, migrate: bool, create: bool = True) -> str:
    """Make sure the database is at head: create a new one (unless ``create`` is False),
    upgrade if asked, else refuse."""
    # A read transaction: on SQLite a write one would wait for the write lock, which
    # the caller's own transaction may hold (a store first opened inside Django's
    # atomic(), which has written already).
    with engine.execution_options(durablesched_read=True).connect() as conn:
        revision = current_revision(conn)
        has_tables = bool(inspect(conn).get_table_names())
        conn.rollback()
    if revision == HEAD_REVISION:
        return revision
    head = head_revision()
    if revision == head:  # only if HEAD_REVISION were behind the scripts (a test forbids it)
        return revision
    if revision is None and not has_tables:
        if not create:
            raise SchemaMissingError(
                f"{engine.url.render_as_string(hide_password=True)} has no durablesched "
                "schema: run `durablesched migrate` to create it"
            )
        return upgrade(engine)  # a brand-new database is created at head
    if revision is None:
        raise SchemaError(
            "the database has tables but no durablesched schema version: "
            "it is not a durablesched database"
        )
    if revision not in known_revisions():
        raise SchemaError(
            f"the database schema is at revision {revision!r}, newer than this version of "
            f"durablesched knows (head {head!r}): upgrade durablesched"
        )
    if not migrate:
        raise SchemaError(
            f"the database schema is at revision {revision!r} but this code needs {head!r}: "
            "run `durablesched migrate` (or open with migrate=True) to upgrade it"
        )
    return upgrade(engine)
