"""Driving the Alembic migrations from the library (and the CLI)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect

from durablesched.errors import SchemaError, SchemaMissingError


def migrations_dir() -> Path:
    """Where the migration scripts are: the checkout's migrations/ or the installed copy."""
    spec = importlib.util.find_spec("durablesched.migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations have no head revision"
    return head


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The revision stored in the database, or None for a database without our schema."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine) -> str:
    """Create or upgrade the schema to head; returns the revision now stored."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
        revision = current_revision(conn)
    assert revision is not None
    return revision


def check_schema(engine: Engine, *, migrate: bool, create: bool = True) -> str:
    """Make sure the database is at head: create a new one (unless ``create`` is False),
    upgrade if asked, else refuse."""
    head = head_revision()
    # A read transaction: on SQLite a write one would wait for the write lock, which
    # the caller's own transaction may hold (a store first opened inside Django's
    # atomic(), which has written already).
    with engine.execution_options(durablesched_read=True).connect() as conn:
        revision = current_revision(conn)
        has_tables = bool(inspect(conn).get_table_names())
        conn.rollback()
    if revision == head:
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
