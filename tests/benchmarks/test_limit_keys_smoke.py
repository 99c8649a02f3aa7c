"""benchmarks/limit_keys.py runs end to end at a tiny size, so it never rots: the busy key
and the plain queue, on SQLite and on PostgreSQL. Not timed."""

from __future__ import annotations

import pytest

from ..conftest import PG_URL, require_postgres


@pytest.mark.processes
def test_the_limit_keys_benchmark_runs_on_both_databases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_postgres()
    from benchmarks.limit_keys import main  # noqa: PLC0415 - after the check

    argv = [
        "--tasks",
        "600",
        "--keys",
        "80",
        "--busy",
        "200",
        "--claims",
        "2",
        "--claim-rounds",
        "2",
    ]
    argv += [
        "--plain",
        "100",
        "--rounds",
        "1",
        "--debounce-rate",
        "50",
        "--debounce-seconds",
        "0.2",
    ]
    assert main([*argv, "--pg", PG_URL]) == 0
    out = capsys.readouterr().out
    for name in ("SQLite", "PostgreSQL"):
        assert f"{name}: a claim with a busy key of 200 ahead costs" in out
        assert "(median of 2 rounds' ratios; quartiles" in out
        assert f"{name}, plain queue (100 tasks, median of 1):" in out
        assert f"{name}, debounce:" in out and "1 task, due 30.000s after the last" in out
    assert "PostgreSQL (after VACUUM): a claim with a busy key of 200 ahead costs" in out
