"""Limits per key on SQLite: the index of a key's tasks holds its waiting tasks only, so a
claim of a key's head leaves it alone.

A claim of ten keys' heads deleted ten entries of ``ix_tasks_key_claimable`` (every
claimable task of a key, in the order its head is chosen), on leaf pages scattered by
key: each one more page changed and written at the commit. At 1,000,000 tasks that upkeep
was most of what a claim with a busy key ahead cost beyond one without keys (the keys'
trigger a tenth of it; docs/queues.md). On SQLite the index now holds the waiting tasks
(``key_waiting = 1``) only: a head (``key_waiting = 0``) is not in it, and its claim
touches no entry; a task leaves it when it becomes its key's head instead (an outcome
freeing the key, a claim leaving room).

A key's next head is its first claimable task, which is either waiting (in the index) or
the task whose change the trigger handles (``NEW``: just stored, retried, moved,
touched): every other claimable task of a key in a queue limited per key waits, and its
head is not looked for while it has one. The triggers' ``first`` takes the better of the
two. The view ``queue_limit_keys`` counts a key's waiting tasks and its head.

PostgreSQL: nothing changes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

CLAIMABLE = "state IN ('PENDING', 'RETRY_WAIT')"
UNLIMITED = 2**31 - 1
INDEX = (
    "CREATE INDEX ix_tasks_key_claimable ON tasks (queue, limit_key, due_at, priority DESC, seq) "
    "WHERE {where}"
)
WAITING = f"limit_key IS NOT NULL AND key_waiting = 1 AND {CLAIMABLE}"
#: The view's count of a key's claimable tasks: its waiting ones and its head.
VIEW_WAITING = (
    "(SELECT count(*) FROM tasks t WHERE t.queue = k.queue AND t.limit_key = k.limit_key "
    f"AND t.limit_key IS NOT NULL AND t.key_waiting = 1 AND t.{CLAIMABLE}) "
    "+ (k.head_id IS NOT NULL)"
)


def _revision(name: str) -> ModuleType:
    """An earlier migration's module (its file name is no Python name)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"durablesched_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first(q: str, k: str, changed: str) -> str:
    """Key (``q``, ``k``)'s first claimable task: its first waiting one (the index) or
    task ``changed`` if claimable, of the key and not waiting, whichever comes first."""
    order = "ORDER BY due_at, priority DESC, seq"
    return (
        "(SELECT id FROM (SELECT * FROM (SELECT id, due_at, priority, seq FROM tasks "
        f"WHERE queue = {q} AND limit_key = {k} AND {WAITING} {order} LIMIT 1) "
        "UNION ALL SELECT id, due_at, priority, seq FROM tasks "
        f"WHERE id = {changed} AND queue = {q} AND limit_key = {k} AND key_waiting = 0 "
        f"AND {CLAIMABLE}) {order} LIMIT 1)"
    )


def _triggers() -> list[tuple[str, str]]:
    """0017's triggers (0018 and 0019 kept them) with :func:`first` for their ``first``."""
    old = _revision("0017_limit_key_claims.py")
    made = []
    for name, (when, body) in old.SQLITE_TRIGGERS.items():
        q, k, changed = ("OLD.queue", "OLD.limit_key", "NULL")
        if name == "durablesched_limit_key_update":
            q, k, changed = ("NEW.queue", "NEW.limit_key", "NEW.id")
        made.append(
            (name, f"CREATE TRIGGER {name} {when} BEGIN {_swap(body, q, k, changed)}\n    END")
        )
    return made


def _swap(body: str, q: str, k: str, changed: str) -> str:
    old_first = (
        f"(SELECT id FROM tasks WHERE queue = {q} AND limit_key = {k} AND limit_key IS NOT NULL "
        f"AND {CLAIMABLE} ORDER BY due_at, priority DESC, seq LIMIT 1)"
    )
    assert old_first in body, body
    return body.replace(old_first, first(q, k, changed))


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    old = _revision("0017_limit_key_claims.py")
    for name, sql in _triggers():
        op.execute(f"DROP TRIGGER {name}")
        op.execute(sql)
    op.execute("DROP VIEW durablesched_new_keyed_tasks")  # and its trigger
    op.execute(old.SQLITE_KEYED_VIEW)
    op.execute(_swap(old.SQLITE_KEYED_INSERT, "NEW.queue", "NEW.limit_key", "NEW.id"))
    op.execute("DROP INDEX ix_tasks_key_claimable")
    op.execute(INDEX.format(where=WAITING))
    view = _revision("0013_limit_keys.py").LIMIT_KEYS_VIEW
    waiting = (
        "(SELECT count(*) FROM tasks t\n"
        f"            WHERE t.queue = k.queue AND t.limit_key = k.limit_key AND t.{CLAIMABLE})"
    )
    assert waiting in view
    op.execute("DROP VIEW queue_limit_keys")
    op.execute(view.replace(waiting, VIEW_WAITING))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    old = _revision("0017_limit_key_claims.py")
    op.execute("DROP VIEW queue_limit_keys")
    op.execute(_revision("0013_limit_keys.py").LIMIT_KEYS_VIEW)
    op.execute("DROP INDEX ix_tasks_key_claimable")
    op.execute(INDEX.format(where=f"limit_key IS NOT NULL AND {CLAIMABLE}"))
    for name, (when, body) in old.SQLITE_TRIGGERS.items():
        op.execute(f"DROP TRIGGER {name}")
        op.execute(f"CREATE TRIGGER {name} {when} BEGIN {body}\n    END")
    op.execute("DROP VIEW durablesched_new_keyed_tasks")
    op.execute(old.SQLITE_KEYED_VIEW)
    op.execute(old.SQLITE_KEYED_INSERT)
