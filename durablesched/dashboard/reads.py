"""What each page shows, read from the store: plain values for the templates, which
hold no logic of their own. Every read here is one the store bounds by an index."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from durablesched.attempts import AttemptInfo, attempts_from_history
from durablesched.queues import QueueInfo
from durablesched.records import (
    SUBMITTED,
    MinuteCounts,
    TaskEvent,
    TaskRecord,
    WorkerInfo,
    reclaim_owner,
)
from durablesched.schedules.declaration import ScheduleInfo
from durablesched.states import TaskState
from durablesched.store.protocol import Console, Store

#: How far back the overview's chart and totals go.
CHART_SPAN = timedelta(hours=1)
#: The smallest step of a stored time.
_INSTANT = timedelta(microseconds=1)
#: The live states, as the overview counts them per queue.
LIVE = (TaskState.PENDING, TaskState.RETRY_WAIT, TaskState.RUNNING)


class DashboardStore(Store, Console, Protocol):
    """What the dashboard reads and does: the :class:`Store` and :class:`Console` protocols
    (the durable stores' ``requeue``, for Retry, is used where the store has it)."""


@dataclass(frozen=True)
class Overview:
    queues: list[QueueInfo]
    minutes: list[MinuteCounts]
    succeeded: int
    failed: int
    workers_alive: int
    workers_gone: int
    now: datetime


class MinuteCache:
    """The chart's counts of minutes long past, kept: a refresh reads only the history
    written since the last minute that had settled, not the whole hour again.

    A minute is settled :data:`SETTLE` after it ended: a line is written with its
    writer's time, and its transaction may commit a moment later.
    """

    SETTLE = timedelta(seconds=15)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[datetime, MinuteCounts] = {}
        #: Every minute before this one is in ``_counts`` (or had no ended attempt).
        self._settled: datetime | None = None

    def last_hour(self, store: DashboardStore, now: datetime) -> list[MinuteCounts]:
        since = now - CHART_SPAN
        with self._lock:
            settled = self._settled
        if settled is None or settled <= since:
            start, fresh = since, store.minute_counts(since, now)
        else:
            # From the settled minute's first instant (the window's start is excluded).
            start = settled
            fresh = [m for m in store.minute_counts(settled - _INSTANT, now) if m.minute >= settled]
        boundary = (now - self.SETTLE).replace(second=0, microsecond=0)
        with self._lock:
            if self._settled is None or boundary > self._settled:
                self._counts.update((m.minute, m) for m in fresh if m.minute < boundary)
                self._settled = boundary
            for minute in [m for m in self._counts if m < since - CHART_SPAN]:
                del self._counts[minute]  # older than any chart will ask for
            kept = {m: c for m, c in self._counts.items() if since <= m < start}
        merged = {**kept, **{m.minute: m for m in fresh}}
        return [merged[m] for m in sorted(merged)]


def overview(store: DashboardStore, now: datetime, cache: MinuteCache | None = None) -> Overview:
    """Per queue: its live tasks by state, running against its limits, the oldest wait;
    attempts per minute of the last hour; workers alive. Finished tasks are not counted:
    counting a million of them costs a scan, and the chart says what ended lately."""
    queues = store.queue_info(now, finished=False)
    if cache is None:
        minutes = store.minute_counts(now - CHART_SPAN, now)
    else:
        minutes = cache.last_hour(store, now)
    workers = store.list_workers(now)
    alive = sum(1 for w in workers if w.alive(now))
    return Overview(
        queues=queues,
        minutes=minutes,
        succeeded=sum(m.succeeded for m in minutes),
        failed=sum(m.failed for m in minutes),
        workers_alive=alive,
        workers_gone=len(workers) - alive,
        now=now,
    )


@dataclass(frozen=True)
class Moment:
    """One line of a task's timeline: what happened, in words, and its kind (a CSS class)."""

    at: datetime
    kind: str
    state: str
    attempt: int
    what: str
    detail: str | None
    event: TaskEvent | None


def _moment(event: TaskEvent, previous: TaskEvent | None) -> Moment:
    detail = event.detail
    state = event.state
    if state is TaskState.RUNNING:
        kind, what = "claim", "claimed"
    elif reclaim_owner(detail) is not None:
        kind = "reclaim"
        what = "lease expired: reclaimed, " + (
            "to retry" if state is TaskState.RETRY_WAIT else state.value.lower()
        )
    elif state is TaskState.PENDING and (detail or "").startswith(SUBMITTED):
        kind, what = "submitted", "submitted"
    elif state is TaskState.PENDING and detail == "requeued":
        kind, what = "requeued", "requeued by an operator"
    elif (
        state is TaskState.PENDING
        and previous is not None
        and previous.state is (TaskState.RUNNING)
    ):
        kind, what = "released", "given back unfinished"
    elif state is TaskState.SUCCEEDED:
        kind, what = "succeeded", "succeeded"
    elif state is TaskState.RETRY_WAIT:
        kind, what = "failed", "failed: will retry"
    elif state is TaskState.FAILED:
        kind, what = "failed", "failed"
    elif state is TaskState.CANCELLED:
        kind, what = "cancelled", "cancelled"
    else:
        kind, what = "other", state.value.lower()
    return Moment(event.at, kind, state.value, event.attempt, what, detail, event)


@dataclass(frozen=True)
class TaskPage:
    task: TaskRecord
    attempts: list[AttemptInfo]
    timeline: list[Moment]
    now: datetime


def task_page(store: DashboardStore, task_id: int, now: datetime) -> TaskPage | None:
    """A task, its attempts and its timeline (a running one's lease expiry ahead), or None."""
    task = store.get(task_id)
    if task is None:
        return None
    history = store.history(task_id)
    timeline = [_moment(e, history[i - 1] if i else None) for i, e in enumerate(history)]
    if task.state is TaskState.RUNNING and task.lease_expires_at is not None:
        expired = task.lease_expires_at <= now
        timeline.append(
            Moment(
                task.lease_expires_at,
                "lease-expired" if expired else "lease",
                "RUNNING",
                task.attempts,
                "lease expired: waiting for a worker to reclaim it"
                if expired
                else f"lease of {task.lease_owner} runs until here",
                None,
                None,
            )
        )
    return TaskPage(task, attempts_from_history(history), timeline, now)


def duration(attempt: AttemptInfo, now: datetime) -> timedelta:
    return (attempt.finished_at or now) - attempt.started_at


def ended_attempts(store: DashboardStore) -> dict[str, dict[str, int]]:
    """Per queue, attempts that ended each way, ever (purged tasks included): the attempt
    totals, a few rows per task name, not a count of a million finished rows."""
    ended: dict[str, dict[str, int]] = {}
    for total in store.attempt_totals():
        by_outcome = ended.setdefault(total.queue, {})
        by_outcome[total.outcome] = by_outcome.get(total.outcome, 0) + total.attempts
    return ended


def schedules(store: DashboardStore) -> list[ScheduleInfo]:
    return store.list_schedules()


def workers(store: DashboardStore, now: datetime) -> list[WorkerInfo]:
    return store.list_workers(now)


def as_json(value: Any) -> str:
    """A task's arguments or result as indented JSON text (escaped by the template)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
