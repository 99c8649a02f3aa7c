"""What ``ls`` shows first: the work that is live, then what finished most recently.

RUNNING tasks, then PENDING and RETRY_WAIT by due time, then finished tasks
most recent first; and how many matching tasks the limit left out.

The store lists tasks in (due_at, seq) order only, so finished tasks are read
from the first ``FINISHED_WINDOW`` of each finished state and ordered here:
exact for a queue that ``purge`` keeps below that, and said so when it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from durablesched.records import TaskRecord
from durablesched.states import TaskState

if TYPE_CHECKING:
    from durablesched.store.protocol import DurableStore

#: Live states, in the order ``ls`` shows them; tasks of one group merge by due time.
LIVE_GROUPS: tuple[tuple[TaskState, ...], ...] = (
    (TaskState.RUNNING,),
    (TaskState.PENDING, TaskState.RETRY_WAIT),
)
FINISHED: tuple[TaskState, ...] = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
#: Finished tasks read per state to find the most recent ones among them.
FINISHED_WINDOW = 10_000

_NEVER = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Listing:
    """The tasks to show, in order, and what the limit left out."""

    tasks: list[TaskRecord]
    #: Matching tasks not shown (a lower bound when ``more_than``).
    left_out: int
    #: True when more tasks may match than were counted.
    more_than: bool
    #: True when a finished state had more tasks than ``FINISHED_WINDOW``: the
    #: most recent of them may not be among those shown.
    window_full: bool


def live_first(
    store: DurableStore,
    *,
    state: TaskState | None,
    name: str | None,
    limit: int,
    now: datetime,
    queue: str | None = None,
) -> Listing:
    """Up to ``limit`` tasks of ``state`` (default: all), ``name`` and ``queue``, live first."""
    groups = [(state,)] if state is not None else [*LIVE_GROUPS, FINISHED]
    shown: list[TaskRecord] = []
    #: Tasks read per state, and whether the read stopped at its limit (more may match).
    read: dict[TaskState, tuple[int, bool]] = {}
    for group in groups:
        room = limit - len(shown)
        if room <= 0:
            break
        finished = group[0] in FINISHED
        fetch = max(room, FINISHED_WINDOW) if finished else room
        rows: list[TaskRecord] = []
        for s in group:
            found = store.list_tasks(state=s, name=name, limit=fetch, queue=queue)
            read[s] = (len(found), len(found) >= fetch)
            rows.extend(found)
        if finished:
            rows.sort(key=lambda t: (t.finished_at or _NEVER, t.id), reverse=True)
        else:
            rows.sort(key=lambda t: (t.due_at, t.seq))
        shown.extend(rows[:room])
    window_full = any(full for s, (_, full) in read.items() if s in FINISHED)
    wanted = [s for group in groups for s in group]
    if name is None and queue is None:
        # Without a filter the store counts every state exactly.
        counts = store.stats(now)["counts"]
        total = sum(counts[s.value] for s in wanted)
        return Listing(shown, total - len(shown), more_than=False, window_full=window_full)
    # With one, what was read is all that is known: a state not read, or read
    # up to its limit, may hold more.
    total = sum(n for n, _ in read.values())
    more_than = any(s not in read or read[s][1] for s in wanted)
    return Listing(shown, total - len(shown), more_than=more_than, window_full=window_full)
