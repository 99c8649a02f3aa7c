"""``durablesched signal ID NAME --payload JSON`` (docs/cli.md, docs/workflows.md)."""

from __future__ import annotations

import json
from pathlib import Path

from durablesched import SQLiteStore

from .test_cli_edges import Run, usage_error


def test_signal_keeps_the_payload_for_the_task(run: Run, db: Path) -> None:
    assert run("submit", "wf").code == 0
    result = run("signal", "1", "approved", "--payload", '{"by": "ada"}')
    assert result.code == 0, result
    assert "signal 'approved' sent" in result.out
    result = run("--json", "signal", "1", "approved")
    assert json.loads(result.out) == {"id": 1, "signal": "approved", "signal_id": 2}
    store = SQLiteStore(db)
    try:
        assert [(s.name, s.payload) for s in store.signals(1)] == [
            ("approved", {"by": "ada"}),
            ("approved", None),
        ]
    finally:
        store.close()


def test_signal_refuses_bad_json_an_unknown_id_and_a_finished_task(run: Run, db: Path) -> None:
    assert run("submit", "wf").code == 0
    usage_error(run("signal", "1", "go", "--payload", "{nope"), "--payload is not valid JSON")
    usage_error(run("signal", "1", "", "--payload", "1"), "must not be empty")
    missing = run("signal", "9", "go")
    assert missing.code == 1 and "no task with id 9" in missing.err
    assert run("cancel", "1").code == 0
    finished = run("signal", "1", "go")
    assert finished.code == 1 and "a finished task takes no signal" in finished.err
