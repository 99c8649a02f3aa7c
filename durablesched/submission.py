"""Checking what is submitted, before anything is stored."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from durablesched.errors import InvalidTaskArgumentsError, InvalidTaskError, UnknownTaskNameError
from durablesched.queues import check_priority, check_queue
from durablesched.records import DEFAULT_QUEUE, POSITIONAL, TRACE, JSONArgs, NewTask
from durablesched.retry import DEFAULT_RETRY

if TYPE_CHECKING:
    # Annotations only: the registry imports the schedules' declarations, which
    # use this module's checks.
    from durablesched.registry import TaskDefinition, TaskRegistry

# -- the limits: each said once, here; the CLI and docs/api.md take them from this list ---------

#: Characters in a task name.
MAX_NAME_LENGTH = 200
#: Characters in an idempotency key.
MAX_KEY_LENGTH = 200
#: Levels of nesting in a task's arguments: the object itself is level 1.
MAX_ARGS_DEPTH = 64
#: Bytes of a task's arguments as UTF-8 JSON (1 MiB).
MAX_ARGS_BYTES = 1024 * 1024
#: Attempts a task may be given: the largest number a PostgreSQL ``integer`` column holds.
MAX_ATTEMPTS = 2**31 - 1
#: Task ids, and limits on how many to read, are 64-bit integers in every backend.
MAX_INT64 = 2**63 - 1

#: How :func:`build_task` names each argument in its errors: the Python API's
#: names; the CLI passes its options' names instead.
API_NAMES: Mapping[str, str] = {
    "name": "task name",
    "args": "arguments of task {name!r}",
    "at": "at=",
    "delay": "delay=",
    "max_attempts": "max_attempts",
    "key": "idempotency key",
    "queue": "queue",
    "priority": "priority",
    "limit_key": "limit_key",
}

#: The longest limit key (it shows in ``queue ls`` and the dashboard as it is).
MAX_LIMIT_KEY_LENGTH = 200


def check_limit_key(limit_key: object, what: str = "limit_key") -> str:
    """A limit key: a non-empty string of at most 200 characters."""
    if not isinstance(limit_key, str) or not limit_key:
        raise InvalidTaskError(f"{what} must be a non-empty string, got {limit_key!r}")
    if len(limit_key) > MAX_LIMIT_KEY_LENGTH:
        raise InvalidTaskError(f"{what} is longer than {MAX_LIMIT_KEY_LENGTH} characters")
    return limit_key


#: How a submit asks for debouncing: (key, delay) and the optional longest wait.
Debounce = tuple[str, timedelta | float]


def _debounce(
    now: datetime,
    debounce: Debounce | None,
    *,
    max_wait: timedelta | float | None,
    at: datetime | None,
    delay: timedelta | float | None,
    key: str | None,
) -> tuple[str | None, datetime | None, datetime | None]:
    """(debounce key, due time, latest due time) of a debounced submit, checked; Nones
    without ``debounce``."""
    if debounce is None:
        if max_wait is not None:
            raise InvalidTaskError("max_wait= is for a debounced submit: give debounce= too")
        return None, None, None
    if not isinstance(debounce, tuple) or len(debounce) != 2:
        raise InvalidTaskError(
            f"debounce= must be (key, delay), such as ('doc:7', timedelta(seconds=30)), "
            f"got {debounce!r}"
        )
    if at is not None or delay is not None:
        raise InvalidTaskError(
            "a debounced submit is due its debounce delay: give no at= or delay="
        )
    if key is not None:
        raise InvalidTaskError("give either an idempotency key or debounce=, not both")
    name, wait = debounce
    check_limit_key(name, "debounce key")
    due = _due_at(now, None, wait, {"at": "at=", "delay": "debounce delay"})
    until = None
    if max_wait is not None:
        until = _due_at(now, None, max_wait, {"at": "at=", "delay": "max_wait="})
        if until < due:
            raise InvalidTaskError("max_wait= must be at least the debounce delay")
    return name, due, until


def _limit_key(
    definition: TaskDefinition | None,
    limit_key: str | None,
    args: JSONArgs,
    positional: Sequence[Any] | None,
    names: Mapping[str, str] = API_NAMES,
) -> str | None:
    """The limit key a submit gives, else the one its definition makes of its arguments."""
    if limit_key is not None:
        return check_limit_key(limit_key, names["limit_key"])
    if definition is None or definition.limit_key is None:
        return None
    make = definition.limit_key
    if POSITIONAL in args:  # the positional ones, as stored: given apart
        args = {name: value for name, value in args.items() if name != POSITIONAL}
    try:
        made = make(*(positional or ()), **args)
    except Exception as e:  # the user's function: its failure, named
        raise InvalidTaskError(
            f"task {definition.name!r}: its limit_key function failed: {type(e).__name__}: {e}"
        ) from e
    return check_limit_key(made, f"task {definition.name!r}: the limit key its function made")


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
    """Serialise ``value`` strictly (no NaN, no infinities, valid Unicode), naming ``what``."""
    try:
        text = "".join(_C_ENCODE(value, 0)) if _C_ENCODE is not None else _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskError(f"{what} must be JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidTaskError(
            f"{what} must be JSON-serialisable: it refers to itself or is nested too deeply"
        ) from None
    _check_unicode(text, what)
    return text


def _check_unicode(text: str, what: str) -> None:
    """Refuse a lone surrogate: UTF-8, and so every database, cannot store one."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidTaskError(
            f"{what} must be valid Unicode: {e.object[e.start]!r} is a lone surrogate"
        ) from None


#: Exact types (not subclasses) that JSON stores and reads back unchanged.
_SELF_CANONICAL = frozenset({str, bool, int})


def canonical_json(value: Any, what: str) -> Any:
    """``value`` as it will read back from storage (tuples become lists, and so on)."""
    if value is None or type(value) in _SELF_CANONICAL:
        if type(value) is str:
            _check_unicode(value, what)
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
    names: Mapping[str, str] = API_NAMES,
    queue: str | None = None,
    priority: int | None = None,
    positional: Sequence[Any] | None = None,
    definition: TaskDefinition | None = None,
    limit_key: str | None = None,
    debounce: Debounce | None = None,
    max_wait: timedelta | float | None = None,
) -> NewTask:
    """Validate one submission and say exactly what is wrong with it.

    ``names`` says how the errors name each argument (the CLI names its options).
    With a ``registry``, the name must be registered and the arguments must bind
    to its function as the worker will call it; so must they with a ``definition``
    (a typed task's own), looked up in no registry. ``positional`` arguments are
    stored with the keyword ones, under :data:`~durablesched.records.POSITIONAL`.
    """
    check_name(name, names["name"])
    if definition is None:
        definition = _definition(registry, name)
    elif registry is not None and name not in registry:
        raise UnknownTaskNameError(f"no task is registered under the name {name!r}")
    what = names["args"].format(name=name)
    checked, args_json = check_args(args, what, positional)
    debounce_key, debounce_due, debounce_until = _debounce(
        now, debounce, max_wait=max_wait, at=at, delay=delay, key=key
    )
    due_at = _due_at(now, at, delay, names) if debounce_due is None else debounce_due
    if max_attempts is None:
        max_attempts = (definition.retry if definition is not None else DEFAULT_RETRY).max_attempts
    check_max_attempts(max_attempts, names["max_attempts"])
    if key is not None:
        check_key(key, names["key"])
    queue, priority = _placement(definition, queue, priority, names)
    # Last: a well-formed submit whose arguments the function cannot take.
    _check_binding(definition, checked, what)
    made = _limit_key(definition, limit_key, checked, positional, names)
    return NewTask(
        name,
        checked,
        due_at,
        max_attempts,
        key,
        args_json,
        queue,
        priority,
        made,
        debounce_key,
        debounce_until,
    )


def _placement(
    definition: TaskDefinition | None,
    queue: str | None,
    priority: int | None,
    names: Mapping[str, str] = API_NAMES,
) -> tuple[str, int]:
    """The queue and priority a submit asks for, else its definition's, else the defaults."""
    if queue is None:
        queue = definition.queue if definition is not None else DEFAULT_QUEUE
    else:
        check_queue(queue, names["queue"])
    if priority is None:
        priority = definition.priority if definition is not None else 0
    else:
        check_priority(priority, names["priority"])
    return queue, priority


def build_many(
    name: str,
    args_list: Iterable[Mapping[str, Any] | None],
    *,
    now: datetime,
    at: datetime | None = None,
    delay: timedelta | float | None = None,
    max_attempts: int | None = None,
    registry: TaskRegistry | None = None,
    queue: str | None = None,
    priority: int | None = None,
    limit_key: str | None = None,
) -> list[NewTask]:
    """Validate many submissions of one name: the shared options once, each task's arguments
    (and the limit key its definition makes of them, where it makes one)."""
    items = iter(args_list)
    for args in items:
        first = build_task(
            name,
            args,
            now=now,
            at=at,
            delay=delay,
            max_attempts=max_attempts,
            registry=registry,
            queue=queue,
            priority=priority,
            limit_key=limit_key,
        )
        break
    else:
        return []
    # The shared options are checked once (above); each further task only its arguments.
    tasks = [first]
    append = tasks.append
    due_at, attempts = first.due_at, first.max_attempts
    what = API_NAMES["args"].format(name=name)
    definition = _definition(registry, name)
    # Binding depends only on the argument names: each set of names is bound once.
    fits = {tuple(first.args)}
    # Tasks without arguments are all alike: one immutable NewTask stands for each.
    queue, priority = first.queue, first.priority
    made = limit_key is None and definition is not None and definition.limit_key is not None
    bare = NewTask(name, {}, due_at, attempts, None, "{}", queue, priority, first.limit_key)
    for args in items:
        if made:
            checked, args_json = check_args(args, what)
            _check_binding(definition, checked, what)
            key = _limit_key(definition, None, checked, None)
            append(NewTask(name, checked, due_at, attempts, None, args_json, queue, priority, key))
            continue
        if not args and (args is None or type(args) is dict):
            if () not in fits:
                _check_binding(definition, {}, what)
                fits.add(())
            append(bare)
            continue
        checked, args_json = check_args(args, what)
        arg_names = tuple(checked)
        if arg_names not in fits:
            _check_binding(definition, checked, what)
            fits.add(arg_names)
        append(
            NewTask(
                name, checked, due_at, attempts, None, args_json, queue, priority, first.limit_key
            )
        )
    return tasks


class FurtherCalls:
    """The calls of one task with one set of options after its first, which
    :func:`build_task` checked whole: each further call only its arguments, and their
    binding once per shape of argument names (as :func:`build_many` does)."""

    __slots__ = ("_definition", "_fits", "_limit_key", "_made", "_shared", "_what")

    def __init__(
        self,
        first: NewTask,
        definition: TaskDefinition | None,
        positional_count: int,
        limit_key: str | None = None,
    ) -> None:
        #: The options' limit key (checked with the first call); without one, the
        #: definition's function makes each call's.
        self._limit_key = limit_key
        #: Whether each call's key is made by the definition's function.
        self._made = (
            limit_key is None and definition is not None and definition.limit_key is not None
        )
        self._definition = definition
        #: The shapes of arguments bound once: their names, with the count of positional
        #: ones where there are any (a tuple of names alone has no tuple in it).
        self._fits: set[tuple[Any, ...]] = {
            (tuple(first.args), positional_count) if positional_count else tuple(first.args)
        }
        self._what = API_NAMES["args"].format(name=first.name)
        #: What every further call shares with the first: its fields but the arguments,
        #: their JSON and the limit key.
        self._shared = (
            first.name,
            first.due_at,
            first.max_attempts,
            first.idempotency_key,
            first.queue,
            first.priority,
            first.debounce_key,
            first.debounce_until,
        )

    def build(self, args: Mapping[str, Any] | None, positional: Sequence[Any] | None) -> NewTask:
        checked, args_json = check_args(args, self._what, positional)
        shape = (tuple(checked), len(positional)) if positional else tuple(checked)
        if shape not in self._fits:
            _check_binding(self._definition, checked, self._what)
            self._fits.add(shape)
        limit_key = self._limit_key
        if self._made:
            limit_key = _limit_key(self._definition, None, checked, positional)
        name, due_at, attempts, key, queue, priority, debounce_key, until = self._shared
        # The tuple made directly: NewTask's own __new__ is a Python function, and
        # every field is given.
        return _new_tuple(
            NewTask,
            (
                name,
                checked,
                due_at,
                attempts,
                key,
                args_json,
                queue,
                priority,
                limit_key,
                debounce_key,
                until,
            ),
        )


#: Makes a named tuple of all its fields without its Python-level ``__new__``.
_new_tuple = tuple.__new__


def check_name(name: object, what: str = API_NAMES["name"]) -> None:
    """A non-empty printable string of at most MAX_NAME_LENGTH characters."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidTaskError(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTaskError(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if any(not ch.isprintable() for ch in name):
        # Lone surrogates are not printable either: the name could not be stored.
        raise InvalidTaskError(f"{what} {name!r} contains control characters or lone surrogates")


def check_args(
    args: Mapping[str, Any] | None, what: str, positional: Sequence[Any] | None = None
) -> tuple[dict[str, Any], str]:
    """The arguments as a dict and as JSON, within the limits (``positional`` ones, if
    any, as the dict's :data:`~durablesched.records.POSITIONAL` member)."""
    if args is None:
        checked: dict[str, Any] = {}
    elif not isinstance(args, Mapping):
        raise InvalidTaskArgumentsError(
            f"{what} must be a JSON object (a dict of keyword arguments), got {type(args).__name__}"
        )
    else:
        for arg_name in args:
            if arg_name in _RESERVED:
                raise InvalidTaskError(
                    f"{what}: argument name {arg_name!r} is reserved: durablesched stores "
                    f"{_RESERVED[arg_name]} under it"
                )
            if not isinstance(arg_name, str) or not arg_name.isidentifier():
                raise InvalidTaskError(f"{what}: argument name {arg_name!r} is not a valid keyword")
        checked = dict(args)
    if positional is not None:
        if isinstance(positional, str | bytes | Mapping) or not isinstance(positional, Sequence):
            raise InvalidTaskArgumentsError(
                f"{what}: positional arguments must be a list or tuple, "
                f"got {type(positional).__name__}"
            )
        if positional:
            checked = {POSITIONAL: list(positional), **checked}
    try:
        args_json = to_json(checked, what)
    except InvalidTaskError as e:
        _check_depth(checked, what)  # nested past the limit says so, with the limit
        raise InvalidTaskArgumentsError(str(e)) from None
    # Fewer brackets than the limit cannot nest past it: most arguments skip the walk.
    if args_json.count("{") + args_json.count("[") > MAX_ARGS_DEPTH:
        _check_depth(checked, what)
    # Four bytes per character at most: only a long text needs counting.
    if len(args_json) > MAX_ARGS_BYTES // 4 and len(args_json.encode()) > MAX_ARGS_BYTES:
        raise InvalidTaskError(
            f"{what} must be at most {MAX_ARGS_BYTES:,} bytes as JSON, "
            f"got {len(args_json.encode()):,}"
        )
    return checked, args_json


#: The members of stored arguments that are durablesched's own, and what each holds.
_RESERVED = {POSITIONAL: "the positional arguments", TRACE: "the trace context"}

_CONTAINERS = (dict, list, tuple)


def _check_depth(args: dict[str, Any], what: str) -> None:
    """Refuse nesting deeper than MAX_ARGS_DEPTH.

    Walks containers only, depth first, and stops at the limit; a container
    already seen at this depth or shallower is not walked again, so shared
    parts cost once and a structure that contains itself ends the walk (the
    encoder reports it).
    """
    stack: list[tuple[Any, int]] = [(v, 2) for v in args.values() if isinstance(v, _CONTAINERS)]
    seen: dict[int, int] = {}
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ARGS_DEPTH:
            raise InvalidTaskError(f"{what} must be nested at most {MAX_ARGS_DEPTH} levels deep")
        if seen.get(id(value), MAX_ARGS_DEPTH + 1) <= depth:
            continue
        seen[id(value)] = depth
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, _CONTAINERS))


def _definition(registry: TaskRegistry | None, name: str) -> TaskDefinition | None:
    if registry is None:
        return None
    if name not in registry:
        raise UnknownTaskNameError(f"no task is registered under the name {name!r}")
    return registry.get(name)


def _check_binding(definition: TaskDefinition | None, args: dict[str, Any], what: str) -> None:
    if definition is None:
        return
    positional = args.get(POSITIONAL, ())
    problem = definition.mismatch((n for n in args if n != POSITIONAL), len(positional))
    if problem is not None:
        raise InvalidTaskError(
            f"{what} do not fit its function {definition.call_signature()}: {problem}"
        )


def check_max_attempts(value: object, what: str = API_NAMES["max_attempts"]) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidTaskError(f"{what} must be an integer from 1 to {MAX_ATTEMPTS}, got {value!r}")


def check_key(key: object, what: str = API_NAMES["key"]) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidTaskError(
            f"{what} must be a non-empty string of at most {MAX_KEY_LENGTH} characters"
        )
    _check_unicode(key, what)


def _due_at(
    now: datetime,
    at: datetime | None,
    delay: timedelta | float | None,
    names: Mapping[str, str] = API_NAMES,
) -> datetime:
    at_name, delay_name = names["at"], names["delay"]
    if at is not None and delay is not None:
        raise InvalidTaskError(f"give either {at_name} or {delay_name}, not both")
    if at is not None:
        if not isinstance(at, datetime):
            raise InvalidTaskError(f"{at_name} must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidTaskError(f"{at_name} is a naive datetime ({at}); give it a time zone")
        try:
            return at.astimezone(UTC)
        except OverflowError:
            raise InvalidTaskError(
                f"{at_name} must fall between years 1 and 9999 in UTC, got {at.isoformat()}"
            ) from None
    if delay is None:
        return now
    if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
        raise InvalidTaskError(f"{delay_name} must be a timedelta or seconds, got {delay!r}")
    if isinstance(delay, float) and not math.isfinite(delay):
        raise InvalidTaskError(f"{delay_name} must be finite, got {delay!r}")
    try:
        step = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        # The number itself: a tiny negative float rounds to a zero timedelta.
        if step < timedelta(0) or (not isinstance(delay, timedelta) and delay < 0):
            raise InvalidTaskError(f"{delay_name} must not be negative, got {delay!r}")
        return now + step
    except OverflowError:
        raise InvalidTaskError(f"{delay_name} is too large: {delay!r}") from None
