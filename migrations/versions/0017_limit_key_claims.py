"""Limits per key, cheaper: a claim counts its start on the key's row, and SQLite has no
INSERT trigger on ``tasks``.

Migration 0013's triggers recount a key's RUNNING tasks and revisit its head in seven
statements for every change of a keyed task. The claim is the change that matters
(issue 32's target: a claim in a queue limited per key costs at most 1.5 times one
in a queue without): a task going from claimable to RUNNING in its own queue is one
more RUNNING (``running + 1`` on the key's row, no count) and, being the head, leaves
the key without one; a next head is looked for only while the key has room. Every
other change (submit, outcome, reclaim, operator actions, move, purge) still
recounts, so a count is exact again at the key's next such change whatever happened.
Each claim takes at most one task of a key (a key has one head), so a statement
never both counts up and recounts one key.

SQLite: any trigger on ``INSERT INTO tasks`` (even one whose ``WHEN`` is false) makes
every insert open a statement journal and copy each page it changes into it: a
single-row insert of a task without a key cost 2 to 3 times as much with 0013's
trigger in place. The trigger is gone: the store inserts a task with a limit key into
the view ``durablesched_new_keyed_tasks``, whose INSTEAD OF trigger stores it and
keeps its key as the INSERT trigger did (and touches a debounced one, ``UPDATE tasks
SET state = state``, which fires the UPDATE trigger). PostgreSQL keeps its INSERT
trigger (its ``WHEN`` is tested before any function is called).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

CLAIMABLE = "state IN ('PENDING', 'RETRY_WAIT')"
UNLIMITED = 2**31 - 1
CAP_OF = (
    f"COALESCE(concurrency_per_key, CASE WHEN rate_per_key_count IS NOT NULL THEN {UNLIMITED} END)"
)
#: An UPDATE of a task that a claim makes: claimable to RUNNING, in its own queue.
CLAIM = (
    "(OLD.state IN ('PENDING', 'RETRY_WAIT') AND NEW.state = 'RUNNING' AND OLD.queue = NEW.queue)"
)


def _sqlite_sync(q: str, k: str, changed: str, claim: str) -> str:
    """The statements that bring key (``q``, ``k``) up to date after task ``changed`` (an
    SQL expression, NULL for none) changed, as a SQLite trigger body; ``claim`` is true
    (an SQL expression of NEW and OLD) for a claim's change.

    A claim counts its start on the key's row and picks the next head in the same
    statement (while the key has room); the claimed task was the key's head, so the
    row is there (were it not, the key's next other change recounts). A term of NEW
    and OLD alone is tested before a statement reads any table, so the statements a
    claim skips cost it next to nothing. No ``INSERT OR IGNORE``: the
    statement that fires a trigger imposes its conflict algorithm on the trigger's
    statements (0013)."""
    key = f"queue = {q} AND limit_key = {k}"
    cap = f"(SELECT {CAP_OF} FROM durablesched_queues WHERE name = {q})"
    count = f"(SELECT count(*) FROM tasks WHERE {key} AND state = 'RUNNING')"
    head = f"(SELECT head_id FROM durablesched_limit_keys WHERE {key})"
    first = (
        f"(SELECT id FROM tasks WHERE {key} AND limit_key IS NOT NULL AND {CLAIMABLE} "
        "ORDER BY due_at, priority DESC, seq LIMIT 1)"
    )
    return f"""
        INSERT INTO durablesched_limit_keys (queue, limit_key, running, head_id)
            SELECT {q}, {k}, {count}, NULL WHERE NOT {claim}
            AND NOT EXISTS (SELECT 1 FROM durablesched_limit_keys WHERE {key})
            AND {cap} IS NOT NULL;
        UPDATE durablesched_limit_keys SET
            running = CASE WHEN {claim} THEN running + 1 ELSE {count} END,
            head_id = CASE WHEN {claim} AND (head_id IS NULL OR head_id = {changed})
                THEN CASE WHEN blocked_until IS NULL AND running + 1 < {cap} THEN {first} END
                WHEN head_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM tasks
                    WHERE id = head_id AND {CLAIMABLE} AND key_waiting = 0 AND {key})
                THEN NULL ELSE head_id END
            WHERE {key};
        UPDATE durablesched_limit_keys SET head_id = {first}
            WHERE NOT {claim} AND {key} AND head_id IS NULL AND blocked_until IS NULL
            AND running < {cap};
        UPDATE tasks SET key_waiting = 0 WHERE id = {head} AND key_waiting = 1;
        UPDATE tasks SET key_waiting = 1 WHERE NOT {claim} AND id = {changed}
            AND key_waiting = 0 AND {CLAIMABLE} AND id IS NOT {head} AND {cap} IS NOT NULL;
        DELETE FROM durablesched_limit_keys WHERE NOT {claim} AND {key} AND running = 0
            AND head_id IS NULL AND blocked_until IS NULL;"""


SQLITE_TRIGGERS = {
    "durablesched_limit_key_update": (
        "AFTER UPDATE OF state, due_at, priority, queue ON tasks WHEN NEW.limit_key IS NOT NULL",
        _sqlite_sync("NEW.queue", "NEW.limit_key", "NEW.id", CLAIM),
    ),
    "durablesched_limit_key_leave": (
        "AFTER UPDATE OF queue ON tasks "
        "WHEN OLD.limit_key IS NOT NULL AND OLD.queue IS NOT NEW.queue",
        _sqlite_sync("OLD.queue", "OLD.limit_key", "NULL", "0"),
    ),
    "durablesched_limit_key_delete": (
        "AFTER DELETE ON tasks WHEN OLD.limit_key IS NOT NULL",
        _sqlite_sync("OLD.queue", "OLD.limit_key", "NULL", "0"),
    ),
}

#: SQLite: where the store inserts a task with a limit key (``sqlite.INSERT_KEYED_ROW``),
#: one row at a time in id order: the trigger stores it and keeps its key, as 0013's
#: INSERT trigger did, so that only these inserts pay a trigger's statement journal.
NEW_KEYED_COLUMNS = (
    "id, seq, name, args, state, due_at, attempts, max_attempts, fence, idempotency_key, "
    "created_at, updated_at, queue, priority, limit_key"
)
SQLITE_KEYED_VIEW = (
    f"CREATE VIEW durablesched_new_keyed_tasks AS SELECT {NEW_KEYED_COLUMNS} FROM tasks WHERE 0"
)
SQLITE_KEYED_INSERT = (
    "CREATE TRIGGER durablesched_new_keyed_task INSTEAD OF INSERT ON "
    f"durablesched_new_keyed_tasks BEGIN INSERT INTO tasks ({NEW_KEYED_COLUMNS}) VALUES ("
    + ", ".join(f"NEW.{c}" for c in NEW_KEYED_COLUMNS.split(", "))
    + ");"
    + _sqlite_sync("NEW.queue", "NEW.limit_key", "NEW.id", "0")
    + "\n    END"
)

#: PostgreSQL: the trigger function of 0013 with a claim's own branch first. The key's
#: row is taken after the queue's (the order every sync keeps); the claim already holds
#: the queue's row (``claiming._allowances``), so taking it again costs no wait.
PG_TRIGGER = f"""
CREATE OR REPLACE FUNCTION durablesched_limit_key_trigger() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    cap integer;
    n integer;
    head bigint;
    blocked timestamptz;
BEGIN
    IF TG_OP = 'UPDATE' AND {CLAIM} THEN
        -- Only a queue limited per key is locked (the filter comes before the lock).
        SELECT {CAP_OF} INTO cap FROM durablesched_queues WHERE name = NEW.queue
            AND (concurrency_per_key IS NOT NULL OR rate_per_key_count IS NOT NULL) FOR UPDATE;
        IF cap IS NULL THEN
            RETURN NULL;
        END IF;
        UPDATE durablesched_limit_keys SET running = running + 1,
            head_id = CASE WHEN head_id = NEW.id THEN NULL ELSE head_id END
            WHERE queue = NEW.queue AND limit_key = NEW.limit_key
            RETURNING running, head_id, blocked_until INTO n, head, blocked;
        IF FOUND AND (head IS NOT NULL OR blocked IS NOT NULL OR n >= cap) THEN
            RETURN NULL;
        END IF;
        -- Room for a next head, or no row: the full sync (it counts).
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM durablesched_limit_key_sync(OLD.queue, OLD.limit_key, NULL);
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.queue IS DISTINCT FROM NEW.queue THEN
        PERFORM durablesched_limit_key_sync(OLD.queue, OLD.limit_key, NULL);
    END IF;
    PERFORM durablesched_limit_key_sync(NEW.queue, NEW.limit_key, NEW.id);
    RETURN NULL;
END
$body$;
"""


def _revision_0013() -> ModuleType:
    """Migration 0013's module (its file name is no Python name): its triggers, put back
    by the downgrade."""
    path = Path(__file__).with_name("0013_limit_keys.py")
    spec = importlib.util.spec_from_file_location("durablesched_migration_0013", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_TRIGGER)
        return
    op.execute("DROP TRIGGER durablesched_limit_key_insert")
    for name, (when, body) in SQLITE_TRIGGERS.items():
        op.execute(f"DROP TRIGGER {name}")
        op.execute(f"CREATE TRIGGER {name} {when} BEGIN {body}\n    END")
    op.execute(SQLITE_KEYED_VIEW)
    op.execute(SQLITE_KEYED_INSERT)


def downgrade() -> None:
    old = _revision_0013()
    if op.get_bind().dialect.name == "postgresql":
        function = old.PG_FUNCTIONS.split("CREATE FUNCTION durablesched_limit_key_trigger()", 1)
        op.execute("CREATE OR REPLACE FUNCTION durablesched_limit_key_trigger()" + function[1])
        return
    op.execute("DROP VIEW durablesched_new_keyed_tasks")  # and its trigger
    for name in SQLITE_TRIGGERS:
        op.execute(f"DROP TRIGGER {name}")
    for name, (when, body) in old.SQLITE_TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {name} {when} BEGIN {body}\n    END")
