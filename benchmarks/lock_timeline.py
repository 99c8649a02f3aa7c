"""Who holds SQLite's write lock, and for how long, while worker processes run no-op tasks.

Explains target 6 (4 worker processes against 1): each worker process here
records when each of its write transactions asked for the lock, got it and
let it go; the parent merges the records on the shared wall clock.

    python -m benchmarks.lock_timeline DB N PROCESSES SLOTS   # prints the figures as JSON
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection

from durablesched import Scheduler, SQLiteStore, TaskRegistry, Worker

from .common import ROOT, fresh


class _TimedStore(SQLiteStore):
    """Notes (asked, got, released) for every write transaction, in wall-clock seconds."""

    def __init__(self, db: str) -> None:
        super().__init__(db)
        self.spans: list[tuple[float, float, float]] = []

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        asked = time.time()
        with super()._write(what) as conn:
            got = time.time()
            yield conn
        self.spans.append((asked, got, time.time()))


def _child(db: str, slots: int, out: str) -> None:
    registry = TaskRegistry()
    registry.register(lambda: None, name="noop")
    store = _TimedStore(db)
    Worker(Scheduler(store, registry=registry), concurrency=slots).run(burst=True)
    store.close()
    Path(out).write_text(json.dumps(store.spans))


def timeline(path: Path, n: int, processes: int, slots: int) -> dict[str, float]:
    """Run ``processes`` burst workers over ``n`` no-op tasks; figures of the lock's use."""
    store = SQLiteStore(fresh(path))
    Scheduler(store).submit_many("noop", [{} for _ in range(n)])
    store.close()
    outs = [path.with_name(f"{path.name}.spans{i}.json") for i in range(processes)]
    children = [
        subprocess.Popen(  # noqa: S603 - our own module
            [
                sys.executable,
                "-m",
                "benchmarks.lock_timeline",
                "--child",
                str(path),
                str(slots),
                str(out),
            ],
            cwd=ROOT,
        )
        for out in outs
    ]
    for child in children:
        assert child.wait(600) == 0, f"a worker exited {child.returncode}"
    spans = sorted(
        (got, released, asked, i)
        for i, out in enumerate(outs)
        for asked, got, released in json.loads(out.read_text())
    )
    for out in outs:
        out.unlink()
    start, end = spans[0][0], max(s[1] for s in spans)
    holds = [released - got for got, released, _, _ in spans]
    waits = [got - asked for got, _, asked, _ in spans]
    gaps = [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(spans)]
    same = sum(1 for a, b in itertools.pairwise(spans) if a[3] == b[3])
    return {
        "tasks_per_s": n / (end - start),
        "transactions": len(spans),
        "lock_busy_pct": 100 * min(1.0, sum(holds) / (end - start)),
        "hold_p50_ms": statistics.median(holds) * 1e3,
        "hold_mean_ms": statistics.mean(holds) * 1e3,
        "wait_mean_ms": statistics.mean(waits) * 1e3,
        "gap_mean_ms": statistics.mean(gaps) * 1e3 if gaps else 0.0,
        "same_process_next_pct": 100 * same / max(1, len(spans) - 1),
    }


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        _child(argv[1], int(argv[2]), argv[3])
        return 0
    db, n, processes, slots = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    print(json.dumps(timeline(db, n, processes, slots)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
