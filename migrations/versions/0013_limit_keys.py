"""Limits per key: ``tasks.limit_key``, each key's head, and the triggers that keep it;
and debouncing: ``tasks.debounce_key`` (one task per key, given up when it starts).

A queue with a concurrency per key lets at most that many tasks of one
``limit_key`` run at once. Each key with a claimable task has at most one *head*
(``durablesched_limit_keys.head_id``): the claimable task of the key that the claim
may take, chosen while the key has fewer than its limit RUNNING; every other
claimable task of the key has ``key_waiting = 1``, which keeps it out of the claim's
index (``ix_tasks_queue_claimable`` now leads with ``(queue, key_waiting)``). A
busy key's backlog is therefore never walked by a claim.

The head is kept by triggers on ``tasks``, in the transaction of every change of a
keyed task's state, due time, priority or queue (submit, claim, outcome, reclaim,
operator actions, move, purge): whichever code path makes it. Rows without a
``limit_key`` fire nothing (the triggers' ``WHEN``). On PostgreSQL the trigger first
takes the queue's row (``FOR UPDATE``), the lock a claim of a limited queue takes
before it picks a row: per-key bookkeeping of one queue is one step at a time, and
a claim never waits for a task row while holding it (the head is taken with
``SKIP LOCKED``; the only task rows updated are the head and the changed row).

A head is *sticky*: it stays the head until it stops being claimable (claimed,
cancelled, moved); a task submitted later with an earlier due time waits behind it.
When the head goes, the next is the key's claimable task first by (due_at,
priority desc, seq).

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None

Id = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

CLAIMABLE = "state IN ('PENDING', 'RETRY_WAIT')"
#: The cap per key of a queue with a rate per key only (``queues.KEY_CAP_UNLIMITED``).
UNLIMITED = 2**31 - 1
CAP = (
    f"COALESCE(concurrency_per_key, CASE WHEN rate_per_key_count IS NOT NULL THEN {UNLIMITED} END)"
)


def _sqlite_sync(q: str, k: str, changed: str) -> str:
    """The statements that bring key (``q``, ``k``) up to date after task ``changed``
    (an SQL expression, NULL for none) changed, as a SQLite trigger body.

    No ``INSERT OR IGNORE`` in it: the statement that fires a trigger imposes its own
    conflict algorithm on the trigger's statements, and a debounced submit's upsert
    (ABORT) made the key's second insert fail."""
    key = f"queue = {q} AND limit_key = {k}"
    cap = (
        "(SELECT COALESCE(concurrency_per_key, CASE WHEN rate_per_key_count IS NOT NULL "
        f"THEN {UNLIMITED} END) FROM durablesched_queues WHERE name = {q})"
    )
    head = f"(SELECT head_id FROM durablesched_limit_keys WHERE {key})"
    return f"""
        INSERT INTO durablesched_limit_keys (queue, limit_key, running, head_id)
            SELECT {q}, {k}, 0, NULL WHERE {cap} IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM durablesched_limit_keys WHERE {key});
        UPDATE durablesched_limit_keys SET running =
            (SELECT count(*) FROM tasks WHERE {key} AND state = 'RUNNING') WHERE {key};
        UPDATE durablesched_limit_keys SET head_id = NULL WHERE {key} AND head_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM tasks WHERE id = head_id AND {CLAIMABLE}
                            AND key_waiting = 0 AND {key});
        UPDATE durablesched_limit_keys SET head_id = (SELECT id FROM tasks WHERE {key}
            AND limit_key IS NOT NULL AND {CLAIMABLE} ORDER BY due_at, priority DESC, seq LIMIT 1)
            WHERE {key} AND head_id IS NULL AND blocked_until IS NULL AND running < {cap};
        UPDATE tasks SET key_waiting = 0 WHERE id = {head} AND key_waiting = 1;
        UPDATE tasks SET key_waiting = 1 WHERE id = {changed} AND key_waiting = 0
            AND {CLAIMABLE} AND id IS NOT {head} AND {cap} IS NOT NULL;
        DELETE FROM durablesched_limit_keys WHERE {key} AND running = 0 AND head_id IS NULL
            AND blocked_until IS NULL;"""


SQLITE_TRIGGERS = {
    "durablesched_limit_key_insert": (
        "AFTER INSERT ON tasks WHEN NEW.limit_key IS NOT NULL",
        _sqlite_sync("NEW.queue", "NEW.limit_key", "NEW.id"),
    ),
    "durablesched_limit_key_update": (
        "AFTER UPDATE OF state, due_at, priority, queue ON tasks WHEN NEW.limit_key IS NOT NULL",
        _sqlite_sync("NEW.queue", "NEW.limit_key", "NEW.id"),
    ),
    "durablesched_limit_key_leave": (
        "AFTER UPDATE OF queue ON tasks "
        "WHEN OLD.limit_key IS NOT NULL AND OLD.queue IS NOT NEW.queue",
        _sqlite_sync("OLD.queue", "OLD.limit_key", "NULL"),
    ),
    "durablesched_limit_key_delete": (
        "AFTER DELETE ON tasks WHEN OLD.limit_key IS NOT NULL",
        _sqlite_sync("OLD.queue", "OLD.limit_key", "NULL"),
    ),
}

PG_FUNCTIONS = f"""
CREATE FUNCTION durablesched_limit_key_sync(q text, k text, changed bigint) RETURNS void
LANGUAGE plpgsql AS $body$
DECLARE
    cap integer;
    n integer;
    head bigint;
    blocked timestamptz;
BEGIN
    -- Keys of a queue without a limit per key cost no lock.
    SELECT {CAP} INTO cap FROM durablesched_queues WHERE name = q;
    IF cap IS NULL THEN
        RETURN;
    END IF;
    -- The queue's row: the lock a claim of the queue takes before it picks rows.
    SELECT {CAP} INTO cap FROM durablesched_queues WHERE name = q FOR UPDATE;
    IF cap IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM tasks
        WHERE queue = q AND limit_key = k AND state = 'RUNNING';
    SELECT head_id, blocked_until INTO head, blocked
        FROM durablesched_limit_keys WHERE queue = q AND limit_key = k;
    IF head IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM tasks WHERE id = head AND queue = q AND limit_key = k
            AND {CLAIMABLE} AND key_waiting = 0) THEN
        head := NULL;
    END IF;
    IF head IS NULL AND blocked IS NULL AND n < cap THEN
        SELECT id INTO head FROM tasks
            WHERE queue = q AND limit_key = k AND limit_key IS NOT NULL AND {CLAIMABLE}
            ORDER BY due_at, priority DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF head IS NOT NULL THEN
            UPDATE tasks SET key_waiting = 0 WHERE id = head AND key_waiting = 1;
        END IF;
    END IF;
    IF changed IS NOT NULL AND changed IS DISTINCT FROM head THEN
        UPDATE tasks SET key_waiting = 1
            WHERE id = changed AND key_waiting = 0 AND {CLAIMABLE};
    END IF;
    IF n = 0 AND head IS NULL AND blocked IS NULL THEN
        DELETE FROM durablesched_limit_keys WHERE queue = q AND limit_key = k;
    ELSE
        INSERT INTO durablesched_limit_keys (queue, limit_key, running, head_id)
            VALUES (q, k, n, head)
            ON CONFLICT (queue, limit_key)
            DO UPDATE SET running = excluded.running, head_id = excluded.head_id;
    END IF;
END
$body$;

CREATE FUNCTION durablesched_limit_key_trigger() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM durablesched_limit_key_sync(OLD.queue, OLD.limit_key, NULL);
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.queue IS DISTINCT FROM NEW.queue THEN
        PERFORM durablesched_limit_key_sync(OLD.queue, OLD.limit_key, NULL);
    END IF;
    PERFORM durablesched_limit_key_sync(NEW.queue, NEW.limit_key, NEW.id);
    RETURN NULL;
END
$body$;
"""

PG_TRIGGERS = [
    "CREATE TRIGGER durablesched_limit_key_insert AFTER INSERT ON tasks FOR EACH ROW "
    "WHEN (NEW.limit_key IS NOT NULL) EXECUTE FUNCTION durablesched_limit_key_trigger()",
    "CREATE TRIGGER durablesched_limit_key_update AFTER UPDATE OF state, due_at, priority, "
    "queue ON tasks FOR EACH ROW WHEN (NEW.limit_key IS NOT NULL) "
    "EXECUTE FUNCTION durablesched_limit_key_trigger()",
    "CREATE TRIGGER durablesched_limit_key_delete AFTER DELETE ON tasks FOR EACH ROW "
    "WHEN (OLD.limit_key IS NOT NULL) EXECUTE FUNCTION durablesched_limit_key_trigger()",
]


#: A debounced task that leaves PENDING (starts, is cancelled) gives up its debounce key:
#: the next submit with the key makes a new task.
SQLITE_DEBOUNCE = (
    "CREATE TRIGGER durablesched_debounce_started AFTER UPDATE OF state ON tasks "
    "WHEN NEW.debounce_key IS NOT NULL AND NEW.state <> 'PENDING' "
    "BEGIN UPDATE tasks SET debounce_key = NULL WHERE id = NEW.id; END"
)
PG_DEBOUNCE = """
CREATE FUNCTION durablesched_debounce_started() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    NEW.debounce_key := NULL;
    RETURN NEW;
END
$body$;
CREATE TRIGGER durablesched_debounce_started BEFORE UPDATE OF state ON tasks FOR EACH ROW
    WHEN (NEW.debounce_key IS NOT NULL AND NEW.state <> 'PENDING')
    EXECUTE FUNCTION durablesched_debounce_started();
"""


#: For people: every live limit key of a queue with limits per key, busiest first.
LIMIT_KEYS_VIEW = f"""
    CREATE VIEW queue_limit_keys AS
    SELECT k.queue, k.limit_key, k.running,
           (SELECT count(*) FROM tasks t
            WHERE t.queue = k.queue AND t.limit_key = k.limit_key AND t.{CLAIMABLE}) AS waiting,
           q.concurrency_per_key,
           CASE WHEN q.rate_per_key_count IS NULL THEN NULL
                ELSE q.rate_per_key_count || '/' || q.rate_per_key_seconds || 's' END
               AS rate_per_key,
           CASE WHEN k.running >= q.concurrency_per_key OR k.blocked_until IS NOT NULL
                THEN 1 ELSE 0 END AS at_limit,
           k.head_id, k.blocked_until
    FROM durablesched_limit_keys k JOIN durablesched_queues q ON q.name = k.queue
    ORDER BY k.queue, k.running DESC, k.limit_key"""


def upgrade() -> None:
    op.add_column("tasks", sa.Column("limit_key", sa.Text()))
    op.add_column(
        "tasks", sa.Column("key_waiting", sa.Integer(), nullable=False, server_default="0")
    )
    time = sa.Text().with_variant(sa.TIMESTAMP(timezone=True), "postgresql")
    op.add_column("tasks", sa.Column("debounce_key", sa.Text()))
    op.add_column("tasks", sa.Column("debounce_until", time))
    op.create_index(
        "ux_tasks_debounce_key",
        "tasks",
        ["debounce_key"],
        unique=True,
        sqlite_where=sa.text("debounce_key IS NOT NULL"),
        postgresql_where=sa.text("debounce_key IS NOT NULL"),
    )
    with op.batch_alter_table("durablesched_queues") as batch:
        batch.add_column(sa.Column("concurrency_per_key", sa.Integer()))
        batch.add_column(sa.Column("rate_per_key_count", sa.Integer()))
        batch.add_column(sa.Column("rate_per_key_seconds", sa.Integer()))
        batch.create_check_constraint(
            "ck_queues_concurrency_per_key",
            "concurrency_per_key IS NULL OR concurrency_per_key >= 1",
        )
        batch.create_check_constraint(
            "ck_queues_rate_per_key",
            "(rate_per_key_count IS NULL AND rate_per_key_seconds IS NULL) OR "
            "(rate_per_key_count >= 1 AND rate_per_key_seconds >= 1)",
        )
    op.create_table(
        "durablesched_limit_keys",
        sa.Column("queue", sa.Text(), primary_key=True),
        sa.Column("limit_key", sa.Text(), primary_key=True),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("head_id", Id),
        sa.Column("blocked_until", time),
    )
    op.create_index(
        "ix_durablesched_limit_keys_blocked",
        "durablesched_limit_keys",
        ["queue", "blocked_until"],
    )
    op.create_table(
        "durablesched_key_starts",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("limit_key", sa.Text(), nullable=False),
        sa.Column("at", time, nullable=False),
    )
    op.create_index(
        "ix_durablesched_key_starts", "durablesched_key_starts", ["queue", "limit_key", "at"]
    )
    op.drop_index("ix_tasks_queue_claimable", table_name="tasks")
    _claimable_index(
        "ix_tasks_queue_claimable",
        ["queue", "key_waiting", sa.text("priority DESC"), "due_at", "seq"],
        CLAIMABLE,
    )
    _claimable_index(
        "ix_tasks_key_claimable",
        ["queue", "limit_key", "due_at", sa.text("priority DESC"), "seq"],
        f"limit_key IS NOT NULL AND {CLAIMABLE}",
    )
    _claimable_index(
        "ix_tasks_key_running",
        ["queue", "limit_key"],
        "limit_key IS NOT NULL AND state = 'RUNNING'",
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTIONS)
        for trigger in PG_TRIGGERS:
            op.execute(trigger)
        op.execute(PG_DEBOUNCE)
    else:
        for name, (when, body) in SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {when} BEGIN {body}\n    END")
        op.execute(SQLITE_DEBOUNCE)
    op.execute(LIMIT_KEYS_VIEW)


def _claimable_index(name: str, columns: list[str | sa.TextClause], where: str) -> None:
    op.create_index(
        name,
        "tasks",
        columns,
        sqlite_where=sa.text(where),
        postgresql_where=sa.text(where),
    )


def downgrade() -> None:
    op.execute("DROP VIEW queue_limit_keys")
    if op.get_bind().dialect.name == "postgresql":
        for name in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER durablesched_limit_key_{name} ON tasks")
        op.execute("DROP FUNCTION durablesched_limit_key_trigger()")
        op.execute("DROP FUNCTION durablesched_limit_key_sync(text, text, bigint)")
        op.execute("DROP TRIGGER durablesched_debounce_started ON tasks")
        op.execute("DROP FUNCTION durablesched_debounce_started()")
    else:
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER {name}")
        op.execute("DROP TRIGGER durablesched_debounce_started")
    op.drop_index("ux_tasks_debounce_key", table_name="tasks")
    op.drop_index("ix_tasks_key_running", table_name="tasks")
    op.drop_index("ix_tasks_key_claimable", table_name="tasks")
    op.drop_index("ix_tasks_queue_claimable", table_name="tasks")
    _claimable_index(
        "ix_tasks_queue_claimable", ["queue", sa.text("priority DESC"), "due_at", "seq"], CLAIMABLE
    )
    op.drop_table("durablesched_key_starts")
    op.drop_table("durablesched_limit_keys")
    with op.batch_alter_table("durablesched_queues") as batch:
        batch.drop_constraint("ck_queues_concurrency_per_key", type_="check")
        batch.drop_constraint("ck_queues_rate_per_key", type_="check")
        batch.drop_column("concurrency_per_key")
        batch.drop_column("rate_per_key_count")
        batch.drop_column("rate_per_key_seconds")
    # Plain DROP COLUMN (SQLite 3.35+ too): a batch would rebuild tasks, and SQLite
    # refuses to rename the rebuilt table under the views that read it.
    for column in ("key_waiting", "debounce_until", "debounce_key", "limit_key"):
        op.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
