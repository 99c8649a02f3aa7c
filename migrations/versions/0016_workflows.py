"""Workflows: step checkpoints, signals and what a suspended workflow waits for
(docs/workflows.md), and the children workflows spawn.

Self-contained: new tables, empty, their rows deleted with their task.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

Time = sa.Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
Json = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
Id = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


#: The views docs/sql.md documents: the same SQL on both databases.
VIEWS = {
    "workflow_steps": (
        "SELECT s.task_id, t.name AS task, s.position, s.name AS step, "
        "length(CAST(s.result AS TEXT)) AS result_size, s.recorded_at, s.attempt "
        "FROM task_steps s JOIN tasks t ON t.id = s.task_id"
    ),
    "workflow_signals": (
        "SELECT g.id, g.task_id, t.name AS task, g.name AS signal, g.sent_at, "
        "g.consumed_at AS taken_at, g.consumed_position AS taken_by_step "
        "FROM task_signals g JOIN tasks t ON t.id = g.task_id"
    ),
}


def upgrade() -> None:
    op.create_table(
        "task_steps",
        sa.Column(
            "task_id",
            Id,
            sa.ForeignKey("tasks.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("result", Json),
        sa.Column("recorded_at", Time, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.CheckConstraint("position >= 0", name="ck_task_steps_position"),
    )
    op.create_table(
        "task_signals",
        sa.Column("id", Id, primary_key=True),
        sa.Column("task_id", Id, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("payload", Json),
        sa.Column("sent_at", Time, nullable=False),
        sa.Column("consumed_at", Time),
        sa.Column("consumed_position", sa.Integer()),
    )
    op.create_index("ix_task_signals_task", "task_signals", ["task_id", "name", "id"])
    op.create_table(
        "task_waits",
        sa.Column("task_id", Id, sa.ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("signal", sa.Text()),
    )
    op.create_table(
        "task_children",
        sa.Column("child_id", Id, sa.ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("parent_id", Id, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
    )
    op.create_index("ix_task_children_parent", "task_children", ["parent_id"])
    for name, select in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {select}")


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index("ix_task_children_parent", table_name="task_children")
    op.drop_table("task_children")
    op.drop_table("task_waits")
    op.drop_index("ix_task_signals_task", table_name="task_signals")
    op.drop_table("task_signals")
    op.drop_table("task_steps")
