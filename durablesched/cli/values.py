"""Option strings into values, or a UsageError that names the option and the rule."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from durablesched.cli.errors import UsageError
from durablesched.errors import ConfigurationError
from durablesched.store.durability import Durability, durability
from durablesched.submission import MAX_INT64

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

#: The longest a seconds option (--lease, --grace, --cancel-grace) may be: a year.
MAX_SECONDS = 365 * 86400


def positive_int(what: str, value: str, *, maximum: int = MAX_INT64) -> int:
    """A whole number from 1 to ``maximum`` (by default the largest a 64-bit column holds)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a whole number, got {value!r}") from None
    if not 1 <= number <= maximum:
        raise UsageError(f"{what} must be a whole number from 1 to {maximum}, got {value}")
    return number


def positive_float(what: str, value: str) -> float:
    """A number of seconds above 0 and at most MAX_SECONDS."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number of seconds, got {value!r}") from None
    if not 0 < number <= MAX_SECONDS:
        raise UsageError(
            f"{what} must be a number of seconds above 0 and at most {MAX_SECONDS} "
            f"(a year), got {value}"
        )
    return number


def seconds(what: str, value: str) -> float:
    """A number of seconds from 0 to MAX_SECONDS."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number of seconds, got {value!r}") from None
    if not 0 <= number <= MAX_SECONDS:
        raise UsageError(
            f"{what} must be a number of seconds from 0 to {MAX_SECONDS} (a year), got {value}"
        )
    return number


def task_id(value: str) -> int:
    """A task id: a whole number from 1 to the largest a 64-bit column holds."""
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"task id must be a whole number, got {value!r}") from None
    if not 1 <= number <= MAX_INT64:
        raise UsageError(f"task id must be a whole number from 1 to {MAX_INT64}, got {value}")
    return number


def durability_of(value: str) -> Durability:
    """``--durability``, checked by the store's own rule so the choices are said once."""
    try:
        return durability(value)
    except ConfigurationError as e:
        raise UsageError(f"--{e}") from None


def parse_duration(value: str, what: str) -> timedelta:
    """``30s``, ``5m``, ``2h``, ``7d``, ``1h30m`` or a number of seconds."""
    text_value = value.strip().lower()
    try:
        seconds = float(text_value)
    except ValueError:
        parts = _DURATION.findall(text_value)
        if not parts or "".join(n + u for n, u in parts) != text_value:
            raise UsageError(
                f"{what} must be a duration like 30s, 5m, 2h, 7d or 1h30m, got {value!r}"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"{what} must be a non-negative duration, got {value!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise UsageError(f"{what} is too long: {value!r}") from None
