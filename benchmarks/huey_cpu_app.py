"""huey's side of the CPU-bound benchmark: the same work (``benchmarks.cpu_work``) as a
huey task, on huey_app's SqliteHuey (its file from BENCH_HUEY_DB)."""

from .cpu_work import loops_from_env, spin
from .huey_app import huey

LOOPS = loops_from_env()


@huey.task()  # type: ignore[untyped-decorator]
def cpu() -> None:
    spin(LOOPS)
