"""Live workers on SQL: registration, the heartbeat's mark, listing and pruning.

A worker's row is written at its start, its ``last_seen`` moved by each heartbeat
(in the heartbeat's own transaction, :meth:`SQLStore.heartbeat`), and deleted at
its clean exit; rows of workers gone for longer than
:data:`~durablesched.records.WORKER_FORGET_AFTER` are deleted when a worker
registers and by ``durablesched purge``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row

from durablesched.records import WORKER_FORGET_AFTER, WorkerInfo
from durablesched.store.sql.codec import from_db_time
from durablesched.store.sql.statements import (
    SQL_DEREGISTER_WORKER,
    SQL_FORGET_WORKERS,
    SQL_HELD_BY_OWNER,
    SQL_REGISTER_WORKER,
    SQL_WORKERS,
    SQL_WORKERS_UNSEEN,
)
from durablesched.store.sql.transactions import Transactions


def register_worker(tx: Transactions, worker: WorkerInfo, now: datetime) -> None:
    """Store the worker's row (replacing one of the same id) and prune forgotten ones."""
    params = {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": None if worker.queues is None else json.dumps(dict(worker.queues)),
        "concurrency": worker.concurrency,
        "version": worker.version,
        "started_at": tx._t(worker.started_at),
        "last_seen": tx._t(worker.last_seen),
        "lease_seconds": worker.lease.total_seconds(),
    }
    with tx._write(f"registering worker {worker.id}") as conn:
        _prune(tx, conn, now)
        conn.execute(SQL_REGISTER_WORKER, params)


def deregister_worker(tx: Transactions, worker_id: str) -> bool:
    with tx._write(f"deregistering worker {worker_id}") as conn:
        return bool(conn.execute(SQL_DEREGISTER_WORKER, {"id": worker_id}).rowcount)


def list_workers(tx: Transactions, now: datetime) -> list[WorkerInfo]:
    with tx._read("listing workers") as conn:
        rows = conn.execute(SQL_WORKERS).all()
        held = {
            r.lease_owner: (r.started, r.held - r.started) for r in conn.execute(SQL_HELD_BY_OWNER)
        }
    listed = [w for w in map(worker_info, rows) if not w.forgotten(now)]
    return [
        replace(w, running=held[w.id][0], waiting=held[w.id][1]) if w.id in held else w
        for w in listed
    ]


def prune_workers(tx: Transactions, now: datetime) -> int:
    with tx._write("pruning workers gone long ago") as conn:
        return _prune(tx, conn, now)


def _prune(tx: Transactions, conn: Connection, now: datetime) -> int:
    """Delete forgotten workers' rows: the SQL cuts at the shortest possible age (no
    lease), each row's own lease decides."""
    unseen = conn.execute(SQL_WORKERS_UNSEEN, {"before": tx._t(now - WORKER_FORGET_AFTER)})
    ids = [w.id for w in map(worker_info, unseen) if w.forgotten(now)]
    if ids:
        conn.execute(SQL_FORGET_WORKERS, {"ids": ids})
    return len(ids)


def worker_info(row: Row[Any]) -> WorkerInfo:
    """A worker's row (:data:`~.statements.WORKER_COLUMNS`) as a record."""
    queues = (
        None if row.queues is None else {str(q): int(n) for q, n in json.loads(row.queues).items()}
    )
    return WorkerInfo(
        id=row.id,
        host=row.host,
        pid=row.pid,
        queues=queues,
        concurrency=row.concurrency,
        version=row.version,
        started_at=from_db_time(row.started_at),
        last_seen=from_db_time(row.last_seen),
        lease=timedelta(seconds=row.lease_seconds),
    )
