"""Alembic environment: runs on a connection handed over by durablesched, or on the URL."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from durablesched.store.opening import create_engine_for
from durablesched.store.sql.schema import metadata

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
    engine = create_engine_for(url)
    try:
        with engine.connect() as conn:
            run(conn)
            conn.commit()
    finally:
        engine.dispose()
