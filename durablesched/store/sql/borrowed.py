"""A caller's own driver connection (``sqlite3``, ``psycopg``), in the caller's transaction.

``submit(connection=)`` takes an SQLAlchemy ``Connection`` or the database
driver's own connection, the one a framework such as Django holds. The second
is wrapped here into the little the submit path uses of a connection
(:class:`~durablesched.store.sql.transactions.Executor`): statements are run
on the caller's connection through its own cursors, in whatever transaction
it is in. Nothing here begins, commits, rolls back or closes anything: the
tasks exist if and only if the caller's transaction commits.

Why not an SQLAlchemy ``Connection`` around it: SQLAlchemy would run its
first-connect queries and hooks on the caller's connection, and closing its
``Connection`` rolls the transaction back; the submit statements are plain
text, so they go to the driver as the hot path already sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import TextClause, exc

from durablesched.errors import InvalidTaskError
from durablesched.store.sql.dialect import SQLDialect


class DriverResult:
    """The rows of one statement, read at once (a cursor is not kept open)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def first(self) -> Any:
        """The first row (a tuple), or None if there is none."""
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        """The first column of the first row, or None if there is none."""
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        if len(self._rows) != 1:
            raise exc.NoResultFound(f"expected one row, got {len(self._rows)}")
        return self._rows[0][0]


class DriverConnection:
    """A driver connection as the submit path uses a connection: ``execute`` a text
    statement (``:name`` placeholders, converted for the driver), and ``connection``,
    whose ``cursor()`` the driver-level statements use."""

    __slots__ = ("_dialect", "_error", "connection")

    def __init__(self, connection: Any, dialect: SQLDialect, error: type[Exception]) -> None:
        self.connection = connection
        self._dialect = dialect
        self._error = error

    def execute(
        self, statement: TextClause, parameters: Mapping[str, Any] | None = None, /
    ) -> DriverResult:
        sql = self._dialect.driver(statement.text)
        params = dict(parameters or {})
        cursor = self.connection.cursor()
        try:
            cursor.execute(sql, params)
            return DriverResult(list(cursor.fetchall()) if cursor.description else [])
        except self._error as e:
            raise exc.DBAPIError.instance(sql, params, e, self._error) from e
        finally:
            cursor.close()


def borrow(connection: object, dialect: SQLDialect, dbapi: Any) -> DriverConnection:
    """``connection`` wrapped for the submit path, once it is known to be ``dbapi``'s own
    and in a transaction; else :class:`InvalidTaskError` saying what to do."""
    expected = getattr(dbapi, "Connection", None)
    if expected is None or not isinstance(connection, expected):
        raise InvalidTaskError(
            f"connection= must be an SQLAlchemy Connection or a {dbapi.__name__}.Connection "
            f"on this store's database, got {type(connection).__module__}."
            f"{type(connection).__qualname__}"
        )
    problem = dialect.borrowed_problem(connection) if dialect.borrowed_problem else None
    if problem is not None:
        raise InvalidTaskError(f"cannot submit in the caller's transaction: {problem}")
    return DriverConnection(connection, dialect, dbapi.Error)
