"""Alembic environment: runs on a connection handed over by durablesched, or on the URL.

It imports no backend (they run these migrations when they open a database):
durablesched hands over its own connection in ``config.attributes``; the
standalone ``alembic`` command gets a plain engine on ``DURABLESCHED_DB`` or
``sqlalchemy.url``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, create_engine

from durablesched.store.sql.schema import metadata
from durablesched.store.sql.urls import is_postgres_url, postgres_url, sqlite_url

config = context.config


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


given = config.attributes.get("connection")
if given is not None:
    run(given)
else:
    url = os.environ.get("DURABLESCHED_DB") or config.get_main_option("sqlalchemy.url")
    assert url, "set sqlalchemy.url in alembic.ini or DURABLESCHED_DB"
    engine = create_engine(postgres_url(url) if is_postgres_url(url) else sqlite_url(url))
    try:
        with engine.connect() as conn:
            run(conn)
            conn.commit()
    finally:
        engine.dispose()
