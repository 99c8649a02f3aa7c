"""The ``TaskResult`` a worker sends with ``task_started`` and ``task_finished`` (and gives a
``takes_context`` task) is built from what it knows, not read: each must equal what
``get_result`` reads at that moment, field by field, whatever way the task ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from django.tasks import Task, TaskResult, TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started

from durablesched.contrib.django.backend import DurableSchedBackend
from tests_django.conftest import work
from tests_django.testapp.tasks import (
    add,
    async_add,
    attempt_number,
    boom,
    cancels_itself,
    send,
    slow,
)

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

FIELDS = (
    "task", "id", "status", "enqueued_at", "started_at", "last_attempted_at", "finished_at",
    "args", "kwargs", "backend", "errors", "worker_ids",
)  # fmt: skip


class Seen:
    """Each signal's result beside what ``get_result`` read when it was sent, and how many
    times the worker itself read a result."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, TaskResult, TaskResult]] = []
        self.worker_reads = 0


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[Seen]:
    found = Seen()
    read = DurableSchedBackend.get_result

    def counted(self: DurableSchedBackend, result_id: Any) -> TaskResult:
        found.worker_reads += 1
        return read(self, result_id)

    def listener(name: str) -> Any:
        def receive(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
            stored = read(task_backends[task_result.backend], task_result.id)
            found.pairs.append((name, task_result, stored))

        return receive

    receivers = [(task_started, listener("started")), (task_finished, listener("finished"))]
    for signal, receiver in receivers:
        signal.connect(receiver)
    monkeypatch.setattr(DurableSchedBackend, "get_result", counted)
    yield found
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def _same(built: TaskResult, read: TaskResult) -> None:
    for name in FIELDS:
        assert getattr(built, name) == getattr(read, name), name
    if read.status is TaskResultStatus.SUCCESSFUL:
        assert built.return_value == read.return_value
    assert built == read


class Case(NamedTuple):
    task: Task
    args: list[Any]
    kwargs: dict[str, Any]
    #: The status of each signal's result, in order.
    statuses: list[str]
    #: How many errors the finished result holds.
    errors: int


CASES = {
    "first attempt": Case(add, [1, 2], {}, ["RUNNING", "SUCCESSFUL"], 0),
    "queue and priority": Case(
        send.using(priority=7), ["a@example.com"], {"subject": "hi"}, ["RUNNING", "SUCCESSFUL"], 0
    ),
    "async": Case(async_add, [2, 3], {}, ["RUNNING", "SUCCESSFUL"], 0),
    "retried then failed": Case(boom, ["no"], {}, ["RUNNING", "RUNNING", "FAILED"], 2),
    "retried then succeeded": Case(
        attempt_number, [], {"fail_first": True}, ["RUNNING", "RUNNING", "SUCCESSFUL"], 1
    ),
    "timed out": Case(slow, [0.2], {}, ["RUNNING", "RUNNING", "FAILED"], 2),
    "cancelled": Case(cancels_itself, [], {}, ["RUNNING", "FAILED"], 0),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_signal_s_result_is_what_a_read_would_give(alias: str, seen: Seen, case: Case) -> None:
    task, args, kwargs, statuses, errors = case
    enqueued = task.using(backend=alias).enqueue(*args, **kwargs)
    seen.worker_reads = 0
    work(alias, "--concurrency", "1")
    mine = [(name, built, read) for name, built, read in seen.pairs if built.id == enqueued.id]
    assert [built.status for _, built, _ in mine] == statuses
    for _, built, read in mine:
        _same(built, read)
    # A first claim's start and any finish are built without a read; a later claim's
    # start reads once (its earlier workers and errors).
    assert seen.worker_reads == len(mine) - 2
    last = mine[-1][1]
    assert last.finished_at is not None
    assert last.enqueued_at == enqueued.enqueued_at
    assert len(last.worker_ids) == statuses.count("RUNNING")
    assert len(last.errors) == errors
