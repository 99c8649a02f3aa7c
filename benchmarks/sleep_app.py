"""A task registry for the long-task cases of benchmarks.ahead: a task that sleeps."""

import time

from durablesched import TaskRegistry

registry = TaskRegistry()


@registry.task("sleep")
def sleep(seconds: float) -> None:
    time.sleep(seconds)
