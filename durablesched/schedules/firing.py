"""What one step makes for one due schedule: each fire's task, or why it makes none.

Shared by every backend, so that they make the same tasks from the same
schedule; a backend only records what this says, atomically, and only if its
next fire time was still the one read (see ``ScheduleStore.fire_schedules``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from durablesched.records import DEFAULT_QUEUE, NewTask
from durablesched.schedules.declaration import (
    CATCH_UP,
    RUN_NOW,
    SKIPPED_OVERLAP,
    Schedule,
    fire_key,
)
from durablesched.schedules.timing import Overlap, plan
from durablesched.states import TaskState

#: The states in which a fire's task overlaps the next fire (``overlap="skip"``).
LIVE = frozenset({TaskState.PENDING, TaskState.RUNNING, TaskState.RETRY_WAIT})

#: How a fire is recorded: on time, caught up after a misfire, or asked for by run-now.
ON_TIME = "on time"
KINDS = (ON_TIME, CATCH_UP, RUN_NOW)


@dataclass(frozen=True)
class PlannedFire:
    """One fire to record: its task (None when skipped) and how it came."""

    at: datetime
    kind: str
    task: NewTask | None
    skipped: str | None

    @property
    def catch_up(self) -> bool:
        return self.kind == CATCH_UP


def fire_task(schedule: Schedule, at: datetime, kind: str) -> NewTask:
    """The task a fire makes: due at its fire time, keyed by schedule and fire time,
    in the schedule's queue with its priority (the defaults where it has none)."""
    key = fire_key(schedule.name, at, None if kind == ON_TIME else kind)
    return NewTask(
        schedule.task,
        schedule.args,
        at,
        schedule.max_attempts,
        key,
        schedule.args_json,
        DEFAULT_QUEUE if schedule.queue is None else schedule.queue,
        0 if schedule.priority is None else schedule.priority,
    )


def due_fires(
    schedule: Schedule, next_fire_at: datetime, now: datetime, previous: TaskState | None
) -> tuple[list[PlannedFire], datetime]:
    """The fires due at ``now`` and the next fire time after them.

    ``previous`` is the state of the task the schedule's latest fire made (None
    if none): with ``overlap="skip"`` and that task still live, every fire of
    this step is recorded as skipped. Fires made together in one step (catch-ups)
    do not skip each other.
    """
    steps = plan(
        schedule.times(),
        next_fire_at,
        now,
        misfire=schedule.misfire,
        max_catch_up=schedule.max_catch_up,
        grace=schedule.misfire_grace,
    )
    skip = schedule.overlap is Overlap.SKIP and previous in LIVE
    fires = []
    for fire in steps.fires:
        kind = CATCH_UP if fire.catch_up else ON_TIME
        if skip:
            fires.append(PlannedFire(fire.at, kind, None, SKIPPED_OVERLAP))
        else:
            fires.append(PlannedFire(fire.at, kind, fire_task(schedule, fire.at, kind), None))
    return fires, steps.next_fire_at


def run_now(schedule: Schedule, now: datetime) -> PlannedFire:
    """The fire ``durablesched schedule run-now`` makes: a task now, whatever else holds."""
    return PlannedFire(now, RUN_NOW, fire_task(schedule, now, RUN_NOW), None)
