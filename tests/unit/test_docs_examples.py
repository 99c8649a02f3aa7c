"""Every ```python block in docs/api.md runs, in order, in one namespace."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", ["api.md", "schedules.md"])
def test_examples_run(doc: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="durablesched")
    blocks = python_blocks(DOCS / doc)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, f"{doc} example", "exec"), namespace)  # noqa: S102 - our own docs
