"""A web process's own commits survive durablesched opening the SQLite file it already holds.

The everyday flow: a request runs an ORM query (Django's connection opens the file), then
the first ``enqueue()`` opens durablesched's store on the same file (SQLite only: POSIX
locks on a file); a burst worker in
another process runs and exits. Had the store read the file with ``open()``/``close()``,
POSIX would have dropped the locks of Django's connection, the worker would have been the
last connection and deleted the WAL, and every later commit of the web process would have
gone to a deleted file: no other process would see its orders or its tasks.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.db import connections

from durablesched.contrib.django.database import close_stores
from tests_django.conftest import ROOT, WAIT, worker_env
from tests_django.testapp.tasks import add

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

#: Another process counts the orders and the tasks it can see in the file.
COUNT = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
orders = connection.execute("SELECT count(*) FROM shop_orders").fetchone()[0]
tasks = connection.execute("SELECT count(*) FROM tasks").fetchone()[0]
print(orders, tasks)
connection.close()
"""


def _seen_elsewhere(path: str) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", COUNT, path],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    orders, tasks = done.stdout.split()
    return int(orders), int(tasks)


def _burst_worker() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "django", "durablesched_worker", "--burst", "--backend", "default"],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def no_store() -> Iterator[None]:
    """This process has no store yet (the first enqueue opens it), its queue empty."""
    close_stores()
    with connections["default"].cursor() as cursor:
        for table in ("task_events", "idempotency_keys", "tasks"):
            cursor.execute(f"DELETE FROM {table}")
    yield
    close_stores()


@pytest.mark.usefixtures("no_store")
def test_orders_and_tasks_of_the_web_process_stay_visible_to_other_processes() -> None:
    path = connections["default"].settings_dict["NAME"]
    with connections["default"].cursor() as cursor:  # a request's ORM work
        cursor.execute("CREATE TABLE IF NOT EXISTS shop_orders (id INTEGER PRIMARY KEY)")
        cursor.execute("DELETE FROM shop_orders")
        cursor.execute("INSERT INTO shop_orders VALUES (1)")
    first = add.enqueue(1, 2)  # opens durablesched's store beside Django's connection
    _burst_worker()  # runs it and exits: another process closing its last connection
    second = add.enqueue(3, 4)
    with connections["default"].cursor() as cursor:
        cursor.execute("INSERT INTO shop_orders VALUES (2)")
    assert first.id != second.id
    assert _seen_elsewhere(path) == (2, 2)
    with connections["default"].cursor() as cursor:  # and the web process reads its own
        cursor.execute("SELECT count(*) FROM shop_orders")
        assert cursor.fetchone() == (2,)
