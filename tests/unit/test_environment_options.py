"""Execution-environment options are checked where they are given, with errors naming them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablesched import ConfigurationError, MemoryStore, Scheduler, TaskRegistry, Worker


def test_a_bad_environment_or_timeout_is_refused_at_registration() -> None:
    registry = TaskRegistry()
    with pytest.raises(ConfigurationError, match="'gpu'"):
        registry.register(lambda: None, name="a", environment="gpu")
    with pytest.raises(ConfigurationError, match="task 'b': timeout must be positive"):
        registry.register(lambda: None, name="b", timeout=0)
    with pytest.raises(ConfigurationError, match="task 'c': timeout must be a timedelta"):
        registry.register(lambda: None, name="c", timeout="soon")  # type: ignore[arg-type]
    defined = registry.register(lambda: None, name="d", environment="process", timeout=1.5)
    assert (defined.environment, defined.timeout) == ("process", timedelta(seconds=1.5))
    assert "a" not in registry and "b" not in registry


def test_a_bad_worker_environment_or_grace_is_refused() -> None:
    scheduler = Scheduler(MemoryStore(), registry=TaskRegistry())
    with pytest.raises(ConfigurationError, match="environment must be 'thread' or 'process'"):
        Worker(scheduler, environment="fiber")
    with pytest.raises(ConfigurationError, match="cancel_grace must not be negative"):
        Worker(scheduler, cancel_grace=-1)


def test_an_async_function_is_known_as_such() -> None:
    registry = TaskRegistry()

    async def waits() -> None:
        return None

    assert registry.register(waits, name="w").is_async
    assert not registry.register(lambda: None, name="s").is_async
