"""Typed tasks and their handles (docs/api.md, "Typed tasks" and "Handles"), on every backend:
enqueue checks and stores what the function takes, a handle reads and waits for its task,
and the store's ``finished`` read and ``watch_finished`` watcher that waiting stands on."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Collection, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durablesched import (
    CancelOutcome,
    InvalidTaskError,
    ManualClock,
    MemoryStore,
    RetryPolicy,
    Scheduler,
    Task,
    TaskCancelled,
    TaskContext,
    TaskFailed,
    TaskHandle,
    TaskNotFoundError,
    TaskRegistry,
    TaskState,
    UnknownTaskNameError,
    UnsupportedOperationError,
    WaitInTaskError,
)
from durablesched.records import Outcome
from durablesched.store.sql.postgres import NotifyWatcher
from durablesched.store.sql.sqlite import DataVersionWatcher
from durablesched.store.sql.store import SQLStore
from durablesched.testing import run_due
from durablesched.waiting import Waiter, Waiters

from ..conftest import BackendStore, RecordingEvent, sql_backends_only

WAIT = 10.0  # seconds: the bound on every wait below; none should take near it


@pytest.fixture
def tasks() -> TaskRegistry:
    registry = TaskRegistry(default_retry=RetryPolicy(max_attempts=1))

    @registry.task("add")
    def add(a: int, b: int = 0, *, scale: int = 1) -> int:
        return (a + b) * scale

    @registry.task("boom")
    def boom(message: str) -> None:
        raise ValueError(message)

    @registry.task("chain", pass_context=True)
    def chain(ctx: TaskContext, n: int) -> str:
        child = ctx.enqueue(add, n, b=1)
        try:
            child.result()
        except WaitInTaskError as e:
            return f"refused: {e}"
        return "waited"

    @registry.task("wait_inside")
    def wait_inside(task_id: int) -> str:
        try:
            Scheduler(store_of[0], registry=registry).handle(task_id).result(timeout=0)
        except WaitInTaskError:
            return "refused"
        return "waited"

    @registry.task("gather_inside")
    def gather_inside(task_id: int) -> str:
        scheduler = Scheduler(store_of[0], registry=registry)
        try:
            scheduler.gather(scheduler.handle(task_id), timeout=0)
        except WaitInTaskError as e:
            return f"refused: {e}"
        return "waited"

    @registry.task("await_inside", pass_context=True)
    async def await_inside(ctx: TaskContext, task_id: int) -> str:
        try:
            await ctx.scheduler.handle(task_id).aresult(timeout=0)
        except WaitInTaskError:
            return "refused"
        return "waited"

    return registry


#: The store of the test running (for the task that makes a scheduler of its own).
store_of: list[BackendStore] = []


@pytest.fixture
def sched(store: BackendStore, tasks: TaskRegistry, clock: ManualClock) -> Iterator[Scheduler]:
    store_of[:] = [store]
    scheduler = Scheduler(store, registry=tasks, clock=clock)
    yield scheduler
    scheduler.close()  # the waiting thread and its watcher, before the store closes


def task_of(registry: TaskRegistry, name: str) -> Task[..., object]:
    return Task(registry.get(name))


def test_a_task_is_still_the_function(tasks: TaskRegistry) -> None:
    add = task_of(tasks, "add")
    assert add(2, 3, scale=2) == 10
    assert getattr(add, "__name__", None) == "add"  # the function's, for help() and docs
    assert add.name == "add"
    assert "add(a, b=0, *, scale=1)" in repr(add)


def test_enqueue_stores_positional_and_keyword_arguments(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    handle = sched.enqueue(add, 2, b=3, scale=4)
    assert isinstance(handle, TaskHandle)
    record = handle.record()
    assert (record.name, record.args) == ("add", {"*args": [2], "b": 3, "scale": 4})
    assert handle.state() is TaskState.PENDING
    assert run_due(sched) == 1
    assert handle.result() == 20
    assert handle.state() is TaskState.SUCCEEDED


def test_enqueue_refuses_arguments_the_function_cannot_take(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    with pytest.raises(InvalidTaskError, match=r"add\(a, b=0, \*, scale=1\).*unexpected"):
        sched.enqueue(add, 1, nope=2)
    with pytest.raises(InvalidTaskError, match="missing a required argument"):
        sched.enqueue(add)
    with pytest.raises(InvalidTaskError, match="JSON-serialisable"):
        sched.enqueue(add, object())
    assert sched.list_tasks() == []  # nothing stored


def test_a_scheduler_with_a_registry_refuses_a_task_of_another(sched: Scheduler) -> None:
    other = TaskRegistry()

    @other.task("elsewhere")
    def elsewhere() -> None: ...

    with pytest.raises(UnknownTaskNameError, match="elsewhere"):
        sched.enqueue(elsewhere)
    # A submit-only scheduler (no registry) takes it, checked against its own definition.
    bare = Scheduler(sched.store, clock=sched.clock)
    assert bare.enqueue(elsewhere).record().name == "elsewhere"
    with pytest.raises(InvalidTaskError, match="too many positional"):
        bare.enqueue(elsewhere, 1)  # type: ignore[call-overload]


def test_options_are_the_submit_options(sched: Scheduler, clock: ManualClock) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    at = datetime(2031, 1, 1, tzinfo=UTC)
    record = sched.enqueue(
        add.options(at=at, key="k1", queue="maths", priority=7, max_attempts=3), 1
    ).record()
    assert (record.due_at, record.idempotency_key, record.queue, record.priority) == (
        at,
        "k1",
        "maths",
        7,
    )
    assert record.max_attempts == 3
    delayed = sched.enqueue(add.options(at=at).options(delay=60), 1).record()
    assert delayed.due_at == clock.now() + timedelta(seconds=60)  # the later one stands
    # The same key: the handle of the task that holds it.
    assert sched.enqueue(add.options(key="k1"), 5).id == record.id
    with pytest.raises(InvalidTaskError, match="priority"):
        sched.enqueue(add.options(priority=1000), 1)
    with pytest.raises(InvalidTaskError, match="either at= or delay="):
        sched.enqueue(add.options(at=at, delay=1), 1)
    # An option named like a parameter never collides with it.
    assert add.options(priority=3).submit_options.priority == 3
    assert add.submit_options.priority is None  # options() made a new task


def test_enqueue_many_stores_all_or_none(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    boom = task_of(sched.registry or TaskRegistry(), "boom")
    handles = sched.enqueue_many([add.bind(i, b=i) for i in range(5)] + [boom.bind("x")])
    assert [h.record().name for h in handles] == ["add"] * 5 + ["boom"]
    assert len({h.id for h in handles}) == 6
    run_due(sched)
    assert [h.result() for h in handles[:5]] == [0, 2, 4, 6, 8]
    # A task's later calls are checked too (its options once, each shape of arguments
    # once), and a task given other options is another task.
    for bad in (add.bind(2, zzz=3), add.bind(1, 2, 3), add.options(priority=1000).bind(1)):
        with pytest.raises(InvalidTaskError):
            sched.enqueue_many([add.bind(1), bad])
    # Calls of several tasks, interleaved: each is checked against its own function,
    # and a task's run of calls after another task's is its own again.
    interleaved = [
        [add.bind(1), boom.bind("x"), add.bind(1, zzz=3)],
        [boom.bind("x"), add.bind(1), boom.bind("y", 2)],
        [add.bind(1), boom.bind("x"), boom.bind(message="y", b=2)],
        [add.bind(1), add.bind(2), add.bind(object())],
    ]
    for batch in interleaved:
        with pytest.raises(InvalidTaskError, match=r"arguments of task '(add|boom)'"):
            sched.enqueue_many(batch)
    wrongs: list[object] = [add, (add, (1,), {}), "add"]  # not calls: refused, named
    for wrong in wrongs:
        with pytest.raises(InvalidTaskError, match=r"calls made by task\.bind"):
            sched.enqueue_many([add.bind(1), wrong])  # type: ignore[arg-type]
    assert len(sched.list_tasks()) == 6  # the bad batches stored nothing
    mixed = sched.enqueue_many([add.bind(1), boom.bind("x"), add.bind(2, b=1), boom.bind("y")])
    assert [(h.name, h.record().name, h.record().args) for h in mixed] == [
        ("add", "add", {"*args": [1]}),
        ("boom", "boom", {"*args": ["x"]}),
        ("add", "add", {"*args": [2], "b": 1}),
        ("boom", "boom", {"*args": ["y"]}),
    ]
    assert sched.enqueue_many([]) == []


def test_a_failed_task_raises_task_failed_with_its_error(sched: Scheduler) -> None:
    boom = task_of(sched.registry or TaskRegistry(), "boom")
    handle = sched.enqueue(boom, "it broke")
    run_due(sched)
    with pytest.raises(TaskFailed, match=r"failed after 1 attempt: builtins.ValueError: it broke"):
        handle.result()
    try:
        handle.result()
    except TaskFailed as e:
        assert (e.task_id, e.name, e.attempts) == (handle.id, "boom", 1)
        assert e.error is not None and e.error.type == "builtins.ValueError"
        assert "raise ValueError(message)" in e.traceback


def test_a_cancelled_task_raises_task_cancelled(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    handle = sched.enqueue(add.options(delay=60), 1)
    assert handle.cancel() is CancelOutcome.CANCELLED
    with pytest.raises(TaskCancelled, match="was cancelled") as raised:
        handle.result()
    assert raised.value.task_id == handle.id


def test_a_timeout_raises_timeout_error(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    handle = sched.enqueue(add.options(delay=60), 1)
    with pytest.raises(TimeoutError, match=f"task {handle.id} is not finished"):
        handle.result(timeout=0)
    assert sched.waiters.waiting == 0  # the timed-out wait left nothing behind


def test_a_handle_from_an_id(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    task_id = sched.enqueue(add, 4).id
    run_due(sched)
    assert sched.handle(task_id, add).result() == 4
    assert sched.handle(task_id) == sched.handle(task_id, add)
    with pytest.raises(TaskNotFoundError):
        sched.handle(task_id + 1000).result()
    with pytest.raises(TaskNotFoundError):
        sched.handle(task_id + 1000).state()
    with pytest.raises(InvalidTaskError, match="integer"):
        sched.handle("7")  # type: ignore[call-overload]


def test_a_waiting_handle_wakes_when_its_task_finishes(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    handles = [sched.enqueue(add, i) for i in range(20)]
    results: dict[int, object] = {}
    waiting = threading.Barrier(len(handles) + 1, timeout=WAIT)

    def wait(handle: TaskHandle[object]) -> None:
        waiting.wait()
        results[handle.id] = handle.result(timeout=WAIT)

    threads = [threading.Thread(target=wait, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    waiting.wait()
    run_due(sched)
    for thread in threads:
        thread.join(WAIT)
    assert results == {h.id: i for i, h in enumerate(handles)}


def test_handles_are_awaited_together(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")

    async def main() -> list[object]:
        handles = [await sched.aenqueue(add, i, scale=2) for i in range(10)]
        waiting = [asyncio.ensure_future(h.aresult(timeout=WAIT)) for h in handles]
        await asyncio.sleep(0)  # every wait registered before the tasks run
        await asyncio.to_thread(run_due, sched)
        results = await asyncio.gather(*waiting)
        assert await handles[0] == 0
        assert await handles[1].astate() is TaskState.SUCCEEDED
        assert (await handles[1].arecord()).result == 2
        return list(results)

    assert asyncio.run(main()) == [2 * i for i in range(10)]


def test_async_reads_and_submits(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")

    async def main() -> None:
        (one, two) = await sched.aenqueue_many([add.bind(1), add.bind(2)])
        task_id = await sched.asubmit("add", {"a": 5})
        ids = await sched.asubmit_many("add", [{"a": 6}, {"a": 7}])
        assert (await sched.aget(task_id)).args == {"a": 5}
        assert len(await sched.alist_tasks(name="add")) == 5
        assert await sched.acancel(ids[0]) is CancelOutcome.CANCELLED
        assert await sched.handle(ids[1]).acancel() is CancelOutcome.CANCELLED
        assert [e.state for e in await sched.ahistory(ids[0])][-1] is TaskState.CANCELLED
        assert await sched.aattempts(one.id) == []
        with pytest.raises(TimeoutError):
            await two.aresult(timeout=0.001)
        assert sched.waiters.waiting == 0

    asyncio.run(main())


def test_aresult_is_a_future_that_cancelling_stops(sched: Scheduler) -> None:
    """``aresult`` hands out a future of the running loop (no coroutine, no Task per
    handle): gathered bare, awaited through ``wait_for``, cancelled with what awaits it,
    and a cancelled wait leaves nothing waiting."""
    add = task_of(sched.registry or TaskRegistry(), "add")

    async def main() -> None:
        handles = await sched.aenqueue_many([add.bind(i) for i in range(3)])
        future = handles[0].aresult()
        assert isinstance(future, asyncio.Future)
        assert future.get_loop() is asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(future, 0.001)  # cancels it
        assert future.cancelled()
        waiting = asyncio.ensure_future(asyncio.gather(*(h.aresult() for h in handles)))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert sched.waiters.waiting == 0
        gathered = asyncio.gather(*(h.aresult(timeout=WAIT) for h in handles))
        await asyncio.to_thread(run_due, sched)
        assert await gathered == [0, 1, 2]

    asyncio.run(main())


def test_closing_the_scheduler_wakes_its_waiting_handles(sched: Scheduler) -> None:
    """Nothing would ever end a wait once the scheduler's waiting thread is gone: closing
    it makes every handle still waiting raise RuntimeError, in threads and coroutines."""
    handle = sched.enqueue(task_of(sched.registry or TaskRegistry(), "add"), 1)
    raised: list[BaseException] = []
    waiters, registered = sched.waiters, threading.Event()
    add = waiters.add

    def add_then_tell(task_id: int, waiter: Waiter) -> None:
        add(task_id, waiter)
        registered.set()

    waiters.add = add_then_tell  # type: ignore[method-assign]

    def wait() -> None:
        try:
            handle.result(timeout=WAIT)
        except RuntimeError as e:
            raised.append(e)

    async def main() -> None:
        thread = threading.Thread(target=wait)
        thread.start()
        future = handle.aresult(timeout=WAIT)
        assert await asyncio.to_thread(registered.wait, WAIT)
        await asyncio.to_thread(sched.close)
        with pytest.raises(RuntimeError, match=f"closed while task {handle.id} was waited on"):
            await asyncio.wait_for(future, WAIT)
        await asyncio.to_thread(thread.join, WAIT)

    asyncio.run(asyncio.wait_for(main(), WAIT))
    assert [str(e) for e in raised] == [
        f"the scheduler was closed while task {handle.id} was waited on"
    ]


def test_waits_after_a_quiet_moment_are_answered(sched: Scheduler) -> None:
    """Once nothing is waited on and no read is due, the waiting thread sleeps until a wait
    comes, and answers it: one on a task already finished (read at once), one on a task
    finishing later (the watcher), one that times out (a deadline). (Its sleep was once
    an infinite timeout, which ended the thread: every later wait hung, its own timeout
    too.) The thread rereads each wait within 50 ms here, so it is soon quiet."""
    add = task_of(sched.registry or TaskRegistry(), "add")
    waiters = sched._waiters = Waiters(sched.store, fallback=0.05)
    wake = waiters._wake = RecordingEvent()

    def quiet() -> bool:  # nothing waited on, nothing due: a sleep with no end in sight
        with wake.slept:
            slept = wake.slept.wait_for(lambda: max(wake.timeouts, default=0) > 3600, WAIT)
            return slept and max(wake.timeouts) <= threading.TIMEOUT_MAX

    async def main() -> None:
        first = sched.enqueue(add, 1)
        waiting = first.aresult(timeout=WAIT)
        await asyncio.to_thread(run_due, sched)
        assert await waiting == 1
        assert await asyncio.to_thread(quiet)
        done = sched.enqueue(add, 2)
        await asyncio.to_thread(run_due, sched)
        assert await done.aresult(timeout=WAIT) == 2
        later = sched.enqueue(add, 3)
        waiting = later.aresult(timeout=WAIT)
        await asyncio.to_thread(run_due, sched)
        assert await waiting == 3
        with pytest.raises(TimeoutError):
            await sched.enqueue(add, 4).aresult(timeout=0.01)  # never run

    asyncio.run(asyncio.wait_for(main(), 4 * WAIT))


def test_after_its_waiting_thread_failed_the_scheduler_serves_waits_again(
    sched: Scheduler,
) -> None:
    """A bug in the waiting thread ends the waits it served with the failure (not a hang),
    and the scheduler's next waits are served by a new thread."""
    add = task_of(sched.registry or TaskRegistry(), "add")
    failed = sched.waiters

    def broken(delivered: int, spent: float) -> None:  # (the waiting thread's own call)
        raise ValueError("a bug")

    failed._nudge_when = broken  # type: ignore[method-assign]

    async def main() -> None:
        first = sched.enqueue(add, 1)
        with pytest.raises(RuntimeError, match=r"waiting thread failed \(ValueError: a bug\)"):
            await asyncio.wait_for(first.aresult(timeout=WAIT), WAIT)
        assert sched.waiters is not failed
        second = sched.enqueue(add, 2)
        waiting = second.aresult(timeout=WAIT)
        await asyncio.to_thread(run_due, sched)
        assert await waiting == 2
        assert await first.aresult(timeout=WAIT) == 1

    asyncio.run(asyncio.wait_for(main(), 3 * WAIT))


def test_waiting_inside_a_task_is_refused(sched: Scheduler) -> None:
    registry = sched.registry or TaskRegistry()
    add, chain = task_of(registry, "add"), task_of(registry, "chain")
    wait_inside, await_inside = task_of(registry, "wait_inside"), task_of(registry, "await_inside")
    gather_inside = task_of(registry, "gather_inside")
    other = sched.enqueue(add, 1)
    handles = [
        sched.enqueue(chain, 3),
        sched.enqueue(wait_inside, other.id),
        sched.enqueue(await_inside, other.id),
        sched.enqueue(gather_inside, other.id),
    ]
    run_due(sched)
    results = [h.result() for h in handles]
    assert str(results[0]).startswith("refused: waiting on <TaskHandle child to be stored (add)>")
    assert results[1:3] == ["refused", "refused"]
    assert str(results[3]).startswith(f"refused: waiting on <TaskHandle {other.id}> inside")
    # The child enqueued by "chain" was stored with its success.
    children = [t for t in sched.list_tasks(name="add") if t.id != other.id]
    assert [c.args for c in children] == [{"*args": [3], "b": 1}]


def test_gather_returns_every_result_in_order(sched: Scheduler) -> None:
    """A thread blocked in ``gather`` wakes once every task is finished, with their
    results in the order asked (a handle given twice, twice); gathered once finished,
    they are read at once, with nothing left waiting."""
    add = task_of(sched.registry or TaskRegistry(), "add")
    handles = [sched.enqueue(add, i, scale=3) for i in range(6)]
    waiters, registered = sched.waiters, threading.Event()
    gathering = waiters.gathering

    def gathering_then_tell(*args: Any, **kwargs: Any) -> Any:
        made = gathering(*args, **kwargs)
        registered.set()
        return made

    waiters.gathering = gathering_then_tell  # type: ignore[method-assign]
    results: list[list[object]] = []
    thread = threading.Thread(
        target=lambda: results.append(sched.gather(*handles, handles[0], timeout=WAIT))
    )
    thread.start()
    assert registered.wait(WAIT)
    run_due(sched)
    thread.join(WAIT)
    assert results == [[0, 3, 6, 9, 12, 15, 0]]
    assert sched.gather(*reversed(handles)) == [15, 12, 9, 6, 3, 0]
    assert sched.gather() == []
    assert waiters.waiting == 0


def test_gather_raises_the_first_failure_in_order_unless_return_exceptions(
    sched: Scheduler,
) -> None:
    registry = sched.registry or TaskRegistry()
    add, boom = task_of(registry, "add"), task_of(registry, "boom")
    handles = [sched.enqueue(add, 2), sched.enqueue(add.options(delay=60), 1)]
    handles.append(sched.enqueue(boom, "it broke"))
    handles[1].cancel()
    run_due(sched)
    missing = sched.handle(handles[-1].id + 1000)
    with pytest.raises(TaskCancelled, match=f"task {handles[1].id}"):
        sched.gather(*handles)
    values = sched.gather(*handles, missing, return_exceptions=True)
    assert values[0] == 2
    assert [type(v) for v in values[1:]] == [TaskCancelled, TaskFailed, TaskNotFoundError]

    async def main() -> None:
        with pytest.raises(TaskFailed, match="it broke"):
            await sched.agather(handles[0], handles[2], timeout=WAIT)
        values = await sched.agather(*handles, return_exceptions=True)
        assert [type(v) for v in values] == [int, TaskCancelled, TaskFailed]

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_gather_times_out_naming_what_is_not_finished(sched: Scheduler) -> None:
    add = task_of(sched.registry or TaskRegistry(), "add")
    done, later = sched.enqueue(add, 1), sched.enqueue(add.options(delay=60), 2)
    run_due(sched)
    said = f"1 of the 2 tasks gathered did not finish within 0 s (the first: task {later.id})"
    with pytest.raises(TimeoutError, match=re.escape(said)):
        sched.gather(later, done, later, timeout=0)
    with pytest.raises(TimeoutError, match=r"within 0\.01 s"):
        sched.gather(done, later, timeout=0.01)  # a thread's own timeout, named
    assert sched.waiters.waiting == 0

    async def main() -> None:
        with pytest.raises(TimeoutError, match=r"within 0\.01 s"):
            await sched.agather(done, later, timeout=0.01)
        assert await sched.agather(done, timeout=0) == [1]

    asyncio.run(asyncio.wait_for(main(), WAIT))
    assert sched.waiters.waiting == 0


def test_agather_is_one_future_that_cancelling_stops(sched: Scheduler) -> None:
    """``agather`` hands out one future of the running loop for all the handles: resolved
    as their tasks finish, cancelled with what awaits it (leaving nothing waiting)."""
    add = task_of(sched.registry or TaskRegistry(), "add")

    async def main() -> None:
        handles = await sched.aenqueue_many([add.bind(i) for i in range(5)])
        waiting = sched.agather(*handles, timeout=WAIT)
        assert isinstance(waiting, asyncio.Future)
        assert waiting.get_loop() is asyncio.get_running_loop()
        assert sched.waiters.waiting == 5
        await asyncio.to_thread(run_due, sched)
        assert await waiting == [0, 1, 2, 3, 4]
        later = await sched.aenqueue(add.options(delay=60), 9)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sched.agather(later, *handles), 0.001)  # cancels it
        assert sched.waiters.waiting == 0
        assert await sched.agather() == []

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_gather_refuses_what_is_not_its_own_handle(sched: Scheduler) -> None:
    """A handle of a scheduler on another store could name another database's task:
    refused, as is anything but a handle, before any wait; one of another scheduler on
    the same store is taken."""
    add = task_of(sched.registry or TaskRegistry(), "add")
    handle = sched.enqueue(add, 1)
    elsewhere = Scheduler(MemoryStore(), registry=sched.registry)
    with pytest.raises(InvalidTaskError, match="a scheduler on another store"):
        sched.gather(handle, elsewhere.handle(handle.id), timeout=0)
    with pytest.raises(InvalidTaskError, match="gather takes task handles, got 7"):
        sched.gather(handle, 7, timeout=0)  # type: ignore[call-overload]
    with pytest.raises(InvalidTaskError, match=r"got \[<TaskHandle .*unpacked"):
        sched.gather([handle] * 50, timeout=0)  # type: ignore[call-overload]
    assert sched.waiters.waiting == 0
    run_due(sched)
    same_store = Scheduler(sched.store, registry=sched.registry)
    assert sched.gather(handle, same_store.handle(handle.id)) == [1, 1]


def test_a_childs_handle_has_no_id_until_stored(sched: Scheduler, clock: ManualClock) -> None:
    registry = sched.registry or TaskRegistry()
    add = task_of(registry, "add")
    sched.submit("add", {"a": 0})
    (claim,) = sched.store.claim("w", 1, clock.now(), timedelta(seconds=30))
    ctx = TaskContext(claim, sched)
    child = ctx.enqueue(add.options(queue="kids", priority=3), 1, b=2)
    with pytest.raises(UnsupportedOperationError, match="only when that attempt succeeds"):
        _ = child.id
    assert ctx.children[0].queue == "kids" and ctx.children[0].priority == 3
    with pytest.raises(InvalidTaskError, match="unexpected"):
        ctx.enqueue(add, 1, zzz=2)
    assert len(ctx.children) == 1


# -- the store's side: finished() and watch_finished() -----------------------------------------


def test_finished_answers_finished_and_missing_tasks(
    store: BackendStore, clock: ManualClock
) -> None:
    scheduler = Scheduler(store, clock=clock)
    done, live, cancelled = (scheduler.submit("t") for _ in range(3))
    scheduler.cancel(cancelled)
    (claim,) = store.claim("w", 1, clock.now(), timedelta(seconds=30))
    assert claim.task_id == done
    store.complete(claim, {"ok": True}, clock.now())
    found = store.finished([done, live, cancelled, 999_999])
    assert set(found) == {done, cancelled, 999_999}
    record = found[done]
    assert record is not None and (record.state, record.result) == (
        TaskState.SUCCEEDED,
        {"ok": True},
    )
    cancelled_record = found[cancelled]
    assert cancelled_record is not None and cancelled_record.state is TaskState.CANCELLED
    assert found[999_999] is None
    assert store.finished([]) == {}


def test_finished_gives_each_task_its_own_result(store: BackendStore, clock: ManualClock) -> None:
    """Results read together (decoded in one go) each reach their own task, whatever
    JSON they hold, with cancelled and missing tasks (no result) in between."""
    scheduler = Scheduler(store, clock=clock)
    results: list[object] = [
        None, 0, "a,b]", [1, [2, {"c": None}]], {"x": "}", "y": [3]}, 1.5, True, "", [],
    ]  # fmt: skip
    ids = [scheduler.submit("t") for _ in results]
    cancelled = [scheduler.submit("t") for _ in range(2)]
    for task_id in cancelled:
        scheduler.cancel(task_id)
    claims = store.claim("w", len(ids), clock.now(), timedelta(seconds=30))
    by_id = dict(zip(ids, results, strict=True))
    for claim in claims:
        store.complete(claim, by_id[claim.task_id], clock.now())
    wanted = [cancelled[0], *ids[:5], 999_998, *ids[5:], cancelled[1]]
    found = store.finished(wanted)
    assert {i: r.result for i, r in found.items() if r is not None and i in by_id} == by_id
    assert [found[i].state for i in cancelled] == [TaskState.CANCELLED] * 2  # type: ignore[union-attr]
    assert [found[i].result for i in cancelled] == [None, None]  # type: ignore[union-attr]
    assert found[999_998] is None


def test_the_finish_watcher_hears_tasks_finish(store: BackendStore, clock: ManualClock) -> None:
    """Every way a task finishes reaches the watcher, by id: a group commit's outcomes, a
    cancel before start (SQLite's reads them from the history's new lines)."""
    scheduler = Scheduler(store, clock=clock)
    ids = [scheduler.submit("t") for _ in range(3)]
    heard: set[int] = set()
    some = threading.Event()
    told = threading.Condition()

    def on_finished(task_ids: Collection[int] | None) -> None:
        with told:
            if task_ids is None:
                some.set()
            else:
                heard.update(task_ids)
            told.notify_all()

    def hears(expected: set[int]) -> bool:
        """The watcher said these finished."""
        with told:
            return told.wait_for(lambda: expected <= heard, WAIT)

    watcher = store.watch_finished()
    assert watcher is not None
    watcher.start(on_finished)
    try:
        claims = store.claim("w", 2, clock.now(), timedelta(seconds=30))
        results, _ = store.record_and_claim(
            [Outcome(c, result=c.task_id) for c in claims],
            clock.now(),
            owner="w",
            limit=0,
            lease=timedelta(seconds=30),
        )
        assert results == [TaskState.SUCCEEDED, TaskState.SUCCEEDED]
        assert hears(set(ids[:2]))
        scheduler.cancel(ids[2])
        assert hears({ids[2]})
        assert not some.is_set()  # every backend names them
    finally:
        watcher.close()


def test_a_finish_watcher_asked_for_a_batch_loses_nothing(
    store: BackendStore, clock: ManualClock
) -> None:
    """Answered True (a batch), a watcher may keep what finishes next until nudged; after
    the nudge it tells all of it (PostgreSQL: the notifications waited in its
    connection; SQLite: the look covers every line written meanwhile)."""
    scheduler = Scheduler(store, clock=clock)
    ids = [scheduler.submit("t") for _ in range(3)]
    heard: set[int] = set()
    told = threading.Condition()

    def on_finished(task_ids: Collection[int] | None) -> bool:
        with told:
            heard.update(ids if task_ids is None else task_ids)
            told.notify_all()
        return True

    def hears(expected: set[int]) -> bool:
        with told:
            return told.wait_for(lambda: expected <= heard, WAIT)

    watcher = store.watch_finished()
    assert watcher is not None
    watcher.start(on_finished)
    try:
        (claim,) = store.claim("w", 1, clock.now(), timedelta(seconds=30))
        store.complete(claim, 1, clock.now())
        assert hears({ids[0]})
        (claim,) = store.claim("w", 1, clock.now(), timedelta(seconds=30))
        store.complete(claim, 2, clock.now())
        scheduler.cancel(ids[2])
        watcher.nudge()
        assert hears(set(ids))
    finally:
        watcher.close()


def test_a_finish_watcher_answered_seconds_looks_again_by_itself(
    store: BackendStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answered a number of seconds (a batch that long), a watcher keeps what finishes
    next for that long at most and then tells it without a nudge. (The longest quiet
    is made a minute here: a watcher that took the number for True would keep quiet
    that long, past the wait below.)"""
    monkeypatch.setattr(DataVersionWatcher, "QUIET", 60.0)
    monkeypatch.setattr(NotifyWatcher, "QUIET", 60.0)
    scheduler = Scheduler(store, clock=clock)
    ids = [scheduler.submit("t") for _ in range(2)]
    heard: set[int] = set()
    told = threading.Condition()

    def on_finished(task_ids: Collection[int] | None) -> float:
        with told:
            heard.update(ids if task_ids is None else task_ids)
            told.notify_all()
        return 0.01

    def hears(expected: set[int]) -> bool:
        with told:
            return told.wait_for(lambda: expected <= heard, WAIT)

    watcher = store.watch_finished()
    assert watcher is not None
    watcher.start(on_finished)
    try:
        for task_id in ids:
            (claim,) = store.claim("w", 1, clock.now(), timedelta(seconds=30))
            assert claim.task_id == task_id
            store.complete(claim, 1, clock.now())
            assert hears({task_id})  # the second: after the first report's quiet, unnudged
    finally:
        watcher.close()


@sql_backends_only
def test_finished_reads_again_on_a_new_connection_when_its_own_broke(
    store: BackendStore, clock: ManualClock
) -> None:
    """The SQL stores read ``finished`` on a connection kept for it (no pool, no
    transaction); one broken under it (a database restart) is replaced at once and the
    read made again: the waiting handles see no error."""
    assert isinstance(store, SQLStore)
    scheduler = Scheduler(store, clock=clock)
    task_id = scheduler.submit("t")
    scheduler.cancel(task_id)
    assert set(store.finished([task_id])) == {task_id}
    kept = store._lone
    assert kept is not None
    kept.close()  # as a restart leaves it
    found = store.finished([task_id])
    record = found[task_id]
    assert record is not None and record.state is TaskState.CANCELLED
    assert store._lone is not kept
