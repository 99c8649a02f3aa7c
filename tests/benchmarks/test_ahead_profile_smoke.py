"""benchmarks/ahead_profile.py runs at a tiny size and prints its per-phase table, and
leaves the worker's classes as it found them (its counters wrap their methods)."""

from __future__ import annotations

import pytest

from benchmarks import ahead_profile
from durablesched.worker.commit import GroupCommit
from durablesched.worker.threads import TaskThreads


def test_the_profile_prints_a_table_per_side(capsys: pytest.CaptureFixture[str]) -> None:
    before = {(cls, attr): vars(cls).get(attr) for _, cls, attr in ahead_profile.PHASES}
    loop, hand_over = TaskThreads._loop, GroupCommit.hand_over
    assert ahead_profile.main(["--smoke", "--noop", "--cprofile", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "| task | hand-over of the outcome |" in out
    assert "| committer | record_and_claim statements |" in out  # ahead=8: the committer
    assert "**wall per task**" in out and "cProfile, ahead=8" in out
    assert {(cls, attr): vars(cls).get(attr) for _, cls, attr in ahead_profile.PHASES} == before
    assert (TaskThreads._loop, GroupCommit.hand_over) == (loop, hand_over)
