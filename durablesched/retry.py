"""When a failed attempt runs again: exponential backoff with a cap and jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from durablesched.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts a task gets and how long it waits between them.

    The wait before attempt ``n + 1`` is ``initial * multiplier ** (n - 1)``,
    capped at ``maximum``, then spread by +/- ``jitter`` (a fraction) so that
    tasks that failed together do not all retry in the same instant.
    """

    max_attempts: int = 5
    initial: timedelta = timedelta(seconds=1)
    multiplier: float = 2.0
    maximum: timedelta = timedelta(minutes=10)
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial < timedelta(0) or self.maximum < timedelta(0):
            raise ConfigurationError("retry delays must not be negative")
        if self.multiplier < 1:
            raise ConfigurationError(f"multiplier must be at least 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"jitter must be in [0, 1), got {self.jitter}")

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
