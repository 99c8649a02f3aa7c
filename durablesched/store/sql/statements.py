"""The SQL both databases run as written, each statement named, with what it does.

Where SQLite and PostgreSQL must differ (the claim's locking, JSON functions,
writing history in the same statement) the statement is in that database's
module instead, in its :class:`~durablesched.store.sql.dialect.SQLDialect`.
Values are always bound (``:name``); only our own column lists and clauses
are pasted in. Every outcome write names its claim (:data:`VALID`).
"""

from __future__ import annotations

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.sql.elements import BindParameter

from durablesched.queues import KEY_CAP_UNLIMITED
from durablesched.records import SUBMITTED, Environment
from durablesched.store.sql.predicates import CLAIMABLE_SQL, KEY_HOLDING_SQL

# -- pieces --------------------------------------------------------------------------------------

#: Valid claim: RUNNING, same owner, same fence, lease not yet expired.
VALID = (
    "id = :id AND state = 'RUNNING' AND lease_owner = :owner AND fence = :fence "
    "AND lease_expires_at > :now"
)
#: A claim ahead started (``record_and_claim(started=)``): its start time, once. As the
#: driver takes it (``SQLDialect.prepared``): a group commit runs it for every start.
MARK_STARTED = f"UPDATE tasks SET started_at = :at WHERE {VALID} AND started_at IS NULL"
#: ... and its claim's history line moved to that time: the attempt's start.
#: Run after :data:`MARK_STARTED` for a batch of starts: moved only where the claim
#: is valid and its task's start is this one (the line of a start recorded before, at
#: another time, stays).
START_LINE = (
    "UPDATE task_events SET at = :at WHERE id = "
    "(SELECT max(id) FROM task_events WHERE task_id = :id AND state = 'RUNNING') "
    f"AND EXISTS (SELECT 1 FROM tasks WHERE {VALID} AND started_at = :at)"
)
#: Per queue, the RUNNING tasks claimed ahead and not started (few: read by state).
#: Grouped by an expression: grouped by the column, SQLite walked every task in
#: ``ix_tasks_queue_created`` order (1.5 s of a /metrics scrape at 1M tasks).
SQL_WAITING_BY_QUEUE = text(
    "SELECT queue || '' AS queue, count(*) FROM tasks "
    "WHERE state = 'RUNNING' AND started_at IS NULL GROUP BY 1"
)
#: Per owner, the RUNNING tasks it holds, and how many of them started.
SQL_HELD_BY_OWNER = text(
    "SELECT lease_owner, count(*) AS held, count(started_at) AS started FROM tasks "
    "WHERE state = 'RUNNING' GROUP BY lease_owner"
)
#: Every column of a task, in the order :func:`codec.record` reads them.
TASK_COLUMNS = (
    "id, seq, name, args, state, due_at, attempts, max_attempts, lease_owner, "
    "lease_expires_at, fence, cancel_requested_at, result, last_error, idempotency_key, "
    "created_at, updated_at, finished_at, environment, queue, priority, limit_key, started_at, "
    "debounce_key, debounce_until"
)
#: What a claim returns per task, in the order the store unpacks it.
CLAIM_RETURNING = (
    "id, seq, name, args, attempts, max_attempts, fence, due_at, idempotency_key, queue, "
    "priority, created_at, limit_key"
)
#: Names bound one parameter each (an expanding IN), compared exactly as stored.
NAMES_FILTER = "AND name IN :names"
#: The expanding parameter of :data:`NAMES_FILTER`.
NAMES: BindParameter[list[str]] = bindparam("names", expanding=True)

# -- submitting ----------------------------------------------------------------------------------

#: Take ``:n`` task ids (and seqs) from the counter; returns the last one taken
#: (SQLite: PostgreSQL takes them from a sequence, ``postgres.ALLOCATE``).
SQL_ALLOCATE = text(
    "UPDATE durablesched_counters SET value = value + :n WHERE name = 'task_seq' RETURNING value"
)
#: The task holding idempotency key ``:key``, if any (PENDING to SUCCEEDED hold it).
SQL_FIND_KEY = text(
    "SELECT id, created_at FROM tasks WHERE idempotency_key = :key AND "
    "state IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED')"
)
#: New tasks, straight to the driver's executemany; ``{p}`` is its placeholder.
INSERT_TASK = (
    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence, "
    "idempotency_key, created_at, updated_at, queue, priority, limit_key) "
    "VALUES ({p}, {p}, {p}, {p}, 'PENDING', {p}, 0, {p}, 0, {p}, {p}, {p}, {p}, {p}, {p})"
)
#: The conflict target of a key-holding task's key: the partial unique index
#: ``ux_tasks_idempotency_key``, named by its columns and predicate.
KEY_HOLDER_CONFLICT = (
    f"ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL AND {KEY_HOLDING_SQL}"
)
#: One keyed task, or nothing if a key-holding task has its key (``RETURNING`` tells).
INSERT_KEYED_TASK = f"{INSERT_TASK} {KEY_HOLDER_CONFLICT} DO NOTHING RETURNING id"
#: A debounced task: new, or (a task PENDING with its debounce key, never started) that
#: task with these arguments, due at this submit's due time but no later than its
#: ``debounce_until``. Its id tells which (``:id`` was allocated for a new one).
SQL_INSERT_DEBOUNCED = text(
    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence, "
    "created_at, updated_at, queue, priority, limit_key, debounce_key, debounce_until) "
    "VALUES (:id, :id, :name, :args, 'PENDING', :due_at, 0, :max_attempts, 0, :now, :now, "
    ":queue, :priority, :limit_key, :debounce_key, :debounce_until) "
    "ON CONFLICT (debounce_key) WHERE debounce_key IS NOT NULL DO UPDATE SET "
    "args = excluded.args, updated_at = excluded.updated_at, due_at = CASE "
    "WHEN tasks.debounce_until IS NOT NULL AND tasks.debounce_until < excluded.due_at "
    "THEN tasks.debounce_until ELSE excluded.due_at END "
    "RETURNING id, created_at"
)
#: Whether queue ``:name`` has its row.
SQL_QUEUE_EXISTS = text("SELECT 1 FROM durablesched_queues WHERE name = :name")
#: A queue's row, made the first time a task is submitted to it.
SQL_ENSURE_QUEUE = text(
    "INSERT INTO durablesched_queues (name) VALUES (:name) ON CONFLICT (name) DO NOTHING"
)

# -- queues --------------------------------------------------------------------------------------

#: Every queue and its limits.
QUEUE_ROWS = (
    "SELECT name, concurrency, rate_count, rate_seconds, paused, concurrency_per_key, "
    "rate_per_key_count, rate_per_key_seconds FROM durablesched_queues "
    "ORDER BY name"
)
SQL_QUEUES = text(QUEUE_ROWS)
#: A queue's limits set (the row made if new).
SQL_PUT_QUEUE = text(
    "INSERT INTO durablesched_queues (name, concurrency, rate_count, rate_seconds, paused, "
    "updated_at, concurrency_per_key, rate_per_key_count, rate_per_key_seconds) "
    "VALUES (:name, :concurrency, :rate_count, :rate_seconds, :paused, :now, "
    ":concurrency_per_key, :rate_per_key_count, :rate_per_key_seconds) "
    "ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, "
    "concurrency_per_key = excluded.concurrency_per_key, "
    "rate_per_key_count = excluded.rate_per_key_count, "
    "rate_per_key_seconds = excluded.rate_per_key_seconds, "
    "rate_count = excluded.rate_count, rate_seconds = excluded.rate_seconds, "
    "paused = excluded.paused, updated_at = excluded.updated_at"
)
#: A queue's concurrency per key (no row: none).
SQL_QUEUE_PER_KEY = text(
    "SELECT COALESCE(concurrency_per_key, CASE WHEN rate_per_key_count IS NOT NULL "
    f"THEN {KEY_CAP_UNLIMITED} END) FROM durablesched_queues WHERE name = :name"
)
#: A queue's concurrency per key changed: forget its keys' heads, let every task of it be
#: claimed, then (with a limit per key) hold back every keyed claimable task ...
SQL_FORGET_KEYS = text("DELETE FROM durablesched_limit_keys WHERE queue = :name")
SQL_UNBLOCK_KEYS = text("UPDATE tasks SET key_waiting = 0 WHERE queue = :name AND key_waiting = 1")
#: ... (with a limit per key, these two instead: each writes only the rows it changes, so
#: a change of the limit leaves the tasks that wait, waiting; each row written leaves its
#: old version's entry in the claim's index until a vacuum, and a claim steps over those
#: in its range) ...
SQL_UNBLOCK_UNKEYED = text(
    "UPDATE tasks SET key_waiting = 0 WHERE queue = :name AND key_waiting = 1 "
    f"AND NOT (limit_key IS NOT NULL AND {CLAIMABLE_SQL})"
)
SQL_BLOCK_KEYS = text(
    "UPDATE tasks SET key_waiting = 1 WHERE queue = :name AND key_waiting = 0 "
    f"AND limit_key IS NOT NULL AND {CLAIMABLE_SQL}"
)
#: ... count each key's RUNNING tasks into its row (SQLite's triggers add a change's part
#: to the row's count since migration 0021; PostgreSQL's count again) ...
SQL_SEED_KEYS = text(
    "INSERT INTO durablesched_limit_keys (queue, limit_key, running, head_id) "
    "SELECT queue, limit_key, count(*), NULL FROM tasks WHERE queue = :name "
    "AND limit_key IS NOT NULL AND state = 'RUNNING' GROUP BY queue, limit_key"
)
#: ... and give each live key its head: setting a task's state to itself fires the
#: triggers of migration 0013 for its key (one task per key).
SQL_TOUCH_KEYS = text(
    "UPDATE tasks SET state = state WHERE id IN (SELECT min(id) FROM tasks "
    "WHERE queue = :name AND limit_key IS NOT NULL "
    "AND state IN ('PENDING', 'RETRY_WAIT', 'RUNNING') GROUP BY limit_key)"
)
#: Per queue with a concurrency per key, how many keys have that many RUNNING.
SQL_KEYS_AT_LIMIT = text(
    "SELECT k.queue, count(*) FROM durablesched_limit_keys k JOIN durablesched_queues q "
    "ON q.name = k.queue WHERE k.running >= q.concurrency_per_key "
    "OR k.blocked_until IS NOT NULL GROUP BY k.queue"
)
#: Rates per key (``claiming._unblock_keys``, ``claiming._count_key_starts``): the keys
#: whose full window has passed, freed and given a head (by the triggers, touching the
#: key's first claimable task) ...
SQL_KEYS_TO_FREE = text(
    "SELECT limit_key FROM durablesched_limit_keys WHERE queue = :queue "
    "AND blocked_until <= :now ORDER BY limit_key"
)
SQL_FREE_KEY = text(
    "UPDATE durablesched_limit_keys SET blocked_until = NULL "
    "WHERE queue = :queue AND limit_key = :key"
)
SQL_TOUCH_KEY = text(
    "UPDATE tasks SET state = state WHERE id = (SELECT id FROM tasks WHERE queue = :queue "
    f"AND limit_key = :key AND limit_key IS NOT NULL AND key_waiting = 1 AND {CLAIMABLE_SQL} "
    "ORDER BY due_at, priority DESC, seq LIMIT 1)"
)
#: ... each start remembered, the older ones forgotten, the window's counted ...
SQL_REMEMBER_KEY_START = text(
    "INSERT INTO durablesched_key_starts (queue, limit_key, at) VALUES (:queue, :key, :at)"
)
SQL_FORGET_KEY_STARTS = text(
    "DELETE FROM durablesched_key_starts WHERE queue = :queue AND limit_key = :key "
    "AND at <= :before"
)
SQL_KEY_STARTS = text(
    "SELECT at FROM durablesched_key_starts WHERE queue = :queue AND limit_key = :key "
    "AND at > :since"
)
#: ... the claim statement undone when it took a key whose window was full at the
#: claim's time (``claiming._claim_within_key_rates``) ...
SQL_KEY_SAVEPOINT = text("SAVEPOINT durablesched_key_rates")
SQL_KEY_ROLLBACK = text("ROLLBACK TO SAVEPOINT durablesched_key_rates")
SQL_KEY_RELEASE = text("RELEASE SAVEPOINT durablesched_key_rates")
#: ... and a key whose window is full left without a head until it passes.
SQL_KEY_HEAD = text(
    "SELECT head_id FROM durablesched_limit_keys WHERE queue = :queue AND limit_key = :key"
)
SQL_BLOCK_KEY = text(
    "UPDATE durablesched_limit_keys SET blocked_until = :until, head_id = NULL "
    "WHERE queue = :queue AND limit_key = :key"
)
SQL_HOLD_BACK = text(
    f"UPDATE tasks SET key_waiting = 1 WHERE id = :id AND key_waiting = 0 AND {CLAIMABLE_SQL}"
)
#: When the first key whose rate window is full (of the queues, if given) may start again.
SQL_NEXT_KEY_FREE = text(
    "SELECT min(blocked_until) FROM durablesched_limit_keys WHERE blocked_until > :now"
)
SQL_NEXT_KEY_FREE_IN = text(
    "SELECT min(blocked_until) FROM durablesched_limit_keys WHERE blocked_until > :now "
    "AND queue IN :queues"
).bindparams(bindparam("queues", expanding=True))
#: How many tasks of queue ``:queue`` run now, anywhere.
SQL_RUNNING_IN_QUEUE = text("SELECT count(*) FROM tasks WHERE state = 'RUNNING' AND queue = :queue")
#: The starts a rate window still remembers, and the forgetting of older ones.
SQL_QUEUE_STARTS = text(
    "SELECT at FROM durablesched_queue_starts WHERE queue = :queue AND at > :since"
)
SQL_FORGET_STARTS = text(
    "DELETE FROM durablesched_queue_starts WHERE queue = :queue AND at <= :before"
)
SQL_REMEMBER_START = text("INSERT INTO durablesched_queue_starts (queue, at) VALUES (:queue, :at)")
#: Per queue and state: how many tasks, and the earliest due time of the claimable ones
#: already due (how long the oldest has waited).
_QUEUE_COUNTS = (
    "SELECT queue, state, count(*) AS tasks, "
    f"min(CASE WHEN {CLAIMABLE_SQL} AND due_at <= :now THEN due_at END) AS oldest_due "
    "FROM tasks {where} GROUP BY queue, state"
)
SQL_QUEUE_COUNTS = text(_QUEUE_COUNTS.format(where=""))
#: The same for the live states only: ``ix_tasks_state_name`` finds them without
#: reading the finished ones (SQLite is told so: :func:`sql_live_queue_counts`).
LIVE_STATES_WHERE = "WHERE state IN ('PENDING', 'RETRY_WAIT', 'RUNNING')"
SQL_LIVE_QUEUE_COUNTS = text(_QUEUE_COUNTS.format(where=LIVE_STATES_WHERE))


def sql_live_queue_counts(index_hint: str) -> TextClause:
    """:data:`SQL_LIVE_QUEUE_COUNTS` with ``index_hint`` after the table (SQLite's
    ``INDEXED BY``): with statistics, SQLite may rather walk a whole index that is
    ordered by queue than find the few live rows, and read a million finished ones."""
    return text(_QUEUE_COUNTS.format(where=f"{index_hint} {LIVE_STATES_WHERE}"))


# -- history and keys ----------------------------------------------------------------------------

#: The submission of the tasks with ids ``:first`` to ``:last`` (just inserted), as
#: their first history lines: one statement per submitted batch, on the driver.
SUBMITTED_EVENTS = (
    "INSERT INTO task_events (task_id, at, state, attempt, detail) "
    f"SELECT id, created_at, 'PENDING', 0, '{SUBMITTED}' FROM tasks "
    "WHERE id >= :first AND id <= :last ORDER BY id"
)

#: History lines, many at once through the driver; ``{p}`` is its placeholder.
INSERT_EVENTS = (
    "INSERT INTO task_events (task_id, at, state, attempt, detail) VALUES ({p}, {p}, {p}, {p}, {p})"
)
#: Idempotency keys with their results, many at once through the driver.
#: A key already recorded stays with the task that recorded it first (a submit key
#: may spell the key generated for another task: ``durablesched-task-<id>``).
RECORD_KEYS = (
    "INSERT INTO idempotency_keys (key, task_id, recorded_at, result) VALUES ({p}, {p}, {p}, {p}) "
    "ON CONFLICT (key) DO NOTHING"
)
#: One history line, in the transaction that made the change.
SQL_INSERT_EVENT = text(
    "INSERT INTO task_events (task_id, at, state, attempt, detail, error) "
    "VALUES (:task_id, :at, :state, :attempt, :detail, :error)"
)
#: A succeeded task's key with its result.
SQL_RECORD_KEY = text(
    "INSERT INTO idempotency_keys (key, task_id, recorded_at, result) "
    "VALUES (:key, :task_id, :now, :result) ON CONFLICT (key) DO NOTHING"
)

# -- outcomes (each fenced by its claim) ---------------------------------------------------------

#: RUNNING -> SUCCEEDED with the result.
SQL_COMPLETE = text(
    "UPDATE tasks SET state = 'SUCCEEDED', result = :result, lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = :now, finished_at = :now "
    f"WHERE {VALID} RETURNING attempts, idempotency_key"
)
#: ``:give_up`` is 1 when the attempt has no retry; never NULL, so that no
#: database has to guess the type of a bare NULL parameter.
_GIVE_UP = "(:give_up = 1 OR cancel_requested_at IS NOT NULL)"
#: RUNNING -> RETRY_WAIT due at ``:retry_at``, or FAILED (no retry, or cancel requested).
SQL_FAIL = text(
    f"UPDATE tasks SET state = CASE WHEN {_GIVE_UP} THEN 'FAILED' ELSE 'RETRY_WAIT' END, "
    f"due_at = CASE WHEN {_GIVE_UP} THEN due_at ELSE :retry_at END, "
    f"finished_at = CASE WHEN {_GIVE_UP} THEN :now ELSE NULL END, "
    "last_error = :error, lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    f"WHERE {VALID} RETURNING state, attempts"
)
#: RUNNING -> CANCELLED, only if cancellation was requested.
SQL_ACK_CANCEL = text(
    "UPDATE tasks SET state = 'CANCELLED', lease_owner = NULL, lease_expires_at = NULL, "
    "updated_at = :now, finished_at = :now "
    f"WHERE {VALID} AND cancel_requested_at IS NOT NULL RETURNING attempts"
)
#: A stopping worker gives a claim back: the attempt does not count.
SQL_RELEASE = text(
    "UPDATE tasks SET state = CASE WHEN cancel_requested_at IS NULL THEN 'PENDING' "
    "ELSE 'CANCELLED' END, "
    "attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END, "
    "finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE :now END, "
    "lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    f"WHERE {VALID} RETURNING state, attempts"
)
#: Whether the claim is still valid (to tell a lost claim from a refused write).
SQL_IS_VALID = text(f"SELECT 1 FROM tasks WHERE {VALID}")

# -- leases and cancellation ---------------------------------------------------------------------

#: Unexpired leases of tasks ``:ids``, read without renewing them.
SQL_LEASES = text(
    "SELECT id, fence, lease_owner, lease_expires_at, cancel_requested_at FROM tasks "
    "WHERE id IN :ids AND state = 'RUNNING' AND lease_expires_at > :now ORDER BY id"
).bindparams(bindparam("ids", expanding=True))
#: A task that has not started: CANCELLED at once.
SQL_CANCEL_WAITING = text(
    "UPDATE tasks SET state = 'CANCELLED', updated_at = :now, finished_at = :now "
    f"WHERE id = :id AND {CLAIMABLE_SQL} RETURNING attempts"
)
#: A running task: cancellation requested (the first request's time stands).
SQL_CANCEL_RUNNING = text(
    "UPDATE tasks SET cancel_requested_at = :now, updated_at = :now "
    "WHERE id = :id AND state = 'RUNNING' AND cancel_requested_at IS NULL "
    "RETURNING environment"
)
#: A task's state alone.
SQL_STATE = text("SELECT state FROM tasks WHERE id = :id")
#: A task's state, and where its attempt runs (a thread or a child process).
SQL_STATE_AND_ENVIRONMENT = text("SELECT state, environment FROM tasks WHERE id = :id")
#: Claimed attempts that run in a child process: their cancellation is enforced.
SQL_IN_PROCESS = text(
    f"UPDATE tasks SET environment = '{Environment.PROCESS}' WHERE id IN :ids"
).bindparams(bindparam("ids", expanding=True))

# -- expired leases ------------------------------------------------------------------------------

#: Whether any lease has expired (a read, before taking the write lock for nothing).
SQL_ANY_EXPIRED = text(
    "SELECT 1 FROM tasks WHERE state = 'RUNNING' AND lease_expires_at <= :now LIMIT 1"
)
#: Every lease valid at ``:since``: what a write that waited for the lock since then extends.
SQL_LEASES_VALID_SINCE = text(
    "SELECT id, fence, lease_expires_at FROM tasks "
    "WHERE state = 'RUNNING' AND lease_expires_at > :since"
)
SQL_EXTEND_LEASE = text(
    "UPDATE tasks SET lease_expires_at = :lease_expires_at "
    "WHERE id = :id AND fence = :fence AND state = 'RUNNING'"
)
#: Every RUNNING task whose lease expired at or before ``:now``.
SQL_EXPIRED = text(
    "SELECT id, name, queue, attempts, max_attempts, lease_owner, lease_expires_at, "
    "cancel_requested_at, fence FROM tasks "
    "WHERE state = 'RUNNING' AND lease_expires_at <= :now ORDER BY id"
)
#: The reclaim re-checks state, fence and expiry itself: a completion that
#: landed a moment earlier is never overwritten.
SQL_RECLAIM = text(
    "UPDATE tasks SET state = :state, due_at = coalesce(:due_at, due_at), "
    "finished_at = :finished_at, "
    "last_error = :error, lease_owner = NULL, lease_expires_at = NULL, updated_at = :now "
    "WHERE id = :id AND state = 'RUNNING' AND fence = :fence AND lease_expires_at <= :now"
)

# -- when to wake --------------------------------------------------------------------------------

#: The earliest due time after ``:now`` of a claimable task, of any name.
SQL_NEXT_DUE = text(
    f"SELECT due_at FROM tasks WHERE {CLAIMABLE_SQL} AND due_at > :now ORDER BY due_at, seq LIMIT 1"
)
#: The same among some queues (``:queues``, expanding) and, if given, names.
QUEUES_FILTER = "AND queue IN :queues"
QUEUES: BindParameter[list[str]] = bindparam("queues", expanding=True)
#: The earliest lease expiry after ``:now``.
SQL_NEXT_EXPIRY = text(
    "SELECT lease_expires_at FROM tasks WHERE state = 'RUNNING' AND lease_expires_at > :now "
    "ORDER BY lease_expires_at LIMIT 1"
)

# -- reading tasks -------------------------------------------------------------------------------

#: One task, every column.
SQL_GET = text(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = :id")
#: When a task was submitted (for tasks stored before submission lines were written).
SQL_CREATED = text("SELECT created_at FROM tasks WHERE id = :id")
#: A task's history, oldest first (its submission first).
SQL_HISTORY = text(
    "SELECT task_id, at, state, attempt, detail, error FROM task_events "
    "WHERE task_id = :id ORDER BY id"
)
#: The last history line of each of ``:ids``: each task's lines found by its index on
#: ``task_id`` (a workflow has a few a suspension), the last then by the primary key.
SQL_LATEST_EVENTS = text(
    "SELECT task_id, at, state, attempt, detail, error FROM task_events "
    "WHERE id IN (SELECT max(id) FROM task_events WHERE task_id IN :ids GROUP BY task_id)"
).bindparams(bindparam("ids", expanding=True))


def sql_list_tasks(*, state: bool, name: bool, queue: bool = False) -> TextClause:
    """Up to ``:limit`` tasks in (due_at, seq) order, filtered by ``:state``, ``:name`` and
    ``:queue`` where asked."""
    clauses = []
    if state:
        clauses.append("state = :state")
    if name:
        clauses.append("name = :name")
    if queue:
        clauses.append("queue = :queue")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return text(f"SELECT {TASK_COLUMNS} FROM tasks {where} ORDER BY due_at, seq LIMIT :limit")


# -- operator actions: the CLI's retry, stats and purge ------------------------------------------

#: FAILED or CANCELLED -> PENDING, due ``:now``, with a fresh attempt budget.
SQL_REQUEUE = text(
    "UPDATE tasks SET state = 'PENDING', due_at = :now, seq = :seq, attempts = 0, "
    "lease_owner = NULL, lease_expires_at = NULL, cancel_requested_at = NULL, result = NULL, "
    "finished_at = NULL, updated_at = :now "
    "WHERE id = :id AND state IN ('FAILED', 'CANCELLED') RETURNING id"
)
#: Another task now holding task ``:id``'s idempotency key, if any.
SQL_KEY_HELD_BY_OTHER = text(
    "SELECT other.id FROM tasks AS this JOIN tasks AS other "
    "ON other.idempotency_key = this.idempotency_key AND other.id != this.id "
    "WHERE this.id = :id AND other.state IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED')"
)
#: How many tasks are in each state.
SQL_COUNT_BY_STATE = text("SELECT state, count(*) AS n FROM tasks GROUP BY state ORDER BY state")
#: A claimable task whose queue is not paused: a task a paused queue holds back waits by
#: the operator's choice, so it is never overdue (``check``, ``stats``).
NOT_PAUSED_SQL = "queue NOT IN (SELECT name FROM durablesched_queues WHERE paused != 0)"
#: The claimable task that has waited longest past its due time.
SQL_OLDEST_OVERDUE = text(
    f"SELECT id, name, due_at FROM tasks WHERE {CLAIMABLE_SQL} AND due_at <= :now "
    f"AND {NOT_PAUSED_SQL} ORDER BY due_at, seq LIMIT 1"
)
#: Overdue claimable tasks per name, with the oldest due time.
SQL_OVERDUE_BY_NAME = text(
    f"SELECT name, count(*) AS n, min(due_at) AS oldest FROM tasks "
    f"WHERE {CLAIMABLE_SQL} AND due_at <= :now AND {NOT_PAUSED_SQL} "
    "GROUP BY name ORDER BY oldest"
)
#: Every running task with its lease, soonest expiry first.
SQL_RUNNING = text(
    "SELECT id, name, attempts, lease_owner, lease_expires_at, cancel_requested_at "
    "FROM tasks WHERE state = 'RUNNING' ORDER BY lease_expires_at"
)
#: Tasks that FAILED since ``:since``, newest first.
SQL_RECENT_FAILURES = text(
    "SELECT id, name, attempts, finished_at, last_error FROM tasks "
    "WHERE state = 'FAILED' AND finished_at >= :since ORDER BY finished_at DESC"
)
#: Finished tasks only, oldest first, a bounded batch per transaction.
SQL_PURGE_BATCH = text(
    "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks "
    "WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND finished_at < :before "
    "ORDER BY finished_at LIMIT :batch)"
)

# -- what a dashboard reads and deletes (Console) ------------------------------------------------

#: A finished task deleted; its history, recorded key and copies go with it (ON DELETE
#: CASCADE), a schedule's fire that made it stays naming none (SET NULL).
SQL_DELETE_FINISHED = text(
    "DELETE FROM tasks WHERE id = :id AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') "
    "RETURNING id"
)


#: The states the task list finds through an index of their own rows: few, or
#: ``ix_tasks_state_created``'s (which holds these four: a task leaves it when claimed
#: and never enters it by succeeding). RUNNING tasks are as many as the workers'
#: slots (``ix_tasks_running_lease``).
INDEXED_STATES = frozenset({"PENDING", "RUNNING", "RETRY_WAIT", "FAILED", "CANCELLED"})


def sql_find_tasks(
    *,
    state: str | None,
    queue: bool,
    name: bool,
    key: bool,
    created_from: bool,
    created_until: bool,
    before: bool,
    after: bool = False,
    hint: tuple[str, str] = ("", ""),
    planned_by_statistics: bool = False,
) -> TextClause:
    """Up to ``:limit`` tasks newest first, ``(created_at, id)`` descending, filtered where
    asked: ``ix_tasks_created`` and ``ix_tasks_{queue,name}_created`` hold that order
    after their first column, so a page reads only its own rows (a key's tasks are
    few: ``ix_tasks_key``). ``:before_at``, ``:before_id``: the keyset cursor, as a row
    value (a range on the index, not a filter). ``:after_at``, ``:after_id``: the cursor
    the other way: the index is walked from the oldest end (or from the cursor) up,
    and the page's rows are put newest first again.

    ``state`` is written in as a literal (one of ours), so that the partial indexes
    can serve it. One of :data:`INDEXED_STATES` is found through its index; SUCCEEDED,
    which most tasks end in, has none in the list's order (it would cost every
    success a write): it is compared as an expression, which no index serves, so
    the list walks its order from either end and keeps those rows, most of them.
    ``planned_by_statistics`` (PostgreSQL): SUCCEEDED is compared as a column, so that
    the planner knows from its statistics that most rows match and that a page's walk
    stops early (as an expression it guesses 0.5 % and may read the whole table). ``hint`` is what
    follows the table's name and a term added to the state's (SQLite's ``INDEXED BY``
    and the partial index's own term, which its planner needs to see: it would walk
    the whole list's order for a state that has no row; PostgreSQL needs neither, and
    a term said twice would make it misjudge how many rows match)."""
    table_hint, state_term = hint
    if state is None:
        state_clause = None
    elif state in INDEXED_STATES:
        state_clause = f"state = '{state}'{f' AND {state_term}' if state_term else ''}"
    elif planned_by_statistics:
        state_clause = f"state = '{state}'"
    else:
        state_clause = f"state || '' = '{state}'"
    # A cursor on a state of ix_tasks_state_created's names the state too: a range of
    # that index then, which ix_tasks_created cannot serve. PostgreSQL's planner cannot
    # know that a state's rows are all the newest (PENDING) or few, and would otherwise
    # walk ix_tasks_created from the cursor over every other row to the list's end.
    indexed = state is not None and state in INDEXED_STATES and state != "RUNNING"
    by_state, state_value = ("state, ", f"'{state}', ") if indexed else ("", "")
    clauses = [
        clause
        for wanted, clause in (
            (state is not None, state_clause),
            (queue, "queue = :queue"),
            (name, "name = :name"),
            (key, "idempotency_key = :key"),
            (created_from, "created_at >= :created_from"),
            (created_until, "created_at < :created_until"),
            (before, f"({by_state}created_at, id) < ({state_value}:before_at, :before_id)"),
            (after, f"({by_state}created_at, id) > ({state_value}:after_at, :after_id)"),
        )
        if wanted
    ]
    where = f"WHERE {' AND '.join(str(c) for c in clauses)}" if clauses else ""
    if not after:
        return text(
            f"SELECT {TASK_COLUMNS} FROM tasks {table_hint} {where} "
            "ORDER BY created_at DESC, id DESC LIMIT :limit"
        )
    return text(
        f"SELECT * FROM (SELECT {TASK_COLUMNS} FROM tasks {table_hint} {where} "
        "ORDER BY created_at, id LIMIT :limit) AS page "
        "ORDER BY created_at DESC, id DESC"
    )


# -- what happened lately (metrics: Store.activity) ------------------------------------------------

#: History lines of the window (``:since``, ``:now``], read through ``ix_task_events_at``.
_WINDOW = "e.at > :since AND e.at <= :now"
#: A reclaim's history line (``lease of <owner> expired at ...``).
_RECLAIM = "e.detail LIKE 'lease of % expired at %'"
#: The line before ``e`` in its task's history: its state or time (its claim's, if RUNNING).
_PREVIOUS = (
    "(SELECT {what} FROM task_events AS p WHERE p.task_id = e.task_id AND p.id < e.id "
    "ORDER BY p.id DESC LIMIT 1)"
)
#: Lines of the window per queue, state and whether a reclaim wrote them: claims, and
#: ends of attempts (a CANCELLED line only when its task was running).
SQL_ACTIVITY_COUNTS = text(
    f"SELECT t.queue, e.state, CASE WHEN {_RECLAIM} THEN 1 ELSE 0 END AS reclaim, "
    "count(*) AS n FROM task_events AS e JOIN tasks AS t ON t.id = e.task_id "
    f"WHERE {_WINDOW} AND e.state <> 'PENDING' AND (e.state <> 'CANCELLED' OR "
    f"{_PREVIOUS.format(what='p.state')} = 'RUNNING') "
    "GROUP BY t.queue, e.state, CASE WHEN "
    f"{_RECLAIM} THEN 1 ELSE 0 END"
)
#: The reclaims' lines of the window (each names the worker whose lease expired).
SQL_ACTIVITY_RECLAIMS = text(
    f"SELECT e.detail FROM task_events AS e WHERE {_WINDOW} AND e.state <> 'PENDING' AND {_RECLAIM}"
)


def sql_activity_durations(bounds: int, elapsed_us: str) -> TextClause:
    """Per task name, the attempts that ended in the window (reclaims left out): how
    many, their run time in microseconds (``elapsed_us``: the database's exact
    difference of ``{end}`` and ``{start}``), and how many ran at most ``:b0``,
    ``:b1`` ... microseconds."""
    ended = (
        f"SELECT t.name AS name, e.at AS ended_at, {_PREVIOUS.format(what=_CLAIM_TIME)} "
        "AS started_at FROM task_events AS e JOIN tasks AS t ON t.id = e.task_id "
        f"WHERE {_WINDOW} AND e.state IN ('SUCCEEDED', 'FAILED', 'RETRY_WAIT', 'CANCELLED') "
        f"AND (e.detail IS NULL OR NOT {_RECLAIM})"
    )
    runs = (
        f"SELECT name, {elapsed_us.format(end='ended_at', start='started_at')} AS us "
        "FROM ended WHERE started_at IS NOT NULL"
    )
    counts = "".join(
        f", sum(CASE WHEN us <= :b{i} THEN 1 ELSE 0 END) AS b{i}" for i in range(bounds)
    )
    # MATERIALIZED: each line's claim is looked up once, each run's time worked out
    # once; flattened, both would be repeated in every expression that uses them.
    return text(
        f"WITH ended AS MATERIALIZED ({ended}), runs AS MATERIALIZED ({runs}) "
        f"SELECT name, count(*) AS n, sum(us) AS total{counts} FROM runs GROUP BY name"
    )


_CLAIM_TIME = "CASE WHEN p.state = 'RUNNING' THEN p.at END"

# -- live workers --------------------------------------------------------------------------------

#: Every column of a worker's row, in the order :func:`.workers.worker_info` reads them.
WORKER_COLUMNS = "id, host, pid, queues, concurrency, version, started_at, last_seen, lease_seconds"
#: A worker's registration; the same id again replaces the row.
SQL_REGISTER_WORKER = text(
    f"INSERT INTO durablesched_workers ({WORKER_COLUMNS}) VALUES (:id, :host, :pid, :queues, "
    ":concurrency, :version, :started_at, :last_seen, :lease_seconds) "
    "ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
    "queues = excluded.queues, concurrency = excluded.concurrency, version = excluded.version, "
    "started_at = excluded.started_at, last_seen = excluded.last_seen, "
    "lease_seconds = excluded.lease_seconds"
)
#: The worker ``:id`` seen at ``:now`` (its heartbeat).
SQL_SEE_WORKER = text("UPDATE durablesched_workers SET last_seen = :now WHERE id = :id")
#: A worker's clean exit.
SQL_DEREGISTER_WORKER = text("DELETE FROM durablesched_workers WHERE id = :id")
#: Every worker's row, in the order they are listed.
SQL_WORKERS = text(f"SELECT {WORKER_COLUMNS} FROM durablesched_workers ORDER BY started_at, id")
#: Workers not seen since ``:before`` (a first cut; their leases decide which are forgotten).
SQL_WORKERS_UNSEEN = text(
    f"SELECT {WORKER_COLUMNS} FROM durablesched_workers WHERE last_seen < :before"
)
SQL_FORGET_WORKERS = text("DELETE FROM durablesched_workers WHERE id IN :ids").bindparams(
    bindparam("ids", expanding=True)
)

# -- the health check ----------------------------------------------------------------------------

#: How many RUNNING tasks are on a lease that expired at or before ``:now``, and the oldest expiry.
#: ``check``: the keys of queues limited per key whose bookkeeping is out of step with
#: their tasks (a bug, or a database changed by hand): a count of RUNNING tasks that is
#: not the count, a live keyed task without its key's row, a key with room whose head is
#: not its first claimable task (none while one waits, one gone, or a waiting one that
#: comes first: found through the index of waiting tasks, one probe a key), or a
#: claimable task marked waiting where it is its key's head (or the other way round).
#: Each part reads the keys' rows, or the live keyed tasks, once.
SQL_KEYS_OUT_OF_STEP = text(
    "SELECT k.queue, k.limit_key FROM durablesched_limit_keys k LEFT JOIN (SELECT queue, "
    "limit_key, count(*) AS n FROM tasks WHERE limit_key IS NOT NULL AND state = 'RUNNING' "
    "GROUP BY queue, limit_key) r ON r.queue = k.queue AND r.limit_key = k.limit_key "
    "WHERE k.running <> COALESCE(r.n, 0) "
    "UNION SELECT t.queue, t.limit_key FROM tasks t JOIN durablesched_queues q "
    "ON q.name = t.queue WHERE t.limit_key IS NOT NULL "
    "AND t.state IN ('PENDING', 'RETRY_WAIT', 'RUNNING') "
    "AND (q.concurrency_per_key IS NOT NULL OR q.rate_per_key_count IS NOT NULL) "
    "AND NOT EXISTS (SELECT 1 FROM durablesched_limit_keys k "
    "WHERE k.queue = t.queue AND k.limit_key = t.limit_key) "
    "UNION SELECT k.queue, k.limit_key FROM durablesched_limit_keys k "
    "JOIN durablesched_queues q ON q.name = k.queue WHERE k.blocked_until IS NULL "
    f"AND k.running < COALESCE(q.concurrency_per_key, {KEY_CAP_UNLIMITED}) AND ("
    "(k.head_id IS NULL AND EXISTS (SELECT 1 FROM tasks w WHERE w.queue = k.queue "
    f"AND w.limit_key = k.limit_key AND w.limit_key IS NOT NULL AND w.key_waiting = 1 "
    f"AND w.{CLAIMABLE_SQL})) "
    "OR (k.head_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM tasks h WHERE h.id = k.head_id "
    f"AND h.queue = k.queue AND h.limit_key = k.limit_key AND h.{CLAIMABLE_SQL})) "
    "OR EXISTS (SELECT 1 FROM tasks h JOIN tasks t ON t.id = (SELECT w.id FROM tasks w "
    "WHERE w.queue = k.queue AND w.limit_key = k.limit_key AND w.limit_key IS NOT NULL "
    f"AND w.key_waiting = 1 AND w.{CLAIMABLE_SQL} ORDER BY w.due_at, w.priority DESC, w.seq "
    "LIMIT 1) WHERE h.id = k.head_id "
    "AND (t.due_at, h.priority, t.seq) < (h.due_at, t.priority, h.seq))) "
    "UNION SELECT k.queue, k.limit_key FROM durablesched_limit_keys k JOIN tasks t "
    f"ON t.queue = k.queue AND t.limit_key = k.limit_key WHERE t.{CLAIMABLE_SQL} "
    "AND t.key_waiting = CASE WHEN t.id = k.head_id THEN 1 ELSE 0 END "
    "ORDER BY 1, 2"
)
SQL_EXPIRED_COUNT = text(
    "SELECT count(*) AS n, min(lease_expires_at) AS oldest FROM tasks "
    "WHERE state = 'RUNNING' AND lease_expires_at <= :now"
)
#: The first ``:limit`` of them, oldest expiry first.
SQL_EXPIRED_IDS = text(
    "SELECT id FROM tasks WHERE state = 'RUNNING' AND lease_expires_at <= :now "
    "ORDER BY lease_expires_at, id LIMIT :limit"
)


def sql_unclaimed(paused_queues: bool) -> tuple[TextClause, TextClause]:
    """How many claimable tasks were due before ``:before`` and are still unclaimed (with the
    oldest due time), and the first ``:limit`` of their ids in claim order. A paused queue's
    tasks are left out (``paused_queues``) on a schema that has queues: they are not late."""
    where = f"{CLAIMABLE_SQL} AND due_at < :before"
    if paused_queues:
        where += f" AND {NOT_PAUSED_SQL}"
    return (
        text(f"SELECT count(*) AS n, min(due_at) AS oldest FROM tasks WHERE {where}"),
        text(f"SELECT id FROM tasks WHERE {where} ORDER BY due_at, seq LIMIT :limit"),
    )


# -- moving live tasks from one database to another ----------------------------------------------

#: This database's random identity, made by its migrations.
SQL_INSTANCE = text("SELECT value FROM durablesched_counters WHERE name = 'instance'")
#: The next ``:batch`` live (claimable) tasks with ids above ``:after``.
SQL_LIVE_IDS = text(
    f"SELECT id, state, debounce_key FROM tasks WHERE {CLAIMABLE_SQL} AND id > :after "
    "ORDER BY id LIMIT :batch"
)
#: (The debounce key is read before: a task leaving PENDING gives it up.)
#: Live tasks leave the source as CANCELLED (no worker there can run them again)
#: before they exist in the destination; the event's detail says where they went.
SQL_HAND_OVER = text(
    "UPDATE tasks SET state = 'CANCELLED', updated_at = :now, finished_at = :now "
    f"WHERE id IN :ids AND {CLAIMABLE_SQL} RETURNING {TASK_COLUMNS}"
).bindparams(bindparam("ids", expanding=True))
#: Handed over but not yet confirmed: a move that stopped half way finishes these first.
SQL_IN_TRANSIT = text(
    f"SELECT {', '.join('t.' + c for c in TASK_COLUMNS.split(', '))}, e.id AS event_id, "
    "e.detail FROM tasks t JOIN task_events e ON e.task_id = t.id "
    "WHERE t.state = 'CANCELLED' AND e.state = 'CANCELLED' AND e.detail LIKE :prefix "
    "ORDER BY t.id"
)
#: The hand-over line rewritten to name the task it became.
SQL_CONFIRM_MOVE = text("UPDATE task_events SET detail = :detail WHERE id = :event_id")
#: The latest history line of ``:task_id`` that reads exactly ``:detail``.
SQL_EVENT_ID = text(
    "SELECT id FROM task_events WHERE task_id = :task_id AND detail = :detail ORDER BY id DESC"
)
#: The task a task from another database became here, if it arrived before.
SQL_COPIED = text(
    "SELECT task_id FROM durablesched_copies WHERE source = :source AND source_id = :source_id"
)
#: Remember an arrival: (source database, its task id) -> our task id.
SQL_RECORD_COPY = text(
    "INSERT INTO durablesched_copies (source, source_id, task_id, copied_at) "
    "VALUES (:source, :source_id, :task_id, :now)"
)
#: An arriving task, stored in the state it left in, with its attempts so far; or
#: nothing (no row back) if a key-holding task here has its key.
SQL_INSERT_COPY = text(
    "INSERT INTO tasks (id, seq, name, args, state, due_at, attempts, max_attempts, fence, "
    "last_error, idempotency_key, created_at, updated_at, queue, priority, limit_key, "
    "debounce_key, debounce_until) VALUES (:id, :id, "
    ":name, :args, :state, :due_at, :attempts, :max_attempts, 0, :last_error, :key, "
    ":created_at, :now, :queue, :priority, :limit_key, :debounce_key, :debounce_until) "
    f"{KEY_HOLDER_CONFLICT} DO NOTHING RETURNING id"
)
#: Whether a task here holds debounce key ``:key`` (an arriving task then leaves its own).
SQL_DEBOUNCE_HELD = text("SELECT 1 FROM tasks WHERE debounce_key = :key")
#: An arrived task with a limit key brought into its key's bookkeeping: setting its state
#: to itself fires the triggers (SQLite has no INSERT trigger on ``tasks``, migration 0017).
SQL_TOUCH_TASK = text("UPDATE tasks SET state = state WHERE id = :id")


# -- workflows: what every task's end writes besides itself (docs/workflows.md) ------------------


def wake_parents(children: str) -> str:
    """A spawned child ended: its parent, suspended (PENDING, due later), is due now, at
    the wake (not at the time it suspended: a due time in the past would read as a task
    kept waiting that long, to ``check``'s overdue finding and the claim-lag figures, and
    put it ahead of all work queued since; its priority is what may put it ahead).
    ``children``: the term choosing the ended children from ``task_children``, by the
    task ids ``:ids`` bound as one parameter (``SQLDialect.ids``): one statement for any
    number of them, prepared once (an expanding ``IN`` is compiled again for each length).

    Every parent row is locked, changed or not: a parent suspending at this
    moment either commits first (and is woken here) or waits and then sees the child ended.
    On PostgreSQL the parents' rows are locked already, with the transaction's other rows
    in id order, at its start (``Transactions._lock_tasks``): taken here, after the
    child's row, a parent (a lower id) would be locked out of order, and two group
    commits each ending a child of the other's workflow deadlocked."""
    return (
        "UPDATE tasks SET due_at = CASE WHEN state = 'PENDING' AND due_at > :now "
        "THEN :now ELSE due_at END, updated_at = CASE WHEN state = 'PENDING' AND due_at > :now "
        "THEN :now ELSE updated_at END "
        f"WHERE id IN (SELECT parent_id FROM task_children WHERE {children})"
    )
