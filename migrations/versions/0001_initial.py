"""The first schema: tasks, their events, idempotency keys, counters.

SQLite stores times and JSON as TEXT; PostgreSQL as timestamptz and jsonb,
with bigint ids.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATES = "'CANCELLED', 'FAILED', 'PENDING', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED'"
CLAIMABLE = "state IN ('PENDING', 'RETRY_WAIT')"
KEY_HOLDING = "state IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'SUCCEEDED')"

TIME = sa.Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
ID = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", ID, primary_key=True, autoincrement=False),
        sa.Column("seq", ID, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("args", JSON, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("due_at", TIME, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", TIME),
        sa.Column("fence", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("cancel_requested_at", TIME),
        sa.Column("result", JSON),
        sa.Column("last_error", JSON),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("finished_at", TIME),
        sa.CheckConstraint(f"state IN ({STATES})", name="ck_tasks_state"),
        sa.CheckConstraint("max_attempts >= 1", name="ck_tasks_max_attempts"),
        sa.CheckConstraint("attempts >= 0", name="ck_tasks_attempts"),
    )
    op.create_index(
        "ix_tasks_claimable",
        "tasks",
        ["due_at", "seq"],
        sqlite_where=sa.text(CLAIMABLE),
        postgresql_where=sa.text(CLAIMABLE),
    )
    op.create_index(
        "ix_tasks_running_lease",
        "tasks",
        ["lease_expires_at"],
        sqlite_where=sa.text("state = 'RUNNING'"),
        postgresql_where=sa.text("state = 'RUNNING'"),
    )
    op.create_index(
        "ux_tasks_idempotency_key",
        "tasks",
        ["idempotency_key"],
        unique=True,
        sqlite_where=sa.text(f"idempotency_key IS NOT NULL AND {KEY_HOLDING}"),
        postgresql_where=sa.text(f"idempotency_key IS NOT NULL AND {KEY_HOLDING}"),
    )
    op.create_index("ix_tasks_state_name", "tasks", ["state", "name"])

    op.create_table(
        "task_events",
        sa.Column("id", ID, primary_key=True),
        sa.Column(
            "task_id",
            ID,
            sa.ForeignKey("tasks.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("at", TIME, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("detail", sa.Text),
        sa.CheckConstraint(f"state IN ({STATES})", name="ck_task_events_state"),
    )
    op.create_index("ix_task_events_task_id", "task_events", ["task_id"])

    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column(
            "task_id",
            ID,
            sa.ForeignKey("tasks.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.Column("result", JSON),
    )
    op.create_index("ix_idempotency_keys_task_id", "idempotency_keys", ["task_id"])

    counters = op.create_table(
        "durablesched_counters",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", ID, nullable=False),
    )
    op.bulk_insert(counters, [{"name": "task_seq", "value": 0}])


def downgrade() -> None:
    op.drop_table("durablesched_counters")
    op.drop_index("ix_idempotency_keys_task_id", "idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_index("ix_task_events_task_id", "task_events")
    op.drop_table("task_events")
    op.drop_index("ix_tasks_state_name", "tasks")
    op.drop_index("ux_tasks_idempotency_key", "tasks")
    op.drop_index("ix_tasks_running_lease", "tasks")
    op.drop_index("ix_tasks_claimable", "tasks")
    op.drop_table("tasks")
