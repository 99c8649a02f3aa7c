"""benchmarks/metrics.py runs end to end at a tiny size, so it never rots: a scrape on
SQLite and on PostgreSQL, with the attempt totals filled in. Not timed."""

from __future__ import annotations

import pytest

from benchmarks import pg

from ..conftest import require_postgres


@pytest.mark.processes
def test_the_metrics_benchmark_scrapes_both_databases(capsys: pytest.CaptureFixture[str]) -> None:
    require_postgres()
    if not pg.reachable():
        pytest.skip(f"no PostgreSQL at {pg.BASE_URL}")
    from benchmarks.metrics import main  # noqa: PLC0415 - after the checks

    assert main(["--tasks", "300", "--recent", "30", "--scrapes", "1", "--pg"]) == 0
    out = capsys.readouterr().out
    assert "scrape, SQLite: median" in out and "scrape, PostgreSQL: median" in out
