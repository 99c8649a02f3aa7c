"""What the store must know about a database: its own statements and how it binds values.

Each database's module (:mod:`.sqlite`, :mod:`.postgres`) builds one
:class:`SQLDialect` from its statements; the store runs whichever it is given,
and knows neither database by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import TextClause


def pyformat(sql: str) -> str:
    """``:name`` placeholders as psycopg's ``%(name)s`` (the statements hold no ``%``)."""
    assert "%" not in sql and "::" not in sql, sql
    return re.sub(r"(?<![\w:]):(\w+)", r"%(\1)s", sql)


@dataclass(frozen=True)
class SQLDialect:
    """The statements and conversions that differ between the databases.

    The hot-path statements (claim, heartbeat, group commit) are handed straight
    to the driver: SQLAlchemy's work per statement costs more than the statement
    (docs/performance.md). They are written with ``:name`` placeholders.
    """

    name: str
    claim: str
    #: The claim limited to some names; ``{names}`` takes one placeholder per name.
    claim_named: str
    heartbeat: str
    complete_many: str
    next_due_named: TextClause
    insert_task: str
    insert_events: str
    record_keys: str
    #: How a datetime is bound: text on SQLite, timestamptz on PostgreSQL.
    time: Callable[[datetime], Any]
    #: A ``:name`` statement as the driver takes it.
    driver: Callable[[str], str] = str
    #: Run first in a submitting transaction, if the database needs it.
    lock_submissions: TextClause | None = None
    #: Run in a transaction whose commit should wake idle workers elsewhere.
    notify: TextClause | None = None
    #: The claim and group-commit statements write their own history lines and keys.
    writes_history: bool = False

    def claim_for(self, count: int) -> str:
        """The claim for ``count`` names, bound as ``n0`` ... (cached: names rarely change)."""
        cached = _CLAIMS.get((self.name, count))
        if cached is None:
            names = ", ".join(f":n{i}" for i in range(count))
            cached = self.driver(self.claim_named.replace("{names}", names))
            _CLAIMS[(self.name, count)] = cached
        return cached


_CLAIMS: dict[tuple[str, int], str] = {}
