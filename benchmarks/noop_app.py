"""The benchmark's task registry: one no-op task."""

from durablesched import TaskRegistry

registry = TaskRegistry()


@registry.task("noop")
def noop() -> None:
    return None
