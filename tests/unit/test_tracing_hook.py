"""The tracing hook when nothing is instrumented (nothing imported, nothing stored), and the
stored form of a trace context, and a tracer that fails (docs/tracing.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from durablesched import (
    InvalidScheduleError,
    InvalidTaskError,
    ManualClock,
    MemoryStore,
    Scheduler,
    SQLiteStore,
    TaskContext,
    TaskRegistry,
    Worker,
)
from durablesched.context import AttemptSignals
from durablesched.records import (
    TRACE,
    Claim,
    ErrorInfo,
    NewTask,
    Submitted,
    join_trace,
    split_trace,
)
from durablesched.states import TaskState
from durablesched.submission import build_task
from durablesched.tracing import (
    CANCELLED,
    FAILED,
    LEASE_LOST,
    RETRY,
    SUCCEEDED,
    AttemptTrace,
    install,
    outcome_of,
    with_trace,
)

from ..conftest import WAIT
from .test_cli_edges import Run

NOW = datetime(2030, 1, 1, tzinfo=UTC)
CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.strip()


def test_submitting_and_running_without_instrumenting_imports_no_opentelemetry(
    tmp_path: Path,
) -> None:
    """The SDK is installed here (the test extra), so only the code can keep it out."""
    db = tmp_path / "tasks.db"
    out = run_python(
        f"""
        import sqlite3, sys
        from durablesched import Scheduler, SQLiteStore, TaskRegistry, Worker
        registry = TaskRegistry()
        ran = []
        registry.task("job")(lambda **kw: ran.append(kw))
        store = SQLiteStore({str(db)!r})
        scheduler = Scheduler(store, registry=registry)
        scheduler.submit("job", {{"a": 1}})
        scheduler.submit_many("job", [{{"b": 2}}])
        assert Worker(scheduler).run_due() == 2
        store.close()
        stored = [r[0] for r in sqlite3.connect({str(db)!r}).execute("SELECT args FROM tasks")]
        print(ran, stored, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    assert out == """[{'a': 1}, {'b': 2}] ['{"a":1}', '{"b":2}'] []"""


def test_the_otel_module_without_opentelemetry_names_the_extra() -> None:
    out = run_python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        from durablesched import ConfigurationError
        try:
            import durablesched.otel
        except ConfigurationError as e:
            print(e)
        """
    )
    assert out == "durablesched.otel needs opentelemetry-api: pip install 'durablesched[otel]'"


@pytest.mark.parametrize(
    ("args", "positional"), [({}, None), ({"a": [1, {"b": "ü"}]}, None), ({"k": None}, [1, 2])]
)
def test_the_context_extends_the_arguments_json_as_if_made_together(
    args: dict[str, object], positional: list[int] | None
) -> None:
    task = build_task("t", args, now=NOW, positional=positional)
    traced = with_trace(task, CARRIER)
    assert traced.args_json is not None
    assert json.loads(traced.args_json) == {TRACE: CARRIER, **task.args} == traced.args
    assert split_trace(json.loads(traced.args_json)) == (task.args, CARRIER)
    assert join_trace(task.args, CARRIER) == traced.args
    # A task built without its JSON (the process environment's children) gets the member too.
    bare = NewTask("t", dict(task.args), NOW, 1)
    assert with_trace(bare, CARRIER).args == traced.args
    assert with_trace(bare, CARRIER).args_json is None


def test_an_empty_carrier_leaves_the_task_as_it_was() -> None:
    task = build_task("t", {"a": 1}, now=NOW)
    assert with_trace(task, {}) is task


def test_a_malformed_stored_context_is_dropped_not_passed_on() -> None:
    stored = {TRACE: "not a mapping", "a": 1}
    assert split_trace(stored) == ({"a": 1}, None)
    assert split_trace({TRACE: {"traceparent": 7}}) == ({}, None)
    assert stored == {TRACE: "not a mapping", "a": 1}  # read, not changed
    plain = {"a": 1}
    assert split_trace(plain)[0] is plain  # the common case: no copy


def test_each_end_state_has_its_outcome_name() -> None:
    assert [outcome_of(s) for s in TaskState if s.value not in ("PENDING", "RUNNING")] == [
        SUCCEEDED,
        RETRY,
        FAILED,
        CANCELLED,
    ]
    assert outcome_of(None) == LEASE_LOST


class BrokenTracer:
    """A tracer whose every attempt call fails: at its start, or at its end."""

    def __init__(self, fail_at: str) -> None:
        self.fail_at = fail_at

    def submit(
        self,
        name: str,
        build: Callable[[], list[NewTask]],
        store: Callable[[list[NewTask]], list[Submitted]],
        *,
        batch: bool,
    ) -> list[Submitted]:
        return store(build())

    def carry(self, task: NewTask) -> NewTask:
        return task

    def attempt(self, claim: Claim, owner: str) -> AttemptTrace:
        if self.fail_at == "start":
            raise RuntimeError("tracer down")
        return self

    def running(self) -> AbstractContextManager[object]:
        return nullcontext()

    def end(self, outcome: str, error: ErrorInfo | None = None) -> None:
        raise RuntimeError("tracer down")


@pytest.mark.parametrize("fail_at", ["start", "end"])
def test_a_failing_tracer_neither_stops_an_attempt_nor_holds_its_slot(
    fail_at: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = TaskRegistry()
    registry.task("job")(lambda: "done")
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(NOW))
    ids = [scheduler.submit("job") for _ in range(3)]
    previous = install(BrokenTracer(fail_at))
    try:
        worker = Worker(scheduler, concurrency=2)
        assert worker.run_once() == 2  # on the worker's threads: the group commit ends them
        assert worker.wait_idle(WAIT)
        assert worker.run_once() == 1  # the slots were freed
        assert worker.wait_idle(WAIT)
        assert worker.stop(WAIT)
    finally:
        install(previous)
    assert [scheduler.get(i).state for i in ids] == [TaskState.SUCCEEDED] * 3
    assert "tracing: could not" in caplog.text


def test_show_prints_the_arguments_and_the_context_apart(run: Run, db: Path) -> None:
    store = SQLiteStore(db)
    (submitted,) = store.submit([with_trace(build_task("t", {"n": 1}, now=NOW), CARRIER)], NOW)
    store.close()
    shown = run("show", str(submitted.task_id))
    assert shown.code == 0
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in
             shown.out.split("\nhistory:")[0].splitlines()}  # fmt: skip
    assert lines["args"] == '{"n": 1}'
    assert json.loads(lines["trace"]) == CARRIER
    as_json = json.loads(run("show", str(submitted.task_id), "--json").out)
    assert (as_json["args"], as_json["trace"]) == ({"n": 1}, CARRIER)
    listed = json.loads(run("ls", "--json").out)
    assert listed[0]["args"] == {"n": 1}


def test_a_schedule_or_a_child_cannot_take_the_reserved_name_either() -> None:
    registry = TaskRegistry()
    registry.task("job")(lambda **kwargs: None)
    with pytest.raises(InvalidScheduleError, match=r"'\*trace' is reserved"):
        registry.schedule("job", every=timedelta(minutes=1), args={TRACE: {}})
    scheduler = Scheduler(MemoryStore(), registry=registry, clock=ManualClock(NOW))
    claim = Claim(1, "job", {}, 1, 1, "w", 1, NOW, NOW, 1, "k")
    ctx = TaskContext(claim, scheduler, AttemptSignals())
    with pytest.raises(InvalidTaskError, match=r"'\*trace' is reserved"):
        ctx.submit("job", {TRACE: {"traceparent": "forged"}})
