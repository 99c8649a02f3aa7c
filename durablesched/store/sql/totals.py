"""Attempt totals on SQL: added in the outcome's own transaction, read summed.

One upsert per (queue, name, outcome, bucket) an outcome batch touches, in key
order (the order every writer locks these rows in: PostgreSQL workers then wait,
never deadlock), on the writer's shard row (``durablesched.totals``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from durablesched.store.sql.transactions import Transactions
from durablesched.totals import AttemptTotal, Tally, shard_of

#: Adds to a key's shard row, creating it at the first attempt. As the driver takes it
#: (``SQLDialect.prepared``): every group commit runs it.
ADD = (
    "INSERT INTO durablesched_attempt_totals "
    "(queue, name, outcome, bucket, shard, attempts, duration_us) "
    "VALUES (:queue, :name, :outcome, :bucket, :shard, :attempts, :duration_us) "
    "ON CONFLICT (queue, name, outcome, bucket, shard) DO UPDATE SET "
    "attempts = durablesched_attempt_totals.attempts + excluded.attempts, "
    "duration_us = durablesched_attempt_totals.duration_us + excluded.duration_us"
)
#: Every key's totals, the shards summed.
SQL_READ = text(
    "SELECT queue, name, outcome, bucket, sum(attempts) AS attempts, "
    "sum(duration_us) AS duration_us FROM durablesched_attempt_totals "
    "GROUP BY queue, name, outcome, bucket ORDER BY queue, name, outcome, bucket"
)


def add_totals(tx: Transactions, conn: Connection, tally: Tally, owner: str) -> None:
    """Add ``tally`` to the totals, on ``owner``'s shard, in the caller's transaction."""
    if not tally:
        return
    shard = shard_of(owner)
    tx._many(
        conn,
        tx.dialect.prepared(ADD),
        [
            {
                "queue": queue,
                "name": name,
                "outcome": outcome,
                "bucket": bucket,
                "shard": shard,
                "attempts": tally[queue, name, outcome, bucket][0],
                "duration_us": tally[queue, name, outcome, bucket][1],
            }
            for queue, name, outcome, bucket in sorted(tally)
        ],
    )


def read_totals(conn: Any) -> list[AttemptTotal]:
    return [
        AttemptTotal(r.queue, r.name, r.outcome, r.bucket, int(r.attempts), int(r.duration_us))
        for r in conn.execute(SQL_READ)
    ]
