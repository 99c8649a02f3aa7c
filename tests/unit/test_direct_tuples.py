"""Named tuples made per task or per result are made directly with ``tuple.__new__``
(their own ``__new__`` is a Python function): a batch's further calls
(``FurtherCalls.build``), a typed call (``Task.bind``), a read's outcomes
(``finished_outcomes``). Each must equal the tuple its class makes, field for field, so
that a field added to the class later cannot be left out there unnoticed."""

from __future__ import annotations

from datetime import timedelta

from durablesched import TaskRegistry
from durablesched.records import ErrorInfo, Finished, NewTask
from durablesched.registry import TaskCall
from durablesched.states import TaskState
from durablesched.store.sql.codec import finished_outcomes, to_db_time
from durablesched.submission import FurtherCalls, build_task

from ..conftest import T0


def test_a_further_call_is_the_first_with_its_own_arguments() -> None:
    registry = TaskRegistry()

    @registry.task("add", limit_key=lambda a, b=0: f"k{a}")
    def add(a: int, b: int = 0) -> int:
        return a + b

    first = build_task(
        "add",
        {"b": 1},
        now=T0,
        delay=timedelta(seconds=5),
        key="k",
        queue="maths",
        priority=3,
        positional=[1],
        registry=registry,
    )
    further = FurtherCalls(first, registry.get("add"), 1).build({"b": 2}, [7])
    expected = first._replace(args={"*args": [7], "b": 2}, args_json=further.args_json)
    assert further == expected._replace(limit_key="k7")
    assert len(further) == len(NewTask._fields)
    assert type(further) is NewTask


def test_a_bound_call_is_a_task_call() -> None:
    registry = TaskRegistry()

    @registry.task("add")
    def add(a: int, b: int = 0) -> int:
        return a + b

    call = add.bind(1, b=2)
    assert call == TaskCall(add, (1,), {"b": 2})
    assert type(call) is TaskCall
    assert (call.task, call.args, call.kwargs) == (add, (1,), {"b": 2})


def test_a_read_outcome_is_a_finished() -> None:
    error = '{"type": "ValueError", "message": "no", "traceback": "tb"}'
    rows = [
        (1, "add", "SUCCEEDED", 1, "[1, 2]", None, to_db_time(T0)),
        (2, "boom", "FAILED", 3, None, error, to_db_time(T0)),
        (3, None, None, None, None, None, None),
    ]
    found = finished_outcomes(rows)
    assert found[1] == Finished(1, "add", TaskState.SUCCEEDED, 1, [1, 2], None, T0)
    failed = found[2]
    assert failed is not None and type(failed) is Finished
    assert isinstance(failed.last_error, ErrorInfo)
    assert failed == Finished(2, "boom", TaskState.FAILED, 3, None, failed.last_error, T0)
    assert len(failed) == len(Finished._fields)
    assert found[3] is None
