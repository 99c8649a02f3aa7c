"""The demo's tasks; the demo's worker processes import this as demo_app:registry."""

from __future__ import annotations

from datetime import timedelta

from durablesched import RetryPolicy, TaskContext, TaskRegistry

registry = TaskRegistry(
    default_retry=RetryPolicy(max_attempts=3, initial=timedelta(milliseconds=500), jitter=0.1)
)


@registry.task("greet")
def greet(who: str) -> str:
    return f"hello, {who}"


@registry.task("flaky", pass_context=True)
def flaky(ctx: TaskContext) -> str:
    if ctx.attempt < 3:
        raise ConnectionError(f"upstream unavailable (attempt {ctx.attempt})")
    return "worked on attempt 3"


@registry.task("doomed", retry=RetryPolicy(max_attempts=2, initial=timedelta(milliseconds=300)))
def doomed() -> None:
    raise ValueError("this input can never work")


@registry.task("parent", pass_context=True)
def parent(ctx: TaskContext, items: int) -> int:
    ctx.submit("greet", {"who": f"child of task {ctx.task_id}"})
    return items


@registry.task("long_job", pass_context=True)
def long_job(ctx: TaskContext, seconds: float) -> str:
    # Long enough for the demo to kill the worker holding it on its first attempt.
    # ctx.sleep, not time.sleep: a worker stopping (Ctrl-C) gives the task back at
    # once, and a cancel ends it, instead of the loop running on regardless.
    ctx.sleep(seconds if ctx.attempt == 1 else 0.2)
    return f"finished on attempt {ctx.attempt}"
