"""The guard table of docs/reliability.md names real code and real tests.

Each row says which guard a test protects; a renamed test or a moved statement
would leave the row pointing at nothing. Every test named in a row must be
defined under ``tests/`` or ``tests_django/`` (in the file the row names, when it
names one), and every guard's file must exist under ``durablesched/`` (or, for a
migration's trigger, under ``migrations/``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TITLE = "## Every guard and the test that fails without it"


def rows() -> list[list[str]]:
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert TITLE in text, f"docs/reliability.md has no section {TITLE!r}"
    section = text.split(TITLE, 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(table) > 2, "the guard table is empty"
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[2:]]


def defined_tests() -> dict[str, set[str]]:
    """Each test function's name -> the files (relative paths) defining it."""
    found: dict[str, set[str]] = {}
    for folder in ("tests", "tests_django"):
        for path in (ROOT / folder).rglob("test_*.py"):
            for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_row_names_a_guard_file_and_tests_that_exist() -> None:
    tests = defined_tests()
    for guard, _prevents, _change, named in rows():
        files = re.findall(r"`((?:\w+/)*\w+\.py)`", guard)
        assert files, f"the guard names no file: {guard}"
        for file in files:
            where = ROOT if file.startswith("migrations/") else ROOT / "durablesched"
            assert (where / file).is_file(), f"no {file} under {where}"
        paths = re.findall(r"((?:tests|tests_django)/[\w/]+\.py)", named)
        names = re.findall(r"\b(test_\w+)", re.sub(r"[\w/]+\.py", "", named))
        assert names, f"no test named for {guard}"
        for name in names:
            assert name in tests, f"{name} (for {guard}) is defined nowhere"
        for path in paths:
            assert (ROOT / path).is_file(), f"no {path}"
