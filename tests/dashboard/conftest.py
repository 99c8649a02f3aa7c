"""A dashboard over a store of each durable backend, and the tasks pages are made of."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from httpx2 import Response
from starlette.testclient import TestClient

from durablesched import ErrorInfo, ManualClock, PostgresStore, Scheduler, SQLiteStore
from durablesched.dashboard import create_app
from durablesched.store.sql.store import SQLStore

from ..conftest import T0

LEASE = timedelta(seconds=30)
#: What a browser on this machine asks for (a dashboard without a token answers no other name).
LOCAL = "http://localhost"
ERROR = ErrorInfo("builtins.ValueError", "no <b>such</b> thing", "Traceback:\n  raise <x>")


@dataclass
class Dash:
    store: SQLStore
    scheduler: Scheduler
    clock: ManualClock
    client: TestClient

    def csrf(self, path: str = "/tasks") -> str:
        """The CSRF token a page's forms carry (a MAC of the browser's cookie)."""
        return form_csrf(self.client.get(path).text)

    def post(self, path: str, data: dict[str, str | list[str]] | None = None) -> Response:
        """A form posted as a browser without the script would: 303 back, or an error page."""
        return self.client.post(path, data={"csrf": self.csrf(), **(data or {})})

    def act(self, path: str, data: dict[str, str | list[str]] | None = None) -> Response:
        """A form posted by the page's script: a JSON answer."""
        return self.client.post(
            path,
            data={"csrf": self.csrf(), **(data or {})},
            headers={"X-Requested-With": "fetch"},
        )


def form_csrf(page: str) -> str:
    """The CSRF token in a page's forms."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "the page has no form"
    return found.group(1)


def open_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> SQLStore:
    if backend == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"))
    return SQLiteStore(tmp_path / "dash.db")


@pytest.fixture(params=["sqlite", "postgres"])
def dash(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Dash]:
    store = open_store(str(request.param), tmp_path, request)
    clock = ManualClock(T0)
    scheduler = Scheduler(store, clock=clock)
    with TestClient(create_app(store, clock=clock), base_url=LOCAL) as client:
        yield Dash(store, scheduler, clock, client)
    store.close()


def failed_task(dash: Dash, name: str = "flaky", attempts: int = 2) -> int:
    """A task whose every attempt failed: FAILED after ``attempts`` attempts."""
    task_id = dash.scheduler.submit(name, {"n": 1}, max_attempts=attempts)
    for attempt in range(1, attempts + 1):
        now = dash.clock.now()
        (claim,) = dash.store.claim(f"worker-{attempt}", 1, now, LEASE, names=[name])
        dash.clock.advance(1.5)
        retry = dash.clock.now() if attempt < attempts else None
        dash.store.fail(claim, ERROR, retry, dash.clock.now())
    return task_id
