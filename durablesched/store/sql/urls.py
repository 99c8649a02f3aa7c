"""Which database a ``--db`` value names, and its SQLAlchemy URL.

Neutral ground: the backends, :mod:`durablesched.store.opening` and the
Alembic environment (``migrations/env.py``) all read URLs the same way without
importing one another.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from durablesched.errors import ConfigurationError


def is_postgres_url(db: object) -> bool:
    """True for a URL the PostgreSQL backend opens (anything else is taken as SQLite)."""
    return isinstance(db, str) and db.startswith(("postgresql:", "postgresql+", "postgres:"))


def sqlite_url(db: str | os.PathLike[str]) -> str:
    """An SQLAlchemy URL for ``db``, a file path or an ``sqlite://`` URL."""
    raw = os.fspath(db)
    if "://" in raw:
        url = make_url(raw)
        if url.get_backend_name() != "sqlite":
            raise ConfigurationError(
                f"only SQLite databases are supported here, got a {url.get_backend_name()} URL"
            )
        return raw
    return f"sqlite:///{Path(raw).expanduser().resolve()}"


def postgres_url(db: str) -> str:
    """``db`` with the psycopg 3 driver named: ``postgresql://`` becomes ``postgresql+psycopg://``."""
    if db.startswith("postgres://"):  # the scheme many hosting services hand out
        db = "postgresql://" + db.removeprefix("postgres://")
    url = make_url(db)
    if url.get_backend_name() != "postgresql":
        raise ConfigurationError(f"not a PostgreSQL URL: {db!r}")
    if url.get_driver_name() not in ("psycopg", "postgresql", ""):
        raise ConfigurationError(
            f"durablesched talks to PostgreSQL through psycopg 3 (postgresql+psycopg://), "
            f"not {url.get_driver_name()}"
        )
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
