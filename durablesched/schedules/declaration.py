"""What a schedule is declared with, checked; what one looks like stored; its tasks' keys.

Every check runs before anything is stored: a bad declaration raises
:class:`InvalidScheduleError` naming the problem, and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from durablesched.errors import InvalidScheduleError, InvalidTaskError, UnknownTaskNameError
from durablesched.queues import check_priority, check_queue
from durablesched.schedules.timing import (
    DEFAULT_GRACE,
    CronTimes,
    EveryTimes,
    FireTimes,
    Misfire,
    Overlap,
)
from durablesched.states import TaskState
from durablesched.submission import MAX_ATTEMPTS, check_args, check_name

if TYPE_CHECKING:
    from durablesched.registry import TaskRegistry

#: Characters in a schedule's name: its tasks' idempotency keys carry it and a fire time.
MAX_SCHEDULE_NAME = 150
#: The shortest ``every=``: fire times are kept to the second, like cron's.
MIN_EVERY = timedelta(seconds=1)
#: The longest ``every=`` and misfire grace (ten years).
MAX_EVERY = timedelta(days=3650)
#: The most catch-up runs ``misfire="all"`` may make in one go.
MAX_CATCH_UP = 10_000
DEFAULT_MAX_CATCH_UP = 100


@dataclass(frozen=True)
class Schedule:
    """A periodic task, checked: build one with :func:`schedule`, not directly.

    Exactly one of ``cron`` (in ``timezone``) and ``every`` is set. Two
    schedules are the same declaration when every field is equal.
    """

    name: str
    task: str
    args: dict[str, Any]
    cron: str | None
    every: timedelta | None
    timezone: str
    misfire: Misfire
    max_catch_up: int
    misfire_grace: timedelta
    overlap: Overlap
    max_attempts: int
    #: The queue and priority of its tasks (None: the task's own, else the defaults).
    queue: str | None = None
    priority: int | None = None
    #: ``args`` as JSON text, as stored.
    args_json: str = field(default="{}", compare=False, repr=False)

    def times(self) -> FireTimes:
        """The fire times, as :mod:`~durablesched.schedules.timing` computes them."""
        if self.every is not None:
            return EveryTimes(self.every)
        assert self.cron is not None
        return CronTimes(self.cron, ZoneInfo(self.timezone))

    @property
    def expression(self) -> str:
        """How ``schedule ls`` shows when it fires: the cron expression, or ``every 300s``."""
        if self.every is not None:
            return f"every {self.every.total_seconds():g}s"
        return str(self.cron)

    def same_timing(self, other: Schedule) -> bool:
        """True if both fire at the same times (then a stored next fire time still holds)."""
        return (self.cron, self.every, self.timezone) == (other.cron, other.every, other.timezone)


def schedule(
    task: str,
    *,
    name: str | None = None,
    cron: str | None = None,
    every: timedelta | float | None = None,
    timezone: str = "UTC",
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    misfire: str | Misfire = Misfire.LATEST,
    max_catch_up: int = DEFAULT_MAX_CATCH_UP,
    misfire_grace: timedelta | float = DEFAULT_GRACE,
    overlap: str | Overlap = Overlap.SKIP,
    max_attempts: int = 3,
) -> Schedule:
    """A checked :class:`Schedule`, or :class:`InvalidScheduleError` naming what is wrong.

    ``name`` defaults to the task's name. The caller checks the task name
    against its registry (and passes the task's own attempts).
    """
    schedule_name = task if name is None else name
    what = f"schedule {schedule_name!r}"
    _invalid(check_name, schedule_name, "schedule name")
    if len(schedule_name) > MAX_SCHEDULE_NAME:
        raise InvalidScheduleError(f"schedule name is longer than {MAX_SCHEDULE_NAME} characters")
    _invalid(check_name, task, f"{what}: task name")
    checked_args, args_json = _invalid(check_args, args, f"{what}: args")
    if (cron is None) == (every is None):
        raise InvalidScheduleError(f"{what}: give either cron= or every=, not both or neither")
    zone = check_timezone(timezone, what)
    interval: timedelta | None = None
    if cron is not None:
        cron = check_cron(cron, what)
    else:
        assert every is not None
        interval = _duration(every, f"{what}: every", MIN_EVERY)
        if zone != "UTC":
            raise InvalidScheduleError(
                f"{what}: every= is elapsed time, the same in every time zone: "
                f"drop timezone={timezone!r} (or use cron=)"
            )
    return Schedule(
        name=schedule_name,
        task=task,
        args=checked_args,
        cron=cron,
        every=interval,
        timezone=zone,
        misfire=_choice(Misfire, misfire, f"{what}: misfire"),
        max_catch_up=_int_in(max_catch_up, range(1, MAX_CATCH_UP + 1), f"{what}: max_catch_up"),
        misfire_grace=_duration(misfire_grace, f"{what}: misfire_grace", timedelta(0)),
        overlap=_choice(Overlap, overlap, f"{what}: overlap"),
        max_attempts=_int_in(max_attempts, range(1, MAX_ATTEMPTS + 1), f"{what}: max_attempts"),
        queue=None if queue is None else _invalid(check_queue, queue, f"{what}: queue"),
        priority=None
        if priority is None
        else _invalid(check_priority, priority, f"{what}: priority"),
        args_json=args_json,
    )


def checked_schedule(
    registry: TaskRegistry | None, task: str, *, name: str | None = None, **settings: Any
) -> Schedule:
    """:func:`schedule`, with the task looked up in ``registry``: it must be registered,
    ``args`` must fit its function, and its retry policy gives the attempts."""
    if registry is not None:
        if not isinstance(task, str) or task not in registry:
            raise UnknownTaskNameError(
                f"schedule {task if name is None else name!r}: no task is registered "
                f"under the name {task!r}"
            )
        settings.setdefault("max_attempts", registry.retry_policy(task).max_attempts)
        # Unless the schedule says, its tasks go where the task's submits go.
        if settings.get("queue") is None:
            settings["queue"] = registry.get(task).queue
        if settings.get("priority") is None:
            settings["priority"] = registry.get(task).priority
    declared = schedule(task, name=name, **settings)
    if registry is not None:
        problem = registry.get(task).mismatch(declared.args)
        if problem is not None:
            raise InvalidScheduleError(
                f"schedule {declared.name!r}: args do not fit the function of task "
                f"{task!r} ({registry.get(task).call_signature()}): {problem}"
            )
    return declared


def check_cron(expression: object, what: str) -> str:
    """A cron expression of 5 fields (minute hour day month weekday), or 6 with seconds first."""
    if not isinstance(expression, str):
        raise InvalidScheduleError(f"{what}: cron must be a string, got {expression!r}")
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise InvalidScheduleError(
            f"{what}: cron {expression!r} must have 5 fields (minute hour day month weekday) "
            f"or 6 (seconds first), got {len(fields)}"
        )
    normal = " ".join(fields)
    try:
        next(CronSim(normal, datetime(2000, 1, 1)))
    except CronSimError as e:
        raise InvalidScheduleError(f"{what}: cron {expression!r} is not valid: {e}") from None
    except StopIteration:  # pragma: no cover - cronsim's iteration does not end
        raise InvalidScheduleError(f"{what}: cron {expression!r} never fires") from None
    return normal


def check_timezone(timezone: object, what: str) -> str:
    """An IANA time zone name that ``zoneinfo`` knows (``Europe/Berlin``, ``UTC``)."""
    if not isinstance(timezone, str) or not timezone:
        raise InvalidScheduleError(f"{what}: timezone must be a zone name, got {timezone!r}")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidScheduleError(
            f"{what}: unknown time zone {timezone!r} (an IANA name such as 'Europe/Berlin')"
        ) from None
    return timezone


def _invalid(check: Any, value: Any, what: str) -> Any:
    """``check(value, what)``, its InvalidTaskError raised as an InvalidScheduleError."""
    try:
        return check(value, what)
    except InvalidTaskError as e:
        raise InvalidScheduleError(str(e)) from None


def _choice(kind: Any, value: object, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = " or ".join(repr(c.value) for c in kind)
        raise InvalidScheduleError(f"{what} must be {choices}, got {value!r}") from None


def _int_in(value: object, allowed: range, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise InvalidScheduleError(
            f"{what} must be an integer from {allowed.start} to {allowed.stop - 1}, got {value!r}"
        )
    return value


def _duration(value: object, what: str, minimum: timedelta) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidScheduleError(f"{what} must be a timedelta or seconds, got {value!r}")
    try:
        step = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except (OverflowError, ValueError):
        raise InvalidScheduleError(f"{what} must be a finite duration, got {value!r}") from None
    if step < minimum or step > MAX_EVERY:
        raise InvalidScheduleError(
            f"{what} must be from {minimum.total_seconds():g}s to {MAX_EVERY.days} days, "
            f"got {step.total_seconds():g}s"
        )
    if minimum > timedelta(0) and step.microseconds:
        raise InvalidScheduleError(f"{what} must be a whole number of seconds, got {value!r}")
    return step


# -- what a schedule looks like stored --------------------------------------------------------


class ScheduleStatus:
    """A stored schedule's status (plain strings: they are stored as they are)."""

    #: Fires at its times.
    ACTIVE = "active"
    #: Paused by an operator: fires nothing until resumed.
    PAUSED = "paused"
    #: Declared in code once, and no longer: kept, firing nothing, until declared again.
    REMOVED = "removed from code"

    ALL = (ACTIVE, PAUSED, REMOVED)


class Origin:
    """Where a stored schedule was declared."""

    #: ``registry.schedule(...)``, synced when a worker starts.
    CODE = "code"
    #: ``durablesched schedule add`` or ``Scheduler.add_schedule``.
    OPERATOR = "operator"


@dataclass(frozen=True)
class ScheduleInfo:
    """A stored schedule, what it last did and when it fires next."""

    schedule: Schedule
    status: str
    origin: str
    next_fire_at: datetime
    last_fire_at: datetime | None
    #: The task the last fire made (None: none yet, or that fire was skipped).
    last_task_id: int | None
    last_task_state: TaskState | None
    #: Why the last fire made no task ("overlap": the task before was still live).
    last_skip: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Fired:
    """One fire time a step handled: the task made for it, or why none was."""

    schedule: str
    fire_at: datetime
    catch_up: bool
    task_id: int | None
    #: None if a task was made; "overlap" if the previous fire's task was still live.
    skipped: str | None = None


#: Why a fire made no task: the previous fire's task was still PENDING, RUNNING or RETRY_WAIT.
SKIPPED_OVERLAP = "overlap"

# -- the idempotency key of a fired task ------------------------------------------------------

KEY_PREFIX = "schedule:"
CATCH_UP = "catch-up"
RUN_NOW = "run-now"
_KEY = re.compile(
    r"^schedule:(?P<name>.+):(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?Z)"
    r"(?::(?P<kind>catch-up|run-now))?$",
    re.S,
)


def fire_key(name: str, fire_at: datetime, kind: str | None = None) -> str:
    """``schedule:<name>:<fire time, ISO 8601 UTC>``, with ``:catch-up`` or ``:run-now``
    for those fires: unique per fire, the same on every attempt of its task."""
    at = fire_at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    return f"{KEY_PREFIX}{name}:{at}" + (f":{kind}" if kind else "")


@dataclass(frozen=True)
class FireKey:
    """What a fired task's idempotency key says."""

    schedule: str
    fire_at: datetime
    kind: str | None

    @property
    def catch_up(self) -> bool:
        return self.kind == CATCH_UP


def parse_fire_key(key: str | None) -> FireKey | None:
    """The schedule and fire time a key carries, or None for a task no schedule made."""
    if key is None or not key.startswith(KEY_PREFIX):
        return None
    match = _KEY.match(key)
    if match is None:
        return None
    at = datetime.fromisoformat(match["at"][:-1]).replace(tzinfo=UTC)
    return FireKey(match["name"], at, match["kind"])
