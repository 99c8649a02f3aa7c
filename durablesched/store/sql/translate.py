"""Database errors in durablesched's terms: what failed, and whether to try again.

Callers see :class:`StoreError`, :class:`SchemaError` or :class:`CorruptDatabase`
(a damaged file: permanent, not worth a retry), never a driver's exception;
the messages name the operation (tests assert them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc

from durablesched.errors import CorruptDatabase, SchemaError, StoreError

#: SQLite's primary result codes for a lock held by another connection.
SQLITE_BUSY, SQLITE_LOCKED = 5, 6
#: SQLite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26
#: Their messages, for a driver that gives no code.
CORRUPT_MESSAGES = ("database disk image is malformed", "file is not a database")


def is_busy(error: exc.DBAPIError) -> bool:
    """SQLite's 'database is locked': worth retrying the BEGIN."""
    code = getattr(error.orig, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
    return "database is locked" in str(error.orig)


def is_corrupt(error: exc.DBAPIError) -> bool:
    """SQLite says the file is damaged: permanent, whatever is retried."""
    code = getattr(error.orig, "sqlite_errorcode", None)
    if code is not None and int(code) & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return True
    return any(m in str(error.orig) for m in CORRUPT_MESSAGES)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Database errors leave as StoreError (or SchemaError) naming what failed."""
    try:
        yield
    except exc.DBAPIError as e:
        message = str(e.orig) if e.orig is not None else str(e)
        if is_corrupt(e):
            raise CorruptDatabase(f"{what} failed: {message.strip()}") from e
        if "no such table" in message or ("relation" in message and "does not exist" in message):
            raise SchemaError(f"{what}: the durablesched schema is missing ({message})") from e
        if "\\u0000" in message:
            raise StoreError(
                f"{what} failed: PostgreSQL cannot store the NUL character (\\u0000) in "
                f"JSON or text ({message.splitlines()[0]})"
            ) from e
        raise StoreError(f"{what} failed: {message.strip()}") from e
