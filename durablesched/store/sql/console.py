"""What a dashboard reads and deletes in a SQL store (the ``Console`` protocol).

``SQLStore`` offers each as a method of the same name. Every read here is bounded
by an index: a page of the task list walks one of the ``ix_tasks_*_created``
indexes from its cursor, and the per-minute counts read the window's history
through ``ix_task_events_at`` (docs/dashboard.md, "Speed").
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from durablesched.errors import InvalidTransitionError, TaskNotFoundError
from durablesched.records import MinuteCounts, TaskQuery, TaskRecord
from durablesched.states import TaskState
from durablesched.store.sql.codec import record
from durablesched.store.sql.statements import SQL_DELETE_FINISHED, SQL_STATE, sql_find_tasks
from durablesched.store.sql.transactions import Transactions


def find_tasks(tx: Transactions, query: TaskQuery, limit: int) -> list[TaskRecord]:
    """A page of the filtered task list, newest first (``Console.find_tasks``)."""
    if limit <= 0:
        return []
    params: dict[str, Any] = {"limit": limit}
    for field in ("queue", "name", "key"):
        value = getattr(query, field)
        if value is not None:
            params[field] = value
    if query.created_from is not None:
        params["created_from"] = tx._t(query.created_from)
    if query.created_until is not None:
        params["created_until"] = tx._t(query.created_until)
    if query.before is not None:
        params["before_at"], params["before_id"] = tx._t(query.before[0]), query.before[1]
    if query.after is not None:
        params["after_at"], params["after_id"] = tx._t(query.after[0]), query.after[1]
    state = None if query.state is None else TaskState(query.state).value
    sql = _find_sql(
        state=state,
        queue=query.queue is not None,
        name=query.name is not None,
        key=query.key is not None,
        created_from=query.created_from is not None,
        created_until=query.created_until is not None,
        before=query.before is not None,
        after=query.after is not None,
        planned_by_statistics=tx.dialect.name == "postgresql",
        # A key's tasks are fewer than any state's: its own index then serves best.
        hint=tx.dialect.find_hints.get(state, ("", ""))
        if state is not None and query.key is None
        else ("", ""),
    )
    with tx._read("finding tasks") as conn:
        return [record(r) for r in conn.execute(sql, params)]


_find_sql = functools.cache(sql_find_tasks)


def minute_counts(tx: Transactions, since: datetime, now: datetime) -> list[MinuteCounts]:
    """Attempts that ended per minute of (``since``, ``now``] (``Console.minute_counts``)."""
    window = {"since": tx._t(since), "now": tx._t(now)}
    with tx._read("counting recent attempts") as conn:
        rows = conn.execute(tx.dialect.minute_counts, window).all()
    return [MinuteCounts(_minute(r.minute), int(r.succeeded), int(r.failed)) for r in rows]


def _minute(value: str | datetime) -> datetime:
    """A minute as the database gives it: SQLite's ``YYYY-MM-DD HH:MM``, or PostgreSQL's
    timestamp in UTC without a zone."""
    if isinstance(value, str):
        value = datetime.fromisoformat(f"{value}:00")
    return value.replace(tzinfo=UTC)


def delete_task(tx: Transactions, task_id: int) -> None:
    """Delete a finished task (``Console.delete_task``)."""
    with tx._write(f"deleting task {task_id}") as conn:
        if conn.execute(SQL_DELETE_FINISHED, {"id": task_id}).first() is not None:
            return
        state = conn.execute(SQL_STATE, {"id": task_id}).scalar()
    if state is None:
        raise TaskNotFoundError(f"no task with id {task_id}")
    raise InvalidTransitionError(
        f"task {task_id} is {state}: only a finished task (SUCCEEDED, FAILED or CANCELLED) "
        "can be deleted; cancel it first"
    )


__all__ = ["delete_task", "find_tasks", "minute_counts"]
