"""scripts/_chromium.sh: a busy apt lock is waited for, not reported as a failure; a real
apt failure is. Run with a fake ``apt-get`` on PATH (no apt, no sleeping: step 0)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCKED = "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1 (apt-get)"


def _install(tmp_path: Path, answers: list[tuple[int, str]], wait: int = 600) -> tuple[int, str]:
    """install_chromium then chromium_outcome, with apt-get giving ``answers`` in turn
    (exit code, stderr line), one per call of ``apt-get install``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = ["#!/usr/bin/env bash", '[ "$1" = update ] && exit 0', f'n="$(cat {tmp_path}/n)"']
    for i, (code, line) in enumerate(answers):
        script.append(
            f'[ "$n" = {i} ] && {{ echo {i + 1} >{tmp_path}/n; echo "{line}" >&2; exit {code}; }}'
        )
    script.append("exit 0")
    fake = bin_dir / "apt-get"
    fake.write_text("\n".join(script) + "\n")
    fake.chmod(0o755)
    (tmp_path / "n").write_text("0")
    shell = (
        f"source {ROOT}/scripts/_chromium.sh; status=0; "
        f"install_chromium {tmp_path}/log || status=$?; chromium_outcome {tmp_path}/log $status; "
        "exit $status"
    )
    done = subprocess.run(
        ["/bin/bash", "-c", shell],
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "CHROMIUM_BIN": str(tmp_path / "no-chromium"),
            "APT_LOCK_STEP": "0",
            "APT_LOCK_WAIT": str(wait),
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout


def test_a_busy_lock_is_waited_for_and_the_install_succeeds(tmp_path: Path) -> None:
    code, out = _install(tmp_path, [(100, LOCKED), (100, LOCKED), (0, "")])
    assert (code, out) == (
        0,
        "chromium installed (after waiting 0s for apt's lock, busy 2 time(s))\n",
    )
    assert (tmp_path / "n").read_text().strip() == "3"  # tried until the lock was free


def test_a_real_apt_failure_is_reported_with_its_error(tmp_path: Path) -> None:
    code, out = _install(tmp_path, [(100, "E: Unable to locate package chromium")])
    assert code == 1
    assert out.startswith("installing chromium failed:")
    assert "Unable to locate package chromium" in out


def test_a_lock_that_stays_busy_says_so_and_not_failed(tmp_path: Path) -> None:
    code, out = _install(tmp_path, [(100, LOCKED)] * 3, wait=0)
    assert code == 2
    assert "stayed busy" in out and "failed" not in out
