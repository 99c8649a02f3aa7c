"""A small task registry for the in-process CLI tests (``--app tests.unit.cli_app``)."""

from __future__ import annotations

from typing import Any

from durablesched import TaskContext, TaskRegistry

registry = TaskRegistry()


@registry.task("ok")
def ok(**_: Any) -> None:
    """Takes anything: what the property test submits runs."""


@registry.task("add")
def add(a: int, b: int) -> int:
    return a + b


@registry.task("numbered", pass_context=True)
def numbered(ctx: TaskContext, n: int) -> str:
    return f"{ctx.task_id}:{n}"


@registry.task("report", queue="reports", priority=5)
def report() -> str:
    return "report"
