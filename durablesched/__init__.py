"""durablesched: a durable job queue and task scheduler in one SQLite file (or PostgreSQL).

The SQL stores (and :func:`open_store`) load SQLAlchemy: they are imported when first
named, so ``import durablesched`` and the CLI's ``--help`` stay cheap; so is the
in-memory store, which a worker on a database never needs.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .attempts import AttemptInfo as AttemptInfo
from .attempts import AttemptOutcome as AttemptOutcome
from .clock import Clock as Clock
from .clock import ManualClock as ManualClock
from .clock import SystemClock as SystemClock
from .context import TaskContext as TaskContext
from .errors import CheckpointRefused as CheckpointRefused
from .errors import ConfigurationError as ConfigurationError
from .errors import CorruptDatabase as CorruptDatabase
from .errors import DatabaseNotFoundError as DatabaseNotFoundError
from .errors import DurableSchedError as DurableSchedError
from .errors import InvalidScheduleError as InvalidScheduleError
from .errors import InvalidTaskArgumentsError as InvalidTaskArgumentsError
from .errors import InvalidTaskError as InvalidTaskError
from .errors import InvalidTransitionError as InvalidTransitionError
from .errors import LeaseExpired as LeaseExpired
from .errors import NoRetry as NoRetry
from .errors import ProcessCrashed as ProcessCrashed
from .errors import ScheduleConflictError as ScheduleConflictError
from .errors import ScheduleNotFoundError as ScheduleNotFoundError
from .errors import SchemaError as SchemaError
from .errors import SchemaMissingError as SchemaMissingError
from .errors import StoreError as StoreError
from .errors import TaskCancelled as TaskCancelled
from .errors import TaskFailed as TaskFailed
from .errors import TaskNotFoundError as TaskNotFoundError
from .errors import TaskTimeout as TaskTimeout
from .errors import UnknownTaskNameError as UnknownTaskNameError
from .errors import UnsupportedOperationError as UnsupportedOperationError
from .errors import WaitInTaskError as WaitInTaskError
from .errors import WorkerStopping as WorkerStopping
from .errors import WorkflowChanged as WorkflowChanged
from .errors import WorkflowSuspended as WorkflowSuspended
from .handles import TaskHandle as TaskHandle
from .queues import QueueInfo as QueueInfo
from .queues import QueueLimits as QueueLimits
from .queues import Rate as Rate
from .records import CancelOutcome as CancelOutcome
from .records import Claim as Claim
from .records import ErrorInfo as ErrorInfo
from .records import Finding as Finding
from .records import HealthReport as HealthReport
from .records import Outcome as Outcome
from .records import QueueStats as QueueStats
from .records import Submitted as Submitted
from .records import TaskEvent as TaskEvent
from .records import TaskRecord as TaskRecord
from .records import WorkerInfo as WorkerInfo
from .registry import Task as Task
from .registry import TaskCall as TaskCall
from .registry import TaskOptions as TaskOptions
from .registry import TaskRegistry as TaskRegistry
from .retry import RetryPolicy as RetryPolicy
from .scheduler import Scheduler as Scheduler
from .schedules.declaration import Fired as Fired
from .schedules.declaration import Schedule as Schedule
from .schedules.declaration import ScheduleInfo as ScheduleInfo
from .schedules.timing import Misfire as Misfire
from .schedules.timing import Overlap as Overlap
from .states import TaskState as TaskState
from .store.protocol import DurableStore as DurableStore
from .store.protocol import Operator as Operator
from .store.protocol import Store as Store
from .worker.loop import Worker as Worker

if TYPE_CHECKING:
    from .store.memory import MemoryStore as MemoryStore
    from .store.opening import open_store as open_store
    from .store.sql.postgres import PostgresStore as PostgresStore
    from .store.sql.sqlite import SQLiteStore as SQLiteStore

#: The names imported when first used, and their modules.
_LAZY = {
    "MemoryStore": "durablesched.store.memory",
    "open_store": "durablesched.store.opening",
    "PostgresStore": "durablesched.store.sql.postgres",
    "SQLiteStore": "durablesched.store.sql.sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'durablesched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups find it without this function
    return value


__all__ = [
    "AttemptInfo",
    "AttemptOutcome",
    "CancelOutcome",
    "CheckpointRefused",
    "Claim",
    "Clock",
    "ConfigurationError",
    "CorruptDatabase",
    "DatabaseNotFoundError",
    "DurableSchedError",
    "DurableStore",
    "ErrorInfo",
    "Finding",
    "Fired",
    "HealthReport",
    "InvalidScheduleError",
    "InvalidTaskArgumentsError",
    "InvalidTaskError",
    "InvalidTransitionError",
    "LeaseExpired",
    "ManualClock",
    "MemoryStore",
    "Misfire",
    "NoRetry",
    "Operator",
    "Outcome",
    "Overlap",
    "PostgresStore",
    "ProcessCrashed",
    "QueueInfo",
    "QueueLimits",
    "QueueStats",
    "Rate",
    "RetryPolicy",
    "SQLiteStore",
    "Schedule",
    "ScheduleConflictError",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "Scheduler",
    "SchemaError",
    "SchemaMissingError",
    "Store",
    "StoreError",
    "Submitted",
    "SystemClock",
    "Task",
    "TaskCall",
    "TaskCancelled",
    "TaskContext",
    "TaskEvent",
    "TaskFailed",
    "TaskHandle",
    "TaskNotFoundError",
    "TaskOptions",
    "TaskRecord",
    "TaskRegistry",
    "TaskState",
    "TaskTimeout",
    "UnknownTaskNameError",
    "UnsupportedOperationError",
    "WaitInTaskError",
    "Worker",
    "WorkerInfo",
    "WorkerStopping",
    "WorkflowChanged",
    "WorkflowSuspended",
    "open_store",
]
