"""Checking what is submitted, before anything is stored."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from durablesched.errors import InvalidTaskError, UnknownTaskNameError
from durablesched.records import NewTask
from durablesched.registry import TaskRegistry
from durablesched.retry import DEFAULT_RETRY

MAX_NAME_LENGTH = 200
MAX_KEY_LENGTH = 200


#: One strict encoder (no NaN, no infinities), made once: bulk submits call it per task.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def _unserialisable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_encoder() -> Any:
    """The C encoder ``_ENCODER`` would build on every call, built once (3x faster per task).

    Without the circular-reference markers: a cycle then ends in RecursionError,
    which to_json reports like any other unserialisable value.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        return make(
            None, _unserialisable, json.encoder.encode_basestring, None, ":", ",",
            False, False, False,
        )  # fmt: skip
    except TypeError:  # a Python whose C encoder takes other arguments
        return None


_C_ENCODE = _c_encoder()


def to_json(value: Any, what: str) -> str:
    """Serialise ``value`` strictly (no NaN, no infinities), naming ``what`` on failure."""
    try:
        if _C_ENCODE is not None:
            return "".join(_C_ENCODE(value, 0))
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskError(f"{what} must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidTaskError(
            f"{what} must be JSON-serialisable: it refers to itself or is nested too deeply"
        ) from None


#: Exact types (not subclasses) that JSON stores and reads back unchanged.
_SELF_CANONICAL = frozenset({str, bool, int})


def canonical_json(value: Any, what: str) -> Any:
    """``value`` as it will read back from storage (tuples become lists, and so on)."""
    if value is None or type(value) in _SELF_CANONICAL:
        return value  # reads back as itself: skip the round trip (most results are None)
    return json.loads(to_json(value, what))


def build_task(
    name: str,
    args: Mapping[str, Any] | None,
    *,
    now: datetime,
    at: datetime | None = None,
    delay: timedelta | float | None = None,
    max_attempts: int | None = None,
    key: str | None = None,
    registry: TaskRegistry | None = None,
) -> NewTask:
    """Validate one submission and say exactly what is wrong with it."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidTaskError(f"task name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTaskError(f"task name is longer than {MAX_NAME_LENGTH} characters")
    if any(not ch.isprintable() for ch in name):
        raise InvalidTaskError(f"task name {name!r} contains control characters")
    if registry is not None and name not in registry:
        raise UnknownTaskNameError(f"no task is registered under the name {name!r}")
    checked = _check_args(args)
    args_json = to_json(checked, f"arguments of task {name!r}")
    due_at = _due_at(now, at, delay)
    if max_attempts is None:
        max_attempts = (registry.retry_policy(name) if registry else DEFAULT_RETRY).max_attempts
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidTaskError(
            f"max_attempts must be an integer of at least 1, got {max_attempts!r}"
        )
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH):
        raise InvalidTaskError(
            f"idempotency key must be a non-empty string of at most {MAX_KEY_LENGTH} characters"
        )
    return NewTask(name, checked, due_at, max_attempts, key, args_json)


def build_many(
    name: str,
    args_list: Iterable[Mapping[str, Any] | None],
    *,
    now: datetime,
    at: datetime | None = None,
    delay: timedelta | float | None = None,
    max_attempts: int | None = None,
    registry: TaskRegistry | None = None,
) -> list[NewTask]:
    """Validate many submissions of one name: the shared options once, each task's arguments."""
    items = iter(args_list)
    for args in items:
        first = build_task(
            name, args, now=now, at=at, delay=delay, max_attempts=max_attempts, registry=registry
        )
        break
    else:
        return []
    # The shared options are checked once (above); each further task only its arguments.
    tasks = [first]
    append = tasks.append
    due_at, attempts = first.due_at, first.max_attempts
    what = f"arguments of task {name!r}"
    # Tasks without arguments are all alike: one immutable NewTask stands for each.
    bare = NewTask(name, {}, due_at, attempts, None, "{}")
    for args in items:
        if not args and (args is None or type(args) is dict):
            append(bare)
            continue
        checked = _check_args(args)
        append(NewTask(name, checked, due_at, attempts, None, to_json(checked, what)))
    return tasks


def _check_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise InvalidTaskError(
            f"task arguments must be a JSON object (a dict of keyword arguments), "
            f"got {type(args).__name__}"
        )
    for arg_name in args:
        if not isinstance(arg_name, str) or not arg_name.isidentifier():
            raise InvalidTaskError(f"argument name {arg_name!r} is not a valid keyword")
    return dict(args)


def _due_at(now: datetime, at: datetime | None, delay: timedelta | float | None) -> datetime:
    if at is not None and delay is not None:
        raise InvalidTaskError("give either at= or delay=, not both")
    if at is not None:
        if not isinstance(at, datetime):
            raise InvalidTaskError(f"at= must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidTaskError(f"at= is a naive datetime ({at}); give it a time zone")
        return at.astimezone(UTC)
    if delay is None:
        return now
    if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
        raise InvalidTaskError(f"delay= must be a timedelta or seconds, got {delay!r}")
    if isinstance(delay, float) and not math.isfinite(delay):
        raise InvalidTaskError(f"delay= must be finite, got {delay!r}")
    try:
        step = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        if step < timedelta(0):
            raise InvalidTaskError(f"delay= must not be negative, got {delay!r}")
        return now + step
    except OverflowError:
        raise InvalidTaskError(f"delay= is too large: {delay!r}") from None
