"""The CPU-bound benchmark's task registry: one task of about 1 ms of pure Python
(``benchmarks.cpu_work``)."""

from durablesched import TaskRegistry

from .cpu_work import loops_from_env, spin

LOOPS = loops_from_env()
registry = TaskRegistry()


@registry.task("cpu")
def cpu() -> None:
    """Returns None, as huey's twin does: neither queue stores a result."""
    spin(LOOPS)
