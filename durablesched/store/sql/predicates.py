"""SQL predicates over task states, with the state literals inlined: both databases' SQL
and the schema's partial indexes say them the same way.

A bound parameter would make SQLite re-prepare the statement and miss the partial
indexes. Kept apart from the schema's metadata, which the SQLite store never needs:
building it loads SQLAlchemy's PostgreSQL dialect (its indexes name options of both
databases), tens of milliseconds of a SQLite worker's start-up.
"""

from __future__ import annotations

from durablesched.states import CLAIMABLE, KEY_HOLDING, TERMINAL, TaskState


def _in(states: frozenset[TaskState] | set[TaskState]) -> str:
    return ", ".join(f"'{s.value}'" for s in sorted(states))


#: The states a task can be claimed from.
CLAIMABLE_SQL = f"state IN ({_in(CLAIMABLE)})"
#: The states in which a task holds its idempotency key.
KEY_HOLDING_SQL = f"state IN ({_in(KEY_HOLDING)})"
#: The states of a finished task.
TERMINAL_SQL = f"state IN ({_in(TERMINAL)})"
#: Every state, for the schema's check constraint.
ALL_STATES_SQL = _in(set(TaskState))
#: The rows of ``ix_tasks_state_created``: every state but RUNNING (as many as the
#: workers' slots, found through ``ix_tasks_running_lease``) and SUCCEEDED (most tasks:
#: the list walks ``ix_tasks_created`` for them, and a success never writes this index).
STATE_CREATED_SQL = f"state IN ({_in(set(TaskState) - {TaskState.RUNNING, TaskState.SUCCEEDED})})"
