"""An every-second schedule for the process tests (``--app tests.processes.schedule_app``).

Apart from ``app.py``: a worker of that app must not fire these schedules.
"""

from __future__ import annotations

import os
from pathlib import Path

from durablesched import TaskContext, TaskRegistry

registry = TaskRegistry()
OUT = Path(os.environ.get("DS_TEST_DIR", "."))


@registry.task("tick", pass_context=True)
def tick(ctx: TaskContext) -> None:
    assert ctx.fire_time is not None
    line = f"{ctx.task_id} {ctx.fire_time.isoformat()} {ctx.catch_up} {os.getpid()}\n"
    # O_APPEND: one short write per line, so concurrent processes never interleave.
    fd = os.open(OUT / "ticks", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


registry.schedule("tick", every=1, overlap="allow")
