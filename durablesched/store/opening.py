"""Opening the right store for a ``--db`` value: a SQLite file path or URL, or PostgreSQL."""

from __future__ import annotations

import os

from sqlalchemy import Engine

from durablesched.store.durability import Durability
from durablesched.store.sql.postgres import PostgresStore, create_postgres_engine
from durablesched.store.sql.sqlite import SQLiteStore, create_sqlite_engine
from durablesched.store.sql.store import SQLStore
from durablesched.store.sql.urls import is_postgres_url


def open_store(
    db: str | os.PathLike[str], *, durability: Durability = "full", migrate: bool = False
) -> SQLStore:
    """A :class:`PostgresStore` for a ``postgresql://`` URL, else a :class:`SQLiteStore`."""
    if is_postgres_url(db):
        return PostgresStore(str(db), durability=durability, migrate=migrate)
    return SQLiteStore(db, durability=durability, migrate=migrate)


def create_engine_for(db: str | os.PathLike[str], *, durability: Durability = "full") -> Engine:
    """An engine with durablesched's connection settings, for migrations and tools."""
    if is_postgres_url(db):
        return create_postgres_engine(str(db), durability=durability)
    return create_sqlite_engine(db, durability=durability)
