"""Migration 0022 (a key's head is always its first claimable task) on a database at 0021
whose heads were kept as 0021 kept them (a task due sooner, submitted later, waited
behind its key's head): the upgrade gives each key its first task, the downgrade puts
0021's bookkeeping back, and the upgrade again gives the heads back their places."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine, text

from durablesched.store.sql.migrate import HEAD_REVISION, alembic_config

from ..conftest import at
from .test_upgrade_limit_key_claim_statement import insert_old
from .test_upgrade_limit_key_claims import LEASE, database, keyed_queue_at, open_store

__all__ = ["database"]  # the fixture, shared


def heads(engine: Engine) -> dict[str, int]:
    """Each key's head, checked against the tasks' marks: the head alone is not waiting."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT limit_key, head_id FROM durablesched_limit_keys"))
        found = {str(k): int(h) for k, h in rows if h is not None}
        not_waiting = conn.execute(
            text(
                "SELECT id FROM tasks WHERE limit_key IS NOT NULL AND key_waiting = 0 "
                "AND state IN ('PENDING', 'RETRY_WAIT')"
            )
        )
        assert sorted(found.values()) == sorted(int(i) for (i,) in not_waiting)
        return found


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def test_0022_gives_each_key_its_first_task_up_down_and_up(database: tuple[str, Engine]) -> None:
    url, engine = database
    try:
        keyed_queue_at(engine, "0021", 1)
        insert_old(engine, 1001, "k", due=100)
        insert_old(engine, 1002, "k", due=5)  # due sooner: waited behind 1001 at 0021
        insert_old(engine, 1003, "j", due=5)
        insert_old(engine, 1004, "j", due=100)
        assert heads(engine) == {"k": 1001, "j": 1003}
        upgrade(engine)
        assert heads(engine) == {"k": 1002, "j": 1003}
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0021")
        insert_old(engine, 1005, "m", due=100)
        insert_old(engine, 1006, "m", due=5)
        assert heads(engine)["m"] == 1005  # 0021's bookkeeping: the head stays
        upgrade(engine)
        assert heads(engine) == {"k": 1002, "j": 1003, "m": 1006}
        store = open_store(url, engine)
        try:
            assert store.schema_revision == HEAD_REVISION
            assert sorted(c.task_id for c in store.claim("w", 10, at(10), LEASE)) == [
                1002,
                1003,
                1006,
            ]
        finally:
            store.close()
    finally:
        engine.dispose()
