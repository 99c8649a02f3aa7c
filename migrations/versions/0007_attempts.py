"""Attempts: each failed attempt's error on the history line that ends it, and a view
of every attempt (``durablesched_attempts``, docs/sql.md).

``task_events.error`` (JSON: type, message, traceback) is written on the
RETRY_WAIT or FAILED line that ends a failed attempt, in the statement that
already wrote that line: nothing more is written on a success. Lines written
before this revision have none (their message stays in ``detail``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Json = sa.Text().with_variant(postgresql.JSONB(), "postgresql")


def _attempts(position: str, error_type: str, error_message: str) -> str:
    """Each claim (a RUNNING line) with the line after it, which says how it ended."""
    return f"""
        SELECT a.task_id, t.name, a.attempt,
               substr(a.detail, 12, {position} - 12) AS worker,
               a.at AS started_at,
               a.next_at AS finished_at,
               CASE a.next_state
                   WHEN 'SUCCEEDED' THEN 'SUCCEEDED'
                   WHEN 'RETRY_WAIT' THEN 'FAILED'
                   WHEN 'FAILED' THEN 'FAILED'
                   WHEN 'CANCELLED' THEN 'CANCELLED'
                   WHEN 'PENDING' THEN 'RELEASED'
               END AS outcome,
               {error_type} AS error_type,
               {error_message} AS error_message
        FROM (SELECT id, task_id, at, state, attempt, detail,
                     lead(state) OVER w AS next_state,
                     lead(at) OVER w AS next_at,
                     lead(error) OVER w AS next_error
              FROM task_events WINDOW w AS (PARTITION BY task_id ORDER BY id)) AS a
        JOIN tasks AS t ON t.id = a.task_id
        WHERE a.state = 'RUNNING'"""


SQLITE_VIEW = _attempts(
    "instr(a.detail, ' from queue ')",
    "json_extract(a.next_error, '$.type')",
    "json_extract(a.next_error, '$.message')",
)
POSTGRES_VIEW = _attempts(
    "strpos(a.detail, ' from queue ')",
    "a.next_error->>'type'",
    "a.next_error->>'message'",
)


def upgrade() -> None:
    op.add_column("task_events", sa.Column("error", Json))
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(f"CREATE VIEW durablesched_attempts AS {POSTGRES_VIEW if postgres else SQLITE_VIEW}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS durablesched_attempts")
    with op.batch_alter_table("task_events") as batch:
        batch.drop_column("error")
