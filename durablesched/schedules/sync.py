"""Code-declared schedules against stored ones: what a worker's start changes, by name.

Shared by every backend, so that they agree on the same rules (see
``ScheduleStore.sync_schedules``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from durablesched.errors import ScheduleConflictError, ScheduleNotFoundError
from durablesched.schedules.declaration import Origin, Schedule, ScheduleStatus

ADDED, UPDATED, RESTORED = "added", "updated", "restored"

#: A stored schedule as the sync sees it: its settings, status and origin.
Stored = tuple[Schedule, str, str]
#: What to do with a name: (change, the settings to store or None to keep them, status).
Change = tuple[str, Schedule | None, str]


def sync_plan(
    stored: Mapping[str, Stored], declared: Sequence[Schedule], tasks: Collection[str]
) -> dict[str, Change]:
    """The changes that make the code's schedules the stored ones; names left out stay.

    A stored schedule from code that is not declared is removed only if its task
    is among ``tasks``: a worker of another app does not remove this app's.
    """
    changes: dict[str, Change] = {}
    names = set()
    for schedule in declared:
        names.add(schedule.name)
        row = stored.get(schedule.name)
        if row is None:
            changes[schedule.name] = (ADDED, schedule, ScheduleStatus.ACTIVE)
            continue
        settings, status, origin = row
        if status == ScheduleStatus.REMOVED:
            changes[schedule.name] = (RESTORED, schedule, ScheduleStatus.ACTIVE)
        elif settings != schedule or origin != Origin.CODE:
            changes[schedule.name] = (UPDATED, schedule, status)  # a pause stands
    for name, (settings, status, origin) in stored.items():
        if (
            name not in names
            and origin == Origin.CODE
            and status != ScheduleStatus.REMOVED
            and settings.task in tasks
        ):
            changes[name] = (ScheduleStatus.REMOVED, None, ScheduleStatus.REMOVED)
    return dict(sorted(changes.items()))


def conflict(name: str) -> ScheduleConflictError:
    return ScheduleConflictError(
        f"a schedule named {name!r} exists with other settings: remove it first, "
        "or give the new one another name"
    )


def not_found(name: str) -> ScheduleNotFoundError:
    return ScheduleNotFoundError(f"no schedule named {name!r}")
