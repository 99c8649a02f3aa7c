"""Model-based differential test: the SQL backends against the in-memory one, step by step.

Hypothesis drives random interleavings of every store operation against the
in-memory store (the model) and a SQL store (SQLite, or PostgreSQL) in
lockstep, comparing every answer:

* the :class:`~durablesched.store.protocol.Store` protocol: ``submit`` (equal due
  times, idempotency keys, repeats within a batch, keys that collide with the
  keys generated for keyless tasks), ``submit(connection=...)`` in a caller's
  transaction that commits or rolls back, ``get``, ``history``, ``finished``, ``list_tasks``
  (every state and name filter, limits from 0), ``claim`` (names, process
  names), ``heartbeat`` and ``check_leases`` (with stale, forged and other
  owners' claims), ``record_and_claim`` (successes with results, children and
  database effects, a raising effect, failures, retries, cancellations, repeats
  of one claim, then a claim with names and process names), ``acknowledge_cancel``,
  ``release``, ``request_cancel``, ``reclaim_expired``, ``next_wakeup`` (with
  name subsets) and unknown task ids; the live workers: ``register_worker``
  (again, with other queues and leases), ``deregister_worker``,
  ``list_workers`` and ``prune_workers`` (a day and more later), with the
  heartbeat's mark of its worker compared after every step; ``activity``
  (windows of several lengths, ending now or ahead of now, with several bounds);
  ``attempt_totals`` after every step (equal, and never going back);
  the dashboard's ``Console``: ``find_tasks`` (every filter alone and together,
  created-time ranges, a keyset cursor from a task's own or a shifted time,
  limits from 0), ``minute_counts`` (windows ending now or ahead) and
  ``delete_task`` (finished, live and unknown tasks); workflows' ``record_step`` (held,
  lost and forged claims, recorded positions, effects that commit or raise), ``suspend``
  (wake times past and to come, cancel requests, waiting for a signal or not),
  ``send_signal`` (live, finished and unknown tasks), ``receive_signal`` (held, lost
  and forged claims), ``spawn`` (held, lost and forged claims, recorded positions),
  a child's end waking its suspended parent (any finishing operation), ``forget_steps``
  (finished, live and unknown tasks), and ``steps``,
  ``signals`` and ``children`` of every task after every step, and every task's
  ``latest_events`` in one read;
* the lone-outcome calls both backends have (``complete`` with children, ``fail``);
* the :class:`~durablesched.store.protocol.Operator` calls an operator makes:
  ``requeue``, ``stats``, ``purge`` and ``check``.

After every step each task's full record and history, and every recorded
idempotency key, must be identical, and the invariants must hold: each new
history line is a transition the operation that ran may make, a task cancelled
before it started never starts, at most one valid claim per task, a claim that
lost its lease records nothing.

What cannot be compared exactly, and what is compared instead:

* ``MemoryStore`` has no ``requeue``, ``stats`` or ``purge`` (the in-memory
  backend has no operator). :class:`ModelStore` adds them to it here, as the
  docstrings of ``Operator`` and ``docs/cli.md`` promise them, so the SQL
  answers are compared with a model's.
* ``stats`` lists tasks in orders SQL leaves open on ties (overdue names by
  their oldest due time, running tasks by lease expiry, failures by finish
  time): those lists are compared sorted on a full key.
* ``check`` on SQL also reports the database's revision and the release's head
  (the memory store has no schema): the findings are compared, and the SQL
  revision must be the head.
* The memory store refuses database effects and a connection to submit in
  (``UnsupportedOperationError``, which is checked). The SQL side runs the
  effects (they write a row to ``effect_log`` in the success's transaction) and
  the memory side records the same outcome without them; an effect that raises
  must undo its outcome alone, so the memory side leaves that outcome out and
  the SQL answer must be the exception exactly when the claim was valid at its
  turn. A submit in a transaction is a plain submit on the memory side when the
  transaction commits, and nothing when it rolls back; on PostgreSQL the ids that
  transaction took stay taken (a sequence: an open transaction holds up no other
  submit), so the memory side skips them too, and a new queue's row (made apart,
  committed) stays as an empty queue. The machine runs one transaction at a
  time: the order between concurrent open transactions ("submission order among
  committed tasks", docs/scaling.md) is tested in
  ``tests/integration/test_postgres_open_transactions.py``, not here.

The run is bounded by time, not by a count of examples: see
:func:`run_for_a_while`.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Connection, text

from durablesched import (
    DurableSchedError,
    ErrorInfo,
    InvalidTransitionError,
    ManualClock,
    MemoryStore,
    QueueLimits,
    QueueStats,
    Rate,
    SQLiteStore,
    TaskNotFoundError,
    TaskState,
    UnsupportedOperationError,
)
from durablesched.attempts import attempts_from_history
from durablesched.records import (
    OLDEST,
    TASK_KEY_PREFIX,
    WORKER_FORGET_AFTER,
    Claim,
    NewTask,
    Outcome,
    OutcomeResult,
    SignalSend,
    TaskEvent,
    TaskQuery,
    TaskRecord,
    WorkerInfo,
)
from durablesched.states import (
    CLAIMABLE,
    OPERATOR_TRANSITIONS,
    TERMINAL,
    TRANSITIONS,
)
from durablesched.store.sql.codec import from_db_time
from durablesched.store.sql.migrate import head_revision
from durablesched.store.sql.postgres import PostgresStore
from durablesched.store.sql.store import SQLStore

from ..conftest import T0

LEASE = timedelta(seconds=30)
SOAK = os.environ.get("DURABLESCHED_SOAK", "") not in ("", "0")
IN_CI = os.environ.get("CI", "").lower() == "true"
#: Seconds each backend's machine runs for (SQLite, then PostgreSQL, each this long).
DIFF_SECONDS = float(
    os.environ.get("DURABLESCHED_DIFF_SECONDS") or (300 if SOAK else 40 if IN_CI else 20)
)
#: Steps per example.
STEPS = 60 if SOAK else 35
#: Examples per call of hypothesis: the budget is checked between calls.
CHUNK = 5

NAMES = ["a", "b", "c"]
OWNERS = ["w1", "w2"]
QUEUES = ["default", "mail", "api"]
PRIORITIES = [-5, 0, 0, 5]
#: Limit keys (issue 32): most tasks have none.
LIMIT_KEYS = [None, None, "x", "y"]
#: Debounce keys (issue 32): most submits have none.
DEBOUNCE_KEYS = [None, None, None, "d1", "d2"]
#: What a worker may ask of each queue: every queue, some queues, or none.
QUEUE_ASKS: list[dict[str, int] | None] = [
    None,
    None,
    {"mail": 1},
    {"default": 2, "api": 1},
    {"api": 3, "mail": 2, "default": 1},
    {},
]
#: Submit keys: none, two ordinary ones, and two that are the keys durablesched
#: generates for the effects of keyless tasks 1 and 2.
KEYS = [None, None, "k1", "k2", f"{TASK_KEY_PREFIX}1", f"{TASK_KEY_PREFIX}2"]
UNKNOWN_IDS = [0, -1, 10_000]
BOOM = ErrorInfo("builtins.RuntimeError", "boom", "")
_TEMPLATE: Path | None = None

S = TaskState
Move = tuple[TaskState | None, TaskState]
_CLAIM: frozenset[Move] = frozenset({(S.PENDING, S.RUNNING), (S.RETRY_WAIT, S.RUNNING)})
_SUBMIT: frozenset[Move] = frozenset({(None, S.PENDING)})
_SUCCEED: frozenset[Move] = frozenset({(S.RUNNING, S.SUCCEEDED)}) | _SUBMIT  # with children
_FAIL: frozenset[Move] = frozenset({(S.RUNNING, S.RETRY_WAIT), (S.RUNNING, S.FAILED)})
_ACK: frozenset[Move] = frozenset({(S.RUNNING, S.CANCELLED)})
#: Which moves (previous state, new state; None: the task is new) each operation
#: may write into a history. Operations not named here write none.
ALLOWED: dict[str, frozenset[Move]] = {
    "submit": _SUBMIT,
    "claim": _CLAIM,
    "complete": _SUCCEED,
    "fail": _FAIL,
    "acknowledge_cancel": _ACK,
    "record_and_claim": _SUCCEED | _FAIL | _ACK | _CLAIM,
    "release": frozenset({(S.RUNNING, S.PENDING), (S.RUNNING, S.CANCELLED)}),
    "request_cancel": frozenset({(S.PENDING, S.CANCELLED), (S.RETRY_WAIT, S.CANCELLED)}),
    "reclaim": frozenset(
        {(S.RUNNING, S.RETRY_WAIT), (S.RUNNING, S.FAILED), (S.RUNNING, S.CANCELLED)}
    ),
    "requeue": frozenset({(S.FAILED, S.PENDING), (S.CANCELLED, S.PENDING)}),
    "suspend": frozenset({(S.RUNNING, S.PENDING), (S.RUNNING, S.CANCELLED)}),
    "spawn": _SUBMIT,
    # A spawn, a suspension (which cancels a workflow whose cancel was requested, as
    # "suspend" may), the child's claim and its end.
    "workflow": _SUBMIT
    | _CLAIM
    | _SUCCEED
    | _FAIL
    | frozenset({(S.RUNNING, S.PENDING), (S.RUNNING, S.CANCELLED)}),
}
assert all(
    m in TRANSITIONS | OPERATOR_TRANSITIONS or m[0] is None for ms in ALLOWED.values() for m in ms
)
#: Operations that may change a record without writing a history line, and which fields.
SILENT_FIELDS: dict[str, frozenset[str]] = {
    "signal": frozenset({"due_at", "updated_at"}),
    "heartbeat": frozenset({"lease_expires_at", "updated_at"}),
    "request_cancel": frozenset({"cancel_requested_at", "updated_at", "due_at"}),
    # A signal sent with a success (ctx.signal) wakes a workflow waiting for it.
    "complete": frozenset({"due_at", "updated_at"}),
    # ... and a claim ahead's start is recorded (its RUNNING line keeps its place).
    "record_and_claim": frozenset({"due_at", "updated_at", "started_at"}),
    # A spawned child's end wakes its suspended parent: due at the wake, no history line.
    **{
        op: frozenset({"due_at", "updated_at"})
        for op in (
            "fail",
            "acknowledge_cancel",
            "release",
            "reclaim",
            "suspend",
            "workflow",
        )
    },
}
#: What a submit may change of a pending task with its debounce key, without a line.
DEBOUNCED_FIELDS = frozenset({"args", "trace", "due_at", "updated_at"})
#: The operations that store new tasks with debounce keys (a workflow's spawn too).
DEBOUNCING_OPS = frozenset({"submit", "spawn"})


def started_then(history: list[TaskEvent], start: datetime | None) -> list[TaskEvent]:
    """A claim ahead's history as the record of its start leaves it: the RUNNING line of
    its claim then says when it really started (docs/design.md), which is no rewrite.
    ``start`` is None when the step recorded no start of the task's claim: a task given
    back unstarted and claimed again keeps its old RUNNING line as it was."""
    if start is None:
        return history
    running = [i for i, e in enumerate(history) if e.state is TaskState.RUNNING]
    if not running:
        return history
    moved = list(history)
    moved[running[-1]] = replace(moved[running[-1]], at=start)
    return moved


def _fresh_db() -> Path:
    """A migrated database file, copied from one made once (migrations are slow-ish)."""
    global _TEMPLATE  # noqa: PLW0603 - a per-process cache of the template file
    if _TEMPLATE is None:
        _TEMPLATE = Path(tempfile.mkdtemp(prefix="ds-template-")) / "template.db"
        SQLiteStore(_TEMPLATE).close()
    target = Path(tempfile.mkdtemp(prefix="ds-diff-")) / "diff.db"
    shutil.copy(_TEMPLATE, target)
    return target


def retry_delay(name: str, attempt: int) -> timedelta:
    return timedelta(seconds=3 * attempt)


def _same(result: Any) -> Any:
    """Results compare by value; exceptions by type."""
    return type(result) if isinstance(result, Exception) else result


def outcome(call: Callable[[], Any]) -> Any:
    """Run ``call`` and return its result, or the type of the library error it raised."""
    try:
        return call()
    except DurableSchedError as e:
        return type(e)


class EffectFailed(RuntimeError):
    """What a failing effect raises."""


def _effect(task_id: int, *, fails: bool) -> Callable[[Connection], object]:
    """An effect that writes a row in the success's transaction (and then raises, if asked)."""

    def effect(conn: Connection) -> None:
        conn.execute(text("INSERT INTO effect_log (task_id) VALUES (:t)"), {"t": task_id})
        if fails:
            raise EffectFailed(f"effect of task {task_id}")

    return effect


def _canonical(stats: QueueStats) -> dict[str, Any]:
    """``stats`` with the lists SQL orders only partly sorted on a full key."""
    return {
        **stats,
        "overdue_by_name": sorted(
            stats["overdue_by_name"], key=lambda r: (r["oldest_due_at"], r["name"])
        ),
        "running": sorted(stats["running"], key=lambda r: (r["lease_expires_at"], r["id"])),
        "failures_last_hour": sorted(
            stats["failures_last_hour"], key=lambda r: (r["finished_at"], r["id"])
        ),
    }


class ModelStore(MemoryStore):
    """The in-memory store with the operator's ``requeue``, ``stats`` and ``purge``, which
    the in-memory backend does not offer: the model of what ``Operator`` promises."""

    def requeue(self, task_id: int, now: datetime, from_step: int | None = None) -> None:
        """With ``from_step``, the steps are forgotten only if the requeue is taken (one
        transaction in the SQL stores): forgotten first, put back if it is refused."""
        if from_step is None:
            return self._requeue(task_id, now)
        steps, signals = dict(self._steps), dict(self._signals)  # forget_steps replaces lists
        with contextlib.suppress(TaskNotFoundError, InvalidTransitionError):
            self.forget_steps(task_id, from_step)  # refused for a live task: so is the requeue
        try:
            self._requeue(task_id, now)
        except (TaskNotFoundError, InvalidTransitionError):
            self._steps, self._signals = steps, signals
            raise
        return None

    def _requeue(self, task_id: int, now: datetime) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise TaskNotFoundError(f"no task with id {task_id}")
            if task.state not in (TaskState.FAILED, TaskState.CANCELLED):
                raise InvalidTransitionError(f"task {task_id} is {task.state}")
            key = task.idempotency_key
            if key is not None and self._keys.get(key, task_id) != task_id:
                raise InvalidTransitionError(f"task {task_id}'s idempotency key is held")
            seq = self._next_id  # the SQL stores take the seq from the id counter
            self._next_id += 1
            self._forget_heap_entries({task_id})
            task = self._put(
                replace(
                    task,
                    state=TaskState.PENDING,
                    due_at=now,
                    seq=seq,
                    attempts=0,
                    lease_owner=None,
                    lease_expires_at=None,
                    cancel_requested_at=None,
                    result=None,
                    finished_at=None,
                    updated_at=now,
                )
            )
            if key is not None:
                self._keys[key] = task_id
            heapq.heappush(self._heap, (task.due_at, task.seq, task.id))
            self._event(task, now, "requeued")

    def purge(self, before: datetime, *, batch: int = 10_000) -> int:
        with self._lock:
            doomed = {
                t.id
                for t in self._tasks.values()
                if t.state in TERMINAL and t.finished_at is not None and t.finished_at < before
            }
            for task_id in doomed:
                task = self._tasks.pop(task_id)
                del self._events[task_id]
                if task.idempotency_key is not None and self._keys.get(task.idempotency_key) == (
                    task_id
                ):
                    del self._keys[task.idempotency_key]
                for key, (holder, _, _) in list(self.recorded_keys.items()):
                    if holder == task_id:
                        del self.recorded_keys[key]
                self._forget_workflow(task_id)
            self._forget_heap_entries(doomed)
        return len(doomed)

    def stats(self, now: datetime) -> QueueStats:
        tasks = sorted(self.list_tasks(limit=1_000_000), key=lambda t: (t.due_at, t.seq))
        paused = {q.name for q in self.queue_limits() if q.paused}
        overdue = [
            t for t in tasks if t.state in CLAIMABLE and t.due_at <= now and t.queue not in paused
        ]
        by_name: dict[str, list[TaskRecord]] = {}
        for t in overdue:
            by_name.setdefault(t.name, []).append(t)
        since = now - timedelta(hours=1)
        return {
            "counts": {s.value: sum(t.state is s for t in tasks) for s in TaskState},
            "oldest_overdue": None
            if not overdue
            else {
                "id": overdue[0].id,
                "name": overdue[0].name,
                "due_at": overdue[0].due_at,
                "lag_seconds": (now - overdue[0].due_at).total_seconds(),
            },
            "overdue_by_name": [
                {"name": name, "tasks": len(ts), "oldest_due_at": ts[0].due_at}
                for name, ts in by_name.items()
            ],
            "running": [
                {
                    "id": t.id,
                    "name": t.name,
                    "attempt": t.attempts,
                    "lease_owner": t.lease_owner,
                    "lease_expires_at": t.lease_expires_at,
                    "cancel_requested": t.cancel_requested_at is not None,
                }
                for t in tasks
                if t.state is TaskState.RUNNING and t.lease_expires_at is not None
            ],
            "failures_last_hour": [
                {
                    "id": t.id,
                    "name": t.name,
                    "attempts": t.attempts,
                    "finished_at": t.finished_at,
                    "error": t.last_error,
                }
                for t in tasks
                if t.state is TaskState.FAILED
                and t.finished_at is not None
                and t.finished_at >= since
            ],
        }

    def _forget_heap_entries(self, task_ids: set[int]) -> None:
        """Drop the (stale) heap entries of ``task_ids``, none of which is claimable."""
        kept = [e for e in self._heap if e[2] not in task_ids]
        self._stale -= len(self._heap) - len(kept)
        self._heap = kept
        heapq.heapify(self._heap)


class Counted(RuleBasedStateMachine):
    """A machine that counts the examples and steps it ran, over all of a test's
    hypothesis calls."""

    examples = 0
    steps = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1


class StoresAgree(Counted):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(T0)
        self.memory = ModelStore(compact_min=4)
        #: Attempts the totals counted at the last step: they never go back.
        self.totals_seen = 0
        self.sql = self.make_sql()
        self.held: list[Claim] = []
        #: Tasks cancelled before they started, as they were then (until requeued).
        self.cancelled_before_start: dict[int, TaskRecord] = {}
        #: Effects that ran and committed, by task id, in the order they ran.
        self.effects: list[int] = []
        #: The operation of the last step, and what the stores held before it.
        self.op = "init"
        self.purged_before: datetime | None = None
        self.seen_records: dict[int, TaskRecord | None] = {}
        self.seen_histories: dict[int, list[TaskEvent]] = {}
        #: The starts of claims ahead the last record_and_claim records, by task id.
        self.starts: dict[int, datetime] = {}

    def make_sql(self) -> SQLStore:
        self.path = _fresh_db()
        store = SQLiteStore(self.path)
        with store.engine.begin() as conn:
            conn.execute(
                text("CREATE TABLE effect_log (id INTEGER PRIMARY KEY, task_id INTEGER NOT NULL)")
            )
        return store

    def teardown(self) -> None:
        self.sql.close()
        shutil.rmtree(self.path.parent, ignore_errors=True)

    def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        a = outcome(lambda: getattr(self.memory, method)(*args, **kwargs))
        b = outcome(lambda: getattr(self.sql, method)(*args, **kwargs))
        assert a == b, f"{method}{args}{kwargs}: memory {a!r} != {self.sql.dialect.name} {b!r}"
        return a

    def ids(self) -> range:
        """Every id a task may have had, and one beyond."""
        return range(1, self.memory._next_id + 1)

    def now(self) -> datetime:
        return self.clock.now()

    def task_id(self, data: st.DataObject) -> int:
        task_id: int = data.draw(st.sampled_from([*self.ids(), *UNKNOWN_IDS]), label="task_id")
        return task_id

    def new_tasks(
        self, data: st.DataObject, count: int, label: str, *, debounce: bool = True
    ) -> list[NewTask]:
        now = self.now()
        tasks = [
            NewTask(
                data.draw(st.sampled_from(NAMES), label=f"{label} name"),
                {"i": i, "of": label},
                now + timedelta(seconds=data.draw(st.integers(0, 20), label=f"{label} due")),
                data.draw(st.integers(1, 3), label=f"{label} attempts"),
                data.draw(st.sampled_from(KEYS), label=f"{label} key"),
                None,
                data.draw(st.sampled_from(QUEUES), label=f"{label} queue"),
                data.draw(st.sampled_from(PRIORITIES), label=f"{label} priority"),
                data.draw(st.sampled_from(LIMIT_KEYS), label=f"{label} limit key"),
            )
            for i in range(count)
        ]
        if not debounce:
            return tasks
        # Debounced ones (no idempotency key), some with a longest wait.
        return [
            task._replace(
                idempotency_key=None,
                debounce_key=key,
                debounce_until=None if wait is None else now + timedelta(seconds=wait),
            )
            if (key := data.draw(st.sampled_from(DEBOUNCE_KEYS), label=f"{label} debounce"))
            and (wait := data.draw(st.sampled_from([None, 5, 30]), label=f"{label} wait")) != -1
            else task
            for task in tasks
        ]

    def is_valid(self, claim: Claim) -> bool:
        """Whether the model holds ``claim`` valid now."""
        return bool(self.memory.check_leases(claim.owner, [claim], self.now()))

    # -- submitting ------------------------------------------------------------------------------

    @rule(data=st.data(), count=st.integers(0, 3))
    def submit(self, data: st.DataObject, count: int) -> None:
        self.op = "submit"
        self.both("submit", self.new_tasks(data, count, "submit"), self.now())

    @precondition(lambda self: any(q.key_cap is not None for q in self.memory.queue_limits()))
    @rule(data=st.data(), count=st.integers(1, 3))
    def submit_keyed(self, data: st.DataObject, count: int) -> None:
        """Tasks with limit keys, due now, in a queue limited per key: without this rule
        few keyed tasks ever run in such a queue, and each key's count of RUNNING tasks
        (:meth:`each_limit_keys_running_count_is_exact`) would go untested."""
        self.op = "submit"
        keyed = sorted(q.name for q in self.memory.queue_limits() if q.key_cap is not None)
        queue = data.draw(st.sampled_from(keyed), label="keyed queue")
        tasks = [
            t._replace(queue=queue, due_at=self.now(), limit_key=key)
            for t in self.new_tasks(data, count, "keyed", debounce=False)
            if (key := data.draw(st.sampled_from(["x", "y"]), label="limit key"))
        ]
        self.both("submit", tasks, self.now())

    @rule(data=st.data(), count=st.integers(1, 3), commit=st.booleans())
    def submit_in_transaction(self, data: st.DataObject, count: int, commit: bool) -> None:
        """With the caller's connection: the tasks exist if and only if it commits.

        The memory store has no transaction to join and refuses the connection;
        its equivalent is a plain submit when the caller commits, nothing otherwise."""
        self.op = "submit"
        # No debounce here: on PostgreSQL a rolled-back update of a debounced task
        # spends an id the model cannot tell from the answers.
        tasks = self.new_tasks(data, count, "tx", debounce=False)
        now = self.now()
        refused = outcome(lambda: self.memory.submit(tasks, now, connection=cast(Any, object())))
        assert refused is UnsupportedOperationError
        conn = self.sql.engine.connect()
        try:
            with conn.begin() as tx:
                got = self.sql.submit(tasks, now, connection=conn)
                if not commit:
                    tx.rollback()
        finally:
            conn.close()
        if commit:
            assert self.memory.submit(tasks, now) == got
        elif self.sql.dialect.allocate is not None:
            # PostgreSQL takes ids (and seqs) from a sequence, which a rollback does not
            # give back (so that an open transaction holds up no other submit): the ids
            # the rolled-back tasks took are a gap, never handed out. SQLite's counter
            # row rolls back with the transaction, and the next submit reuses them.
            taken = [s.task_id for s in got if s.created]
            first = self.memory._next_id
            assert taken == list(range(first, first + len(taken))), (taken, first)
            self.memory._next_id = first + len(taken)
            # A new queue's row is made apart from the caller's transaction (so that no
            # other submit to it waits), and stays: an empty queue. Only for the tasks
            # that were to be stored: not one whose key another task (of the batch, or
            # stored) holds.
            for task, submitted in zip(tasks, got, strict=True):
                if not submitted.created:
                    continue
                if task.queue not in {q.name for q in self.memory.queue_limits()}:
                    self.memory.put_queue(QueueLimits(task.queue), now)

    # -- reading ---------------------------------------------------------------------------------

    @rule(
        state=st.sampled_from([None, *TaskState]),
        name=st.sampled_from([None, *NAMES, "zz"]),
        limit=st.sampled_from([0, 1, 2, 5, 100]),
    )
    def list_tasks(self, state: TaskState | None, name: str | None, limit: int) -> None:
        self.op = "read"
        listed = self.both("list_tasks", state=state, name=name, limit=limit)
        keys = [(t.due_at, t.seq) for t in listed]
        assert keys == sorted(keys) and len(listed) <= limit

    @rule(data=st.data())
    def read_one(self, data: st.DataObject) -> None:
        """get and history of any id, unknown ones included (None and [] on both)."""
        self.op = "read"
        task_id = self.task_id(data)
        self.both("get", task_id)
        self.both("history", task_id)

    @rule(data=st.data())
    def finished(self, data: st.DataObject) -> None:
        """Which of some ids (unknown ones among them) are finished, or no task's: what
        waiting handles read."""
        self.op = "read"
        ids = data.draw(st.lists(st.sampled_from(list(self.ids())), max_size=6), label="ids")
        found = self.both("finished", ids)
        assert all(
            r is None or r.state.value in {"SUCCEEDED", "FAILED", "CANCELLED"}
            for r in found.values()
        )

    @rule(
        names=st.sampled_from(
            [None, frozenset(), frozenset("a"), frozenset("ab"), frozenset("c"), frozenset(["zz"])]
        ),
        queues=st.sampled_from([None, frozenset(), frozenset(["mail"]), frozenset(QUEUES)]),
    )
    def next_wakeup(self, names: frozenset[str] | None, queues: frozenset[str] | None) -> None:
        self.op = "read"
        when = self.both("next_wakeup", self.now(), names, queues)
        assert when is None or when > self.now()

    # -- queues ----------------------------------------------------------------------------------

    @rule(
        queue=st.sampled_from([*QUEUES, "new"]),
        concurrency=st.sampled_from([None, None, 1, 2]),
        rate=st.sampled_from(
            [None, None, Rate(1, timedelta(seconds=10)), Rate(2, timedelta(seconds=30))]
        ),
        paused=st.sampled_from([False, False, True]),
        per_key=st.sampled_from([None, None, 1, 2]),
        key_rate=st.sampled_from(
            [None, None, Rate(1, timedelta(seconds=10)), Rate(2, timedelta(seconds=10))]
        ),
    )
    def put_queue(  # noqa: PLR0917 - one rule's drawn arguments
        self,
        queue: str,
        concurrency: int | None,
        rate: Rate | None,
        paused: bool,
        per_key: int | None,
        key_rate: Rate | None,
    ) -> None:
        """Limits and pause, as an operator sets them: no task changes state (a changed
        limit per key chooses its keys' heads afresh)."""
        self.op = "read"
        limits = QueueLimits(queue, concurrency, rate, paused, per_key, key_rate)
        self.both("put_queue", limits, self.now())

    @rule()
    def queues(self) -> None:
        self.op = "read"
        self.both("queue_limits")
        self.both("queue_info", self.now())
        self.both("queue_info", self.now(), finished=False)

    @rule()
    def stats(self) -> None:
        self.op = "read"
        now = self.now()
        model, sql = _canonical(self.memory.stats(now)), _canonical(self.sql.stats(now))
        assert model == sql, f"stats:\n model {model}\n {self.sql.dialect.name} {sql}"

    @rule(after=st.sampled_from([0, 5, 30, 300]))
    def check(self, after: int) -> None:
        self.op = "read"
        now = self.now()
        model = self.memory.check(now, overdue_after=timedelta(seconds=after))
        sql = self.sql.check(now, overdue_after=timedelta(seconds=after))
        assert model.findings == sql.findings
        assert sql.revision == sql.head == head_revision()

    # -- claims and leases -----------------------------------------------------------------------

    @rule(
        owner=st.sampled_from(OWNERS),
        limit=st.integers(0, 4),
        names=st.sampled_from([None, frozenset("ab"), frozenset("c"), frozenset()]),
        in_process=st.sampled_from([(), ("a",), ("a", "c")]),
        queues=st.sampled_from(QUEUE_ASKS),
        behind=st.sampled_from([0, 0, 0, 1, 5, 12]),
        ahead=st.sampled_from([0, 0, 1, 3]),
    )
    def claim(  # noqa: PLR0917 - one rule's drawn arguments
        self,
        owner: str,
        limit: int,
        names: frozenset[str] | None,
        in_process: tuple[str, ...],
        queues: dict[str, int] | None,
        behind: int,
        ahead: int,
    ) -> None:
        """A claim at the clock's time, or seconds behind it: a worker that read its
        clock and then waited for the write lock while others claimed (the rate
        windows' starts must be the same on both, whatever was forgotten since)."""
        self.op = "claim"
        now = self.now() - timedelta(seconds=behind)
        running = self.running_by_queue()
        keys_running = self.keys_running()
        claims = self.both(
            "claim",
            owner,
            limit,
            now,
            LEASE,
            names,
            process_names=in_process,
            queues=queues,
            ahead=ahead,
        )
        self.check_claims(claims, limit, names, queues, running, now=now, ahead=ahead)
        self.check_keys(claims, keys_running)

    def keys_running(self) -> dict[tuple[str, str], int]:
        """Per (queue, limit key), how many RUNNING, counted from the model's tasks."""
        counts: dict[tuple[str, str], int] = {}
        for t in self.memory.list_tasks(state=TaskState.RUNNING, limit=1_000_000):
            if t.limit_key is not None:
                counts[(t.queue, t.limit_key)] = counts.get((t.queue, t.limit_key), 0) + 1
        return counts

    def check_keys(self, claims: list[Claim], before: dict[tuple[str, str], int]) -> None:
        """A claim starts at most one task of a limit key, and none of a key already at its
        queue's concurrency per key."""
        limits = {q.name: q for q in self.memory.queue_limits()}
        tasks = {t.id: t for t in self.memory.list_tasks(limit=1_000_000)}
        taken: set[tuple[str, str]] = set()
        for c in claims:
            key, cap = tasks[c.task_id].limit_key, limits[c.queue].concurrency_per_key
            if key is None or cap is None:
                continue
            assert (c.queue, key) not in taken, "one claim started two tasks of a limit key"
            taken.add((c.queue, key))
            assert before.get((c.queue, key), 0) < cap, "a limit key went past its limit"

    def running_by_queue(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.memory.list_tasks(state=TaskState.RUNNING, limit=1_000_000):
            counts[t.queue] = counts.get(t.queue, 0) + 1
        return counts

    def check_claims(
        self,
        claims: list[Claim],
        limit: int,
        names: Any,
        queues: dict[str, int] | None = None,
        running: dict[str, int] | None = None,
        *,
        now: datetime | None = None,
        ahead: int = 0,
    ) -> None:
        now = now or self.now()
        tasks = {t.id: t for t in self.memory.list_tasks(limit=1_000_000)}
        limits = {q.name: q for q in self.memory.queue_limits()}
        waiting = [c for c in claims if c.started_at is None]
        assert claims[len(claims) - len(waiting) :] == waiting, "a claim ahead before a start"
        assert len(waiting) <= ahead, "more claimed ahead than asked"
        for c in waiting:
            assert not limits[c.queue].limited, "claimed ahead from a limited queue"
            if queues is not None:
                assert c.queue in queues, "claimed ahead from a queue not asked"
        ahead_keys = [(-tasks[c.task_id].priority, c.due_at, c.seq) for c in waiting]
        assert ahead_keys == sorted(ahead_keys), "claims ahead out of order"
        self.held.extend(waiting)
        claims = claims[: len(claims) - len(waiting)]
        assert all(c.started_at == c.claimed_at for c in claims), "a started claim's start"
        keys = [(-tasks[c.task_id].priority, c.due_at, c.seq) for c in claims]
        assert keys == sorted(keys), "claims out of (priority desc, due_at, seq) order"
        assert len(claims) <= limit
        taken: dict[str, int] = {}
        for c in claims:
            assert c.due_at <= now, "claimed before its due time"
            assert c.task_id not in self.cancelled_before_start, "a cancelled task started"
            assert names is None or c.name in names
            assert c.queue == tasks[c.task_id].queue
            assert (c.priority, c.created_at) == (
                tasks[c.task_id].priority,
                tasks[c.task_id].created_at,
            )
            assert c.claimed_at == now, "a claim's time is not the claim's now"
            assert not limits[c.queue].paused, "a paused queue started a task"
            taken[c.queue] = taken.get(c.queue, 0) + 1
        for queue, n in taken.items():
            assert queues is None or n <= queues.get(queue, 0), "more than asked of a queue"
            concurrency = limits[queue].concurrency
            if concurrency is not None and running is not None:
                assert running.get(queue, 0) + n <= max(concurrency, running.get(queue, 0)), (
                    "a claim went past a queue's concurrency limit"
                )
        if len(claims) < limit and queues is None and not any(q.limited for q in limits.values()):
            left = [
                t
                for t in tasks.values()
                if t.state in CLAIMABLE and t.due_at <= now and (names is None or t.name in names)
            ]
            assert left == [], "a due task was left unclaimed with slots free"
        self.held.extend(claims)

    def some_claims(self, data: st.DataObject, owner: str) -> list[Claim]:
        """Claims held, lost, superseded, of either owner, or forged."""
        forged = [
            replace(c, fence=c.fence + 1)
            if kind == 0
            else replace(c, owner="w3")
            if kind == 1
            else replace(c, task_id=10_000)
            for kind, c in enumerate(self.held[-3:])
        ]
        pool = self.held + forged
        mine = [c for c in pool if c.owner == owner]
        return data.draw(
            st.one_of(st.just(mine), st.lists(st.sampled_from(pool), max_size=5))
            if pool
            else st.just([]),
            label="claims",
        )

    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def heartbeat(self, data: st.DataObject, owner: str) -> None:
        self.op = "heartbeat"
        claims = self.some_claims(data, owner)
        statuses = self.both("heartbeat", owner, claims, self.now(), LEASE)
        assert [s.task_id for s in statuses] == sorted({s.task_id for s in statuses})

    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def check_leases(self, data: st.DataObject, owner: str) -> None:
        self.op = "read"
        self.both("check_leases", owner, self.some_claims(data, owner), self.now())

    # -- outcomes --------------------------------------------------------------------------------

    @precondition(lambda self: self.held)
    @rule(data=st.data(), result=st.integers(-5, 5), children=st.integers(0, 2))
    def complete(self, data: st.DataObject, result: int, children: int) -> None:
        """A success with children and signals (``ctx.signal``) to any task: a signal
        refused (an unknown or finished task, the sender itself) undoes it all, alike."""
        self.op = "complete"
        claim = data.draw(st.sampled_from(self.held))
        kids = self.new_tasks(data, children, "child", debounce=False)
        sent = self.signals_to_send(data)
        self.both("complete", claim, {"r": result}, self.now(), children=kids, signals=sent)

    def signals_to_send(self, data: st.DataObject) -> list[SignalSend]:
        return [
            SignalSend(self.task_id(data), name, {"p": payload})
            for name, payload in data.draw(
                st.lists(st.tuples(st.sampled_from(["go", "stop"]), st.integers(0, 3)), max_size=2),
                label="signals",
            )
        ]

    @precondition(lambda self: self.held)
    @rule(data=st.data(), retry_in=st.one_of(st.none(), st.integers(0, 10)))
    def fail(self, data: st.DataObject, retry_in: int | None) -> None:
        self.op = "fail"
        claim = data.draw(st.sampled_from(self.held))
        now = self.now()
        retry_at = None if retry_in is None else now + timedelta(seconds=retry_in)
        self.both("fail", claim, BOOM, retry_at, now)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def acknowledge_cancel(self, data: st.DataObject) -> None:
        self.op = "acknowledge_cancel"
        claim = data.draw(st.sampled_from(self.held))
        self.both("acknowledge_cancel", claim, self.now(), detail="stopped")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.op = "release"
        why = data.draw(st.sampled_from(["at shutdown", "unstarted"]), label="why")
        claims = self.some_claims(data, data.draw(st.sampled_from(OWNERS)))
        self.both("release", claims, self.now(), why=why)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), kind=st.sampled_from(["complete", "fail", "ack", "release", "group"]))
    def lost_claim_records_nothing(self, data: st.DataObject, kind: str) -> None:
        """A claim that lost its lease (expired, reclaimed, finished, superseded) or was
        forged is refused by both, identically, and changes nothing."""
        self.op = "read"
        now = self.now()
        forged = [replace(c, fence=c.fence + 1) for c in self.held[-2:]]
        forged += [replace(c, owner="w3") for c in self.held[-2:]]
        lost = [c for c in self.held + forged if not self.is_valid(c)]
        if not lost:
            return
        claim = data.draw(st.sampled_from(lost), label="lost claim")
        if kind == "complete":
            assert (
                self.both(
                    "complete", claim, 1, now, children=self.new_tasks(data, 1, "x", debounce=False)
                )
                is False
            )
        elif kind == "fail":
            assert self.both("fail", claim, BOOM, now, now) is None
        elif kind == "ack":
            assert self.both("acknowledge_cancel", claim, now) is False
        elif kind == "release":
            assert self.both("release", [claim], now) == 0
        else:
            outcomes = [Outcome(claim, result=2), Outcome(claim, error=BOOM, retry_at=now)]
            outcomes += [Outcome(claim, cancelled=True)]
            extra: dict[str, Any] = {"owner": claim.owner, "limit": 0, "lease": LEASE}
            assert self.memory.record_and_claim(outcomes, now, **extra) == ([None] * 3, [])
            assert self.sql.record_and_claim(outcomes, now, **extra) == ([None] * 3, [])

    @precondition(lambda self: self.held)
    @rule(
        data=st.data(),
        name=st.sampled_from(["charge", "ship"]),
        result=st.integers(-3, 3),
        effect=st.sampled_from([None, None, "ok", "raises"]),
    )
    def record_step(self, data: st.DataObject, name: str, result: int, effect: str | None) -> None:
        """A workflow step's checkpoint by a held, lost, superseded or forged claim (after
        any crash the machine made: abandoned leases, reclaims, claims again), at a
        position recorded or not. SQL runs its effect (the memory store refuses one and
        records the same checkpoint without): once, and undone with it if it raises."""
        self.op = "step"
        forged = [replace(c, fence=c.fence + 1) for c in self.held[-2:]]
        claim = data.draw(st.sampled_from(self.held + forged), label="step claim")
        position = data.draw(st.integers(0, 3), label="position")
        now = self.now()
        value = {"r": result}
        if effect is None:
            self.both("record_step", claim, position, name, value, now)
            return
        refused = outcome(
            lambda: self.memory.record_step(
                claim, position, name, value, now, effects=[_effect(claim.task_id, fails=False)]
            )
        )
        assert refused is UnsupportedOperationError
        would = self.is_valid(claim) and all(
            s.position != position for s in self.memory.steps(claim.task_id)
        )
        fails = effect == "raises"
        try:
            got = self.sql.record_step(
                claim, position, name, value, now, effects=[_effect(claim.task_id, fails=fails)]
            )
        except EffectFailed:
            assert fails and would, "an effect ran for a checkpoint that was not to be recorded"
            return
        assert got is would, f"record_step: {self.sql.dialect.name} {got}, model {would}"
        if got:
            assert self.memory.record_step(claim, position, name, value, now)
            self.effects.append(claim.task_id)

    @rule(
        data=st.data(),
        owner=st.sampled_from(OWNERS),
        limit=st.integers(0, 5),
        names=st.sampled_from([None, frozenset("ab"), frozenset("c")]),
        in_process=st.sampled_from([(), ("b",), ("a", "b", "c")]),
    )
    def record_and_claim(
        self,
        data: st.DataObject,
        owner: str,
        limit: int,
        names: frozenset[str] | None,
        in_process: tuple[str, ...],
    ) -> None:
        """A worker's flush: several outcomes (the same claim twice, at times), then a claim."""
        self.op = "record_and_claim"
        now = self.now()
        picked = data.draw(st.lists(st.sampled_from(self.held), max_size=4)) if self.held else []
        outcomes: list[Outcome] = []
        kinds: list[str] = []
        for claim in picked:
            kind = data.draw(
                st.sampled_from(
                    [
                        "ok",
                        "ok",
                        "children",
                        "effect",
                        "bad effect",
                        "signal",
                        "fail",
                        "retry",
                        "cancel",
                    ]
                )
            )
            kinds.append(kind)
            error = BOOM if kind in ("fail", "retry") else None
            outcomes.append(
                Outcome(
                    claim,
                    result=None if kind == "fail" else {"r": claim.task_id},
                    error=error,
                    retry_at=now + timedelta(seconds=data.draw(st.integers(0, 3)))
                    if kind == "retry"
                    else None,
                    cancelled=kind == "cancel",
                    children=tuple(
                        self.new_tasks(data, data.draw(st.integers(1, 2)), "kid", debounce=False)
                    )
                    if kind in ("children", "bad effect")
                    else (),
                    effects=(_effect(claim.task_id, fails=kind == "bad effect"),)
                    if kind in ("effect", "bad effect")
                    else (),
                    signals=tuple(self.signals_to_send(data)) if kind == "signal" else (),
                )
            )
        expected_valid = self.valid_at_turn(outcomes, kinds)
        model_outcomes = [
            replace(o, effects=())
            for o, k in zip(outcomes, kinds, strict=True)
            if k != "bad effect"
        ]
        queues = data.draw(st.sampled_from(QUEUE_ASKS), label="queues")
        extra: dict[str, Any] = {
            "owner": owner,
            "limit": limit,
            "lease": LEASE,
            "names": names,
            "process_names": in_process,
            "queues": queues,
            "ahead": data.draw(st.sampled_from([0, 0, 2]), label="ahead"),
            # Claims ahead started since (and some other claims): their starts first.
            "started": [
                replace(c, started_at=now)
                for c in data.draw(
                    st.lists(st.sampled_from(self.held), max_size=3) if self.held else st.just([]),
                    label="started",
                )
            ],
        }
        self.starts = self.starts_recorded(extra["started"])
        model_results, model_claims = self.memory.record_and_claim(model_outcomes, now, **extra)
        sql_results, sql_claims = self.sql.record_and_claim(outcomes, now, **extra)
        model_iter = iter(model_results)
        ran: list[int] = []  # effects that committed: they run in task id order
        for kind, valid, claim, got in zip(kinds, expected_valid, picked, sql_results, strict=True):
            if kind == "bad effect":
                assert isinstance(got, EffectFailed) if valid else got is None, (kind, valid, got)
                continue
            want: OutcomeResult = next(model_iter)
            assert _same(want) == _same(got), f"{kind} of {claim}: model {want!r} != {got!r}"
            if kind == "signal" and isinstance(want, Exception):
                assert valid, "a signal was refused for an outcome that was not to be written"
                continue
            assert (want is not None and not isinstance(want, Exception)) == valid
            if kind == "effect" and want is TaskState.SUCCEEDED:
                ran.append(claim.task_id)
        self.effects.extend(sorted(ran))
        assert model_claims == sql_claims
        self.check_claims(model_claims, limit, names, queues, ahead=extra["ahead"])

    def starts_recorded(self, started: Sequence[Claim]) -> dict[int, datetime]:
        """The starts a record_and_claim records, by task id: of a claim valid now whose
        task has none yet, the first in task id order. Only these move a RUNNING line."""
        starts: dict[int, datetime] = {}
        for claim in sorted(started, key=lambda c: c.task_id):
            task = self.memory.get(claim.task_id)
            if (
                task is not None
                and task.started_at is None
                and claim.started_at is not None
                and claim.task_id not in starts
                and self.is_valid(claim)
            ):
                starts[claim.task_id] = claim.started_at
        return starts

    def valid_at_turn(self, outcomes: Sequence[Outcome], kinds: Sequence[str]) -> list[bool]:
        """Whether each outcome's claim is valid when its turn comes (task id order), and
        its outcome would be written: an outcome written makes later ones of the same
        claim invalid; one refused (an unrequested cancellation) or undone (a raising
        effect) does not."""
        valid = [False] * len(outcomes)
        written: set[int] = set()
        ended: set[int] = set()  # finished by an outcome before this one
        born = Born(self.memory._next_id, set(self.memory._keys))
        for i in sorted(range(len(outcomes)), key=lambda i: outcomes[i].claim.task_id):
            claim = outcomes[i].claim
            task = self.memory.get(claim.task_id)
            if claim.task_id in written or not self.is_valid(claim) or task is None:
                continue
            if kinds[i] == "cancel" and task.cancel_requested_at is None:
                continue  # refused: InvalidTransitionError, nothing written
            valid[i] = True
            if kinds[i] == "bad effect" or any(
                self.refuses_signal(s.task_id, claim.task_id, ended, born.ids)
                for s in outcomes[i].signals
            ):
                continue
            written.add(claim.task_id)
            born.children(outcomes[i].children)
            if kinds[i] != "retry" or task.cancel_requested_at is not None:
                ended.add(claim.task_id)
        return valid

    def refuses_signal(self, target: int, sender: int, ended: set[int], born: set[int]) -> bool:
        """Whether a success of ``sender`` sending ``target`` a signal is refused (``born``:
        the tasks stored by the outcomes before it in its flush, which take signals)."""
        if target in born:
            return False
        task = self.memory.get(target)
        return task is None or target in ended or target == sender or task.state in TERMINAL

    # -- cancellation, expiry, the clock ---------------------------------------------------------

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.op = "request_cancel"
        task_id = self.task_id(data)
        before = self.memory.get(task_id)
        result = self.both("request_cancel", task_id, self.now())
        if before is None:
            assert result is TaskNotFoundError
        elif before.state in CLAIMABLE:
            assert result == "CANCELLED"
            after = self.memory.get(task_id)
            assert after is not None
            self.cancelled_before_start[task_id] = after
        elif before.state in TERMINAL:
            assert result == "TOO_LATE"
        else:
            assert result == ("ENFORCED" if before.environment == "process" else "REQUESTED")

    @rule(seconds=st.integers(0, 40))
    def advance(self, seconds: int) -> None:
        self.op = "read"
        self.clock.advance(seconds)

    @rule(first=st.booleans())
    def abandon(self, first: bool) -> None:
        """Workers vanish: leases run out (or not yet) and any worker reclaims."""
        self.op = "reclaim"
        if first:
            self.clock.advance(LEASE)
        reclaimed = self.both("reclaim_expired", self.now(), retry_delay)
        assert [r.task_id for r in reclaimed] == sorted(r.task_id for r in reclaimed)

    # -- live workers ----------------------------------------------------------------------------

    @rule(
        owner=st.sampled_from(OWNERS),
        queues=st.sampled_from([None, {"mail": 2}, {"default": 1, "api": 3}]),
        lease=st.sampled_from([LEASE, timedelta(seconds=2.5), timedelta(microseconds=1)]),
        started_ago=st.integers(0, 5),
    )
    def register_worker(
        self, owner: str, queues: dict[str, int] | None, lease: timedelta, started_ago: int
    ) -> None:
        self.op = "workers"
        now = self.now()
        worker = WorkerInfo(
            id=owner,
            host="host",
            pid=started_ago,
            queues=queues,
            concurrency=sum(queues.values()) if queues else 2,
            version="0.0.0",
            started_at=now - timedelta(seconds=started_ago),
            last_seen=now,
            lease=lease,
        )
        self.both("register_worker", worker, now)

    @rule(owner=st.sampled_from([*OWNERS, "nobody"]))
    def deregister_worker(self, owner: str) -> None:
        self.op = "workers"
        self.both("deregister_worker", owner)

    @rule(
        ago=st.sampled_from([0, 1, 5, 30, 3600]),
        ahead=st.sampled_from([0, 10]),
        bounds=st.sampled_from([(), (0, 1, 5), (2, 30)]),
    )
    def activity(self, ago: int, ahead: int, bounds: tuple[int, ...]) -> None:
        """What a window ending now (or ahead of now) holds, as metrics count it."""
        self.op = "read"
        now = self.now()
        activity = self.both(
            "activity",
            now - timedelta(seconds=ago),
            now + timedelta(seconds=ahead),
            [timedelta(seconds=b) for b in bounds],
        )
        for runs in activity.durations.values():
            assert list(runs.at_most) == sorted(runs.at_most) and runs.at_most[-1:] <= (runs.runs,)

    @rule(days=st.sampled_from([0, 1, 2]))
    def prune_workers(self, days: int) -> None:
        """A day and more later: workers gone that long are forgotten."""
        self.op = "workers"
        if days:
            self.clock.advance(WORKER_FORGET_AFTER * days)
        self.both("prune_workers", self.now())

    # -- the dashboard's Console ---------------------------------------------------------------

    @rule(data=st.data(), limit=st.integers(0, 6))
    def find_tasks(self, data: st.DataObject, limit: int) -> None:
        """A page of the dashboard's list: every filter, a created-time range, a cursor."""
        self.op = "read"
        maybe = st.none
        state = data.draw(st.one_of(maybe(), st.sampled_from(list(TaskState))), label="state")
        name = data.draw(st.one_of(maybe(), st.sampled_from([*NAMES, "zzz"])), label="name")
        queue = data.draw(st.one_of(maybe(), st.sampled_from(QUEUES)), label="queue")
        keys = [k for k in KEYS if k is not None]
        key = data.draw(st.one_of(maybe(), st.sampled_from(keys)), label="key")
        now = self.now()
        ago = data.draw(st.one_of(st.none(), st.integers(-5, 120)), label="created from")
        until = data.draw(st.one_of(st.none(), st.integers(-5, 120)), label="created until")
        cursors: dict[str, tuple[datetime, int] | None] = {"before": None, "after": None}
        for way in cursors:
            if data.draw(st.booleans(), label=f"cursor {way}"):
                task = self.memory.get(self.task_id(data))
                shift = data.draw(st.sampled_from([0, 0, 1, -1]), label="shift")
                if task is not None:
                    cursors[way] = (task.created_at + timedelta(seconds=shift), task.id)
                elif way == "after":
                    cursors[way] = OLDEST
        query = TaskQuery(
            state=state,
            queue=queue,
            name=name,
            key=key,
            created_from=None if ago is None else now - timedelta(seconds=ago),
            created_until=None if until is None else now - timedelta(seconds=until),
            before=cursors["before"],
            after=cursors["after"],
        )
        page = self.both("find_tasks", query, limit)
        order = [(t.created_at, t.id) for t in page]
        assert order == sorted(order, reverse=True) and len(page) <= limit

    @rule(ago=st.integers(0, 300), ahead=st.sampled_from([0, 0, 30]))
    def minute_counts(self, ago: int, ahead: int) -> None:
        """The overview's chart: attempts that ended, per minute of a window."""
        self.op = "read"
        now = self.now()
        self.both("minute_counts", now - timedelta(seconds=ago), now + timedelta(seconds=ahead))

    @rule(data=st.data())
    def delete_task(self, data: st.DataObject) -> None:
        """Delete a finished task (a live or unknown one is refused alike)."""
        self.op = "delete"
        task_id = self.task_id(data)
        if self.both("delete_task", task_id) is None:
            self.cancelled_before_start.pop(task_id, None)

    # -- operator actions ------------------------------------------------------------------------

    @rule(data=st.data(), from_step=st.none() | st.integers(0, 3))
    def requeue(self, data: st.DataObject, from_step: int | None) -> None:
        self.op = "requeue"
        task_id = self.task_id(data)
        if self.both("requeue", task_id, self.now(), from_step) is None:
            self.cancelled_before_start.pop(task_id, None)

    @rule(ago=st.integers(-10, 120), batch=st.sampled_from([1, 2, 10_000]))
    def purge(self, ago: int, batch: int) -> None:
        self.op = "purge"
        self.purged_before = self.now() - timedelta(seconds=ago)
        self.both("purge", self.purged_before, batch=batch)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def records_histories_and_keys_match(self) -> None:
        for task_id in self.ids():
            mem, sql = self.memory.get(task_id), self.sql.get(task_id)
            assert mem == sql, f"task {task_id}:\n memory {mem}\n {self.sql.dialect.name} {sql}"
            assert self.memory.history(task_id) == self.sql.history(task_id)
        # Every task's last line in one read (what ``ls`` shows of a suspended workflow),
        # unknown ids left out, alike on both.
        wanted = [*self.ids(), *UNKNOWN_IDS]
        assert self.memory.latest_events(wanted) == self.sql.latest_events(wanted)
        with self.sql.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT key, task_id, recorded_at, result FROM idempotency_keys")
            ).all()
            effects = conn.execute(text("SELECT task_id FROM effect_log ORDER BY id")).all()
            conn.rollback()
        keys = {r.key: (r.task_id, from_db_time(r.recorded_at), _json(r.result)) for r in rows}
        assert self.memory.recorded_keys == keys
        assert [r.task_id for r in effects] == self.effects

    @precondition(lambda self: self.held)
    @rule(data=st.data(), wake_in=st.integers(-5, 60))
    def suspend(self, data: st.DataObject, wake_in: int) -> None:
        """A workflow's durable wait ends its attempt uncounted, due at the wake time (a
        past one too), by a held, lost or forged claim; CANCELLED if asked to stop."""
        self.op = "suspend"
        forged = [replace(c, fence=c.fence + 1) for c in self.held[-2:]]
        claim = data.draw(st.sampled_from(self.held + forged), label="suspend claim")
        now = self.now()
        signal = data.draw(st.sampled_from([None, "go", "stop"]), label="waits for")
        until = now + timedelta(seconds=wake_in)
        awaited = self.memory.children(claim.task_id)
        children = data.draw(
            st.sampled_from([None, (awaited, 0), (awaited, len(awaited))]), label="children"
        )
        self.both("suspend", claim, until, now, detail="sleeping", signal=signal, children=children)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), count=st.integers(1, 2))
    def spawn(self, data: st.DataObject, count: int) -> None:
        """A workflow spawns children with its step, by a held, lost or forged claim, at a
        position recorded or not: all or nothing, never twice."""
        self.op = "spawn"
        forged = [replace(c, fence=c.fence + 1) for c in self.held[-2:]]
        claim = data.draw(st.sampled_from(self.held + forged), label="spawn claim")
        position = data.draw(st.integers(0, 3), label="position")
        kids = self.new_tasks(data, count, "spawn")
        self.both("spawn", claim, position, "spawn:kid", kids, self.now())

    @rule(data=st.data(), name=st.sampled_from(["go", "stop"]), payload=st.integers(0, 3))
    def send_signal(self, data: st.DataObject, name: str, payload: int) -> None:
        """A signal to any task (live, finished, unknown): kept; a suspended workflow
        waiting for it becomes due at once."""
        self.op = "signal"
        task_id = self.task_id(data)
        now = self.now()
        a = outcome(lambda: self.memory.send_signal(task_id, name, {"p": payload}, now))
        b = outcome(lambda: self.sql.send_signal(task_id, name, {"p": payload}, now))
        # Ids come from a counter each (SQLite may reuse a purged one): compared as kinds.
        assert (a if isinstance(a, type) else int) == (b if isinstance(b, type) else int)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), name=st.sampled_from(["go", "stop"]))
    def receive_signal(self, data: st.DataObject, name: str) -> None:
        """A wait takes the oldest signal not taken, with its step, by a held, lost or
        forged claim, at a position recorded or not: each signal once."""
        self.op = "step"
        forged = [replace(c, fence=c.fence + 1) for c in self.held[-2:]]
        claim = data.draw(st.sampled_from(self.held + forged), label="wait claim")
        position = data.draw(st.integers(0, 3), label="position")
        self.both("receive_signal", claim, position, f"signal:{name}", name, self.now())

    @precondition(lambda self: self.held)
    @rule(data=st.data(), ends=st.sampled_from(["succeeds", "fails", "early"]))
    def child_wakes_parent(self, data: st.DataObject, ends: str) -> None:
        """A held workflow spawns a child and suspends waiting for it; the child is then
        claimed and ends: its end wakes the parent (or, when it ended before the parent
        suspended, the suspension sees it), alike on both."""
        self.op = "workflow"
        parent = data.draw(st.sampled_from(self.held), label="parent")
        now = self.now()
        position = data.draw(st.integers(0, 3), label="position")
        kid = NewTask("kid", {"of": parent.task_id}, now, 1, None)
        spawned = self.both("spawn", parent, position, "spawn:kid", [kid], now)
        if not spawned or not spawned[0].created:
            return
        kid_id = spawned[0].task_id
        if ends == "early":
            self.end_kid(owner="w2", kid_id=kid_id, ends="succeeds")
        self.both(
            "suspend",
            parent,
            now + timedelta(seconds=60),
            now,
            detail="gather",
            children=([kid_id], 0),
        )
        if ends != "early":
            self.end_kid(owner="w2", kid_id=kid_id, ends=ends)

    def end_kid(self, *, owner: str, kid_id: int, ends: str) -> None:
        now = self.now()
        claims = self.both("claim", owner, 5, now, LEASE, ["kid"])
        self.held.extend(claims)
        for claim in claims:
            if claim.task_id == kid_id and ends == "succeeds":
                self.both("complete", claim, 1, now)
            elif claim.task_id == kid_id:
                self.both("fail", claim, BOOM, None, now)

    @rule(data=st.data(), position=st.integers(0, 3))
    def forget_steps(self, data: st.DataObject, position: int) -> None:
        """``retry --from-step``'s first half: a finished workflow's steps from a position
        forgotten, the signals their waits took given back (a live or unknown task
        refused alike)."""
        self.op = "read"
        self.both("forget_steps", self.task_id(data), position)

    @invariant()
    def steps_and_signals_match(self) -> None:
        """Every task's checkpoints and signals (but their ids), alike on both (a purge or
        a delete takes them away); a signal taken once, by one position."""
        for task_id in [*self.ids(), *UNKNOWN_IDS]:
            assert self.memory.steps(task_id) == self.sql.steps(task_id), f"steps of {task_id}"
            assert self.memory.children(task_id) == self.sql.children(task_id)
            mem = [replace(s, id=0) for s in self.memory.signals(task_id)]
            assert mem == [replace(s, id=0) for s in self.sql.signals(task_id)]
            taken = [s.consumed_position for s in mem if s.consumed_position is not None]
            assert len(taken) == len(set(taken)), f"task {task_id}: a position took two"

    @invariant()
    def the_attempts_view_reads_the_history_as_the_api_does(self) -> None:
        """``durablesched_attempts`` (SQL) agrees with ``attempts_from_history`` (every
        backend's history, compared line by line above)."""
        expected = [
            (
                a.task_id,
                a.number,
                a.worker_id,
                a.started_at,
                a.finished_at,
                None if a.outcome is None else a.outcome.value,
                None if a.error is None else a.error.type,
                None if a.error is None else a.error.message,
            )
            for task_id in self.ids()
            for a in attempts_from_history(self.memory.history(task_id))
        ]
        with self.sql.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT a.task_id, a.attempt, a.worker, a.started_at, a.finished_at, "
                    "a.outcome, a.error_type, a.error_message FROM durablesched_attempts a"
                )
            ).all()
            conn.rollback()
        got = [
            (*r[:3], from_db_time(r[3]), None if r[4] is None else from_db_time(r[4]), *r[5:])
            for r in rows
        ]
        assert sorted(got, key=repr) == sorted(expected, key=repr)  # the view has no order

    @invariant()
    def each_change_is_one_its_operation_may_make(self) -> None:
        """Every new history line is a move the step's operation may make, from the
        state the task was in; a record changes state only with a history line."""
        if self.op != "init":
            type(self).steps += 1
        allowed = ALLOWED.get(self.op, frozenset())
        silent = SILENT_FIELDS.get(self.op, frozenset())
        records: dict[int, TaskRecord | None] = {}
        histories: dict[int, list[TaskEvent]] = {}
        for task_id in self.ids():
            before, after = self.seen_records.get(task_id), self.memory.get(task_id)
            old = self.seen_histories.get(task_id, [])
            records[task_id], histories[task_id] = after, self.memory.history(task_id)
            if after is None:
                if before is not None and self.op == "delete":  # deleted: finished
                    assert before.state in TERMINAL
                elif before is not None:  # purged: finished before the purge's time
                    assert self.op == "purge" and self.purged_before is not None
                    assert before.state in TERMINAL
                    assert before.finished_at is not None
                    assert before.finished_at < self.purged_before
                continue
            new = histories[task_id]
            if self.op == "record_and_claim":
                old = started_then(old, self.starts.get(task_id))
            assert new[: len(old)] == old, f"task {task_id}: history rewritten by {self.op}"
            state = before.state if before is not None else None
            for event in new[len(old) :]:
                move = (state, event.state)
                assert move in allowed, f"task {task_id}: {self.op} made {move}"
                if move == (TaskState.RUNNING, TaskState.CANCELLED):
                    assert before is not None and before.cancel_requested_at is not None, (
                        f"task {task_id}: {self.op} cancelled a running task nobody asked to stop"
                    )
                state = event.state
            assert state is after.state, f"task {task_id}: {self.op} changed state silently"
            if before is not None and len(new) == len(old):
                quiet = silent
                if self.op in DEBOUNCING_OPS and before.debounce_key is not None:
                    assert before.state is TaskState.PENDING, "a started task kept its debounce"
                    quiet = silent | DEBOUNCED_FIELDS
                unchanged = replace(after, **{f: getattr(before, f) for f in quiet})
                assert unchanged == before, f"task {task_id}: {self.op} changed {after}"
        self.seen_records, self.seen_histories = records, histories

    @invariant()
    def attempt_totals_match(self) -> None:
        """Every ended attempt counted once, the same way, in its outcome's own step: a
        refused outcome, a give-back or a purge adds nothing and takes nothing away."""
        totals = self.both("attempt_totals")
        assert all(t.attempts > 0 and t.duration_us >= 0 for t in totals)
        assert sum(t.attempts for t in totals) >= self.totals_seen
        self.totals_seen = sum(t.attempts for t in totals)

    @invariant()
    def workers_match(self) -> None:
        """The workers listed now (and each one's state), after any step: a heartbeat's
        mark of its worker included."""
        now = self.now()
        listed = self.both("list_workers", now)
        assert [w.state(now) for w in listed] == [w.state(now) for w in self.sql.list_workers(now)]

    @invariant()
    def each_limit_keys_running_count_is_exact(self) -> None:
        """``durablesched_limit_keys.running`` (what a claim reads instead of counting) is
        the number of the key's tasks RUNNING in its queue, after every step (claim,
        outcome, reclaim, cancel, suspend, retry, requeue, move, purge), and a key with
        a task RUNNING in a queue limited per key has its row."""
        running = self.keys_running()
        keyed = {q.name for q in self.memory.queue_limits() if q.key_cap is not None}
        with self.sql.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT queue, limit_key, running FROM durablesched_limit_keys")
            ).all()
            conn.rollback()
        counted = {(r.queue, r.limit_key): r.running for r in rows}
        for (queue, key), n in counted.items():
            assert n == running.get((queue, key), 0), f"key {key} of {queue}: {n} counted"
        for queue, key in running:
            assert queue not in keyed or (queue, key) in counted, f"key {key} of {queue}: no row"

    @invariant()
    def a_task_cancelled_before_it_started_never_starts(self) -> None:
        for task_id, then in self.cancelled_before_start.items():
            now = self.memory.get(task_id)
            assert now is None or now == then, f"task {task_id} changed after its cancellation"

    @invariant()
    def at_most_one_valid_claim_per_task(self) -> None:
        valid: dict[int, int] = {}
        for c in self.held:
            if self.is_valid(c):
                valid[c.task_id] = valid.get(c.task_id, 0) + 1
        assert all(n == 1 for n in valid.values())


def _json(value: Any) -> Any:
    """A JSON column's value: text on SQLite, decoded already on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


class PostgresAgrees(StoresAgree):
    """The same machine with PostgreSQL as the SQL side, in the test's own schema."""

    url = ""

    def make_sql(self) -> SQLStore:
        store = PostgresStore(self.url)
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE IF NOT EXISTS effect_log "
                    "(id bigserial PRIMARY KEY, task_id bigint NOT NULL)"
                )
            )
            conn.execute(
                text(
                    "TRUNCATE tasks, task_events, idempotency_keys, effect_log, "
                    "durablesched_queue_starts, durablesched_workers, durablesched_limit_keys, "
                    "durablesched_key_starts, durablesched_attempt_totals CASCADE"
                )
            )
            conn.execute(text("DELETE FROM durablesched_queues WHERE name <> 'default'"))
            conn.execute(
                text(
                    "UPDATE durablesched_queues SET concurrency = NULL, rate_count = NULL, "
                    "rate_seconds = NULL, paused = 0, concurrency_per_key = NULL, "
                    "rate_per_key_count = NULL, rate_per_key_seconds = NULL"
                )
            )
            conn.execute(text("ALTER SEQUENCE durablesched_task_seq RESTART WITH 1"))
        return store

    def teardown(self) -> None:
        self.sql.close()


def run_for_a_while(machine: type[Counted], seconds: float = DIFF_SECONDS) -> str:
    """Run ``machine`` with fresh random examples until ``seconds`` have passed (at least
    one call of :data:`CHUNK` examples); say how much ran."""
    machine.examples = machine.steps = 0
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    while True:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=CHUNK,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                # Hypothesis's "ci" profile (loaded when CI=true) derandomizes: every
                # call would draw the same CHUNK examples, so CI's whole budget would
                # rerun five. A failure prints its minimal program to reproduce it.
                derandomize=False,
            ),
        )
        if time.monotonic() >= deadline:
            break
    return (
        f"{machine.__name__}: {machine.examples} examples, {machine.steps} steps "
        f"(up to {STEPS} each) in {time.monotonic() - started:.1f}s"
    )


def test_sqlite_agrees_with_memory(record_property: Callable[[str, object], None]) -> None:
    summary = run_for_a_while(StoresAgree)
    record_property("differential", summary)
    print(summary)


def test_postgres_agrees_with_memory(
    pg_url: str, record_property: Callable[[str, object], None]
) -> None:
    PostgresAgrees.url = pg_url
    summary = run_for_a_while(PostgresAgrees)
    record_property("differential", summary)
    print(summary)


class Born:
    """The ids the children of a flush's outcomes will have, as a store hands them out in
    task id order: the next id each, but for a child whose idempotency key a task already
    holds (it is that task)."""

    def __init__(self, next_id: int, keys: set[str]) -> None:
        self._next_id = next_id
        self._keys = keys
        self.ids: set[int] = set()

    def children(self, children: Sequence[NewTask]) -> None:
        for child in children:
            if child.idempotency_key is not None:
                if child.idempotency_key in self._keys:
                    continue
                self._keys.add(child.idempotency_key)
            self.ids.add(self._next_id)
            self._next_id += 1


class Draws(Counted):
    """Records what each example drew, to tell fresh examples from repeated ones."""

    drawn: ClassVar[list[tuple[int, ...]]] = []

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[int] = []

    @rule(n=st.integers(0, 2**62))
    def draw(self, n: int) -> None:
        self.trace.append(n)
        type(self).steps += 1

    def teardown(self) -> None:
        type(self).drawn.append(tuple(self.trace))


def test_each_call_draws_fresh_examples_under_the_ci_profile() -> None:
    """CI loads hypothesis's "ci" profile, which derandomizes: the time-bounded loop must
    still draw new examples on each call, or CI would rerun the same few all along."""
    previous = settings.get_current_profile_name()
    settings.load_profile("ci")
    try:
        Draws.drawn = []
        run_for_a_while(Draws, seconds=0)
        first = {t for t in Draws.drawn if t}
        Draws.drawn = []
        run_for_a_while(Draws, seconds=0)
        second = {t for t in Draws.drawn if t}
    finally:
        settings.load_profile(previous)
    # Hypothesis starts each call with its simplest example; the rest must be new.
    assert first and second - first


def test_the_model_adds_only_what_the_memory_store_lacks() -> None:
    """The model is the in-memory backend itself plus the operator calls it lacks: if it
    gains one, the model's must go (and the machine then compares the real one)."""
    assert not hasattr(MemoryStore, "requeue")
    assert not hasattr(MemoryStore, "stats")
    assert not hasattr(MemoryStore, "purge")


class Scripted:
    """A rule's ``data`` that hands out the given draws in order."""

    def __init__(self, *draws: object) -> None:
        self.draws = list(draws)

    def draw(self, strategy: object, label: str | None = None) -> Any:
        return self.draws.pop(0)


def test_a_claim_ahead_given_back_and_claimed_again_is_no_rewrite() -> None:
    """The minimal program PostgreSQL's run found: claims ahead given back at shutdown
    (with a forged one in the batch), then claimed afresh. The new claim writes a new
    RUNNING line and leaves the old one as it was, which the invariant must not read as
    a rewrite; only a start recorded for a claim ahead moves its line. Fails with the
    line moved for every task that had no start before the step."""
    machine = StoresAgree()
    try:
        machine.op = "submit"
        machine.both("submit", [NewTask("a", {"i": i}, machine.now(), 3) for i in range(3)], T0)
        machine.each_change_is_one_its_operation_may_make()
        # Two claims ahead, nothing started: tasks 1 and 2, RUNNING with no start.
        machine.record_and_claim(Scripted(None, 2, []), "w1", 0, None, ())
        machine.each_change_is_one_its_operation_may_make()
        first, second = machine.held
        forged = replace(first, fence=first.fence + 1)
        machine.release(Scripted("at shutdown", "w1", [first, second, forged]))
        machine.each_change_is_one_its_operation_may_make()
        machine.clock.advance(LEASE)
        # Claimed again, started at once: a new RUNNING line each, the old ones kept.
        machine.record_and_claim(Scripted([], None, 0, []), "w1", 4, None, ())
        machine.each_change_is_one_its_operation_may_make()
        machine.records_histories_and_keys_match()
        running = [e.at for e in machine.memory.history(first.task_id) if e.state is S.RUNNING]
        assert running == [T0, T0 + LEASE]
        # A claim ahead's start recorded by the next commit moves its own line only.
        machine.op = "submit"
        machine.both("submit", [NewTask("a", {"i": 3}, machine.now(), 3)], machine.now())
        machine.each_change_is_one_its_operation_may_make()
        machine.record_and_claim(Scripted([], None, 2, []), "w1", 0, None, ())
        machine.each_change_is_one_its_operation_may_make()
        ahead = machine.held[-1]
        assert ahead.started_at is None
        machine.clock.advance(timedelta(seconds=1))
        machine.record_and_claim(Scripted([], None, 0, [ahead]), "w1", 0, None, ())
        assert machine.starts == {ahead.task_id: machine.now()}
        machine.each_change_is_one_its_operation_may_make()
        (line,) = [e for e in machine.memory.history(ahead.task_id) if e.state is S.RUNNING]
        assert line.at == machine.now()
        machine.records_histories_and_keys_match()
    finally:
        machine.teardown()
