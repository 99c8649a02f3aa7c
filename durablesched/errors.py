"""The exceptions durablesched raises, all under one root.

DurableSchedError
├── InvalidTaskError (ValueError)       bad input to submit: nothing was stored
│   └── InvalidTaskArgumentsError (TypeError)  arguments JSON cannot store
├── TaskNotFoundError (LookupError)     no task has that id
├── InvalidTransitionError              a state change the state machine forbids
├── UnknownTaskNameError (LookupError)  the registry has no task of that name
├── TaskCancelled                       raised by a task to acknowledge cancellation, and
│                                       by a handle whose task was cancelled
├── TaskFailed                          a handle's task failed: its error, attempts, traceback
├── WaitInTaskError                     a handle waited on inside a running task
├── TaskTimeout                         an attempt ran past its task's timeout
├── NoRetry                             raised by a task: fail now, whatever attempts are left
├── WorkerStopping                      raised by ctx.sleep(): the worker is stopping
├── LeaseExpired                        recorded: an attempt's lease lapsed and was reclaimed
├── ProcessCrashed                      recorded: an attempt's child process died unreported
├── StoreError                          the backend could not do what was asked
│   ├── UnsupportedOperationError       this backend cannot do it at all
│   ├── DatabaseNotFoundError           opened without creating, and there is none
│   ├── CorruptDatabase                 the database file is damaged: retrying cannot help
│   └── SchemaError                     the database is not one we can use as is
│       └── SchemaMissingError          opened without creating, and it has no schema
├── ConfigurationError (ValueError)     a worker or scheduler option is out of range
├── InvalidScheduleError (ValueError)   a schedule's settings are wrong: nothing was stored
│   └── ScheduleConflictError           a schedule of that name exists with other settings
└── ScheduleNotFoundError (LookupError) no schedule has that name
"""

from __future__ import annotations

from typing import Protocol


class StoredError(Protocol):
    """An error as a store keeps it (:class:`~durablesched.ErrorInfo`): a protocol here,
    so that this module, which every other imports, imports none of them."""

    @property
    def type(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def traceback(self) -> str: ...


class DurableSchedError(Exception):
    """Root of every error durablesched raises on purpose."""


class InvalidTaskError(DurableSchedError, ValueError):
    """A submitted task was rejected before anything was stored."""


class InvalidTaskArgumentsError(InvalidTaskError, TypeError):
    """A task's arguments are not what JSON can store (an object, a ``datetime``, NaN):
    a ``TypeError`` too, as ``json.dumps`` and Django's task API raise for them."""


class TaskNotFoundError(DurableSchedError, LookupError):
    """No task has the given id."""


class InvalidTransitionError(DurableSchedError):
    """A state change that the task state machine does not allow."""


class UnknownTaskNameError(InvalidTaskError, LookupError):
    """The task registry has no function registered under that name."""


class TaskCancelled(DurableSchedError):
    """Raise this from a task to acknowledge a requested cancellation.

    The worker then records the task as CANCELLED (if cancellation was really
    requested and the claim is still valid). A :class:`~durablesched.TaskHandle`
    raises it too, for a task that was cancelled, with its :attr:`task_id`.
    """

    #: The cancelled task, when a handle raised it.
    task_id: int | None = None


class TaskFailed(DurableSchedError):
    """Raised by a :class:`~durablesched.TaskHandle` whose task FAILED: its attempts are
    spent, or it could not run. Carries the task's id, its last error as stored
    (``error.type``, ``error.message``, ``error.traceback``: the text of the worker's
    traceback, never a pickled exception) and how many attempts it had."""

    def __init__(self, task_id: int, name: str, error: StoredError | None, attempts: int) -> None:
        self.task_id = task_id
        self.name = name
        self.error = error
        self.attempts = attempts
        what = "no error recorded" if error is None else f"{error.type}: {error.message}"
        plural = "" if attempts == 1 else "s"
        super().__init__(f"task {task_id} ({name}) failed after {attempts} attempt{plural}: {what}")

    @property
    def traceback(self) -> str:
        """The failed attempt's traceback as the worker formatted it ("" if none)."""
        return "" if self.error is None else self.error.traceback


class WaitInTaskError(DurableSchedError):
    """A handle was waited on inside a running task. Refused: a task thread blocked on
    another task holds a worker slot, and a full worker whose every slot waits on tasks
    that need a slot never finishes (docs/api.md, "Handles")."""


class TaskTimeout(DurableSchedError):
    """An attempt ran past its task's timeout: it counts as a failure and follows the
    retry policy. Raised by ``ctx.raise_if_cancelled()`` once the time is up, and
    recorded as the error of an attempt stopped or finished too late."""


class NoRetry(DurableSchedError):
    """Raise this from a task to fail it at once: no retry, whatever attempts it has left
    and whatever its :class:`~durablesched.RetryPolicy` says (a bad input no attempt can
    fix). Its message is the error stored; ``raise NoRetry("...") from exc`` keeps the
    cause in the stored traceback."""


class WorkflowChanged(NoRetry):
    """A workflow's replay found another step at a position than the one recorded there:
    the task's code changed under a workflow in flight. The attempt fails at once (no
    retry: every attempt of this code would find the same); the message names both
    steps. docs/workflows.md says how to deploy changed workflow code."""


class WorkflowSuspended(DurableSchedError):
    """Raised by a durable wait (``ctx.sleep_until``, ``ctx.sleep_for``) once it has
    suspended the workflow: the attempt ends here, not counted, and the task is due
    again at its wake time. Let it propagate: the claim is no longer this attempt's."""


class CheckpointRefused(DurableSchedError):
    """A step's checkpoint was not recorded: the attempt's claim is no longer valid (its
    lease was lost and another attempt may run), so this attempt must not go on. Nothing
    of the step was written, its database effects included."""


class WorkerStopping(DurableSchedError):
    """Raised by :meth:`TaskContext.sleep <durablesched.TaskContext.sleep>` once the
    worker running the attempt is stopping. Let it propagate: the worker gives the
    claim back at once (PENDING, due now, the attempt not counted), and the next
    worker runs the task again from the start. Not a failure, and not a cancel."""


class LeaseExpired(DurableSchedError):
    """Recorded as the error of an attempt whose lease lapsed and was reclaimed: its
    worker stopped heartbeating (killed, stalled, or cut off from the database)."""


class ProcessCrashed(DurableSchedError):
    """Recorded as the error of an attempt whose child process exited or was killed
    before it reported an outcome (a segfault, ``os._exit``, the out-of-memory killer)."""


class StoreError(DurableSchedError):
    """The storage backend failed; the message says what and where."""


class UnsupportedOperationError(StoreError):
    """The backend cannot do this at all (for example database effects in memory)."""


class DatabaseNotFoundError(StoreError):
    """Opened without creating (``create=False``, ``readonly=True``): no such database."""


class CorruptDatabase(StoreError):
    """The database file is damaged (SQLite: "database disk image is malformed", "file is
    not a database"): no retry can help, so a worker stops at once. :attr:`advice` says
    what to do; tasks it held are reclaimed by a worker on a healthy database."""

    #: What to do about it, in one line.
    advice = "the database file is damaged: run `durablesched check`; restore from a backup"


class SchemaError(StoreError):
    """The database is not a durablesched database this code can use as it is."""


class SchemaMissingError(SchemaError):
    """Opened without creating, the database has no durablesched schema: run
    ``durablesched migrate`` to create it."""


class ConfigurationError(DurableSchedError, ValueError):
    """An option given to a scheduler or worker is out of range."""


class InvalidScheduleError(DurableSchedError, ValueError):
    """A schedule declared or changed with bad settings: nothing was stored."""


class ScheduleConflictError(InvalidScheduleError):
    """A schedule of that name exists with other settings."""


class ScheduleNotFoundError(DurableSchedError, LookupError):
    """No schedule has that name."""
