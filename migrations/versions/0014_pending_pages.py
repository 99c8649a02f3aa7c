"""The task list's PENDING pages through an index: ``ix_tasks_state_created`` holds
PENDING tasks too, so that the last page of ``/tasks?state=PENDING`` costs what its
first does (it walked the whole list's order to its end before).

Self-contained: one index dropped and made again with a wider WHERE; no table or row
changes. docs/dashboard.md ("What the indexes cost") says what it costs a worker.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

COLUMNS = ["state", "created_at", "id"]
#: Every state but RUNNING (found through ix_tasks_running_lease) and SUCCEEDED (most
#: tasks: the list walks ix_tasks_created for them, and a success never writes this one).
WIDER = "state IN ('CANCELLED', 'FAILED', 'PENDING', 'RETRY_WAIT')"
#: What 0009 made.
GONE_WRONG = "state IN ('CANCELLED', 'FAILED', 'RETRY_WAIT')"


def _index(where: str) -> None:
    op.drop_index("ix_tasks_state_created", "tasks")
    op.create_index(
        "ix_tasks_state_created",
        "tasks",
        COLUMNS,
        sqlite_where=sa.text(where),
        postgresql_where=sa.text(where),
    )


def upgrade() -> None:
    _index(WIDER)


def downgrade() -> None:
    _index(GONE_WRONG)
