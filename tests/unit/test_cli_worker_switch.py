"""The worker command runs with a short thread switch interval, restored after."""

from __future__ import annotations

import sys
from collections.abc import Callable

from durablesched.cli.worker import SWITCH_INTERVAL, SignalStop, run_worker


class FakeWorker:
    """What run_worker calls, noting the interval the loop ran with."""

    def __init__(self) -> None:
        self.seen: float | None = None

    def run(self, *, burst: bool, burst_wait: float) -> None:
        self.seen = sys.getswitchinterval()

    def shutdown(self, grace: float, *, on_wait: Callable[[int, float], object]) -> int:
        return 0

    def request_stop(self) -> None:
        pass


def test_the_loop_runs_with_the_short_interval_and_the_old_one_comes_back() -> None:
    """A task thread holding the interpreter makes the committer wait up to the interval
    after each fsync (docs/performance.md). Fails without the interval set."""
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL  # Python's default, 5 ms
    worker = FakeWorker()
    assert run_worker(worker, SignalStop(worker, 1.0), burst=True, burst_wait=0.0) == 0  # type: ignore[arg-type]
    assert worker.seen == SWITCH_INTERVAL
    assert sys.getswitchinterval() == before


def test_a_shorter_interval_already_set_is_kept() -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL / 2)
    try:
        worker = FakeWorker()
        run_worker(worker, SignalStop(worker, 1.0), burst=True, burst_wait=0.0)  # type: ignore[arg-type]
        assert worker.seen == SWITCH_INTERVAL / 2
    finally:
        sys.setswitchinterval(before)
