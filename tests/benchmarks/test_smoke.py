"""The benchmark harness runs end to end at small sizes, so it never rots. Not a timed test:
it checks that every figure and every target ratio was produced, not their values.

It needs what the full run needs: the peers of the ``bench`` extra and a PostgreSQL
server. Without them it fails in CI and is skipped elsewhere, with one line saying
what to install or start (the policy of ``tests/conftest.py`` for PostgreSQL).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from benchmarks import pg

ROOT = Path(__file__).resolve().parents[2]


def _require(message: str) -> None:
    """Fail in CI, skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def missing_bench_extra() -> list[str]:
    """The distributions of the ``bench`` extra (as pyproject.toml lists them) not installed."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["bench"]
    missing = []
    for line in extra:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # not for this Python (django-tasks-db: 3.12 or newer)
        name = requirement.name
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def require_benchmark_peers() -> None:
    missing = missing_bench_extra()
    if missing:
        _require(
            f"the benchmark smoke test needs the bench extra: pip install -e .[bench] "
            f"(missing: {', '.join(missing)})"
        )
    if not pg.reachable():
        _require(
            f"the benchmark smoke test needs PostgreSQL at {pg.BASE_URL}: start one there "
            "or point BENCH_PG at one"
        )


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_peer_names_the_extra_to_install(
    ci: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = metadata.distribution

    def without_huey(name: str) -> metadata.Distribution:
        if name == "huey":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_huey)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"pip install -e \.\[bench\] \(missing: huey\)"):
        require_benchmark_peers()


@pytest.mark.processes
def test_benchmark_smoke_produces_every_figure(tmp_path: Path) -> None:
    require_benchmark_peers()
    from benchmarks.run import main  # noqa: PLC0415 - after the check: it names what is missing

    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "smoke.json").read_text())
    figures = report["figures"]
    for key in (
        "raw_1_per_tx_full",
        "raw_32_per_tx_normal",
        "raw_executemany",
        "submit_many",
        "e2e_1proc_32slots_full",
        "e2e_4proc_8slots_full",
        "claim_10000_finished",
        "pickup_idle",
        "memory_backend_bytes_per_task",
        "e2e_1proc_32slots_full_info_log",
        "e2e_1proc_8slots_full_process_env",
        "attempt_start_ms",
        "huey_consumer_8threads",
        "huey_consumer_32threads",
        "litequeue_full",
        "persistqueue_ackqueue",
        "path_cli_burst_8slots",
        "path_huey_8threads",
        "cpu_task",
        "cpu_plain_loop",
        "cpu_ours_1proc_1slot",
        "cpu_ours_1proc_2slots",
        "cpu_ours_2proc_1slot",
        "cpu_huey_1proc",
        "cpu_huey_2proc",
        "startup_worker",
        "startup_import_sqlalchemy",
    ):
        assert key in figures, f"the smoke run produced no figure {key!r}"
    assert figures["cpu_ours_1proc_best"]["slots"] in (1, 2)
    assert 0 < figures["startup_worker"]["first_claim_ms"] < figures["startup_worker"]["exit_ms"]
    for processes in (1, 4):
        lock = figures[f"write_lock_{processes}proc_8slots"]
        assert lock["transactions"] > 0 and 0 < lock["lock_busy_pct"] <= 100
    assert figures["write_lock_1proc_8slots"]["same_process_next_pct"] == 100
    for key in ("pg_e2e_4proc_32slots", "pg_pgqueuer_4proc", "pg_procrastinate_1proc"):
        assert key in figures, f"the smoke run produced no PostgreSQL figure {key!r}"
    # 11 + W1a + 4 PostgreSQL + 4 of the queues (issue 18) + 6 of the whole path (issue 22)
    assert len(report["targets"]) == 26
    assert all(t["met"] is not None and math.isfinite(t["value"]) for t in report["targets"])
    assert (tmp_path / "smoke.md").read_text().count("|") > 50
    assert (tmp_path / "smoke.png").stat().st_size > 1000
