"""Workflows: step checkpoints (docs/workflows.md).

Self-contained: one new table, empty, its rows deleted with their task.

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0011"
branch_labels = None
depends_on = None

Time = sa.Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
Json = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
Id = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


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


def downgrade() -> None:
    op.drop_table("task_steps")
