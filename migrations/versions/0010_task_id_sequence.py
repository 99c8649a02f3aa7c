"""PostgreSQL hands out task ids and ``seq`` values from a sequence, not a locked row.

Until now every submit took the ``durablesched_counters`` row ``task_seq`` with
``FOR UPDATE``: inside a caller's open transaction (``submit(connection=...)``, a
Django ``atomic()`` block) that row stayed locked until the caller committed, and
every other process's enqueue waited behind it. A sequence's ``nextval`` takes no
lock that lasts beyond the call. The sequence starts after every id and ``seq``
ever handed out (the counter's value, and the tasks' own, whichever is higher),
and the counter row goes: a submitter of an older release that is still running
finds no row and fails its submit with an error, storing nothing (it never takes
an id twice). SQLite keeps its counter row: it has one writer at a time anyway,
so the row serialises nothing that the database does not.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SEQUENCE = "durablesched_task_seq"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    # The row lock makes a submitter of the old release that is mid-submit finish
    # first (its ids are then counted) and any later one wait, then find no row.
    counter = bind.execute(
        sa.text("SELECT value FROM durablesched_counters WHERE name = 'task_seq' FOR UPDATE")
    ).scalar()
    highest = bind.execute(
        sa.text("SELECT coalesce(max(greatest(id, seq)), 0) FROM tasks")
    ).scalar()
    start = max(int(counter or 0), int(highest or 0)) + 1
    op.execute(sa.text(f"CREATE SEQUENCE {SEQUENCE} AS bigint START WITH {start}"))
    op.execute(sa.text("DELETE FROM durablesched_counters WHERE name = 'task_seq'"))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    taken = bind.execute(
        sa.text(
            f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {SEQUENCE}"
        )
    ).scalar()
    highest = bind.execute(
        sa.text("SELECT coalesce(max(greatest(id, seq)), 0) FROM tasks")
    ).scalar()
    op.execute(
        sa.text(
            "INSERT INTO durablesched_counters (name, value) VALUES ('task_seq', :value)"
        ).bindparams(value=max(int(taken or 0), int(highest or 0)))
    )
    op.execute(sa.text(f"DROP SEQUENCE {SEQUENCE}"))
