"""The tasks the Django tests enqueue (found by the backend: an installed app's ``tasks``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.tasks import TaskContext, task
from sqlalchemy import Connection, text

from durablesched.contrib.django import durable


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails")
def send(to: str, *, subject: str = "") -> dict[str, Any]:
    return {"to": to, "subject": subject}


@task()
def boom(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def attempt_number(context: TaskContext, fail_first: bool) -> int:
    """Fails its first attempt if asked, then says which attempt it is."""
    if fail_first and context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return int(context.attempt)


@task()
async def async_add(a: int, b: int) -> int:
    return a + b


@task()
def record(path: str, value: str) -> None:
    """Appends ``value`` to the file ``path``: the order tasks ran in."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(value + "\n")


@task()
def hold(started: str, go: str) -> str:
    """Says it started (a file), then runs until the file ``go`` exists (at most 30 s)."""
    Path(started).touch()
    deadline = time.monotonic() + 30
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(go)
        time.sleep(0.01)
    return "held"


@task()
def stubborn() -> None:
    """Always fails: OPTIONS["tasks"] gives it 3 attempts (the backend's default is 2)."""
    raise RuntimeError("again")


@task()
def slow(seconds: float) -> str:
    """Runs ``seconds``: OPTIONS["tasks"] gives it a timeout of 0.05 s."""
    time.sleep(seconds)
    return "done"


@task(takes_context=True)
def mark_paid(context: TaskContext, order: int, fail: bool = False) -> int:
    """Records the payment in the app's table ``paid`` in the transaction that records the
    task's success (durable(context).on_success): both, or neither."""

    def record(conn: Connection) -> None:
        conn.execute(text("INSERT INTO paid (task_order) VALUES (:order)"), {"order": order})

    durable(context).on_success(record)
    if fail:
        raise ValueError("declined")
    return order


@task(takes_context=True)
def cancels_itself(context: TaskContext) -> None:
    """Asks for its own cancellation and acknowledges it once its worker hears of it: a
    task that ends CANCELLED."""
    from durablesched.contrib.django import cancel  # noqa: PLC0415 - a test's own shortcut

    result = context.task_result
    cancel(result.id, backend=result.backend)
    running = durable(context)
    running.wait_for_cancel(timeout=30)
    running.raise_if_cancelled()


@task()
def returns_a_set() -> set[int]:
    """Returns what JSON cannot store: failed at once, though the settings allow two."""
    return {1, 2}
