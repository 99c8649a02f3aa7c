"""Values as the tables hold them: times, JSON, and rows read back as records.

SQLite stores a time as fixed-width UTC text, PostgreSQL as ``timestamptz``;
both read back through :func:`from_db_time`. JSON is compact text on both
(PostgreSQL's ``jsonb`` comes back as text too, see ``create_postgres_engine``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row

from durablesched.records import ErrorInfo, Finished, TaskRecord, split_trace
from durablesched.states import TaskState

# -- times ---------------------------------------------------------------------------------------


#: ``len(to_db_time(t))``: ``YYYY-MM-DD HH:MM:SS.ffffff``, no offset.
STORED_TIME_LENGTH = 26


def to_db_time(when: datetime) -> str:
    """SQLite: UTC, fixed width, so that text order is time order and a person can read it."""
    return when.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def as_utc(when: datetime) -> datetime:
    """PostgreSQL: the datetime itself, in UTC, bound as ``timestamptz``."""
    return when.astimezone(UTC)


def from_db_time(value: str | datetime) -> datetime:
    """A stored time (SQLite's text or PostgreSQL's timestamptz) as an aware UTC datetime."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if len(value) == STORED_TIME_LENGTH:  # as to_db_time writes it: 6 times faster
        return datetime.fromisoformat(value + "+00:00")
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def opt_time(value: str | datetime | None) -> datetime | None:
    return None if value is None else from_db_time(value)


# -- JSON ----------------------------------------------------------------------------------------


def dump(value: Any) -> str:
    """Compact, and strict: NaN and infinities are refused, not stored as invalid JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def error_json(error: ErrorInfo) -> str:
    return dump(error.to_dict())


def error_from_json(value: str | None) -> ErrorInfo | None:
    if value is None:
        return None
    return ErrorInfo.from_dict(json.loads(value))


# -- rows ----------------------------------------------------------------------------------------


def record(row: Row[Any]) -> TaskRecord:
    """A row of ``TASK_COLUMNS`` (statements.py) as a :class:`TaskRecord`."""
    args, trace = split_trace(json.loads(row.args))
    return TaskRecord(
        id=row.id,
        seq=row.seq,
        name=row.name,
        args=args,
        state=TaskState(row.state),
        due_at=from_db_time(row.due_at),
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        lease_owner=row.lease_owner,
        lease_expires_at=opt_time(row.lease_expires_at),
        fence=row.fence,
        cancel_requested_at=opt_time(row.cancel_requested_at),
        result=None if row.result is None else json.loads(row.result),
        last_error=error_from_json(row.last_error),
        idempotency_key=row.idempotency_key,
        created_at=from_db_time(row.created_at),
        updated_at=from_db_time(row.updated_at),
        finished_at=opt_time(row.finished_at),
        environment=row.environment,
        queue=row.queue,
        priority=row.priority,
        trace=trace,
        limit_key=row.limit_key,
        debounce_key=row.debounce_key,
        started_at=opt_time(row.started_at),
        # (The column outlives the key, which the task gives up when it leaves PENDING.)
        debounce_until=None if row.debounce_key is None else opt_time(row.debounce_until),
    )


#: A state as stored, as the enum: a lookup, not ``TaskState(...)``'s call.
_STATES = {state.value: state for state in TaskState}


def finished_outcomes(rows: Sequence[Sequence[Any]]) -> dict[int, Finished | None]:
    """Rows of ``SQLDialect.finished_outcomes`` (``id, name, state, attempts, result,
    last_error, finished_at``, from the driver; ``state`` NULL: no such task) as
    :class:`Finished` by id, the results decoded together (:func:`decode_all`)."""
    texts = [r[4] for r in rows if r[4] is not None]
    results = iter(decode_all(texts))
    found: dict[int, Finished | None] = {}
    states, new, decoded = _STATES, new_tuple, next
    for row_id, name, state, attempts, result, error, finished_at in rows:
        task_id = int(row_id)
        # The tuple made directly: Finished's own __new__ is a Python function, and
        # one is made per result read.
        found[task_id] = (
            None
            if state is None
            else new(
                Finished,
                (
                    task_id,
                    name,
                    states[state],
                    attempts,
                    None if result is None else decoded(results),
                    None if error is None else error_from_json(error),
                    None if finished_at is None else from_db_time(finished_at),
                ),
            )
        )
    return found


#: Makes a named tuple of all its fields without its Python-level ``__new__``.
new_tuple = tuple.__new__


def decode_all(texts: list[str]) -> list[Any]:
    """Stored JSON values (each complete as stored), decoded in one ``json.loads`` of
    them all: a seventh of the cost of one per value."""
    if not texts:
        return []
    if len(texts) == 1:
        return [json.loads(texts[0])]
    values = json.loads("[" + ",".join(texts) + "]")
    if not isinstance(values, list) or len(values) != len(texts):  # pragma: no cover
        raise ValueError("a stored result is not one JSON value")  # as stored: never
    return values
