"""Opening the right store for a ``--db`` value: a SQLite file path or URL, or PostgreSQL.

Each database's module is imported only when its URL is opened: a SQLite user never
loads the PostgreSQL module or SQLAlchemy's PostgreSQL dialect.
"""

from __future__ import annotations

import os

from durablesched.store.durability import Durability
from durablesched.store.protocol import DurableStore
from durablesched.store.sql.urls import is_postgres_url


def open_store(
    db: str | os.PathLike[str],
    *,
    durability: Durability = "full",
    migrate: bool = False,
    create: bool = True,
    readonly: bool = False,
    verify_schema: bool = True,
) -> DurableStore:
    """A :class:`PostgresStore` for a ``postgresql://`` URL, else a :class:`SQLiteStore`.

    ``create=False`` creates nothing: no file (:class:`DatabaseNotFoundError`), no
    schema (:class:`SchemaMissingError`). ``readonly=True`` implies it and opens the
    database so that nothing can be written (what ``ls``, ``show``, ``stats`` and
    ``check`` use). ``verify_schema=False`` opens a database at any revision, for
    :meth:`~durablesched.store.protocol.Operator.check` to report on.
    """
    modes = {"create": create, "readonly": readonly, "verify_schema": verify_schema}
    if is_postgres_url(db):
        from durablesched.store.sql.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore(str(db), durability=durability, migrate=migrate, **modes)
    from durablesched.store.sql.sqlite import SQLiteStore  # noqa: PLC0415

    return SQLiteStore(db, durability=durability, migrate=migrate, **modes)
