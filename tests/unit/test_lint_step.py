"""``scripts/test``'s lint step fails the run on a lint error and on a formatting error.

Under ``set -e``, bash ignores a failing command that is not the last of an ``&&`` list:
``ruff check . && ruff format --check .`` let an unused import through. The step is now a
function that keeps each linter's status (``scripts/_lint.sh``), and the script runs its
self-test before it lints the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lint(path: Path) -> int:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = f'set -euo pipefail; source "{ROOT}/scripts/_lint.sh"; lint --isolated "$1"'
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "-c", script, "lint", str(path)],
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )
    return done.returncode


@pytest.mark.parametrize(
    ("source", "fails"),
    [("import os\n", True), ('x = {  "a":1 }\n', True), ("X = 1\n", False)],
    ids=["lint error", "formatting error", "clean"],
)
def test_the_lint_step_fails_on_either_linter(tmp_path: Path, source: str, fails: bool) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    assert (_lint(path) != 0) is fails


def test_scripts_test_runs_the_self_test_before_linting_the_tree() -> None:
    lines = (ROOT / "scripts" / "test").read_text().splitlines()
    assert lines.index("lint_self_test") < lines.index("lint .")
