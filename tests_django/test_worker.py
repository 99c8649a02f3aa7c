"""``manage.py durablesched_worker``: it runs the project's tasks, retries them, orders them by
priority, keeps deferred ones, and sends Django's signals (``task_finished`` after commit)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError
from django.db import connections
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone

from durablesched import InvalidTaskError
from durablesched.contrib.django import durable
from durablesched.contrib.django.database import store_for
from tests_django.conftest import ROOT, WAIT, work, worker_env
from tests_django.testapp.tasks import (
    add,
    async_add,
    attempt_number,
    boom,
    hold,
    mark_paid,
    record,
    returns_a_set,
    send,
    slow,
    stubborn,
)

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_the_worker_runs_a_task_and_the_result_says_so(alias: str) -> None:
    result = add.using(backend=alias).enqueue(2, b=3)
    work(alias)
    result.refresh()
    assert result.status is TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == [] and result.attempts == 1
    assert len(result.worker_ids) == 1 and result.worker_ids[0]
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at


def test_an_async_task_runs(alias: str) -> None:
    result = async_add.using(backend=alias).enqueue(20, 22)
    work(alias)
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_a_failing_task_is_retried_then_failed_with_its_error(alias: str) -> None:
    result = boom.using(backend=alias).enqueue("no luck")
    work(alias)  # OPTIONS retry: 2 attempts, no delay
    result.refresh()
    assert result.status is TaskResultStatus.FAILED
    assert result.attempts == 2 and result.started_at < result.last_attempted_at
    assert len(result.errors) == 2  # one per failed attempt, oldest first
    for error in result.errors:
        assert error.exception_class is ValueError
        assert "no luck" in error.traceback and "Traceback" in error.traceback
    assert len(result.worker_ids) == 2 and all(result.worker_ids)
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


def test_a_row_naming_no_task_of_the_project_fails_at_once(alias: str) -> None:
    # As a removed task leaves it: enqueued by an older version of the project.
    backend = task_backends[alias]
    gone = backend.scheduler.submit(
        "tests_django.testapp.tasks.removed", {"args": [], "kwargs": {}}, max_attempts=5
    )
    kept = add.using(backend=alias).enqueue(1, 2)
    work(alias)
    stored = store_for(alias).get(gone)
    assert stored is not None and (stored.state.value, stored.attempts) == ("FAILED", 1)
    assert stored.last_error is not None
    assert stored.last_error.type == "durablesched.UnknownTaskNameError"
    assert "'tests_django.testapp.tasks.removed'" in stored.last_error.message
    kept.refresh()
    assert kept.status is TaskResultStatus.SUCCESSFUL


def test_told_to_skip_them_the_worker_leaves_such_a_row(alias: str) -> None:
    backend = task_backends[alias]
    gone = backend.scheduler.submit(
        "tests_django.testapp.tasks.removed", {"args": [], "kwargs": {}}
    )
    work(alias, "--unknown-tasks", "skip")
    stored = store_for(alias).get(gone)
    assert stored is not None and stored.state.value == "PENDING"


def test_a_task_s_own_retry_options_are_used(alias: str) -> None:
    result = stubborn.using(backend=alias).enqueue()  # OPTIONS["tasks"]: 3 attempts
    work(alias)
    result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 3, 3)


def test_an_attempt_past_its_timeout_fails(alias: str) -> None:
    late = slow.using(backend=alias).enqueue(0.2)  # OPTIONS["tasks"]: timeout 0.05 s
    quick = slow.using(backend=alias).enqueue(0)
    work(alias)
    late.refresh()
    quick.refresh()
    assert (late.status, late.attempts) == (TaskResultStatus.FAILED, 2)
    assert {e.exception_class_path for e in late.errors} == {"durablesched.errors.TaskTimeout"}
    assert (quick.status, quick.return_value) == (TaskResultStatus.SUCCESSFUL, "done")


def test_an_effect_commits_with_the_success_and_never_without(alias: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS paid (task_order integer)")
        cursor.execute("DELETE FROM paid")
    paid = mark_paid.using(backend=alias).enqueue(7)
    declined = mark_paid.using(backend=alias).enqueue(8, fail=True)
    work(alias)
    paid.refresh()
    declined.refresh()
    assert (paid.status, declined.status) == (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT task_order FROM paid")
        assert cursor.fetchall() == [(7,)]  # once: the failed attempts' effects never ran


def test_a_result_json_cannot_hold_fails_at_its_first_attempt(alias: str) -> None:
    result = returns_a_set.using(backend=alias).enqueue()  # OPTIONS retry: 2 attempts
    work(alias)
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    (error,) = result.errors
    assert error.exception_class_path == "durablesched.errors.NoRetry"
    assert "must be JSON-serialisable" in error.traceback


def test_durable_takes_only_the_context_of_a_running_attempt(alias: str) -> None:
    result = add.using(backend=alias).enqueue(1, 1)
    with pytest.raises(InvalidTaskError, match="running takes_context=True task"):
        durable(TaskContext(task_result=result))


def test_a_task_with_context_sees_its_attempt_and_succeeds_on_the_second(alias: str) -> None:
    result = attempt_number.using(backend=alias).enqueue(fail_first=True)
    work(alias)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        2,
        2,
    )
    [error] = result.errors  # the first attempt's, though the task succeeded
    assert error.exception_class is RuntimeError and "first attempt fails" in error.traceback


def test_a_deferred_task_waits_for_its_time(alias: str) -> None:
    later = add.using(backend=alias, run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    now = add.using(backend=alias).enqueue(2, 2)
    work(alias)
    later.refresh()
    now.refresh()
    assert later.status is TaskResultStatus.READY
    assert now.status is TaskResultStatus.SUCCESSFUL


def test_higher_priority_runs_first(alias: str, tmp_path: Path) -> None:
    out = tmp_path / "order.txt"
    for priority in (-10, 50, 0, 100, -100):
        record.using(backend=alias, priority=priority).enqueue(str(out), str(priority))
    work(alias, "--concurrency", "1")
    assert out.read_text().split() == ["100", "50", "0", "-10", "-100"]


def test_a_worker_serves_only_the_queues_it_is_given(alias: str) -> None:
    mail = send.using(backend=alias).enqueue("a@example.com")
    sums = add.using(backend=alias).enqueue(1, 2)
    work(alias, "--queue", "default")
    mail.refresh()
    sums.refresh()
    assert (mail.status, sums.status) == (TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL)
    work(alias, "--queue", "emails=2")
    mail.refresh()
    assert mail.return_value == {"to": "a@example.com", "subject": ""}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "nope"], "not in TASKS"),
        (["--queue", "emails=0"], "--queue emails"),
        (["--concurrency", "0"], "--concurrency"),
        (["--backend", "missing"], "missing"),
    ],
)
def test_bad_worker_options_are_refused(alias: str, args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        work(alias, *args)


@pytest.fixture
def signals() -> Iterator[list[tuple[str, TaskResult, Any]]]:
    """(signal, task result, the stored state when it was sent) for each signal sent."""
    seen: list[tuple[str, TaskResult, Any]] = []

    def listener(name: str) -> Any:
        def receive(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
            backend = task_backends[task_result.backend]
            stored = store_for(backend.database).get(int(task_result.id))
            seen.append((name, task_result, stored.state if stored else None))

        return receive

    receivers = {
        task_enqueued: listener("enqueued"),
        task_started: listener("started"),
        task_finished: listener("finished"),
    }
    for sent, receiver in receivers.items():
        sent.connect(receiver)
    yield seen
    for sent, receiver in receivers.items():
        sent.disconnect(receiver)


def test_signals_are_sent_and_finished_only_after_the_commit(
    alias: str, signals: list[tuple[str, TaskResult, Any]]
) -> None:
    ok = add.using(backend=alias).enqueue(1, 1)
    bad = boom.using(backend=alias).enqueue("x")
    work(alias, "--concurrency", "1")
    by_task = {
        task_id: [(name, r.status, state) for name, r, state in signals if r.id == task_id]
        for task_id in (ok.id, bad.id)
    }
    assert by_task[ok.id] == [
        ("enqueued", TaskResultStatus.READY, "PENDING"),
        ("started", TaskResultStatus.RUNNING, "RUNNING"),
        ("finished", TaskResultStatus.SUCCESSFUL, "SUCCEEDED"),
    ]
    # Two attempts, one finish: a retry is not the end of a task.
    assert by_task[bad.id] == [
        ("enqueued", TaskResultStatus.READY, "PENDING"),
        ("started", TaskResultStatus.RUNNING, "RUNNING"),
        ("started", TaskResultStatus.RUNNING, "RUNNING"),
        ("finished", TaskResultStatus.FAILED, "FAILED"),
    ]


def test_the_command_runs_as_its_own_process(alias: str) -> None:
    results = [add.using(backend=alias).enqueue(n, n) for n in range(5)]
    env = worker_env()
    done = subprocess.run(
        [sys.executable, "-m", "django", "durablesched_worker", "--burst", "--backend", alias],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "burst done: nothing remains" in done.stdout
    for n, result in enumerate(results):
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2 * n)


def _until(predicate: Any, what: str) -> None:
    """Poll (a process's doing) until ``predicate()``, for at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lets_the_running_task_finish_and_starts_nothing_new(
    alias: str, tmp_path: Path, signum: int
) -> None:
    started, go = tmp_path / "started", tmp_path / "go"
    held = hold.using(backend=alias).enqueue(str(started), str(go))
    waiting = add.using(backend=alias, priority=-1).enqueue(1, 1)
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "durablesched_worker", "--backend", alias,
         "--concurrency", "1"],
        env=worker_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        _until(started.exists, "the task to start")
        worker.send_signal(signum)
        _until(lambda: "no new claims" in _read_so_far(worker), "the worker to hear the signal")
        go.touch()
        _, err = worker.communicate(timeout=WAIT)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, _SEEN.get(id(worker), b"").decode(errors="replace") + err
    held.refresh()
    waiting.refresh()
    assert (held.status, held.return_value) == (TaskResultStatus.SUCCESSFUL, "held")
    assert waiting.status is TaskResultStatus.READY


_SEEN: dict[int, bytes] = {}


def _read_so_far(process: subprocess.Popen[str]) -> str:
    """What the process wrote on stderr so far, read from the pipe itself without blocking long.

    ``os.read`` on the descriptor, not ``readline`` on the text wrapper: the wrapper would pull
    several lines into its own buffer, where ``select`` cannot see them, and a line already
    written would stay unread until the process wrote another."""
    assert process.stderr is not None
    fd = process.stderr.fileno()
    ready, _, _ = select.select([fd], [], [], 0.05)
    if ready:
        _SEEN[id(process)] = _SEEN.get(id(process), b"") + os.read(fd, 65536)
    return _SEEN.get(id(process), b"").decode(errors="replace")


def _start_worker(alias: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "durablesched_worker", "--backend", alias, *args],
        env=worker_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    """The process's output once it exits (within WAIT seconds; killed otherwise)."""
    try:
        return process.communicate(timeout=WAIT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_a_task_whose_worker_is_killed_is_finished_by_another(alias: str, tmp_path: Path) -> None:
    started, go = tmp_path / "started", tmp_path / "go"
    held = hold.using(backend=alias).enqueue(str(started), str(go))
    killed = _start_worker(alias, "--concurrency", "1", "--lease", "1")
    try:
        _until(started.exists, "the task to start")
        killed.send_signal(signal.SIGKILL)
    finally:
        _finish(killed)
    assert killed.returncode == -signal.SIGKILL
    go.touch()  # the next attempt runs through
    # Its burst waits for the dead worker's lease to lapse (at most --lease away), then
    # reclaims the task (the lost attempt counts) and runs it again.
    rescuer = _start_worker(alias, "--burst", "--burst-wait", "10")
    out, err = _finish(rescuer)
    assert rescuer.returncode == 0, err
    assert "burst done: nothing remains" in out
    held.refresh()
    assert (held.status, held.return_value, held.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        "held",
        2,
    )
    first, second = held.worker_ids
    assert first != second
    [lost] = held.errors  # the killed attempt, failed by its lapsed lease
    assert lost.exception_class_path == "durablesched.LeaseExpired"


def test_several_workers_run_each_task_exactly_once(alias: str, tmp_path: Path) -> None:
    out = tmp_path / "ran.txt"
    results = [record.using(backend=alias).enqueue(str(out), str(n)) for n in range(40)]
    workers = [_start_worker(alias, "--burst", "--concurrency", "2") for _ in range(3)]
    for worker in workers:
        _, err = _finish(worker)
        assert worker.returncode == 0, err
    assert sorted(out.read_text().split(), key=int) == [str(n) for n in range(40)]
    for result in results:
        result.refresh()
        assert (result.status, result.attempts) == (TaskResultStatus.SUCCESSFUL, 1)


def test_the_effect_example_in_the_docs_is_the_task_tested_here() -> None:
    docs = (ROOT / "docs" / "django.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", docs, flags=re.S) if "mark_paid" in b]
    source = (ROOT / "tests_django" / "testapp" / "tasks.py").read_text()
    for line in block.splitlines():
        assert line in source.splitlines(), f"docs/django.md's example has {line!r}"


def test_the_worker_forgets_each_attempt_once_its_outcome_commits(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DjangoTasks keeps each running attempt's start (for task_finished) until its
    # outcome commits: retried, failed and successful attempts all leave nothing
    # behind, or a long-running worker grows by one entry per attempt.
    from durablesched.contrib.django.management.commands import (  # noqa: PLC0415
        durablesched_worker as command,
    )
    from durablesched.contrib.django.running import DjangoTasks  # noqa: PLC0415

    made: list[DjangoTasks] = []

    class Kept(DjangoTasks):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(command, "DjangoTasks", Kept)
    results = [
        attempt_number.using(backend=alias).enqueue(True),  # a retry, then a success
        boom.using(backend=alias).enqueue("no luck"),  # two attempts, failed
        add.using(backend=alias).enqueue(1, b=2),
    ]
    work(alias)
    for result in results:
        result.refresh()
    assert [r.status for r in results] == [
        TaskResultStatus.SUCCESSFUL,
        TaskResultStatus.FAILED,
        TaskResultStatus.SUCCESSFUL,
    ]
    (tasks,) = made
    assert tasks._started == {}
