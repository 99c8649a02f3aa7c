"""Limits per key on PostgreSQL: a claim counts its keys' starts in its own statement, and
a key's bookkeeping in a queue not limited per key waits for a change of its limits.

**The claim.** 0017's trigger function ran once per claimed row (two statements of
PL/pgSQL each: the queue's row, the key's row): at 1,000,000 tasks with a busy key of
100,000, a claim of 10 cost 1.6 times one in a queue without keys, most of it those ten
calls. The UPDATE trigger no longer fires for a claim's change (claimable to RUNNING in
its own queue: its ``WHEN``, tested before any function is called); the claim statement
counts its starts on its keys' rows in one more step (``postgres._claim``, the claim of a
queue limited per key, whose row it holds), and a key with room for a next head, or
without a row, or claimed from a queue the claim did not know was limited per key, is
brought up to date by ``durablesched_limit_key_sync`` in the claim's transaction,
after the statement (``claiming._sync_keys``).

**A change of limits racing a key's change.** 0013's sync read the queue's row without
a lock and did nothing for a queue not limited per key. A ``queue set`` that makes it so
counts each key's RUNNING tasks and picks its head from what has committed: a submit of
the key committing meanwhile left its task claimable beside the new head (two of the key
running), and a failed attempt's retry stayed claimable with the key's count one too
many once claimed (until the key's next change other than a claim). The sync now takes
such a queue's row ``FOR KEY SHARE`` (waiting, holding nothing, where a change of limits
holds it), so it waits for a change under way and sees it, and a change to come waits
for it; the change of limits takes the queue's live keyed tasks before the queue's row
(``postgres.LOCK_KEYED_TASKS``), so that a claim or outcome of one under way commits
first instead of deadlocking with it (tests/integration/test_postgres_races.py).

SQLite has one writer at a time: nothing changes there.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

CLAIMABLE = "state IN ('PENDING', 'RETRY_WAIT')"
UNLIMITED = 2**31 - 1
CAP = (
    f"COALESCE(concurrency_per_key, CASE WHEN rate_per_key_count IS NOT NULL THEN {UNLIMITED} END)"
)

#: An UPDATE of a task that a claim makes: claimable to RUNNING, in its own queue.
CLAIM = "OLD.state IN ('PENDING', 'RETRY_WAIT') AND NEW.state = 'RUNNING' AND OLD.queue = NEW.queue"

#: 0013's sync, but for a queue not limited per key as far as what has committed says:
#: its row is taken shared (``FOR KEY SHARE``) before the key is left alone, so that a
#: change of the queue's limits under way is waited for (and then seen: the row locked
#: is the latest), and one to come waits for this transaction. Where that change holds
#: the row, the sync waits for it holding nothing (``SKIP LOCKED``, then ``FOR UPDATE``).
PG_SYNC = f"""
CREATE OR REPLACE FUNCTION durablesched_limit_key_sync(q text, k text, changed bigint)
RETURNS void LANGUAGE plpgsql AS $body$
DECLARE
    cap integer;
    n integer;
    head bigint;
    blocked timestamptz;
BEGIN
    SELECT {CAP} INTO cap FROM durablesched_queues WHERE name = q;
    IF cap IS NULL THEN
        SELECT {CAP} INTO cap FROM durablesched_queues WHERE name = q
            FOR KEY SHARE SKIP LOCKED;
        IF FOUND AND cap IS NULL THEN
            RETURN;
        END IF;
    END IF;
    -- The queue's row: the lock a claim of the queue takes before it picks rows.
    SELECT {CAP} INTO cap FROM durablesched_queues WHERE name = q FOR UPDATE;
    IF cap IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM tasks
        WHERE queue = q AND limit_key = k AND state = 'RUNNING';
    SELECT head_id, blocked_until INTO head, blocked
        FROM durablesched_limit_keys WHERE queue = q AND limit_key = k;
    IF head IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM tasks WHERE id = head AND queue = q AND limit_key = k
            AND {CLAIMABLE} AND key_waiting = 0) THEN
        head := NULL;
    END IF;
    IF head IS NULL AND blocked IS NULL AND n < cap THEN
        SELECT id INTO head FROM tasks
            WHERE queue = q AND limit_key = k AND limit_key IS NOT NULL AND {CLAIMABLE}
            ORDER BY due_at, priority DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF head IS NOT NULL THEN
            UPDATE tasks SET key_waiting = 0 WHERE id = head AND key_waiting = 1;
        END IF;
    END IF;
    IF changed IS NOT NULL AND changed IS DISTINCT FROM head THEN
        UPDATE tasks SET key_waiting = 1
            WHERE id = changed AND key_waiting = 0 AND {CLAIMABLE};
    END IF;
    IF n = 0 AND head IS NULL AND blocked IS NULL THEN
        DELETE FROM durablesched_limit_keys WHERE queue = q AND limit_key = k;
    ELSE
        INSERT INTO durablesched_limit_keys (queue, limit_key, running, head_id)
            VALUES (q, k, n, head)
            ON CONFLICT (queue, limit_key)
            DO UPDATE SET running = excluded.running, head_id = excluded.head_id;
    END IF;
END
$body$;
"""

#: 0013's trigger function: a claim no longer calls it.
PG_TRIGGER = """
CREATE OR REPLACE FUNCTION durablesched_limit_key_trigger() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
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

UPDATE_TRIGGER = (
    "CREATE TRIGGER durablesched_limit_key_update AFTER UPDATE OF state, due_at, priority, "
    "queue ON tasks FOR EACH ROW WHEN (NEW.limit_key IS NOT NULL{when}) "
    "EXECUTE FUNCTION durablesched_limit_key_trigger()"
)


def _revision(name: str) -> ModuleType:
    """An earlier migration's module (its file name is no Python name), whose functions
    the downgrade puts back."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"durablesched_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(PG_SYNC)
    op.execute(PG_TRIGGER)
    op.execute("DROP TRIGGER durablesched_limit_key_update ON tasks")
    op.execute(UPDATE_TRIGGER.format(when=f" AND NOT ({CLAIM})"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    functions = _revision("0013_limit_keys.py").PG_FUNCTIONS
    sync = functions.split("CREATE FUNCTION durablesched_limit_key_trigger()", 1)[0]
    op.execute(sync.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(_revision("0017_limit_key_claims.py").PG_TRIGGER)
    op.execute("DROP TRIGGER durablesched_limit_key_update ON tasks")
    op.execute(UPDATE_TRIGGER.format(when=""))
