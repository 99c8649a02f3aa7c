"""Every ```python block of each doc runs, in order, in one namespace per doc."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


#: Each doc with examples, and how many it has at least (a lost block fails).
DOCS_WITH_EXAMPLES = {
    "api.md": 6,
    "dashboard.md": 1,
    "execution.md": 3,
    "metrics.md": 1,
    "queues.md": 2,
    "schedules.md": 5,
    "tracing.md": 1,
    "workflows.md": 1,
}


@pytest.mark.parametrize("doc", sorted(DOCS_WITH_EXAMPLES))
def test_examples_run(doc: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="durablesched")
    blocks = python_blocks(DOCS / doc)
    assert len(blocks) >= DOCS_WITH_EXAMPLES[doc]
    namespace: dict[str, object] = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, f"{doc} example", "exec"), namespace)  # noqa: S102 - our own docs
