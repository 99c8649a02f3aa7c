"""The SQL schema as SQLAlchemy metadata: what the migrations must produce, exactly.

On SQLite, times are TEXT in UTC, ``YYYY-MM-DD HH:MM:SS.ffffff``: readable in
``sqlite3`` and ordered correctly by plain string comparison, and JSON is TEXT.
On PostgreSQL, times are ``timestamptz``, JSON is ``jsonb`` and ids are ``bigint``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Sequence,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import postgresql

from durablesched.store.sql.predicates import (
    ALL_STATES_SQL,
    CLAIMABLE_SQL,
    KEY_HOLDING_SQL,
    STATE_CREATED_SQL,
)

metadata = MetaData()

#: The column types, per database.
Time = Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
Json = Text().with_variant(postgresql.JSONB(), "postgresql")
Id = Integer().with_variant(BigInteger(), "postgresql")


tasks = Table(
    "tasks",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=False),
    Column("seq", Id, nullable=False),
    Column("name", Text, nullable=False),
    Column("args", Json, nullable=False),
    Column("state", Text, nullable=False),
    Column("due_at", Time, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("lease_owner", Text),
    Column("lease_expires_at", Time),
    Column("fence", Integer, nullable=False, server_default=text("0")),
    Column("cancel_requested_at", Time),
    Column("result", Json),
    Column("last_error", Json),
    Column("idempotency_key", Text),
    Column("created_at", Time, nullable=False),
    Column("updated_at", Time, nullable=False),
    Column("finished_at", Time),
    #: Where the current or last attempt runs: NULL (a thread) or 'process'.
    Column("environment", Text),
    Column("queue", Text, nullable=False, server_default=text("'default'")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    #: The key its queue's per-key limits count it under (NULL: none).
    Column("limit_key", Text),
    #: 1: a claimable task of a limit key that is not its key's head (the key's one
    #: claimable task the claim may take, kept by the triggers of migration 0013), so
    #: out of the claim's walk; 0 for every other task.
    Column("key_waiting", Integer, nullable=False, server_default=text("0")),
    #: Debouncing: the key of a PENDING task not yet started (cleared when it starts,
    #: by the triggers of migration 0013), and the latest its due time may be pushed to.
    Column("debounce_key", Text),
    Column("debounce_until", Time),
    #: When the latest attempt started: NULL while it waits claimed ahead in a worker
    #: (and for a task never claimed).
    Column("started_at", Time),
    CheckConstraint(f"state IN ({ALL_STATES_SQL})", name="ck_tasks_state"),
    CheckConstraint("priority BETWEEN -100 AND 100", name="ck_tasks_priority"),
    CheckConstraint("max_attempts >= 1", name="ck_tasks_max_attempts"),
    CheckConstraint("attempts >= 0", name="ck_tasks_attempts"),
)

#: The claim walks this index, one queue at a time, in (priority desc, due_at,
#: seq) order over claimable rows only, so finished rows never slow it down, and
#: over ``key_waiting = 0`` only, so a busy limit key's backlog is never walked.
Index(
    "ix_tasks_queue_claimable",
    tasks.c.queue,
    tasks.c.key_waiting,
    tasks.c.priority.desc(),
    tasks.c.due_at,
    tasks.c.seq,
    sqlite_where=text(CLAIMABLE_SQL),
    postgresql_where=text(CLAIMABLE_SQL),
)
#: When the next task falls due (an idle worker sleeps until then) and what is
#: overdue: the claimable rows in (due_at, seq) order.
Index(
    "ix_tasks_claimable",
    tasks.c.due_at,
    tasks.c.seq,
    sqlite_where=text(CLAIMABLE_SQL),
    postgresql_where=text(CLAIMABLE_SQL),
)
#: The reclaim finds expired leases through this one.
Index(
    "ix_tasks_running_lease",
    tasks.c.lease_expires_at,
    sqlite_where=text("state = 'RUNNING'"),
    postgresql_where=text("state = 'RUNNING'"),
)
#: At most one key-holding task per idempotency key.
Index(
    "ux_tasks_idempotency_key",
    tasks.c.idempotency_key,
    unique=True,
    sqlite_where=text(f"idempotency_key IS NOT NULL AND {KEY_HOLDING_SQL}"),
    postgresql_where=text(f"idempotency_key IS NOT NULL AND {KEY_HOLDING_SQL}"),
)
#: A limit key's claimable tasks in the order its head is chosen (the triggers); on
#: SQLite its waiting ones only (migration 0019: a claim of a head leaves it alone).
Index(
    "ix_tasks_key_claimable",
    tasks.c.queue,
    tasks.c.limit_key,
    tasks.c.due_at,
    tasks.c.priority.desc(),
    tasks.c.seq,
    sqlite_where=text(f"limit_key IS NOT NULL AND key_waiting = 1 AND {CLAIMABLE_SQL}"),
    postgresql_where=text(f"limit_key IS NOT NULL AND {CLAIMABLE_SQL}"),
)
#: At most one task per debounce key: a submit with the key updates it instead.
Index(
    "ux_tasks_debounce_key",
    tasks.c.debounce_key,
    unique=True,
    sqlite_where=text("debounce_key IS NOT NULL"),
    postgresql_where=text("debounce_key IS NOT NULL"),
)
#: A limit key's RUNNING tasks, counted by PostgreSQL's triggers (a claim adds one
#: instead). SQLite keeps each key's count by its changes instead (migration 0021).
Index(
    "ix_tasks_key_running",
    tasks.c.queue,
    tasks.c.limit_key,
    postgresql_where=text("limit_key IS NOT NULL AND state = 'RUNNING'"),
).ddl_if(dialect="postgresql")
#: The indexes only PostgreSQL has (``ddl_if``), which Alembic's comparison of a SQLite
#: database with this metadata must leave out.
POSTGRES_ONLY_INDEXES = frozenset({"ix_tasks_key_running"})
Index("ix_tasks_state_name", tasks.c.state, tasks.c.name)
#: The dashboard's task list, newest first, one index per filter it walks
#: (``Console.find_tasks``; docs/dashboard.md says what each costs a busy worker).
Index("ix_tasks_created", tasks.c.created_at, tasks.c.id)
#: The failed, cancelled and retrying tasks only: a task that succeeds never enters it
#: (one on every state cost a busy worker 14 % of its throughput).
Index(
    "ix_tasks_state_created",
    tasks.c.state,
    tasks.c.created_at,
    tasks.c.id,
    sqlite_where=text(STATE_CREATED_SQL),
    postgresql_where=text(STATE_CREATED_SQL),
)
Index("ix_tasks_queue_created", tasks.c.queue, tasks.c.created_at, tasks.c.id)
Index("ix_tasks_name_created", tasks.c.name, tasks.c.created_at, tasks.c.id)
#: A key's tasks, whatever their state (the unique index holds the live ones only).
Index(
    "ix_tasks_key",
    tasks.c.idempotency_key,
    sqlite_where=text("idempotency_key IS NOT NULL"),
    postgresql_where=text("idempotency_key IS NOT NULL"),
)

task_events = Table(
    "task_events",
    metadata,
    Column("id", Id, primary_key=True),
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("at", Time, nullable=False),
    Column("state", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("detail", Text),
    #: A failed attempt's error (type, message, traceback), on the line that ended it.
    Column("error", Json),
    CheckConstraint(f"state IN ({ALL_STATES_SQL})", name="ck_task_events_state"),
)
Index("ix_task_events_task_id", task_events.c.task_id)
#: Metrics count the history of a recent window (docs/metrics.md) through this one.
Index("ix_task_events_at", task_events.c.at)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", Text, primary_key=True),
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("recorded_at", Time, nullable=False),
    Column("result", Json),
)
Index("ix_idempotency_keys_task_id", idempotency_keys.c.task_id)

#: On PostgreSQL, hands out task ids and ``tasks.seq`` (migration 0010: ``nextval``
#: holds no lock, where a counter row stayed locked until the submitter committed).
task_seq = Sequence("durablesched_task_seq", metadata=metadata)

#: The row ``task_seq`` allocates ``tasks.seq`` (and new ids) on SQLite, so that
#: neither is ever reused; the row ``instance`` is the database's identity.
counters = Table(
    "durablesched_counters",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", Id, nullable=False),
)

#: Tasks received by ``durablesched copy``: (source database's instance, its task id)
#: -> the task here, so that copying again never makes a second one.
copies = Table(
    "durablesched_copies",
    metadata,
    Column("source", Id, primary_key=True),
    Column("source_id", Id, primary_key=True),
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("copied_at", Time, nullable=False),
)
Index("ix_durablesched_copies_task_id", copies.c.task_id)

#: Every queue a task was submitted to, with the limits every worker obeys
#: (NULL: none). ``rate_count`` starts at most in any ``rate_seconds`` window.
queues = Table(
    "durablesched_queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("concurrency", Integer),
    Column("rate_count", Integer),
    Column("rate_seconds", Integer),
    Column("paused", Integer, nullable=False, server_default=text("0")),
    Column("updated_at", Time),
    #: At most this many RUNNING tasks per ``tasks.limit_key`` (NULL: no limit per key).
    Column("concurrency_per_key", Integer),
    #: At most ``rate_per_key_count`` starts of one limit key in any window of
    #: ``rate_per_key_seconds`` (both NULL: no rate per key).
    Column("rate_per_key_count", Integer),
    Column("rate_per_key_seconds", Integer),
    CheckConstraint("concurrency IS NULL OR concurrency >= 1", name="ck_queues_concurrency"),
    CheckConstraint(
        "concurrency_per_key IS NULL OR concurrency_per_key >= 1",
        name="ck_queues_concurrency_per_key",
    ),
    CheckConstraint(
        "(rate_per_key_count IS NULL AND rate_per_key_seconds IS NULL) OR "
        "(rate_per_key_count >= 1 AND rate_per_key_seconds >= 1)",
        name="ck_queues_rate_per_key",
    ),
    CheckConstraint(
        "(rate_count IS NULL AND rate_seconds IS NULL) OR (rate_count >= 1 AND rate_seconds >= 1)",
        name="ck_queues_rate",
    ),
)

#: When each attempt of a rate-limited queue started, as long as its window
#: remembers it: the claim counts these (other queues write nothing here).
queue_starts = Table(
    "durablesched_queue_starts",
    metadata,
    Column("queue", Text, nullable=False),
    Column("at", Time, nullable=False),
)
Index("ix_durablesched_queue_starts", queue_starts.c.queue, queue_starts.c.at)

#: The limit keys of queues with a concurrency per key that have a task RUNNING or
#: claimable, kept by the triggers of migration 0013 in every transaction that changes
#: such a task: how many RUNNING, and the head (the one claimable task the claim may
#: take; NULL while the key is at its limit or has none). Idle keys have no row.
limit_keys = Table(
    "durablesched_limit_keys",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("limit_key", Text, primary_key=True),
    Column("running", Integer, nullable=False),
    Column("head_id", Id),
    #: A key whose rate window is full: no head until this time (a claim then frees it).
    Column("blocked_until", Time),
)
Index("ix_durablesched_limit_keys_blocked", limit_keys.c.queue, limit_keys.c.blocked_until)

#: When each attempt of a limit key started, in queues with a rate per key, as long as
#: its window remembers it (two windows, as ``durablesched_queue_starts``).
key_starts = Table(
    "durablesched_key_starts",
    metadata,
    Column("queue", Text, nullable=False),
    Column("limit_key", Text, nullable=False),
    Column("at", Time, nullable=False),
)
Index(
    "ix_durablesched_key_starts",
    key_starts.c.queue,
    key_starts.c.limit_key,
    key_starts.c.at,
)

# -- schedules (docs/schedules.md) -----------------------------------------------------------

#: Periodic tasks by name: what makes their tasks, and when they fire next.
schedules = Table(
    "schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("task", Text, nullable=False),
    Column("args", Json, nullable=False),
    #: Exactly one of a cron expression (in ``timezone``) and ``every_seconds``.
    Column("cron", Text),
    Column("every_seconds", Id),
    Column("timezone", Text, nullable=False),
    Column("misfire", Text, nullable=False),
    Column("max_catch_up", Integer, nullable=False),
    Column("misfire_grace_seconds", Float, nullable=False),
    Column("overlap", Text, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    #: The queue and priority of its tasks (NULL: the defaults).
    Column("queue", Text),
    Column("priority", Integer),
    Column("status", Text, nullable=False),
    Column("origin", Text, nullable=False),
    Column("next_fire_at", Time, nullable=False),
    Column("created_at", Time, nullable=False),
    Column("updated_at", Time, nullable=False),
    CheckConstraint(
        "(cron IS NULL AND every_seconds > 0) OR (cron IS NOT NULL AND every_seconds IS NULL)",
        name="ck_schedules_cron_or_every",
    ),
    CheckConstraint("misfire IN ('skip', 'latest', 'all')", name="ck_schedules_misfire"),
    CheckConstraint("overlap IN ('skip', 'allow')", name="ck_schedules_overlap"),
    CheckConstraint(
        "status IN ('active', 'paused', 'removed from code')", name="ck_schedules_status"
    ),
    CheckConstraint("origin IN ('code', 'operator')", name="ck_schedules_origin"),
    CheckConstraint("priority BETWEEN -100 AND 100", name="ck_schedules_priority"),
)
#: A worker's step reads the active schedules due through this one: 10,000 schedules
#: cost one index probe between fires.
Index(
    "ix_schedules_next_fire",
    schedules.c.next_fire_at,
    sqlite_where=text("status = 'active'"),
    postgresql_where=text("status = 'active'"),
)

#: Every fire ever recorded: its primary key (schedule, fire time) is what makes a
#: fire time make one task however many workers try.
schedule_fires = Table(
    "schedule_fires",
    metadata,
    Column("schedule", Text, ForeignKey("schedules.name", ondelete="CASCADE"), primary_key=True),
    Column("fire_at", Time, primary_key=True),
    #: 'on time', 'catch-up' or 'run-now'.
    Column("kind", Text, nullable=False),
    #: The task it made (NULL: skipped, or the task was purged since).
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="SET NULL")),
    #: Why it made no task: 'overlap' (the previous fire's task was still live).
    Column("skipped", Text),
    Column("fired_at", Time, nullable=False),
    CheckConstraint("kind IN ('on time', 'catch-up', 'run-now')", name="ck_schedule_fires_kind"),
)
Index("ix_schedule_fires_task_id", schedule_fires.c.task_id)

# -- live workers (docs/api.md, "Live workers") ------------------------------------------------

#: Every worker process that registered, seen at its heartbeats: gone once not seen
#: for longer than its lease, deleted a day after that (WORKER_FORGET_AFTER).
workers = Table(
    "durablesched_workers",
    metadata,
    #: The worker's owner id, the one its claims carry in ``tasks.lease_owner``.
    Column("id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    #: JSON text: the queues served, each with its slots; NULL: every queue.
    Column("queues", Text),
    Column("concurrency", Integer, nullable=False),
    Column("version", Text, nullable=False),
    Column("started_at", Time, nullable=False),
    Column("last_seen", Time, nullable=False),
    Column("lease_seconds", Float, nullable=False),
    CheckConstraint("concurrency >= 1", name="ck_workers_concurrency"),
    CheckConstraint("lease_seconds > 0", name="ck_workers_lease"),
)

# -- attempt totals (docs/metrics.md) ------------------------------------------------------------

#: Ended attempts, counted in the transaction that records each outcome: monotonic totals
#: per queue, task name, outcome and duration bucket (``durablesched.totals``), each key
#: spread over a few ``shard`` rows so that concurrent writers rarely share one.
attempt_totals = Table(
    "durablesched_attempt_totals",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("outcome", Text, primary_key=True),
    Column("bucket", Integer, primary_key=True),
    Column("shard", Integer, primary_key=True),
    Column("attempts", Id, nullable=False),
    Column("duration_us", Id, nullable=False),
)

# -- workflows (docs/workflows.md) ---------------------------------------------------------------

#: A workflow step's checkpoint: its JSON result, recorded under the attempt's claim with
#: the step's effects; replay reads them by position. Deleted with the task (purge).
task_steps = Table(
    "task_steps",
    metadata,
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("name", Text, nullable=False),
    Column("result", Json),
    Column("recorded_at", Time, nullable=False),
    Column("attempt", Integer, nullable=False),
    CheckConstraint("position >= 0", name="ck_task_steps_position"),
)

#: Signals sent to a task (docs/workflows.md): kept until a wait takes one, oldest first;
#: ``consumed_position`` is the step of the wait that took it (each is taken once).
task_signals = Table(
    "task_signals",
    metadata,
    Column("id", Id, primary_key=True),
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("payload", Json),
    Column("sent_at", Time, nullable=False),
    Column("consumed_at", Time),
    Column("consumed_position", Integer),
)
Index("ix_task_signals_task", task_signals.c.task_id, task_signals.c.name, task_signals.c.id)

#: What a suspended workflow waits for, besides its due time: the signal whose arrival
#: makes it due at once. Replaced at each suspension, deleted with the task.
task_waits = Table(
    "task_waits",
    metadata,
    Column("task_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True),
    Column("signal", Text),
)

#: The children a workflow spawned (``ctx.spawn``), with the step that spawned each: a
#: child's end wakes its parent, in the child's own outcome transaction.
task_children = Table(
    "task_children",
    metadata,
    Column("child_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True),
    Column("parent_id", Id, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
)
Index("ix_task_children_parent", task_children.c.parent_id)
