"""Live workers: a row per worker process (seen at its heartbeats), the ``workers``
view, and an index on the history's times that metrics count over.

Self-contained: one table, one view, one index; no existing row changes.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

Time = sa.Text().with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
#: Each worker with how long ago it was seen and whether that is within its lease.
VIEW = f"""
    SELECT id, host, pid, queues, concurrency, version, started_at, last_seen,
           lease_seconds,
           round((julianday({SQLITE_NOW}) - julianday(last_seen)) * 86400.0, 3)
               AS seen_seconds_ago,
           CASE WHEN (julianday({SQLITE_NOW}) - julianday(last_seen)) * 86400.0
                     <= lease_seconds THEN 'alive' ELSE 'gone' END AS state
    FROM durablesched_workers
    ORDER BY started_at, id"""
POSTGRES_VIEW = """
    SELECT id, host, pid, queues, concurrency, version, started_at, last_seen,
           lease_seconds,
           round(EXTRACT(EPOCH FROM (now() - last_seen)), 3) AS seen_seconds_ago,
           CASE WHEN EXTRACT(EPOCH FROM (now() - last_seen)) <= lease_seconds
                THEN 'alive' ELSE 'gone' END AS state
    FROM durablesched_workers
    ORDER BY started_at, id"""


def upgrade() -> None:
    op.create_table(
        "durablesched_workers",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("queues", sa.Text),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("started_at", Time, nullable=False),
        sa.Column("last_seen", Time, nullable=False),
        sa.Column("lease_seconds", sa.Float, nullable=False),
        sa.CheckConstraint("concurrency >= 1", name="ck_workers_concurrency"),
        sa.CheckConstraint("lease_seconds > 0", name="ck_workers_lease"),
    )
    op.create_index("ix_task_events_at", "task_events", ["at"])
    view = POSTGRES_VIEW if op.get_bind().dialect.name == "postgresql" else VIEW
    op.execute(f"CREATE VIEW workers AS {view}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS workers")
    op.drop_index("ix_task_events_at", "task_events")
    op.drop_table("durablesched_workers")
