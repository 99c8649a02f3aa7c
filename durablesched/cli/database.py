"""Opening the database that ``--db`` and ``--durability`` name.

The store is imported when a command runs, not when the parser is built, so
that ``--help`` does not have to load SQLAlchemy. The commands that only read
open the database read-only: they never create a file or a schema.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from durablesched.cli.errors import UsageError
from durablesched.cli.values import durability_of

if TYPE_CHECKING:
    from durablesched.store.protocol import DurableStore

#: Commands that only read: they open the database read-only and create nothing.
READ_ONLY_COMMANDS = frozenset({"ls", "show", "stats", "check"})


def open_db(args: argparse.Namespace, url: str | None = None) -> DurableStore:
    """The store at ``url``, or at ``--db``, with ``--durability``; read-only for the
    commands that only read."""
    from durablesched.store.opening import open_store

    db = args.db if url is None else url
    readonly = url is None and getattr(args, "command", None) in READ_ONLY_COMMANDS
    with readable(db):
        return open_store(db, durability=durability_of(args.durability), readonly=readonly)


@contextmanager
def readable(db: str) -> Iterator[None]:
    """A missing database or one without the schema, met by a command that creates
    nothing, is a usage error (exit 2) naming it."""
    from durablesched.errors import DatabaseNotFoundError, SchemaMissingError

    try:
        yield
    except (DatabaseNotFoundError, SchemaMissingError) as e:
        raise UsageError(str(e)) from None
