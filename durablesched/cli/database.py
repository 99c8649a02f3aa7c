"""Opening the database that ``--db`` and ``--durability`` name.

The store is imported when a command runs, not when the parser is built, so
that ``--help`` does not have to load SQLAlchemy.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from durablesched.cli.values import durability_of

if TYPE_CHECKING:
    from durablesched.store.protocol import DurableStore


def open_db(args: argparse.Namespace, url: str | None = None) -> DurableStore:
    """The store at ``url``, or at ``--db``, with ``--durability``."""
    from durablesched.store.opening import open_store

    return open_store(args.db if url is None else url, durability=durability_of(args.durability))
