"""huey with SqliteHuey for the peer benchmark; the file comes from BENCH_HUEY_DB."""

import os

from huey import SqliteHuey

huey = SqliteHuey(filename=os.environ.get("BENCH_HUEY_DB", "huey-bench.db"))


@huey.task()  # type: ignore[untyped-decorator]
def noop() -> None:
    return None
