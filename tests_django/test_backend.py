"""The backend as Django's task API sees it: enqueue, get_result, refresh, defer, queues,
priorities, ids, and enqueue inside ``transaction.atomic()``."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.tasks import TaskResult, TaskResultStatus, task, task_backends
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.utils import timezone

from durablesched import CancelOutcome, InvalidTaskArgumentsError, InvalidTaskError
from durablesched.contrib.django import DurableSchedBackend, cancel
from durablesched.contrib.django.database import close_stores, store_for
from durablesched.contrib.django.running import DjangoTasks
from tests_django.testapp.tasks import add, send

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@task()
def not_discoverable() -> None:
    """A task in a test module: no installed app's ``tasks``, so no worker would run it."""


def test_the_backend_says_what_it_supports(alias: str) -> None:
    backend = task_backends[alias]
    assert isinstance(backend, DurableSchedBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_an_enqueued_task_is_ready_and_read_back(alias: str) -> None:
    result = add.using(backend=alias).enqueue(1, b=2)
    assert result.status is TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([1], {"b": 2}, alias)
    assert result.enqueued_at is not None and result.worker_ids == []
    read = (
        add.get_result(result.id)
        if alias == "default"
        else task_backends[alias].get_result(result.id)
    )
    assert read.id == result.id and read.task.func is add.func
    assert read.status is TaskResultStatus.READY
    assert (read.args, read.kwargs) == ([1], {"b": 2})
    assert read.started_at is read.last_attempted_at is read.finished_at is None
    assert read.errors == [] and read.attempts == 0
    # The enqueue time enqueue() gives is the stored one (the submit's, not a read back).
    assert read.enqueued_at == result.enqueued_at
    with pytest.raises(ValueError, match="not finished"):
        _ = read.return_value


def test_the_async_api_enqueues_and_reads_back_the_same_rows(alias: str) -> None:
    """``aenqueue``, ``aget_result`` and ``arefresh`` are Django's defaults (the sync calls
    in a thread): they reach the same store, on the same database."""

    async def enqueue_and_read() -> tuple[TaskResult, TaskResult]:
        result = await add.using(backend=alias).aenqueue(2, b=3)
        read = await task_backends[alias].aget_result(result.id)
        await read.arefresh()
        return result, read

    result, read = asyncio.run(enqueue_and_read())
    assert read.id == result.id and read.status is TaskResultStatus.READY
    assert (read.args, read.kwargs) == ([2], {"b": 3})
    read_again = task_backends[alias].get_result(result.id)
    assert read_again.enqueued_at == result.enqueued_at
    # A result read from a backend refreshes from that backend, not the task's default.
    assert read_again.task.get_backend() is task_backends[alias]
    read_again.refresh()
    assert read_again.status is TaskResultStatus.READY


def test_arguments_are_stored_as_durablesched_s_own(alias: str) -> None:
    """Positional ones under "*args", keywords as members: what `durablesched show` and
    the core's worker read, and JSON only."""
    result = add.using(backend=alias).enqueue(1, b=2)
    stored = store_for(alias).get(int(result.id))
    assert stored is not None and stored.args == {"*args": [1], "b": 2}


def test_queue_and_priority_are_the_rows(alias: str) -> None:
    result = send.using(backend=alias, priority=7).enqueue("a@example.com", subject="hi")
    stored = store_for(alias).get(int(result.id))
    assert stored is not None
    assert (stored.queue, stored.priority, stored.name) == (
        "emails",
        7,
        "tests_django.testapp.tasks.send",
    )
    read = task_backends[alias].get_result(result.id)
    assert (read.task.queue_name, read.task.priority) == ("emails", 7)


def test_run_after_is_the_due_time(alias: str) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = add.using(backend=alias, run_after=later).enqueue(1, 1)
    stored = store_for(alias).get(int(result.id))
    assert stored is not None and stored.due_at == later
    read = task_backends[alias].get_result(result.id)
    assert read.task.run_after == later == result.task.run_after  # as enqueue() returned it
    now = add.using(backend=alias).enqueue(1, 1)
    assert task_backends[alias].get_result(now.id).task.run_after is None


def test_arguments_json_cannot_hold_are_a_type_error_and_utf8_bytes_are_text(
    alias: str,
) -> None:
    with pytest.raises(TypeError, match="must be JSON-serialisable") as raised:
        add.using(backend=alias).enqueue(object(), 1)
    assert isinstance(raised.value, InvalidTaskArgumentsError)
    assert isinstance(raised.value, InvalidTaskError)  # and a durablesched error, ValueError
    with pytest.raises(InvalidTaskArgumentsError):
        send.using(backend=alias).enqueue(b"\xff")  # not UTF-8: Django refuses it too
    result = send.using(backend=alias).enqueue(b"ada@example.com", subject=(b"hi",))
    assert (result.args, result.kwargs) == (["ada@example.com"], {"subject": ["hi"]})
    read = task_backends[alias].get_result(result.id)
    assert (read.args, read.kwargs) == (["ada@example.com"], {"subject": ["hi"]})


def test_a_queue_the_backend_does_not_name_is_refused(alias: str) -> None:
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        add.using(backend=alias, queue_name="nope")


def test_a_task_no_worker_would_find_is_refused(alias: str) -> None:
    with pytest.raises(InvalidTask, match="is not in the tasks module of an installed app"):
        not_discoverable.using(backend=alias).enqueue()
    assert store_for(alias).list_tasks() == []


def test_arguments_that_are_not_json_are_refused(alias: str) -> None:
    with pytest.raises(ValueError, match="JSON"):
        add.using(backend=alias).enqueue(object(), 1)


@pytest.mark.parametrize("result_id", ["999999", "abc", "", "-1", "1.5", "9" * 30, "١٢"])
def test_missing_and_invalid_ids_do_not_exist(alias: str, result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends[alias].get_result(result_id)


def test_enqueue_in_a_rolled_back_atomic_block_leaves_no_task(alias: str) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic(using=alias):
        result = add.using(backend=alias).enqueue(2, 2)
        raise Abort
    with pytest.raises(TaskResultDoesNotExist):
        task_backends[alias].get_result(result.id)
    assert store_for(alias).list_tasks() == []


def test_enqueue_in_a_committed_atomic_block_exists_after_the_commit(alias: str) -> None:
    with transaction.atomic(using=alias):
        result = add.using(backend=alias).enqueue(2, 3)
        # Written on Django's connection, in the block: not visible elsewhere yet.
        with pytest.raises(TaskResultDoesNotExist):
            task_backends[alias].get_result(result.id)
    read = task_backends[alias].get_result(result.id)
    assert read.status is TaskResultStatus.READY and read.args == [2, 3]


def test_enqueue_in_a_savepoint_rolled_back_inside_a_committed_block(alias: str) -> None:
    with transaction.atomic(using=alias):
        kept = add.using(backend=alias).enqueue(1, 0)
        try:
            with transaction.atomic(using=alias):
                lost = add.using(backend=alias).enqueue(0, 1)
                raise RuntimeError
        except RuntimeError:
            pass
    assert task_backends[alias].get_result(kept.id).args == [1, 0]
    with pytest.raises(TaskResultDoesNotExist):
        task_backends[alias].get_result(lost.id)


def test_cancel_before_it_runs(alias: str) -> None:
    result = add.using(backend=alias).enqueue(1, 1)
    assert cancel(result.id, backend=alias) is CancelOutcome.CANCELLED
    result.refresh()
    assert result.status is TaskResultStatus.FAILED
    with pytest.raises(TaskResultDoesNotExist):
        cancel("424242", backend=alias)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"databse": "default"}, "unknown keys"),
        ({"durability": "fast"}, "durability"),
        ({"retry": {"max_attempts": 0}}, "max_attempts"),
        ({"retry": {"tries": 3}}, "must be a dict of"),
        ({"timeout": 0}, r"\['timeout'\] must be a number of seconds above 0"),
        ({"tasks": ["a.b"]}, "must map task module paths"),
        ({"tasks": {"a.b": {"retries": 2}}}, r"\['tasks'\]\['a.b'\] must be a dict of retry"),
        ({"tasks": {"a.b": {"timeout": "1s"}}}, r"\['a.b'\]\['timeout'\] must be a number"),
        ({"tasks": {"a.b": {"retry": {"max_attempts": 0}}}}, "max_attempts"),
    ],
)
def test_bad_options_are_refused_with_what_is_wrong(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidTaskBackend, match=message):
        DurableSchedBackend("x", {"OPTIONS": options})


def test_a_task_runs_once_unless_the_settings_ask_for_more() -> None:
    """Django's own backends never retry: neither does this one unless told."""
    assert DurableSchedBackend("x", {"OPTIONS": {}}).retry.max_attempts == 1
    backoff_only = DurableSchedBackend("x", {"OPTIONS": {"retry": {"initial": 0}}})
    assert backoff_only.retry.max_attempts == 1  # what a dict leaves out is the default's
    backend = DurableSchedBackend(
        "x",
        {
            "OPTIONS": {
                "retry": {"max_attempts": 4, "dont_retry_on": "builtins.ValueError"},
                "tasks": {"a.b": {"retry": {"retry_on": [ConnectionError, "builtins.OSError"]}}},
            }
        },
    )
    assert backend.retry.max_attempts == 4 and backend.retry.dont_retry_on == (ValueError,)
    own = backend.retry_for("a.b")  # the task's own over the backend's
    assert own.max_attempts == 4 and own.retry_on == (ConnectionError, OSError)
    assert not own.retries(ValueError()) and own.retries(ConnectionError())
    with pytest.raises(InvalidTaskBackend, match="retry_on"):
        DurableSchedBackend("x", {"OPTIONS": {"retry": {"retry_on": "builtins.len"}}})
    with pytest.raises(InvalidTaskBackend, match="dont_retry_on"):
        DurableSchedBackend("x", {"OPTIONS": {"retry": {"dont_retry_on": "no.such.Error"}}})


def test_the_first_enqueue_of_a_process_may_come_after_the_block_wrote(alias: str) -> None:
    """The store opens inside the block: on SQLite its schema check must not wait for the
    write lock the block's own writes hold."""
    close_stores()
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("CREATE TABLE scratch (id integer)")
        result = add.using(backend=alias).enqueue(1, 2)
    assert task_backends[alias].get_result(result.id).args == [1, 2]
    with connections[alias].cursor() as cursor:
        cursor.execute("DROP TABLE scratch")


def test_task_options_naming_no_task_of_the_project_stop_the_worker() -> None:
    backend = DurableSchedBackend("x", {"OPTIONS": {"tasks": {"shop.tasks.gone": {"timeout": 1}}}})
    with pytest.raises(InvalidTaskBackend, match=r"names \['shop.tasks.gone'\]"):
        DjangoTasks(backend)
