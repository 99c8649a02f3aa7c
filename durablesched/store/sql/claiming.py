"""Where a task is claimed: the dialect's claim statement, then its rows made into claims.

The claim runs inside a write transaction (alone, or after a group commit's
outcomes); the rows become :class:`Claim` objects only after the commit, so
the write lock is held for the statements alone.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from durablesched.records import Claim, effective_key
from durablesched.store.sql.codec import from_db_time
from durablesched.store.sql.statements import SQL_IN_PROCESS
from durablesched.store.sql.transactions import Transactions


def claim_rows(
    tx: Transactions,
    conn: Connection,
    *,
    owner: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    names: Collection[str] | None,
    process_names: Collection[str] = (),
) -> list[Any]:
    """Claim in ``conn``'s transaction; the rows for :func:`claims_from_rows`, to be made into
    claims after it commits."""
    if names is not None and not names:
        return []  # no name qualifies (and ``IN ()`` is no SQL)
    stamp = tx._t(now)
    params: dict[str, Any] = {
        "owner": owner,
        "lease_expires_at": tx._t(now + lease),
        "now": stamp,
        "limit": limit,
    }
    sql = tx.dialect.claim
    if names is not None:
        ordered = sorted(names)
        sql = tx.dialect.claim_for(len(ordered))
        params.update((f"n{i}", name) for i, name in enumerate(ordered))
    # id, seq, name, args, attempts, max_attempts, fence, due_at, idempotency_key
    rows = tx._rows(conn, sql, params)
    if not rows:
        return []
    in_process = [r[0] for r in rows if r[2] in process_names]
    if in_process:
        conn.execute(SQL_IN_PROCESS, {"ids": in_process})
    if not tx.dialect.writes_history:
        detail = f"claimed by {owner}"
        tx._many(
            conn,
            tx.dialect.insert_events,
            [(r[0], stamp, "RUNNING", r[4], detail) for r in rows],
        )
    return rows


def claims_from_rows(rows: list[Any], owner: str, now: datetime, lease: timedelta) -> list[Claim]:
    """Claims from the rows :func:`claim_rows` returned, in (due_at, seq) order."""
    rows.sort(key=lambda r: (r[7], r[1]))  # times compare as stored
    expires = now + lease
    due: dict[Any, datetime] = {}  # tasks submitted together share a due time
    result = []
    for task_id, seq, name, args, attempts, max_attempts, fence, due_at, key in rows:
        when = due.get(due_at)
        if when is None:
            when = due[due_at] = from_db_time(due_at)
        result.append(
            Claim(
                task_id=task_id,
                name=name,
                args={} if args == "{}" else json.loads(args),
                attempt=attempts,
                max_attempts=max_attempts,
                owner=owner,
                fence=fence,
                lease_expires_at=expires,
                due_at=when,
                seq=seq,
                idempotency_key=effective_key(task_id, key),
            )
        )
    return result
