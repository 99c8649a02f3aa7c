"""Schedules on SQL: kept in ``schedules``, each fire once in ``schedule_fires``.

The statements are the same on both databases. A fire is made in the worker's
step (``fire_schedules``), in one write transaction per call: for each due
schedule, the next fire time is advanced only if it is still the one read
(``SQL_ADVANCE``'s WHERE), and each fire is recorded under the primary key
(schedule, fire time) with ``ON CONFLICT DO NOTHING`` before its task is
inserted through :func:`~durablesched.store.sql.submitting.insert`, the path
every submit takes. A second worker's attempt at the same fire changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, text

from durablesched.schedules.declaration import (
    Fired,
    Origin,
    Schedule,
    ScheduleInfo,
    ScheduleStatus,
)
from durablesched.schedules.firing import PlannedFire, due_fires, run_now
from durablesched.schedules.sync import conflict, not_found, sync_plan
from durablesched.schedules.timing import Misfire, Overlap
from durablesched.states import TaskState
from durablesched.store.sql.codec import dump, from_db_time, opt_time
from durablesched.store.sql.submitting import insert
from durablesched.store.sql.transactions import Transactions

#: A schedule's settings, in the order :func:`_schedule` reads them.
SETTINGS = (
    "name, task, args, cron, every_seconds, timezone, misfire, max_catch_up, "
    "misfire_grace_seconds, overlap, max_attempts, queue, priority"
)
ROW = f"{SETTINGS}, status, origin, next_fire_at, created_at, updated_at"

#: One schedule, by name.
SQL_SCHEDULE = text(f"SELECT {ROW} FROM schedules WHERE name = :name")
#: Every schedule, for the sync.
SQL_ALL = text(f"SELECT {ROW} FROM schedules ORDER BY name")
#: A new schedule, unless another process stored that name a moment ago (workers
#: starting together all sync): then nothing, and the caller reads what is there.
SQL_INSERT = text(
    f"INSERT INTO schedules ({ROW}) VALUES (:name, :task, :args, :cron, :every_seconds, "
    ":timezone, :misfire, :max_catch_up, :misfire_grace_seconds, :overlap, :max_attempts, "
    ":queue, :priority, :status, :origin, :next_fire_at, :now, :now) "
    "ON CONFLICT (name) DO NOTHING"
)
#: New settings, status and origin for a stored schedule (and its next fire time).
SQL_UPDATE = text(
    "UPDATE schedules SET task = :task, args = :args, cron = :cron, "
    "every_seconds = :every_seconds, timezone = :timezone, misfire = :misfire, "
    "max_catch_up = :max_catch_up, misfire_grace_seconds = :misfire_grace_seconds, "
    "overlap = :overlap, max_attempts = :max_attempts, queue = :queue, priority = :priority, "
    "status = :status, origin = :origin, next_fire_at = :next_fire_at, updated_at = :now "
    "WHERE name = :name"
)
#: A status (and next fire time) changed by an operator or the sync.
SQL_SET_STATUS = text(
    "UPDATE schedules SET status = :status, next_fire_at = :next_fire_at, updated_at = :now "
    "WHERE name = :name"
)
SQL_DELETE = text("DELETE FROM schedules WHERE name = :name")
SQL_DELETE_FIRES = text("DELETE FROM schedule_fires WHERE schedule = :name")
#: Active schedules whose next fire time has come, earliest first (ix_schedules_next_fire).
SQL_DUE = text(
    f"SELECT {ROW} FROM schedules WHERE status = 'active' AND next_fire_at <= :now "
    "ORDER BY next_fire_at, name LIMIT :limit"
)
#: Advance the next fire time, if nobody has since the read: the step's claim on its fires.
SQL_ADVANCE = text(
    "UPDATE schedules SET next_fire_at = :next_fire_at WHERE name = :name "
    "AND next_fire_at = :was AND status = 'active'"
)
#: One fire, at most once ever: nothing comes back if it was recorded before.
SQL_RECORD_FIRE = text(
    "INSERT INTO schedule_fires (schedule, fire_at, kind, task_id, skipped, fired_at) "
    "VALUES (:name, :fire_at, :kind, NULL, :skipped, :now) "
    "ON CONFLICT (schedule, fire_at) DO NOTHING RETURNING fire_at"
)
SQL_FIRE_TASK = text(
    "UPDATE schedule_fires SET task_id = :task_id WHERE schedule = :name AND fire_at = :fire_at"
)
SQL_FIRE = text(
    "SELECT task_id, skipped FROM schedule_fires WHERE schedule = :name AND fire_at = :fire_at"
)
#: The state of the task of the schedule's latest fire that made one.
SQL_PREVIOUS_STATE = text(
    "SELECT t.state FROM schedule_fires f JOIN tasks t ON t.id = f.task_id "
    "WHERE f.schedule = :name ORDER BY f.fire_at DESC LIMIT 1"
)
#: Every schedule with its latest fire and that fire's task's state.
SQL_LIST = text(
    f"SELECT {', '.join('s.' + c for c in ROW.split(', '))}, "
    "f.fire_at AS last_fire_at, f.task_id AS last_task_id, f.skipped AS last_skip, "
    "t.state AS last_task_state "
    "FROM schedules s "
    "LEFT JOIN schedule_fires f ON f.schedule = s.name AND f.fire_at = "
    "(SELECT MAX(fire_at) FROM schedule_fires WHERE schedule = s.name) "
    "LEFT JOIN tasks t ON t.id = f.task_id ORDER BY s.name"
)
#: Active schedules that should have fired before ``:before`` (ix_schedules_next_fire).
SQL_OVERDUE = text(
    "SELECT name, next_fire_at FROM schedules WHERE status = 'active' "
    "AND next_fire_at < :before ORDER BY next_fire_at, name"
)
#: The earliest next fire time of an active schedule.
SQL_NEXT_FIRE = text("SELECT MIN(next_fire_at) FROM schedules WHERE status = 'active'")


def sync_schedules(
    tx: Transactions, declared: Sequence[Schedule], now: datetime, tasks: Collection[str]
) -> dict[str, str]:
    with tx._write("syncing the schedules declared in code") as conn:
        rows = {r.name: r for r in conn.execute(SQL_ALL)}
        stored = {n: (_schedule(r), r.status, r.origin) for n, r in rows.items()}
        changes = sync_plan(stored, declared, tasks)
        for name, (_change, schedule, status) in changes.items():
            row = rows.get(name)
            if row is None:
                assert schedule is not None
                _insert(tx, conn, schedule, Origin.CODE, now)
                continue
            next_fire_at = from_db_time(row.next_fire_at)
            if schedule is None:
                conn.execute(
                    SQL_SET_STATUS,
                    {"name": name, "status": status, "next_fire_at": tx._t(next_fire_at),
                     "now": tx._t(now)},
                )  # fmt: skip
                continue
            if not schedule.same_timing(stored[name][0]):
                next_fire_at = schedule.times().next_after(now)
            params = _params(tx, schedule)
            params.update(
                status=status,
                origin=Origin.CODE,
                next_fire_at=tx._t(next_fire_at),
                now=tx._t(now),
            )
            conn.execute(SQL_UPDATE, params)
        return {name: change for name, (change, _, _) in changes.items()}


def add_schedule(tx: Transactions, schedule: Schedule, now: datetime) -> bool:
    with tx._write(f"adding schedule {schedule.name!r}") as conn:
        row = conn.execute(SQL_SCHEDULE, {"name": schedule.name}).first()
        if row is None and _insert(tx, conn, schedule, Origin.OPERATOR, now):
            return True
        row = row or conn.execute(SQL_SCHEDULE, {"name": schedule.name}).one()
        if _schedule(row) != schedule:
            raise conflict(schedule.name)
        return False


def pause_schedule(tx: Transactions, name: str, paused: bool, now: datetime) -> ScheduleInfo:
    with tx._write(f"{'pausing' if paused else 'resuming'} schedule {name!r}") as conn:
        row = conn.execute(SQL_SCHEDULE, {"name": name}).first()
        if row is None:
            raise not_found(name)
        wanted = ScheduleStatus.PAUSED if paused else ScheduleStatus.ACTIVE
        if row.status != wanted:
            next_fire_at = from_db_time(row.next_fire_at)
            if not paused:
                next_fire_at = _schedule(row).times().next_after(now)
            conn.execute(
                SQL_SET_STATUS,
                {"name": name, "status": wanted, "next_fire_at": tx._t(next_fire_at),
                 "now": tx._t(now)},
            )  # fmt: skip
    return next(i for i in list_schedules(tx) if i.schedule.name == name)


def remove_schedule(tx: Transactions, name: str) -> None:
    with tx._write(f"removing schedule {name!r}") as conn:
        conn.execute(SQL_DELETE_FIRES, {"name": name})
        if conn.execute(SQL_DELETE, {"name": name}).rowcount == 0:
            raise not_found(name)


def list_schedules(tx: Transactions) -> list[ScheduleInfo]:
    with tx._read("listing schedules") as conn:
        rows = conn.execute(SQL_LIST).all()
    return [
        ScheduleInfo(
            schedule=_schedule(r),
            status=r.status,
            origin=r.origin,
            next_fire_at=from_db_time(r.next_fire_at),
            last_fire_at=opt_time(r.last_fire_at),
            last_task_id=r.last_task_id,
            last_task_state=None if r.last_task_state is None else TaskState(r.last_task_state),
            last_skip=r.last_skip,
            created_at=from_db_time(r.created_at),
            updated_at=from_db_time(r.updated_at),
        )
        for r in rows
    ]


def fire_schedules(tx: Transactions, now: datetime, limit: int) -> list[Fired]:
    fired: list[Fired] = []
    with tx._write("firing schedules") as conn:
        for row in conn.execute(SQL_DUE, {"now": tx._t(now), "limit": limit}).all():
            schedule = _schedule(row)
            was = from_db_time(row.next_fire_at)
            previous = conn.execute(SQL_PREVIOUS_STATE, {"name": schedule.name}).scalar()
            state = None if previous is None else TaskState(previous)
            fires, next_fire_at = due_fires(schedule, was, now, state)
            params = {"name": schedule.name, "next_fire_at": tx._t(next_fire_at)}
            advanced = conn.execute(SQL_ADVANCE, {**params, "was": row.next_fire_at}).rowcount
            if not advanced:
                continue  # fired by another worker since the read (PostgreSQL)
            for fire in fires:
                done = _record_fire(tx, conn, schedule.name, fire, now)
                if done is not None:
                    fired.append(done)
    return fired


def fire_schedule_now(tx: Transactions, name: str, now: datetime) -> Fired:
    with tx._write(f"running schedule {name!r} now") as conn:
        row = conn.execute(SQL_SCHEDULE, {"name": name}).first()
        if row is None:
            raise not_found(name)
        done = _record_fire(tx, conn, name, run_now(_schedule(row), now), now)
        if done is not None:
            return done
        fire = conn.execute(SQL_FIRE, {"name": name, "fire_at": tx._t(now)}).one()
        return Fired(name, now, False, fire.task_id, fire.skipped)


def next_fire_time(tx: Transactions) -> datetime | None:
    with tx._read("finding the next fire time") as conn:
        value = conn.execute(SQL_NEXT_FIRE).scalar()
    return opt_time(value)


# -- internals ----------------------------------------------------------------------------------


def _record_fire(
    tx: Transactions, conn: Connection, name: str, fire: PlannedFire, now: datetime
) -> Fired | None:
    """Record one fire and make its task, in ``conn``'s transaction; None if recorded before."""
    params: dict[str, Any] = {
        "name": name,
        "fire_at": tx._t(fire.at),
        "kind": fire.kind,
        "skipped": fire.skipped,
        "now": tx._t(now),
    }
    if conn.execute(SQL_RECORD_FIRE, params).first() is None:
        return None
    task_id = None
    if fire.task is not None:
        (submitted,) = insert(tx, conn, [fire.task], now)
        task_id = submitted.task_id
        conn.execute(SQL_FIRE_TASK, {**params, "task_id": task_id})
    return Fired(name, fire.at, fire.catch_up, task_id, fire.skipped)


def _insert(
    tx: Transactions, conn: Connection, schedule: Schedule, origin: str, now: datetime
) -> bool:
    """Store a new schedule; False if another process stored one of that name first."""
    params = _params(tx, schedule)
    params.update(
        status=ScheduleStatus.ACTIVE,
        origin=origin,
        next_fire_at=tx._t(schedule.times().next_after(now)),
        now=tx._t(now),
    )
    return bool(conn.execute(SQL_INSERT, params).rowcount)


def _params(tx: Transactions, schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "task": schedule.task,
        "args": dump(schedule.args),
        "cron": schedule.cron,
        "every_seconds": None if schedule.every is None else int(schedule.every.total_seconds()),
        "timezone": schedule.timezone,
        "misfire": schedule.misfire.value,
        "max_catch_up": schedule.max_catch_up,
        "misfire_grace_seconds": schedule.misfire_grace.total_seconds(),
        "overlap": schedule.overlap.value,
        "max_attempts": schedule.max_attempts,
        "queue": schedule.queue,
        "priority": schedule.priority,
    }


def _schedule(row: Row[Any]) -> Schedule:
    """A stored row's settings (checked when they were stored)."""
    args_json = row.args
    return Schedule(
        name=row.name,
        task=row.task,
        args=json.loads(args_json),
        cron=row.cron,
        every=None if row.every_seconds is None else timedelta(seconds=row.every_seconds),
        timezone=row.timezone,
        misfire=Misfire(row.misfire),
        max_catch_up=row.max_catch_up,
        misfire_grace=timedelta(seconds=row.misfire_grace_seconds),
        overlap=Overlap(row.overlap),
        max_attempts=row.max_attempts,
        queue=row.queue,
        priority=row.priority,
        args_json=args_json,
    )
