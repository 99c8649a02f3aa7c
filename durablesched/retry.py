"""Whether and when a failed attempt runs again: which exceptions are retried, and
exponential backoff with a cap and jitter."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeAlias

from durablesched.errors import ConfigurationError, NoRetry

#: One exception class, or several (a tuple, as ``except`` and ``isinstance`` take them).
ExceptionTypes: TypeAlias = type[BaseException] | tuple[type[BaseException], ...]


def exception_types(value: object, what: str) -> tuple[type[BaseException], ...]:
    """``value`` (one exception class, or an iterable of them) as a tuple of classes;
    :class:`ConfigurationError` for anything else."""
    classes = (value,) if isinstance(value, type) else value
    if isinstance(classes, str | bytes) or not isinstance(classes, Iterable):
        raise ConfigurationError(
            f"{what} must be an exception class or a tuple of them, got {value!r}"
        )
    found = tuple(classes)
    for c in found:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise ConfigurationError(
                f"{what} must be an exception class or a tuple of them, got {c!r} in it"
            )
    return found


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts a task gets and how long it waits between them.

    The wait before attempt ``n + 1`` is ``initial * multiplier ** (n - 1)``,
    capped at ``maximum``, then spread by +/- ``jitter`` (a fraction) so that
    tasks that failed together do not all retry in the same instant.

    ``retry_on`` (default: every exception) and ``dont_retry_on`` (default:
    none) say which failures are retried at all: an exception that is an
    instance of a ``dont_retry_on`` class, or of no ``retry_on`` class, fails
    its task at once. ``dont_retry_on`` wins where both match. A task that
    raises :class:`~durablesched.NoRetry` fails at once whatever they say, and
    so does one that returns a value JSON cannot store (its body ran: a retry
    would repeat its effects, and return the same).
    """

    max_attempts: int = 5
    initial: timedelta = timedelta(seconds=1)
    multiplier: float = 2.0
    maximum: timedelta = timedelta(minutes=10)
    jitter: float = 0.1
    retry_on: ExceptionTypes | None = None
    dont_retry_on: ExceptionTypes = ()

    def __post_init__(self) -> None:
        if self.retry_on is not None:
            object.__setattr__(self, "retry_on", exception_types(self.retry_on, "retry_on"))
        object.__setattr__(
            self, "dont_retry_on", exception_types(self.dont_retry_on, "dont_retry_on")
        )
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial < timedelta(0) or self.maximum < timedelta(0):
            raise ConfigurationError("retry delays must not be negative")
        if self.multiplier < 1:
            raise ConfigurationError(f"multiplier must be at least 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"jitter must be in [0, 1), got {self.jitter}")

    def retries(self, exc: BaseException) -> bool:
        """Whether a failed attempt that raised ``exc`` may run again (if it has attempts
        left): not for :class:`~durablesched.NoRetry`, nor for what ``dont_retry_on``
        names or ``retry_on`` leaves out."""
        if isinstance(exc, (NoRetry, self.dont_retry_on)):
            return False
        return self.retry_on is None or isinstance(exc, self.retry_on)

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        # Cap before multiplying out so large attempt numbers cannot overflow.
        seconds = self.initial.total_seconds()
        cap = self.maximum.total_seconds()
        for _ in range(exponent):
            seconds *= self.multiplier
            if seconds >= cap:
                break
        seconds = min(seconds, cap)
        if self.jitter:
            seconds *= (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return timedelta(seconds=min(seconds, cap))


DEFAULT_RETRY = RetryPolicy()
