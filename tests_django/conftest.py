"""Fixtures of the Django tests: each test runs on every database with a durablesched
backend (``default``: SQLite; ``pg``: PostgreSQL), in a transactional test database."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from sqlalchemy import text

from durablesched.contrib.django.database import close_stores, store_for

#: The repository: a worker process started by a test imports the test project from it.
ROOT = Path(__file__).resolve().parents[1]
#: Every bounded wait, in seconds.
WAIT = 60.0


@pytest.fixture(params=["default", "pg"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """The task backend (and Django database) alias of the test, its queue empty.

    Django's flush empties the app's tables between tests, not the queue's: this does.
    """
    if request.param == "pg" and not settings.POSTGRES:
        message = "PostgreSQL tests need a server at 127.0.0.1:5432 (user postgres, db test)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    alias = str(request.param)
    with store_for(alias).engine.begin() as conn:
        for table in ("task_events", "idempotency_keys", "tasks"):
            conn.execute(text(f"DELETE FROM {table}"))
    yield alias
    close_stores()


def worker_env() -> dict[str, str]:
    """The environment of a worker process started by a test: the test databases."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests_django.settings",
        "PYTHONPATH": str(ROOT),
        # The worker opens the test databases, not the ones the settings would name.
        "DURABLESCHED_DJANGO_SQLITE": connections["default"].settings_dict["NAME"],
        "DURABLESCHED_DJANGO_PG": connections["pg"].settings_dict["NAME"]
        if "pg" in connections
        else "",
    }


def work(alias: str, *args: Any) -> None:
    """Run this backend's worker in this process until nothing is left to run now."""
    call_command("durablesched_worker", "--burst", "--burst-wait", "0", "--backend", alias, *args)
