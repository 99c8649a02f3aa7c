"""Checking a database by its ``--db`` value: open it however it is, and say what is wrong.

:meth:`~durablesched.store.protocol.Operator.check` needs an open store; a file
that is not a database, or is damaged, cannot be opened at all. This opens
read-only, at any schema revision, and turns a failure to open into a finding.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from durablesched.errors import DatabaseNotFoundError, StoreError
from durablesched.records import OVERDUE_AFTER, HealthReport
from durablesched.store.opening import open_store
from durablesched.store.sql.checking import damaged


def check_database(
    db: str | os.PathLike[str], now: datetime, *, overdue_after: timedelta = OVERDUE_AFTER
) -> HealthReport:
    """The health of the database ``db`` names; creates and changes nothing.

    :class:`DatabaseNotFoundError` if there is no such database; everything else
    wrong with it is a finding.
    """
    try:
        store = open_store(db, readonly=True, verify_schema=False)
    except DatabaseNotFoundError:
        raise
    except StoreError as e:
        return HealthReport((damaged(e),))
    try:
        return store.check(now, overdue_after=overdue_after)
    finally:
        store.close()
