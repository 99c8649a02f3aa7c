"""Moving live tasks between databases (SQLite to PostgreSQL and back), safely repeatable.

Each batch first leaves the source (CANCELLED there, with a history line
naming the destination), so no worker on the source can start it again; then
it is stored in the destination, which remembers (source, task id) so that a
task arrives at most once however often the move runs; then the source's line
is rewritten to name the task it became. A move stopped at any point loses
nothing: the next run finds the tasks still in transit and delivers them first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from durablesched.errors import ConfigurationError
from durablesched.records import TaskRecord
from durablesched.states import TaskState
from durablesched.store.protocol import Operator


@dataclass
class MoveReport:
    """What a move did: tasks stored anew (``copied``), found delivered by an earlier
    run cut short (``already``), or deduplicated by idempotency key (``by_key``)."""

    source: int
    destination: int
    copied: int = 0
    already: int = 0
    by_key: int = 0
    #: source task id -> task id in the destination
    mapping: dict[int, int] = field(default_factory=dict)

    @property
    def moved(self) -> int:
        return self.copied + self.already + self.by_key


def move_live_tasks(
    source: Operator,
    destination: Operator,
    now: Callable[[], datetime],
    *,
    batch: int = 500,
) -> MoveReport:
    """Move every PENDING and RETRY_WAIT task of ``source`` into ``destination``: the
    source's rows stay, CANCELLED, with a history line naming the task each became."""
    if batch < 1:
        raise ConfigurationError(f"batch must be at least 1, got {batch}")
    report = MoveReport(source.instance(), destination.instance())
    if report.source == report.destination:
        raise ConfigurationError("the source and the destination are the same database")

    def deliver(moved: Sequence[tuple[TaskRecord, TaskState]]) -> None:
        arrived = destination.receive(report.source, moved, now())
        source.confirm_move(
            report.destination,
            [(r, s, new_id) for (r, s), (new_id, _) in zip(moved, arrived, strict=True)],
        )
        for (record, _), (new_id, how) in zip(moved, arrived, strict=True):
            report.mapping[record.id] = new_id
            if how == "copied":
                report.copied += 1
            elif how == "already":
                report.already += 1
            else:
                report.by_key += 1

    stranded = source.in_transit(report.destination)
    for start in range(0, len(stranded), batch):
        deliver(stranded[start : start + batch])
    after = 0
    while moved := source.hand_over(report.destination, now(), after=after, batch=batch):
        deliver(moved)
        after = moved[-1][0].id
    return report


def copy_live_tasks(
    source: Operator,
    destination: Operator,
    now: Callable[[], datetime],
    *,
    batch: int = 500,
) -> MoveReport:
    """Deprecated name of :func:`move_live_tasks` (it always moved); removed in 0.3."""
    warnings.warn(
        "copy_live_tasks is deprecated: call move_live_tasks (the tasks move, they are not "
        "copied); the old name goes in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    return move_live_tasks(source, destination, now, batch=batch)


#: Deprecated name of :class:`MoveReport`.
CopyReport = MoveReport
