"""Attempt totals: monotonic counts of ended attempts, kept in each outcome's transaction.

Self-contained: one new table, empty (what ended before this revision is not
counted: Prometheus counters start from zero, as after any restart). The
metrics read it instead of counting the history (docs/metrics.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

Count = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "durablesched_attempt_totals",
        sa.Column("queue", sa.Text(), primary_key=True),
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("outcome", sa.Text(), primary_key=True),
        sa.Column("bucket", sa.Integer(), primary_key=True),
        sa.Column("shard", sa.Integer(), primary_key=True),
        sa.Column("attempts", Count, nullable=False),
        sa.Column("duration_us", Count, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("durablesched_attempt_totals")
