"""benchmarks/dashboard.py runs end to end at a tiny size, so it never rots: every page
answers on SQLite and PostgreSQL, and the busy worker's figures come out. Not timed."""

from __future__ import annotations

import pytest

from benchmarks import pg

from ..conftest import require_postgres


@pytest.mark.processes
def test_the_dashboard_benchmark_produces_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    require_postgres()
    if not pg.reachable():
        pytest.skip(f"no PostgreSQL at {pg.BASE_URL}")
    from benchmarks.dashboard import INDEXES, main  # noqa: PLC0415 - after the checks

    args = ["--tasks", "4000", "--requests", "1", "--pg", "--busy", "1000", "--runs", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for database in ("SQLite, 4,000 tasks", "PostgreSQL, 4,000 tasks"):
        table = out.split(database, 1)[1]
        for page in ("| overview |", "| tasks by key |", "| task (failed, with history) |"):
            assert page in table, (database, page)
    for name in ("none", *INDEXES, "all"):
        assert f"| {name} |" in out
    assert "with the overview open" in out
