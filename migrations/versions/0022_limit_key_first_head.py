"""Limits per key: a key's head is always its first claimable task.

Until now a head stayed the head until it was claimed, cancelled or moved: a task of the
key submitted later with an earlier due time or a higher priority waited behind it, and
one due at once waited behind a head due in an hour (the key ran nothing meanwhile).
Within one submit the head was the batch's first task the database stored, which is not
the first in id order on PostgreSQL (tasks without an idempotency key go in first): the
memory store chose another head (found by the differential machine).

Now every change of a keyed task that the triggers handle with the task itself (a
submit, an outcome, a retry, a debounce, a move, a touch) compares it with the key's
head in the key's order (due_at, priority desc, seq): a task that comes first takes the
head's place, and a head moved later gives way to the first waiting task. The key's
head is then its first claimable task after every change, whatever order a batch's rows
went in. Only while the key has room for a head (not blocked by its rate, below its
limit), as before.

SQLite: the two triggers that handle a changed task (``durablesched_limit_key_update``
and ``durablesched_new_keyed_task``) gain two statements: the head leaves (back among
the waiting, its head cleared) when the first of the waiting, the changed task and the
head is not the head; the trigger's next statement then picks the first. PostgreSQL:
``durablesched_limit_key_sync`` does the same, taking the head's row without waiting
(``SKIP LOCKED``: where another transaction holds it, the head stays, as before).

The upgrade gives every key whose head is not its first claimable task its first.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def _revision(name: str) -> ModuleType:
    """An earlier migration's module (its file name is no Python name)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"durablesched_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Migration 0018: its claimable tasks and a queue's cap per key (the terms as it wrote
#: them), and the key function this one replaces and its downgrade puts back.
_0018 = _revision("0018_limit_key_claim_statement.py")
CLAIMABLE: str = _0018.CLAIMABLE
CAP: str = _0018.CAP
#: Task ``t`` comes before task ``h`` in a key's order (due_at, priority desc, seq).
BEFORE = "(t.due_at, h.priority, t.seq) < (h.due_at, t.priority, h.seq)"
#: The triggers that handle a changed task (``NEW``), whose head it may take.
CHANGED = ("durablesched_limit_key_update", "durablesched_new_keyed_task")


def _gives_way(q: str, k: str) -> str:
    """SQLite: the statements that take the head of key (``q``, ``k``) back among the
    waiting when the first of its first waiting task, task ``NEW`` (not waiting yet)
    and the head is not the head, while the key has room for a head. Only for a
    claimable ``NEW`` (a term of NEW alone, tested before any table is read): a task
    that is not claimable changes no key's order."""
    key = f"queue = {q} AND limit_key = {k}"
    cap = f"(SELECT {CAP} FROM durablesched_queues WHERE name = {q})"
    head = f"(SELECT head_id FROM durablesched_limit_keys WHERE {key})"
    order = "ORDER BY due_at, priority DESC, seq"
    first = (
        "(SELECT id FROM (SELECT * FROM (SELECT id, due_at, priority, seq FROM tasks "
        f"WHERE {key} AND limit_key IS NOT NULL AND key_waiting = 1 AND {CLAIMABLE} "
        f"{order} LIMIT 1) UNION ALL SELECT id, due_at, priority, seq FROM tasks "
        f"WHERE id IN (NEW.id, {head}) AND {key} AND key_waiting = 0 AND {CLAIMABLE}) "
        f"{order} LIMIT 1)"
    )
    return f"""
        UPDATE tasks SET key_waiting = 1 WHERE NEW.{CLAIMABLE} AND id = {head}
            AND key_waiting = 0 AND {CLAIMABLE} AND id IS NOT {first}
            AND EXISTS (SELECT 1 FROM durablesched_limit_keys WHERE {key}
                AND blocked_until IS NULL AND running < {cap});
        UPDATE durablesched_limit_keys SET head_id = NULL WHERE NEW.{CLAIMABLE} AND {key}
            AND (SELECT key_waiting FROM tasks WHERE id = head_id) = 1;"""


#: Where the new statements go: before the one that picks a head for a key without one.
PICK = "        UPDATE durablesched_limit_keys SET head_id = (SELECT id"


def sqlite_triggers() -> dict[str, str]:
    """The two triggers that handle a changed task, as 0021 left them with the head's
    giving way before the pick, by name."""
    made = {}
    for name, sql in _revision("0021_limit_key_running_counts.py").triggers().items():
        if name not in CHANGED:
            continue
        assert sql.count(PICK) == 1, sql
        made[name] = sql.replace(PICK, _gives_way("NEW.queue", "NEW.limit_key") + "\n" + PICK)
    return made


#: PostgreSQL: 0018's sync with the head giving way to the key's first claimable task (the
#: changed one, or a waiting one when the head itself moved later). The first is read
#: through the index in the key's order (one entry: the head, usually); the two rows
#: are taken without waiting (another transaction holding either: the head stays).
PG_GIVE_WAY = f"""
    IF head IS NOT NULL AND changed IS NOT NULL AND blocked IS NULL AND n < cap THEN
        SELECT id INTO better FROM tasks WHERE queue = q AND limit_key = k
            AND limit_key IS NOT NULL AND {CLAIMABLE}
            ORDER BY due_at, priority DESC, seq LIMIT 1;
        IF better <> head AND EXISTS (SELECT 1 FROM tasks t, tasks h
                WHERE t.id = better AND h.id = head AND {BEFORE}) THEN
            SELECT count(*) INTO taken FROM (SELECT id FROM tasks
                WHERE id IN (better, head) AND {CLAIMABLE} ORDER BY id
                FOR UPDATE SKIP LOCKED) s;
            IF taken = 2 THEN
                UPDATE tasks SET key_waiting = 1 WHERE id = head AND key_waiting = 0;
                head := better;
                UPDATE tasks SET key_waiting = 0 WHERE id = head AND key_waiting = 1;
            END IF;
        END IF;
    END IF;
"""
#: Where it goes in 0018's sync: after the head is checked, before one is picked.
PG_ANCHOR = "    IF head IS NULL AND blocked IS NULL AND n < cap THEN\n"


def pg_sync() -> str:
    """0018's sync with :data:`PG_GIVE_WAY` in it."""
    old = str(_0018.PG_SYNC)
    assert old.count(PG_ANCHOR) == 1 and old.count("    blocked timestamptz;\n") == 1, old
    return old.replace(PG_ANCHOR, PG_GIVE_WAY + PG_ANCHOR).replace(
        "    blocked timestamptz;\n",
        "    blocked timestamptz;\n    better bigint;\n    taken integer;\n",
    )


#: The upgrade: every head that a claimable task of its key comes before leaves ...
DEMOTE = (
    "UPDATE tasks SET key_waiting = 1 WHERE key_waiting = 0 AND id IN (SELECT k.head_id "
    "FROM durablesched_limit_keys k JOIN tasks h ON h.id = k.head_id WHERE EXISTS "
    "(SELECT 1 FROM tasks t WHERE t.queue = k.queue AND t.limit_key = k.limit_key "
    f"AND t.{CLAIMABLE} AND {BEFORE}))"
)
#: ... its key takes its first claimable task instead ...
REPICK = (
    "UPDATE durablesched_limit_keys SET head_id = (SELECT id FROM tasks t "
    "WHERE t.queue = durablesched_limit_keys.queue "
    f"AND t.limit_key = durablesched_limit_keys.limit_key AND t.{CLAIMABLE} "
    "ORDER BY t.due_at, t.priority DESC, t.seq LIMIT 1) "
    "WHERE head_id IN (SELECT id FROM tasks WHERE key_waiting = 1)"
)
#: ... which leaves the waiting ones.
PROMOTE = (
    "UPDATE tasks SET key_waiting = 0 WHERE key_waiting = 1 "
    "AND id IN (SELECT head_id FROM durablesched_limit_keys WHERE head_id IS NOT NULL)"
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(pg_sync())
    else:
        for name, sql in sqlite_triggers().items():
            op.execute(f"DROP TRIGGER {name}")
            op.execute(sql)
    for sql in (DEMOTE, REPICK, PROMOTE):
        op.execute(sql)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_0018.PG_SYNC)
        return
    old = _revision("0021_limit_key_running_counts.py").triggers()
    for name in CHANGED:
        op.execute(f"DROP TRIGGER {name}")
        op.execute(old[name])
