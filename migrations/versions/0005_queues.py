"""Named queues and priorities: every task in a queue (existing ones in "default",
priority 0), the queues' limits, the start times rate limits count, and the views
with the queue and priority.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

CLAIMABLE = "state IN ('PENDING', 'RETRY_WAIT')"
Time = sa.Text().with_variant(sa.dialects.postgresql.TIMESTAMP(timezone=True), "postgresql")

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
VIEWS = {
    "tasks_due": f"""
        SELECT id, name, state, attempts, due_at,
               round((julianday({SQLITE_NOW}) - julianday(due_at)) * 86400.0, 3) AS lag_seconds,
               queue, priority
        FROM tasks
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND due_at <= {SQLITE_NOW}
        ORDER BY due_at, seq""",
    "tasks_running": f"""
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round((julianday(lease_expires_at) - julianday({SQLITE_NOW})) * 86400.0, 3)
                   AS lease_left_seconds,
               cancel_requested_at, queue, priority
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at""",
    "tasks_failed": """
        SELECT id, name, attempts, finished_at,
               json_extract(last_error, '$.type') AS error_type,
               json_extract(last_error, '$.message') AS error_message,
               queue, priority
        FROM tasks WHERE state = 'FAILED'
        ORDER BY finished_at DESC""",
    "queue_states": """
        SELECT queue, state, count(*) AS tasks, min(due_at) AS earliest_due_at
        FROM tasks GROUP BY queue, state""",
}
POSTGRES_VIEWS = {
    "tasks_due": """
        SELECT id, name, state, attempts, due_at,
               round(EXTRACT(EPOCH FROM (now() - due_at)), 3) AS lag_seconds,
               queue, priority
        FROM tasks
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND due_at <= now()
        ORDER BY due_at, seq""",
    "tasks_running": """
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round(EXTRACT(EPOCH FROM (lease_expires_at - now())), 3) AS lease_left_seconds,
               cancel_requested_at, queue, priority
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at""",
    "tasks_failed": """
        SELECT id, name, attempts, finished_at,
               last_error->>'type' AS error_type,
               last_error->>'message' AS error_message,
               queue, priority
        FROM tasks WHERE state = 'FAILED'
        ORDER BY finished_at DESC""",
    "queue_states": VIEWS["queue_states"],
}


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    for name in ("tasks_due", "tasks_running", "tasks_failed"):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    # Plain ADD COLUMN (both databases take a CHECK on it): SQLite does not rebuild
    # the table, so a large queue upgrades in moments.
    op.execute("ALTER TABLE tasks ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'")
    op.execute(
        "ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 "
        "CONSTRAINT ck_tasks_priority CHECK (priority BETWEEN -100 AND 100)"
    )
    op.create_index(
        "ix_tasks_queue_claimable",
        "tasks",
        ["queue", sa.text("priority DESC"), "due_at", "seq"],
        sqlite_where=sa.text(CLAIMABLE),
        postgresql_where=sa.text(CLAIMABLE),
    )
    op.create_table(
        "durablesched_queues",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("concurrency", sa.Integer),
        sa.Column("rate_count", sa.Integer),
        sa.Column("rate_seconds", sa.Integer),
        sa.Column("paused", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("updated_at", Time),
        sa.CheckConstraint("concurrency IS NULL OR concurrency >= 1", name="ck_queues_concurrency"),
        sa.CheckConstraint(
            "(rate_count IS NULL AND rate_seconds IS NULL) OR "
            "(rate_count >= 1 AND rate_seconds >= 1)",
            name="ck_queues_rate",
        ),
    )
    op.execute("INSERT INTO durablesched_queues (name) VALUES ('default')")
    op.create_table(
        "durablesched_queue_starts",
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("at", Time, nullable=False),
    )
    op.create_index("ix_durablesched_queue_starts", "durablesched_queue_starts", ["queue", "at"])
    for name, select in (POSTGRES_VIEWS if _postgres() else VIEWS).items():
        op.execute(f"CREATE VIEW {name} AS {select}")


def downgrade() -> None:
    raise NotImplementedError(
        "0005 (named queues) has no downgrade: tasks in other queues than 'default' "
        "would lose their queue; restore a backup taken before the upgrade instead"
    )
