"""What `durablesched copy` moved in: one row per task received from another database.

Also gives every database a random identity (the counter row 'instance'),
so that a copy names its source the same way however its URL is spelled.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIME = sa.Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
ID = sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "durablesched_copies",
        sa.Column("source", ID, primary_key=True),
        sa.Column("source_id", ID, primary_key=True),
        sa.Column("task_id", ID, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("copied_at", TIME, nullable=False),
    )
    op.create_index("ix_durablesched_copies_task_id", "durablesched_copies", ["task_id"])
    counters = sa.table("durablesched_counters", sa.column("name"), sa.column("value"))
    op.execute(counters.insert().values(name="instance", value=secrets.randbelow(2**62) + 1))


def downgrade() -> None:
    op.execute("DELETE FROM durablesched_counters WHERE name = 'instance'")
    op.drop_index("ix_durablesched_copies_task_id", "durablesched_copies")
    op.drop_table("durablesched_copies")
