"""Fixtures shared by every layer: a manual clock, a registry, and a store per backend."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from durablesched import ManualClock, MemoryStore, Scheduler, Store, TaskRegistry
from durablesched.sqlite import SQLiteStore

#: "Time 10" of the worked example.
T0 = datetime(2030, 1, 1, 0, 0, 10, tzinfo=UTC)
#: Every bounded wait in the tests, in seconds.
WAIT = 10.0

BACKENDS = ["memory", "sqlite"]


def at(seconds: float) -> datetime:
    """The worked example's time ``seconds`` as a datetime."""
    return T0 + timedelta(seconds=seconds - 10)


def make_store(backend: str, tmp_path: Path) -> Store:
    if backend == "memory":
        return MemoryStore(compact_min=8)
    if backend == "sqlite":
        return SQLiteStore(tmp_path / "tasks.db")
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Iterator[Store]:
    s = make_store(backend, tmp_path)
    yield s
    if isinstance(s, SQLiteStore):
        # A connection-leak check for free: every store call returns its connection.
        assert s.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def registry() -> TaskRegistry:
    return TaskRegistry()


@pytest.fixture
def scheduler(store: Store, registry: TaskRegistry, clock: ManualClock) -> Scheduler:
    return Scheduler(store, registry=registry, clock=clock)
