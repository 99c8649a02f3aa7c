"""Where a running attempt runs: NULL (a worker thread) or 'process' (a child process).

`cancel` answers ENFORCED for a task whose attempt runs in a process and
REQUESTED for one in a thread (docs/execution.md).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("environment", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("environment")
