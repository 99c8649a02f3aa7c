"""``durablesched signal ID NAME --payload JSON`` (docs/cli.md, docs/workflows.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durablesched import SQLiteStore
from durablesched.records import NewTask

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


def _a_workflow_with_a_child(db: Path) -> tuple[int, int]:
    store = SQLiteStore(db)
    try:
        now = datetime.now(UTC)
        (parent,) = store.submit([NewTask("wf", {}, now, 3, None)], now)
        (claim,) = store.claim("w", 1, now, timedelta(seconds=30), ["wf"])
        kids = store.spawn(claim, 0, "spawn:kid", [NewTask("kid", {}, now, 3, None)], now)
        assert kids is not None
        store.suspend(claim, now + timedelta(days=1), now, detail="waiting")
        return parent.task_id, kids[0].task_id
    finally:
        store.close()


def _state(db: Path, task_id: int) -> str:
    store = SQLiteStore(db)
    try:
        record = store.get(task_id)
        assert record is not None
        return record.state.value
    finally:
        store.close()


def test_cancel_takes_a_workflows_children_unless_told_to_keep_them(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    parent, kid = _a_workflow_with_a_child(db)
    assert run("cancel", str(parent), "--keep-children").code == 0
    assert (_state(db, parent), _state(db, kid)) == ("CANCELLED", "PENDING")
    parent, kid = _a_workflow_with_a_child(db)
    assert run("cancel", str(parent)).code == 0
    assert (_state(db, parent), _state(db, kid)) == ("CANCELLED", "CANCELLED")
