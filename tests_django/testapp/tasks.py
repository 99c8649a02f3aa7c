"""The tasks the Django tests enqueue (found by the backend: an installed app's ``tasks``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.tasks import TaskContext, task


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
