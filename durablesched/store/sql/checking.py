"""A SQL store's health check (``durablesched check``): what is wrong, and what to do.

Not part of the Store protocol; ``SQLStore.check`` offers it. It only reads,
and a damaged database comes back as a finding, never as an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Connection

from durablesched.errors import StoreError
from durablesched.records import FINDING_IDS, Finding, HealthReport
from durablesched.store.sql.codec import from_db_time
from durablesched.store.sql.migrate import current_revision, head_revision, known_revisions
from durablesched.store.sql.scheduling import SQL_OVERDUE
from durablesched.store.sql.statements import (
    SQL_EXPIRED_COUNT,
    SQL_EXPIRED_IDS,
    SQL_KEYS_OUT_OF_STEP,
    sql_unclaimed,
)
from durablesched.store.sql.transactions import Transactions

#: What to do about a file SQLite cannot read as a database.
DAMAGED = (
    "stop the workers and restore the file from a backup, or recover what can be read "
    "with `sqlite3 FILE .recover | sqlite3 NEW.db`"
)


def damaged(error: Exception) -> Finding:
    """A database that could not be read, as a finding with what to do."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "not a database" in message or "not a SQLite database" in message:
        return Finding(
            "database",
            f"not a database: {message}",
            "check that --db names a durablesched database; " + DAMAGED,
        )
    if "malformed" in message:
        return Finding("database", f"database disk image is malformed: {message}", DAMAGED)
    return Finding("database", f"the database could not be read: {message}", DAMAGED)


def check(tx: Transactions, now: datetime, overdue_after: timedelta) -> HealthReport:
    """Integrity, schema revision, expired leases, overdue tasks and schedules, and the
    bookkeeping of limit keys: each section that fails to read becomes a finding of its own."""
    head = head_revision()
    findings: list[Finding] = []
    revision: str | None = None
    try:
        with tx._read("checking the database") as conn:
            revision = current_revision(conn)
            findings.extend(tx.dialect.integrity(conn))
            schema = _schema(conn, revision, head)
            findings.extend(schema)
            if revision is not None:
                # a schema older than queues has no paused queue to leave out
                queues = revision == head
                findings.extend(_tasks(conn, tx.dialect.time, now, overdue_after, queues))
            if revision == head:  # an older schema may have no schedules table
                findings.extend(_schedules(conn, tx.dialect.time, now, overdue_after))
                findings.extend(_keys(conn))
    except StoreError as e:
        findings.append(damaged(e))
    return HealthReport(tuple(findings), revision, head)


def _schema(conn: Connection, revision: str | None, head: str) -> list[Finding]:
    if revision == head:
        return []
    if revision is None:
        return [
            Finding(
                "schema",
                "the database has no durablesched schema",
                "run `durablesched migrate` to create it (or check that --db names the "
                "right database)",
            )
        ]
    if revision not in known_revisions():
        return [
            Finding(
                "schema",
                f"the schema is at revision {revision}, newer than this release knows "
                f"(head {head})",
                "upgrade durablesched to the version that wrote it",
            )
        ]
    return [
        Finding(
            "schema",
            f"the schema is at revision {revision}; this release needs {head}",
            "stop the workers and run `durablesched migrate`",
        )
    ]


def _tasks(
    conn: Connection,
    t: Callable[[datetime], object],
    now: datetime,
    overdue_after: timedelta,
    queues: bool,
) -> list[Finding]:
    findings: list[Finding] = []
    expired = conn.execute(SQL_EXPIRED_COUNT, {"now": t(now)}).one()
    if expired.n:
        ids = conn.execute(SQL_EXPIRED_IDS, {"now": t(now), "limit": FINDING_IDS}).scalars()
        findings.append(
            Finding.expired_leases(
                int(expired.n), from_db_time(expired.oldest), tuple(map(int, ids)), now
            )
        )
    before = t(now - overdue_after)
    count_sql, ids_sql = sql_unclaimed(paused_queues=queues)
    overdue = conn.execute(count_sql, {"before": before}).one()
    if overdue.n:
        ids = conn.execute(ids_sql, {"before": before, "limit": FINDING_IDS}).scalars()
        findings.append(
            Finding.overdue(
                int(overdue.n),
                from_db_time(overdue.oldest),
                tuple(map(int, ids)),
                now,
                overdue_after,
            )
        )
    return findings


def _schedules(
    conn: Connection, t: Callable[[datetime], object], now: datetime, overdue_after: timedelta
) -> list[Finding]:
    rows = conn.execute(SQL_OVERDUE, {"before": t(now - overdue_after)}).all()
    if not rows:
        return []
    oldest = from_db_time(rows[0].next_fire_at)
    return [Finding.overdue_schedules([r.name for r in rows], oldest, now, overdue_after)]


def _keys(conn: Connection) -> list[Finding]:
    """Limit keys whose bookkeeping is out of step with their tasks (the memory store
    computes its own: only a SQL database can drift, by a bug or a change by hand)."""
    keys = [(str(q), str(k)) for q, k in conn.execute(SQL_KEYS_OUT_OF_STEP)]
    return [Finding.limit_keys(keys)] if keys else []
