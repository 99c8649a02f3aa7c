"""Limits per key on SQLite: each key's count of RUNNING tasks kept by its changes, not
counted again, and ``ix_tasks_key_running`` dropped.

Since 0017 a claim adds its starts to the key's row (``durablesched_limit_keys.running``)
instead of counting; every other change of a keyed task counted the key's RUNNING tasks
again, through ``ix_tasks_key_running``, an index whose upkeep (an entry inserted per
claimed row, on pages scattered by key) was part of what a claim with a busy key ahead
cost beyond one without keys (docs/queues.md). The triggers now add what the change
does to the count instead: a task becoming RUNNING in the key's queue adds one, one
leaving RUNNING (or the queue, or the table) takes one away; a key's row, made when its
key has none, starts at 0 (a key with a task RUNNING in a queue limited per key always
has its row: a row goes only when its count is 0). Nothing counts RUNNING tasks per key
any more, so the index goes. A changed limit per key (``store.put_queue``) counts each
key's RUNNING tasks once into its new row (``SQL_SEED_KEYS``) before the heads are
chosen. The counts are made exact once here, as 0017's triggers left them.

PostgreSQL: nothing changes (its triggers count, with the index).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

INDEX = (
    "CREATE INDEX ix_tasks_key_running ON tasks (queue, limit_key) "
    "WHERE limit_key IS NOT NULL AND state = 'RUNNING'"
)
#: What a change does to its key's count, by trigger: (queue, key) of the row it keeps,
#: and the change's part of the count.
CHANGES = {
    # Every change of a keyed task but a claim's, for its new queue's key: RUNNING now
    # adds one; RUNNING before, in the same queue, takes one away (a task moved off a
    # queue is taken away from the old queue's key by durablesched_limit_key_leave).
    "durablesched_limit_key_update": (
        "NEW.queue",
        "NEW.limit_key",
        "(NEW.state = 'RUNNING') - (OLD.state = 'RUNNING' AND OLD.queue = NEW.queue)",
    ),
    "durablesched_limit_key_leave": ("OLD.queue", "OLD.limit_key", "-(OLD.state = 'RUNNING')"),
    "durablesched_limit_key_delete": ("OLD.queue", "OLD.limit_key", "-(OLD.state = 'RUNNING')"),
    "durablesched_new_keyed_task": ("NEW.queue", "NEW.limit_key", "(NEW.state = 'RUNNING')"),
}
BACKFILL = (
    "UPDATE durablesched_limit_keys SET running = (SELECT count(*) FROM tasks "
    "WHERE tasks.queue = durablesched_limit_keys.queue "
    "AND tasks.limit_key = durablesched_limit_keys.limit_key AND tasks.state = 'RUNNING')"
)


def _revision(name: str) -> ModuleType:
    """An earlier migration's module (its file name is no Python name)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"durablesched_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def old_triggers() -> dict[str, str]:
    """The four triggers that count, as 0020 left them, by name."""
    made = dict(_revision("0019_limit_key_waiting_index.py")._triggers())
    made.update(_revision("0020_limit_key_claim_trigger.py").triggers())
    keyed = _revision("0017_limit_key_claims.py").SQLITE_KEYED_INSERT
    made["durablesched_new_keyed_task"] = _revision("0019_limit_key_waiting_index.py")._swap(
        keyed, "NEW.queue", "NEW.limit_key", "NEW.id"
    )
    return {name: made[name] for name in CHANGES}


def triggers() -> dict[str, str]:
    """The four triggers with the change's part added to the count instead of a count."""
    made = {}
    for name, sql in old_triggers().items():
        q, k, change = CHANGES[name]
        count = (
            f"(SELECT count(*) FROM tasks WHERE queue = {q} AND limit_key = {k} "
            "AND state = 'RUNNING')"
        )
        recount = f"ELSE {count} END"
        assert sql.count(recount) == 1 and sql.count(count) == 2, sql
        made[name] = sql.replace(recount, f"ELSE running + {change} END").replace(count, "0")
    return made


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    op.execute(BACKFILL)
    for name, sql in triggers().items():
        op.execute(f"DROP TRIGGER {name}")
        op.execute(sql)
    op.execute("DROP INDEX ix_tasks_key_running")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    op.execute(INDEX)
    for name, sql in old_triggers().items():
        op.execute(f"DROP TRIGGER {name}")
        op.execute(sql)
