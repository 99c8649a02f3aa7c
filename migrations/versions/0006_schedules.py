"""Schedules: periodic tasks, and the fires each made (one per schedule and fire time).

Self-contained: the two tables and their indexes, nothing else changes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Time = sa.Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
Json = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
Id = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("args", Json, nullable=False),
        sa.Column("cron", sa.Text),
        sa.Column("every_seconds", Id),
        sa.Column("timezone", sa.Text, nullable=False),
        sa.Column("misfire", sa.Text, nullable=False),
        sa.Column("max_catch_up", sa.Integer, nullable=False),
        sa.Column("misfire_grace_seconds", sa.Float, nullable=False),
        sa.Column("overlap", sa.Text, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("queue", sa.Text),
        sa.Column("priority", sa.Integer),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("origin", sa.Text, nullable=False),
        sa.Column("next_fire_at", Time, nullable=False),
        sa.Column("created_at", Time, nullable=False),
        sa.Column("updated_at", Time, nullable=False),
        sa.CheckConstraint(
            "(cron IS NULL AND every_seconds > 0) OR (cron IS NOT NULL AND every_seconds IS NULL)",
            name="ck_schedules_cron_or_every",
        ),
        sa.CheckConstraint("misfire IN ('skip', 'latest', 'all')", name="ck_schedules_misfire"),
        sa.CheckConstraint("overlap IN ('skip', 'allow')", name="ck_schedules_overlap"),
        sa.CheckConstraint(
            "status IN ('active', 'paused', 'removed from code')", name="ck_schedules_status"
        ),
        sa.CheckConstraint("origin IN ('code', 'operator')", name="ck_schedules_origin"),
        sa.CheckConstraint("priority BETWEEN -100 AND 100", name="ck_schedules_priority"),
    )
    op.create_index(
        "ix_schedules_next_fire",
        "schedules",
        ["next_fire_at"],
        sqlite_where=sa.text("status = 'active'"),
        postgresql_where=sa.text("status = 'active'"),
    )
    op.create_table(
        "schedule_fires",
        sa.Column(
            "schedule",
            sa.Text,
            sa.ForeignKey("schedules.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("fire_at", Time, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("task_id", Id, sa.ForeignKey("tasks.id", ondelete="SET NULL")),
        sa.Column("skipped", sa.Text),
        sa.Column("fired_at", Time, nullable=False),
        sa.CheckConstraint(
            "kind IN ('on time', 'catch-up', 'run-now')", name="ck_schedule_fires_kind"
        ),
    )
    op.create_index("ix_schedule_fires_task_id", "schedule_fires", ["task_id"])


def downgrade() -> None:
    op.drop_table("schedule_fires")
    op.drop_table("schedules")
