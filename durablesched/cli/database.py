"""Opening the database that ``--db`` and ``--durability`` name, and naming it in output.

The store is imported when a command runs, not when the parser is built, so
that ``--help`` does not have to load SQLAlchemy. The commands that only read
open the database read-only: they never create a file or a schema.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from durablesched.cli.errors import UsageError
from durablesched.cli.values import durability_of

if TYPE_CHECKING:
    from durablesched.store.protocol import DurableStore

#: Commands that only read: they open the database read-only and create nothing.
READ_ONLY_COMMANDS = frozenset({"ls", "show", "stats", "check"})

#: The URL schemes ``--db`` takes (a driver may follow a ``+``); anything else is a path.
SCHEMES = ("sqlite", "postgresql", "postgres")
SUPPORTED = "a SQLite file path, a sqlite:///PATH URL or a postgresql:// URL"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:)[^/@]*@")


def display_db(db: str) -> str:
    """``db`` as output may show it: a URL's password replaced by ``***``."""
    return _PASSWORD.sub(r"\1***@", db)


def check_db(db: str, option: str = "--db") -> str:
    """``db`` if durablesched can open it, else a UsageError saying what it takes.

    Only the text is checked here: whether the file or server is there is the
    store's to say (exit 1).
    """
    if not db or not db.strip():
        raise UsageError(f"{option} must be {SUPPORTED}, got an empty value")
    try:
        db.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{option} must be valid UTF-8 (SQLite opens files by UTF-8 name), got {db!r}"
        ) from None
    scheme = _SCHEME.match(db)
    if scheme is None:
        return db
    backend = scheme.group(1).lower().partition("+")[0]
    if backend not in SCHEMES:
        raise UsageError(
            f"{option} must be {SUPPORTED}, got a {scheme.group(1)}:// URL ({display_db(db)})"
        )
    if backend == "sqlite" and db[scheme.end() :].lstrip("/") in ("", ":memory:"):
        raise UsageError(
            f"{option} must name a file: an in-memory SQLite database would vanish "
            f"when the command exits (got {db!r})"
        )
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(db)
    except (ArgumentError, ValueError) as e:  # a port that is not a number, say
        reason = "it cannot be read" if isinstance(e, ArgumentError) else str(e)
        raise UsageError(f"{option} must be a valid URL ({reason}): {display_db(db)}") from None
    return db


def open_db(
    args: argparse.Namespace,
    url: str | None = None,
    option: str = "--db",
    *,
    readonly: bool | None = None,
    create: bool = True,
) -> DurableStore:
    """The store at ``url`` (named ``option`` in errors), or at ``--db``, with
    ``--durability``; read-only for the commands that only read (or as ``readonly`` says).
    ``create=False``: a missing database or schema is a usage error, as for a reader."""
    from durablesched.store.opening import open_store

    db = check_db(args.db if url is None else url, option)
    if readonly is None:
        readonly = url is None and getattr(args, "command", None) in READ_ONLY_COMMANDS
    with readable(db):
        return open_store(
            db, durability=durability_of(args.durability), readonly=readonly, create=create
        )


@contextmanager
def readable(db: str) -> Iterator[None]:
    """A missing database or one without the schema, met by a command that creates
    nothing, is a usage error (exit 2) naming it."""
    from durablesched.errors import DatabaseNotFoundError, SchemaMissingError

    try:
        yield
    except (DatabaseNotFoundError, SchemaMissingError) as e:
        raise UsageError(str(e)) from None
