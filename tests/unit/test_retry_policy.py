from __future__ import annotations

import random
from datetime import timedelta

import pytest

from durablesched import ConfigurationError, RetryPolicy


def test_exponential_backoff_with_cap() -> None:
    policy = RetryPolicy(
        initial=timedelta(seconds=2), multiplier=3, maximum=timedelta(seconds=50), jitter=0
    )
    assert [policy.delay(n).total_seconds() for n in range(1, 6)] == [2, 6, 18, 50, 50]
    assert policy.delay(10_000) == timedelta(seconds=50)


def test_jitter_spreads_within_bounds() -> None:
    policy = RetryPolicy(initial=timedelta(seconds=10), jitter=0.1, maximum=timedelta(hours=1))
    rng = random.Random(7)
    delays = {policy.delay(1, rng).total_seconds() for _ in range(200)}
    assert len(delays) > 100
    assert all(9 <= d <= 11 for d in delays)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"multiplier": 0.5},
        {"jitter": 1.0},
        {"initial": timedelta(seconds=-1)},
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
