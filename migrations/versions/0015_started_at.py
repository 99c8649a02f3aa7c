"""When a task's attempt really started: tasks.started_at, NULL while it waits claimed ahead.

A worker that claims ahead (``Worker(ahead=)``) holds tasks RUNNING under its
lease before their attempts start; ``started_at`` tells them apart: set by a
claim into a free slot (to the claim's time), NULL for a claim ahead until the
worker records the start (with the outcomes of its next group commit). The
``tasks_running`` view gains ``started_at`` and ``phase`` ('waiting' or
'started'), the ``workers`` view ``running`` and ``claimed_ahead``. Tasks
RUNNING at the upgrade were claimed by older workers, which start what they
claim: their ``started_at`` is their ``updated_at``. A plain
ADD COLUMN: neither database rewrites the table.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
PHASE = "CASE WHEN started_at IS NULL THEN 'waiting' ELSE 'started' END AS phase"
SQLITE_RUNNING = f"""
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round((julianday(lease_expires_at) - julianday({SQLITE_NOW})) * 86400.0, 3)
                   AS lease_left_seconds,
               cancel_requested_at, queue, priority, started_at, {PHASE}
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at"""
POSTGRES_RUNNING = f"""
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round(EXTRACT(EPOCH FROM (lease_expires_at - now())), 3) AS lease_left_seconds,
               cancel_requested_at, queue, priority, started_at, {PHASE}
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at"""
#: 0005's view, for the downgrade.
SQLITE_BEFORE = f"""
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round((julianday(lease_expires_at) - julianday({SQLITE_NOW})) * 86400.0, 3)
                   AS lease_left_seconds,
               cancel_requested_at, queue, priority
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at"""
POSTGRES_BEFORE = """
        SELECT id, name, attempts AS attempt, lease_owner, lease_expires_at,
               round(EXTRACT(EPOCH FROM (lease_expires_at - now())), 3) AS lease_left_seconds,
               cancel_requested_at, queue, priority
        FROM tasks WHERE state = 'RUNNING'
        ORDER BY lease_expires_at"""


#: The workers view (0008's) with what each holds: started, and claimed ahead.
HELD = """,
           (SELECT count(*) FROM tasks t WHERE t.state = 'RUNNING'
                AND t.lease_owner = durablesched_workers.id AND t.started_at IS NOT NULL)
               AS running,
           (SELECT count(*) FROM tasks t WHERE t.state = 'RUNNING'
                AND t.lease_owner = durablesched_workers.id AND t.started_at IS NULL)
               AS claimed_ahead"""
SQLITE_WORKERS = f"""
    SELECT id, host, pid, queues, concurrency, version, started_at, last_seen,
           lease_seconds,
           round((julianday({SQLITE_NOW}) - julianday(last_seen)) * 86400.0, 3)
               AS seen_seconds_ago,
           CASE WHEN (julianday({SQLITE_NOW}) - julianday(last_seen)) * 86400.0
                     <= lease_seconds THEN 'alive' ELSE 'gone' END AS state{{held}}
    FROM durablesched_workers
    ORDER BY started_at, id"""
POSTGRES_WORKERS = """
    SELECT id, host, pid, queues, concurrency, version, started_at, last_seen,
           lease_seconds,
           round(EXTRACT(EPOCH FROM (now() - last_seen)), 3) AS seen_seconds_ago,
           CASE WHEN EXTRACT(EPOCH FROM (now() - last_seen)) <= lease_seconds
                THEN 'alive' ELSE 'gone' END AS state{held}
    FROM durablesched_workers
    ORDER BY started_at, id"""


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    postgres = _postgres()
    op.execute("DROP VIEW IF EXISTS tasks_running")
    kind = "TIMESTAMP WITH TIME ZONE" if postgres else "TEXT"
    op.execute(f"ALTER TABLE tasks ADD COLUMN started_at {kind}")
    op.execute("UPDATE tasks SET started_at = updated_at WHERE state = 'RUNNING'")
    op.execute(f"CREATE VIEW tasks_running AS {POSTGRES_RUNNING if postgres else SQLITE_RUNNING}")
    workers = POSTGRES_WORKERS if postgres else SQLITE_WORKERS
    op.execute("DROP VIEW IF EXISTS workers")
    op.execute(f"CREATE VIEW workers AS {workers.format(held=HELD)}")


def downgrade() -> None:
    postgres = _postgres()
    op.execute("DROP VIEW IF EXISTS tasks_running")
    op.execute("DROP VIEW IF EXISTS workers")
    workers = POSTGRES_WORKERS if postgres else SQLITE_WORKERS
    op.execute(f"CREATE VIEW workers AS {workers.format(held='')}")
    op.execute("ALTER TABLE tasks DROP COLUMN started_at")
    op.execute(f"CREATE VIEW tasks_running AS {POSTGRES_BEFORE if postgres else SQLITE_BEFORE}")
