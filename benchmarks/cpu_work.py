"""The CPU-bound task's work: a pure-Python loop whose length comes from BENCH_CPU_LOOPS.

The benchmark calibrates the length once per run (about 1 ms) and passes it to every
process through the environment, so that the plain loop, our workers and huey's do
the same work. ``python -m benchmarks.cpu_work N`` is the plain loop: N calls, timed
inside, printed as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

VARIABLE = "BENCH_CPU_LOOPS"


def spin(loops: int) -> int:
    """Pure Python under the GIL: no I/O, no allocation worth counting."""
    total = 0
    for i in range(loops):
        total ^= i * 7
    return total


def loops_from_env() -> int:
    """The calibrated length. Read when an app module is imported, so that a worker or a
    consumer started without it fails at once rather than running other work."""
    loops = int(os.environ.get(VARIABLE, "0"))
    if loops <= 0:
        raise RuntimeError(f"set {VARIABLE}: the benchmark calibrates the CPU-bound work")
    return loops


def calibrate(seconds: float = 0.001) -> int:
    """The loop length that takes about ``seconds`` in this interpreter: from the median
    of a few timings (the fastest made the work about a quarter too short: a child
    process calling it in a loop does not run at the best moment's speed)."""
    trial = 50_000
    spin(trial)  # warm up
    typical = statistics.median(_timed(trial) for _ in range(21))
    return max(1, round(trial * seconds / typical))


def _timed(loops: int) -> float:
    start = time.perf_counter()
    spin(loops)
    return time.perf_counter() - start


def main() -> int:
    n = int(sys.argv[1])
    loops = loops_from_env()
    start = time.perf_counter()
    for _ in range(n):
        spin(loops)
    print(json.dumps({"seconds": time.perf_counter() - start}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
