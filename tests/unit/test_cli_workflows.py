"""``durablesched signal ID NAME --payload JSON`` (docs/cli.md, docs/workflows.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durablesched import SQLiteStore
from durablesched.cli.output import when
from durablesched.records import NewTask
from durablesched.workflows import waits
from durablesched.workflows.steps import FOREVER

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


def test_ls_says_what_each_suspended_workflow_waits_for(run: Run, db: Path) -> None:
    """A column (and ``waits_for`` in JSON): a sleep's wake time, a signal with its
    timeout, a gather's children ended of all; nothing for a task merely due later."""
    assert run("migrate").code == 0
    store = SQLiteStore(db)
    try:
        now = datetime.now(UTC)
        wake, deadline = now + timedelta(days=3), now + timedelta(hours=48)
        names = ("sleeper", "approval", "fan")
        sleeper, waiter, fan = (
            t.task_id for t in store.submit([NewTask(n, {}, now, 3, None) for n in names], now)
        )
        claims = {c.task_id: c for c in store.claim("w", 3, now, timedelta(seconds=30), names)}
        kids = store.spawn(claims[fan], 0, "spawn:kid", [NewTask("kid", {}, now, 3, None)] * 2, now)
        assert kids is not None
        ids = [k.task_id for k in kids]
        store.suspend(claims[sleeper], wake, now, detail=waits.sleeping(0, wake))
        detail = waits.signal(0, "approved", deadline)
        store.suspend(claims[waiter], deadline, now, detail=detail, signal="approved")
        store.suspend(claims[fan], FOREVER, now, detail=waits.children(1, ids, 0))
        (kid,) = store.claim("w", 1, now, timedelta(seconds=30), ["kid"])
        store.complete(kid, None, now)  # one of the two ends (and wakes its parent: due now)
        store.suspend(store.claim("w", 1, now, timedelta(seconds=30), ["fan"])[0], FOREVER,
                      now, detail=waits.children(1, ids, 1))  # fmt: skip
        (later,) = store.submit([NewTask("send", {}, now + timedelta(days=1), 3, None)], now)
    finally:
        store.close()
    said = {t["id"]: t["waits_for"] for t in json.loads(run("ls", "--json").out)}
    assert said == {
        sleeper: f"sleep until {when(wake)}",
        waiter: f"signal approved (timeout {when(deadline)})",
        fan: "children 1 of 2",
        ids[1]: None,  # a child due now: it waits for a worker
        later.task_id: None,
        kid.task_id: None,
    }
    table = run("ls").out
    assert table.splitlines()[0].split()[-1] == "waits_for"
    rows = {int(line.split()[0]): line for line in table.splitlines()[2:] if line.strip()}
    assert rows[sleeper].endswith(f"sleep until {when(wake)}")
    assert rows[fan].endswith("children 1 of 2")
    assert rows[later.task_id].endswith(" -")
