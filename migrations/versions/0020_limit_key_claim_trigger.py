"""Limits per key on SQLite: a claim's change fires a trigger of its own, two statements
long.

0017's UPDATE trigger handles every change of a keyed task in six statements, four of
which a claim's change (claimable to RUNNING in its own queue) skips by a term of its
``WHERE``; each still started once per claimed row. At 1,000,000 tasks with a busy key
of 100,000 ahead, the keys' trigger was most of what a claim of ten keys' heads cost
beyond one without keys (docs/queues.md). The claim's change now fires
``durablesched_limit_key_claim``, whose body is the two statements of 0017's (as 0019
left them) that a claim runs: the start counted on the key's row and its next head
chosen if it has room, and that head taken out of the waiting ones. Every other change
fires ``durablesched_limit_key_update``, whose body is 0019's for a change that is not
a claim. Their ``WHEN`` terms exclude each other: each change runs what it ran before.

PostgreSQL: nothing changes (a claim fires no trigger there since 0018).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UPDATE = "durablesched_limit_key_update"
CLAIM_TRIGGER = "durablesched_limit_key_claim"
WHEN = "AFTER UPDATE OF state, due_at, priority, queue ON tasks WHEN NEW.limit_key IS NOT NULL"


def _revision(name: str) -> ModuleType:
    """An earlier migration's module (its file name is no Python name)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"durablesched_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _body(claim: str) -> str:
    """0019's UPDATE trigger body with its claim term ``claim`` ("1" or "0")."""
    old, first = _revision("0017_limit_key_claims.py"), _revision("0019_limit_key_waiting_index.py")
    q, k, changed = "NEW.queue", "NEW.limit_key", "NEW.id"
    return str(first._swap(old._sqlite_sync(q, k, changed, claim), q, k, changed))


def triggers() -> dict[str, str]:
    """The two triggers, by name: a claim's change, and every other change."""
    claim = _revision("0017_limit_key_claims.py").CLAIM
    # A claim's body: the statements whose WHERE does not begin with NOT claim (those
    # do nothing for a claim).
    statements = [s.strip() for s in _body("1").split(";") if s.strip()]
    kept = [s for s in statements if not re.search(r"\bNOT 1\b", s)]
    assert len(statements) == 6 and len(kept) == 2, statements
    return {
        UPDATE: f"CREATE TRIGGER {UPDATE} {WHEN} AND NOT {claim} BEGIN {_body('0')}\n    END",
        CLAIM_TRIGGER: (
            f"CREATE TRIGGER {CLAIM_TRIGGER} {WHEN} AND {claim} BEGIN "
            + "".join(f"\n        {s};" for s in kept)
            + "\n    END"
        ),
    }


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    op.execute(f"DROP TRIGGER {UPDATE}")
    for sql in triggers().values():
        op.execute(sql)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        return
    op.execute(f"DROP TRIGGER {CLAIM_TRIGGER}")
    op.execute(f"DROP TRIGGER {UPDATE}")
    old = _revision("0019_limit_key_waiting_index.py")._triggers()
    (sql,) = [s for name, s in old if name == UPDATE]
    op.execute(sql)
