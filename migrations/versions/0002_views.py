"""Views for people inspecting the queue with plain SQL.

Views are for reading by people: they use the database's own clock for "now"
and lags. The library itself never reads them; it binds time from its clock.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"

VIEWS = {
    "queue_summary": """
        SELECT state,
               count(*) AS tasks,
               min(due_at) AS earliest_due_at,
               max(updated_at) AS last_change_at
        FROM tasks GROUP BY state""",
    "tasks_due": f"""
        SELECT id, name, state, attempts, due_at,
               round((julianday({NOW}) - julianday(due_at)) * 86400.0, 3) AS lag_seconds
        FROM tasks
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND due_at <= {NOW}
        ORDER BY due_at, seq""",
    "tasks_running": f"""
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round((julianday(lease_expires_at) - julianday({NOW})) * 86400.0, 3)
                   AS lease_left_seconds,
               cancel_requested_at
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at""",
    "tasks_failed": """
        SELECT id, name, attempts, finished_at,
               json_extract(last_error, '$.type') AS error_type,
               json_extract(last_error, '$.message') AS error_message
        FROM tasks WHERE state = 'FAILED'
        ORDER BY finished_at DESC""",
}

#: The same views on PostgreSQL: timestamptz arithmetic and jsonb operators.
POSTGRES_VIEWS = {
    "queue_summary": VIEWS["queue_summary"],
    "tasks_due": """
        SELECT id, name, state, attempts, due_at,
               round(EXTRACT(EPOCH FROM (now() - due_at)), 3) AS lag_seconds
        FROM tasks
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND due_at <= now()
        ORDER BY due_at, seq""",
    "tasks_running": """
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round(EXTRACT(EPOCH FROM (lease_expires_at - now())), 3) AS lease_left_seconds,
               cancel_requested_at
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at""",
    "tasks_failed": """
        SELECT id, name, attempts, finished_at,
               last_error->>'type' AS error_type,
               last_error->>'message' AS error_message
        FROM tasks WHERE state = 'FAILED'
        ORDER BY finished_at DESC""",
}


def _views() -> dict[str, str]:
    return POSTGRES_VIEWS if op.get_bind().dialect.name == "postgresql" else VIEWS


def upgrade() -> None:
    for name, select in _views().items():
        op.execute(f"CREATE VIEW {name} AS {select}")


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {name}")
