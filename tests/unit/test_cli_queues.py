"""``durablesched queue ...``, ``submit --queue/--priority``, ``ls --queue`` and
``worker --queue``: in process, on a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durablesched import SQLiteStore

from ..conftest import database_image
from .test_cli_edges import Run, usage_error

APP = "tests.unit.cli_app"


def test_queue_set_makes_a_queue_says_so_and_keeps_what_it_is_not_told(run: Run) -> None:
    assert run("migrate").code == 0
    made = run("queue", "set", "api", "--concurrency", "2")
    assert made.code == 0, made
    assert made.out.splitlines() == [
        "queue 'api' did not exist: made it",
        "queue 'api': active, concurrency 2, rate unlimited",
    ]
    again = run("queue", "set", "api", "--rate", "10/s")
    assert again.out.splitlines() == ["queue 'api': active, concurrency 2, rate 10/s"]
    assert run("queue", "pause", "api").out.strip() == (
        "queue 'api': paused, concurrency 2, rate 10/s"
    )
    lifted = run("--json", "queue", "set", "api", "--concurrency", "none")
    assert json.loads(lifted.out) == {
        "created": False,
        "name": "api",
        "concurrency": None,
        "rate": "10/s",
        "paused": True,
        "concurrency_per_key": None,
        "rate_per_key": None,
    }
    assert run("queue", "resume", "api").out.strip().startswith("queue 'api': active")
    per_key = run("queue", "set", "api", "--concurrency-per-key", "1")
    assert per_key.out.strip() == (
        "queue 'api': active, concurrency unlimited, rate 10/s, concurrency per key 1"
    )
    listed = {q["name"]: q for q in json.loads(run("--json", "queue", "ls").out)}
    assert (listed["api"]["concurrency_per_key"], listed["api"]["keys_at_limit"]) == (1, 0)
    assert "1 (0 at limit)" in run("queue", "ls").out
    bad = run("queue", "set", "api", "--concurrency-per-key", "0")
    assert bad.code == 2 and "--concurrency-per-key" in bad.err
    rated = run("queue", "set", "api", "--rate-per-key", "5/s")
    assert rated.out.strip().endswith("concurrency per key 1, rate per key 5/s")
    assert "1 5/s (0 at limit)" in run("queue", "ls").out
    bad = run("queue", "set", "api", "--rate-per-key", "5/x")
    assert bad.code == 2 and "--rate-per-key" in bad.err


def test_queue_ls_shows_depth_running_limits_and_age(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    assert run("submit", "t", "--queue", "mail").code == 0
    assert run("submit", "t", "--queue", "mail", "--priority", "9").code == 0
    assert run("queue", "set", "mail", "--rate", "5/m").code == 0
    listed = json.loads(run("--json", "queue", "ls").out)
    by_name = {q["name"]: q for q in listed}
    assert set(by_name) == {"default", "mail"}
    mail = by_name["mail"]
    assert (mail["counts"]["PENDING"], mail["running"], mail["rate"]) == (2, 0, "5/m")
    assert mail["oldest_waiting_seconds"] is not None and mail["oldest_waiting_seconds"] >= 0
    text = run("queue", "ls").out
    assert text.splitlines()[0].split() == [
        "queue", "state", "waiting", "running", "ahead", "concurrency", "rate", "per", "key",
        "oldest", "wait",
        "succeeded", "failed", "cancelled",
    ]  # fmt: skip
    assert any(
        line.split()[:7] == ["mail", "active", "2", "0", "0", "-", "5/m"]
        for line in text.splitlines()
    )


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["queue", "set", "api", "--concurrency", "0"], "--concurrency"),
        (["queue", "set", "api", "--concurrency", "x"], "--concurrency"),
        (["queue", "set", "api", "--rate", "10/x"], "--rate"),
        (["queue", "set", "bad name", "--rate", "1/s"], "queue's name"),
        (["queue", "set", "api"], "--concurrency, --rate, --concurrency-per-key or --rate-per-key"),
        (["queue", "pause"], "needs the queue's name"),
        (
            ["queue", "pause", "api", "--rate", "1/s"],
            "takes no --concurrency, --rate, --concurrency-per-key or --rate-per-key",
        ),
        (["queue", "ls", "api"], "queue ls takes no queue name"),
        (["queue", "drop", "api"], "invalid choice"),
        (["submit", "t", "--queue", "a b"], "--queue"),
        (["submit", "t", "--priority", "101"], "--priority"),
        (["submit", "t", "--priority", "high"], "--priority"),
        (["ls", "--queue", "a/b"], "--queue"),
        (["worker", "--app", APP, "--queue", "default"], "NAME=SLOTS"),
        (["worker", "--app", APP, "--queue", "default=0"], "--queue default"),
        (["worker", "--app", APP, "--queue", "a=1", "--queue", "a=2"], "names 'a' twice"),
    ],
)
def test_bad_queue_input_is_one_line_and_exit_2_and_changes_nothing(
    run: Run, db: Path, argv: list[str], names: str
) -> None:
    assert run("migrate").code == 0
    before = database_image(db)
    usage_error(run(*argv), names)
    assert database_image(db) == before


def test_submit_places_tasks_and_ls_filters_by_queue(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    report = int(run("submit", "report", "--app", APP).out)
    urgent = int(run("submit", "report", "--app", APP, "--queue", "urgent").out)
    plain = int(run("submit", "t", "--priority", "-3").out)
    store = SQLiteStore(db)
    placed = {i: (t.queue, t.priority) for i in (report, urgent, plain) if (t := store.get(i))}
    store.close()
    assert placed == {report: ("reports", 5), urgent: ("urgent", 5), plain: ("default", -3)}
    listed = json.loads(run("--json", "ls", "--queue", "reports").out)
    assert [t["id"] for t in listed] == [report]


def test_worker_serves_only_its_queues(run: Run, db: Path) -> None:
    assert run("migrate").code == 0
    mine = int(run("submit", "ok", "--queue", "mine").out)
    other = int(run("submit", "ok", "--queue", "other").out)
    result = run("worker", "--app", APP, "--queue", "mine=2", "--burst", "--log-level", "warning")
    assert result.code == 0, result
    store = SQLiteStore(db)
    states = {i: t.state.value for i in (mine, other) if (t := store.get(i))}
    store.close()
    assert states == {mine: "SUCCEEDED", other: "PENDING"}
    env = run(
        "worker", "--app", APP, "--burst", "--log-level", "warning",
        env={"DURABLESCHED_WORKER_QUEUES": "other=1,mine=1"},
    )  # fmt: skip
    assert env.code == 0, env
    store = SQLiteStore(db)
    assert store.get(other).state.value == "SUCCEEDED"  # type: ignore[union-attr]
    store.close()
