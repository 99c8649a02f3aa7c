"""The queue's tables in a Django database: its URL, its schema, one store per process.

The store opens its own connections (SQLAlchemy) to the database Django's
settings name, so that workers and reads do not depend on Django's
per-thread connections; an enqueue inside ``transaction.atomic()`` is the one
thing written on Django's own connection (:mod:`.backend`).
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from sqlalchemy.engine import URL

from durablesched.errors import SchemaError
from durablesched.store.durability import Durability
from durablesched.store.sql.migrate import upgrade
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.sqlite import SQLiteStore
from durablesched.store.sql.store import SQLStore

_stores: dict[tuple[str, Durability], SQLStore] = {}
_lock = threading.Lock()


def database_url(alias: str) -> str:
    """Where Django's database ``alias`` is, as durablesched opens it (a path or a URL)."""
    if alias not in connections:
        raise ImproperlyConfigured(
            f"durablesched's OPTIONS['database'] names {alias!r}, which is not in DATABASES"
        )
    connection = connections[alias]
    settings: dict[str, Any] = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(settings["NAME"])
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"durablesched needs database {alias!r} in a file, not in memory: workers are "
                "other processes (in tests, set DATABASES[...]['TEST']['NAME'] to a file)"
            )
        return name
    if connection.vendor == "postgresql":
        port = settings.get("PORT")
        return URL.create(
            "postgresql+psycopg",
            username=settings.get("USER") or None,
            password=settings.get("PASSWORD") or None,
            host=settings.get("HOST") or None,
            port=int(port) if port else None,
            database=settings.get("NAME") or None,
        ).render_as_string(hide_password=False)
    raise ImproperlyConfigured(
        f"durablesched runs on SQLite and PostgreSQL; database {alias!r} is {connection.vendor}"
    )


def _open(url: str, durability: Durability, **kwargs: Any) -> SQLStore:
    if url.startswith("postgresql"):
        return PostgresStore(url, durability=durability, **kwargs)
    return SQLiteStore(url, durability=durability, **kwargs)


def store_for(alias: str, durability: Durability = "full") -> SQLStore:
    """This process's store on database ``alias`` (opened once, shared by every thread)."""
    url = database_url(alias)
    key = (url, durability)
    with _lock:
        store = _stores.get(key)
        if store is None:
            try:
                store = _open(url, durability)
            except SchemaError as e:
                raise ImproperlyConfigured(
                    f"durablesched's tables in database {alias!r} are missing or out of date "
                    f"({e}): run `manage.py migrate --database {alias}`"
                ) from None
            _stores[key] = store
    return store


def migrate_schema(alias: str) -> str:
    """Create or upgrade the queue's tables in database ``alias``, beside the app's own
    (durablesched's Alembic migrations); returns the revision now stored."""
    store = _open(database_url(alias), "full", verify_schema=False)
    try:
        return upgrade(store.engine)
    finally:
        store.close()


def close_stores() -> None:
    """Close every store this process opened (tests, and a worker on its way out)."""
    with _lock:
        stores = list(_stores.values())
        _stores.clear()
    for store in stores:
        store.close()
