"""The task list's filters, read from a query string: a :class:`TaskQuery`, or a
:class:`BadFilter` saying which one is wrong (a 400, never a traceback)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from durablesched.errors import InvalidTaskError
from durablesched.queues import check_queue
from durablesched.records import OLDEST, TaskQuery
from durablesched.states import TaskState
from durablesched.submission import MAX_KEY_LENGTH, check_name

#: The largest id a task can have (a 64-bit column).
MAX_ID = 2**63 - 1
#: A task id as text: ASCII digits only (``"²"`` and ``"١٢"`` are digits to Python).
_ID = re.compile(r"[0-9]{1,19}")

#: Tasks on one page of the list.
PAGE_SIZE = 50
#: The filters the list reads, in the order its form shows them.
FIELDS = ("state", "queue", "name", "key", "created_from", "created_until")


class BadFilter(ValueError):
    """A filter the list cannot read: the message names it and says what it takes."""


@dataclass(frozen=True)
class ListRequest:
    """A page of the task list as asked: the query, and the filters as given (for links)."""

    query: TaskQuery
    #: The filters given, by name, as text (empty ones left out).
    given: Mapping[str, str]

    def link(self, **changes: str | None) -> str:
        """The list's query string with ``changes`` (None removes a field)."""
        params = {**self.given, **changes}
        return urlencode({k: v for k, v in params.items() if v})


def read_id(value: str, what: str = "a task id") -> int:
    """A task id from a request: ASCII digits, at most :data:`MAX_ID` (a BadFilter else)."""
    text = value.strip()
    if not _ID.fullmatch(text) or int(text) > MAX_ID:
        raise BadFilter(f"{what} is a whole number from 0 to {MAX_ID}, got {value!r}")
    return int(text)


def read_filters(params: Mapping[str, str]) -> ListRequest:
    """The query in ``params`` (a request's query string), checked."""
    given = {k: params[k] for k in (*FIELDS, "before", "after") if params.get(k, "").strip()}
    state = None
    if "state" in given:
        try:
            state = TaskState(given["state"].strip().upper())
        except ValueError:
            names = ", ".join(s.value for s in TaskState)
            raise BadFilter(f"state must be one of {names}, got {given['state']!r}") from None
    try:
        queue = check_queue(given["queue"].strip(), "queue") if "queue" in given else None
        name = given.get("name")
        if name is not None:
            check_name(name, "name")
    except InvalidTaskError as e:
        raise BadFilter(str(e)) from None
    key = given.get("key")
    if key is not None and len(key) > MAX_KEY_LENGTH:
        raise BadFilter(f"key must be at most {MAX_KEY_LENGTH} characters (as keys are)")
    if key is not None and any(not ch.isprintable() for ch in key):
        # NUL, which PostgreSQL cannot take in text, and lone surrogates among them.
        raise BadFilter(f"key {key!r} contains control characters or lone surrogates")
    created_from = _time(given.get("created_from"), "created from")
    created_until = _time(given.get("created_until"), "created until")
    before = _cursor(given.get("before"), "before")
    after = _cursor(given.get("after"), "after")
    return ListRequest(
        TaskQuery(
            state=state,
            queue=queue,
            name=name,
            key=key,
            created_from=created_from,
            created_until=created_until,
            before=before,
            after=after,
        ),
        given,
    )


def _time(value: str | None, what: str) -> datetime | None:
    """An ISO 8601 time; without a zone (a browser's datetime-local field), UTC."""
    if value is None:
        return None
    try:
        return _utc(datetime.fromisoformat(value.strip()))
    except (ValueError, OverflowError):
        raise BadFilter(
            f"{what} must be a time from 0001-01-01 to 9999-12-31 UTC such as 2030-01-31T12:00 "
            f"(UTC) or with a zone, got {value!r}"
        ) from None


def _utc(when: datetime) -> datetime:
    """``when`` in UTC (UTC if it has no zone): OverflowError past the years 1 to 9999."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def cursor(created_at: datetime, task_id: int) -> str:
    """The ``before`` value of the page after a task: its creation time and id."""
    return f"{created_at.astimezone(UTC).replace(tzinfo=None).isoformat()}Z~{task_id}"


def _cursor(value: str | None, what: str) -> tuple[datetime, int] | None:
    if value is None:
        return None
    at, sep, number = value.strip().rpartition("~")
    try:
        if not sep:
            raise ValueError(value)
        return _utc(datetime.fromisoformat(at)), read_id(number)
    except (ValueError, OverflowError):
        raise BadFilter(
            f"{what} must be a page cursor from the list's links, got {value!r}"
        ) from None


#: The ``after`` cursor of the list's last page (older than every task).
LAST_PAGE = cursor(*OLDEST)
