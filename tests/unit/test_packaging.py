"""Every folder of the package that holds files is a listed package: setuptools ships
it without warnings (one per file, ~85 lines on ``pip install -e .`` before)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_folder_with_files_is_a_listed_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {
        ".".join(p.relative_to(ROOT).parts)
        for p in (ROOT / "durablesched").rglob("*")
        if p.is_dir() and p.name != "__pycache__" and any(f.is_file() for f in p.iterdir())
    }
    assert folders <= listed, f"not in [tool.setuptools] packages: {sorted(folders - listed)}"
    data = config["package-data"]
    assert data["durablesched.dashboard.templates"] == ["*.html"]


def test_the_readme_says_how_the_command_gets_on_path_and_that_way_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    use_it = readme[readme.index("## Use it") : readme.index("## Read more")]
    assert "pip install /path/to/durablesched" in use_it and "PATH" in use_it
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["durablesched"] == "durablesched.cli:main"
    done = subprocess.run(
        [sys.executable, "-m", "durablesched", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("durablesched ")
