"""PostgreSQL: its statements, its engine, the store, LISTEN/NOTIFY wake-ups, the server's clock.

Everything that is PostgreSQL's alone is here: the claim (``FOR UPDATE SKIP
LOCKED`` behind a materialized CTE), the heartbeat and group commit over
``jsonb_each`` that lock rows in id order and write history in the same
statement, the sequence that hands out task ids, NOTIFY on :data:`CHANNEL`, and
the :data:`POSTGRES` dialect that hands them to the store. The statements
both databases share are in :mod:`.statements`. Needs psycopg 3
(``pip install 'durablesched[postgres]'``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, bindparam, create_engine, event, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from durablesched.clock import ServerClock
from durablesched.errors import ConfigurationError, StoreError
from durablesched.queues import KEY_CAP_UNLIMITED, MAX_PRIORITY
from durablesched.readable import readable
from durablesched.records import SUBMITTED, TASK_KEY_PREFIX, Finding
from durablesched.store.durability import Durability
from durablesched.store.durability import durability as check_durability
from durablesched.store.protocol import Awaited, OnChange, OnFinished, quiet_for
from durablesched.store.sql.codec import as_utc, from_db_time
from durablesched.store.sql.dialect import SQLDialect, names_in, pyformat
from durablesched.store.sql.predicates import CLAIMABLE_SQL, TERMINAL_SQL
from durablesched.store.sql.schema import metadata, task_seq
from durablesched.store.sql.statements import (
    CLAIM_RETURNING,
    INSERT_EVENTS,
    INSERT_KEYED_TASK,
    INSERT_TASK,
    NAMES,
    NAMES_FILTER,
    QUEUES,
    QUEUES_FILTER,
    RECORD_KEYS,
    SQL_LIVE_QUEUE_COUNTS,
    VALID,
    wake_parents,
)
from durablesched.store.sql.store import SQLStore
from durablesched.store.sql.translate import translated
from durablesched.store.sql.urls import postgres_url

__all__ = [
    "CHANNEL",
    "POSTGRES",
    "NotifyWatcher",
    "PostgresStore",
    "create_postgres_engine",
]

log = logging.getLogger("durablesched.postgres")

# -- the statements that are PostgreSQL's own ---------------------------------------------------


def _claim(arms: int, names: int, keyed: bool = False, bound: int | None = None) -> str:
    """The claim from ``arms`` queues, with its history lines; ``keyed``: and the starts of
    queues limited per key (``:keyed``) counted on their keys' rows; ``bound``: a literal
    no arm's limit exceeds (``SQLDialect.claim_bounded``), or None: none."""

    # Each MATERIALIZED CTE fences its LIMIT: without it the planner may join the
    # subquery so that the UPDATE touches more rows than asked for. SKIP LOCKED
    # lets concurrent claimers take the next rows instead of queueing (FOR UPDATE
    # is not allowed over a UNION: each queue's arm locks its own rows). The
    # history lines go in with the claim, in the same round trip.
    # Each arm is a skip scan of its queue's claimable rows, a priority at a time: ``prios``
    # walks the priorities present, highest first (a seek each), and for each the LATERAL
    # reads the rows of that priority due now in (due_at, seq) order, locking as it goes,
    # up to the first not yet due. One walk of the whole index would read every row due
    # later (sleeping workflows, delayed tasks, retry waits) of a priority before it could
    # reach the next one, whenever the queue has fewer due rows than asked for. The nested
    # loop yields the rows in (priority desc, due_at, seq) order, with no sort: the outer
    # LIMIT stops it, so no row past the last claimed is locked and no priority past it read.
    # In the LATERAL the queue is an array of one and the ORDER BY names it: with queue and
    # priority both equalities, PostgreSQL drops them from the order, which
    # ix_tasks_claimable (due_at, seq) then gives as well, and may walk that index through
    # every queue's due rows; an array is no equality to the planner, so only the claim's
    # index gives (queue, due_at, seq), while the scan still takes it as one.
    # The driver prepares a statement run five times, and PostgreSQL then plans it once for
    # any parameters (a generic plan) if that plan's estimated cost is no more than a plan
    # for the values given. A LIMIT that is a parameter is guessed to return a tenth of
    # its input: the claim's estimated cost was over a hundred times a custom plan's, and
    # every claim was planned afresh (0.3-0.5 ms of it, at 1,000,000 tasks). So each
    # arm's walk is cut at ``bound``, a literal the planner reads, and its limit applied
    # above that cut: the generic plan's cost is then a tenth of ``bound`` rows, a custom
    # one's the limit's share of them, and the generic plan is kept. The rows come out
    # one at a time, so the outer limit still stops the walk at the last row it claims.

    def arm(k: int) -> str:
        claimable = f"key_waiting = 0 AND {CLAIMABLE_SQL}"
        cut = f":l{k}" if bound is None else str(bound)
        walk = (
            f"WITH RECURSIVE prios(p) AS (SELECT {MAX_PRIORITY + 1} "
            f"UNION ALL SELECT (SELECT priority FROM tasks WHERE queue = :q{k} AND {claimable} "
            "AND priority < p ORDER BY priority DESC LIMIT 1) FROM prios WHERE p IS NOT NULL) "
            "SELECT t.id, t.priority, t.due_at, t.seq FROM prios CROSS JOIN LATERAL ("
            "SELECT id, priority, due_at, seq FROM tasks "
            f"WHERE queue = ANY(ARRAY[CAST(:q{k} AS text)]) AND {claimable} AND priority = p "
            f"AND due_at <= :now {names_in(names)} {LOCKED_FIRST if keyed else ''}"
            f"ORDER BY queue, due_at, seq LIMIT {cut} FOR UPDATE SKIP LOCKED) t "
            f"WHERE p <= {MAX_PRIORITY} LIMIT {cut}"
        )
        return walk if bound is None else f"SELECT * FROM ({walk}) w LIMIT :l{k}"

    ctes = [KEYED_QUEUES] if keyed else []
    if arms == 1:
        ctes.append(f"picked AS MATERIALIZED ({arm(0)})")
    else:
        union = " UNION ALL ".join(f"SELECT * FROM a{k}" for k in range(arms))
        ctes += [f"a{k} AS MATERIALIZED ({arm(k)})" for k in range(arms)]
        ctes.append(
            f"picked AS MATERIALIZED (SELECT id FROM ({union}) u "
            "ORDER BY priority DESC, due_at, seq LIMIT :limit)"
        )
    ctes += [
        "claimed AS (UPDATE tasks SET state = 'RUNNING', attempts = attempts + 1, "
        "fence = fence + 1, lease_owner = :owner, lease_expires_at = :lease_expires_at, "
        "updated_at = :now, started_at = CAST(:started AS timestamptz), environment = NULL "
        "FROM picked WHERE tasks.id = picked.id "
        f"RETURNING {', '.join('tasks.' + c for c in CLAIM_RETURNING.split(', '))})",
        "events AS (INSERT INTO task_events (task_id, at, state, attempt, detail) "
        "SELECT id, :now, 'RUNNING', attempts, "
        "'claimed by ' || :owner || ' from queue ' || queue FROM claimed)",
    ]
    if not keyed:
        return f"WITH {', '.join(ctes)} SELECT {CLAIM_RETURNING} FROM claimed"
    keys = ", ".join(ctes + KEY_STARTS)
    return f"WITH {keys} SELECT {CLAIM_RETURNING}, {KEY_TO_SYNC} FROM claimed"


#: The claim of queues limited per key (``:keyed``, names in order) takes their rows first,
#: before any task's: the lock every change of a key's bookkeeping takes (migration 0013),
#: taken here rather than in a statement of its own where nothing else needed it
#: (``claiming._allowances``); a row taken already costs nothing. The latest committed
#: version of each row is what a lock reads: ``cap`` is each queue's limit per key now.
KEYED_QUEUES = (
    "keyed_queues AS MATERIALIZED (SELECT name, COALESCE(concurrency_per_key, CASE WHEN "
    f"rate_per_key_count IS NOT NULL THEN {KEY_CAP_UNLIMITED} END) AS cap "
    "FROM durablesched_queues WHERE name = ANY(CAST(:keyed AS text[])) ORDER BY name FOR UPDATE)"
)
#: Each arm's first row is read once ``keyed_queues`` has locked (an initplan, run before the
#: scan returns a row): the queues' rows are taken before any task's.
LOCKED_FIRST = "AND (SELECT count(*) FROM keyed_queues) >= 0 "
#: Each key that the claim took a task of, in a queue of ``:keyed``: one more RUNNING on
#: its row and its head gone (migration 0018: in place of the UPDATE trigger, which
#: does not fire for a claim), and whether it has room for a next head now.
KEY_STARTS = [
    "counted AS (SELECT queue, limit_key, count(*) AS n, array_agg(id) AS ids FROM claimed "
    "WHERE limit_key IS NOT NULL AND queue = ANY(CAST(:keyed AS text[])) "
    "GROUP BY queue, limit_key)",
    "keys AS (UPDATE durablesched_limit_keys k SET running = k.running + c.n, "
    "head_id = CASE WHEN k.head_id = ANY(c.ids) THEN NULL ELSE k.head_id END "
    "FROM counted c WHERE k.queue = c.queue AND k.limit_key = c.limit_key "
    "RETURNING k.queue, k.limit_key, k.head_id IS NULL AND k.blocked_until IS NULL "
    "AND k.running < (SELECT cap FROM keyed_queues q WHERE q.name = k.queue) AS room)",
]
#: Per claimed task: whether its key needs ``durablesched_limit_key_sync`` after the
#: statement: it has room for a next head, or no row (counted by the sync), or its queue
#: was not one of ``:keyed`` (its limits may have changed since the claim read them).
KEY_TO_SYNC = (
    "limit_key IS NOT NULL AND coalesce((SELECT room FROM keys WHERE keys.queue = "
    "claimed.queue AND keys.limit_key = claimed.limit_key), true) AS sync_key"
)
#: Brings keys (``:queues``, ``:keys``: two arrays, in order) up to date after a claim,
#: in its transaction, as the triggers do after any other change (migration 0013).
SYNC_KEYS = (
    "SELECT count(durablesched_limit_key_sync(q, k, NULL)) FROM "
    "unnest(CAST(:queues AS text[]), CAST(:keys AS text[])) AS u(q, k)"
)


def _next_due(names: bool, queues: bool) -> TextClause:
    """The earliest due time after ``:now``."""
    sql = text(
        f"SELECT due_at FROM tasks WHERE {CLAIMABLE_SQL} AND due_at > :now "
        f"{NAMES_FILTER if names else ''} {QUEUES_FILTER if queues else ''} "
        "ORDER BY due_at, seq LIMIT 1"
    )
    return sql.bindparams(*([NAMES] if names else []), *([QUEUES] if queues else []))


#: Claims of limited queues take their rows first, in name order (no deadlock):
#: counting what runs and starting more is then one step among all hosts.
LOCK_QUEUES = "SELECT name FROM durablesched_queues WHERE name IN :names ORDER BY name FOR UPDATE"
#: A change of a queue's limit per key chooses every key's head afresh from what has
#: committed. A change of a keyed task under way (an outcome, a claim) would be counted
#: nowhere: its own bookkeeping saw the limits as they were, the new heads were chosen
#: without it. Its row is taken here first, in id order (the order of every multi-row
#: lock), before the queue's row: the change commits and is seen, and no later one can
#: begin until this one commits. Tasks made or made live meanwhile (a submit, a retry of
#: a failed task) are not among these rows: their bookkeeping takes the queue's row,
#: shared, and waits (migration 0018). Taken before the queue's row, so that a change
#: holding a task's row never waits for this one while this one waits for it.
LOCK_KEYED_TASKS = (
    "SELECT id FROM tasks WHERE queue = :name AND limit_key IS NOT NULL "
    "AND state IN ('PENDING', 'RETRY_WAIT', 'RUNNING') ORDER BY id FOR UPDATE"
)
#: A transaction that records outcomes takes every row it writes first, in id order:
#: the tasks' own (``:ids``) and their parents' (of ``:children``), which a child's end
#: wakes (locks) after its own row. Locked later, a parent (a lower id) would be taken
#: out of order: two group commits, each ending a child of a workflow whose outcome the
#: other records, deadlocked (tests/integration/test_postgres_workflow_locks.py).
#: Each list one array parameter, as the driver takes it: a group commit runs it, and
#: an expanding ``IN`` was compiled again by SQLAlchemy for each list length.
LOCK_TASKS = pyformat(
    "SELECT id FROM tasks WHERE id = ANY(CAST(:ids AS BIGINT[])) OR id = ANY(ARRAY("
    "SELECT parent_id FROM task_children WHERE child_id = ANY(CAST(:children AS BIGINT[])))) "
    "ORDER BY id FOR UPDATE"
)

#: A step's checkpoint (``Dialect.record_step``): the claim's row locked and checked as
#: ``workflows.SQL_LOCK_VALID`` does, and the checkpoint inserted from it, in one round
#: trip instead of two (a step's transaction is otherwise these two and its commit).
RECORD_STEP = (
    f"WITH valid AS (UPDATE tasks SET fence = fence WHERE {VALID} RETURNING id) "
    "INSERT INTO task_steps (task_id, position, name, result, recorded_at, attempt) "
    "SELECT id, :position, CAST(:name AS text), CAST(:result AS jsonb), :now, :attempt "
    "FROM valid ON CONFLICT (task_id, position) DO NOTHING RETURNING position"
)

#: A wait taking its signal (``Dialect.receive_signal``), in one round trip instead of
#: five: the claim's row locked and checked as ``workflows.SQL_LOCK_VALID`` does, the
#: wait's position checked free, the oldest signal of the name no wait took locked, the
#: step recorded with its payload and the signal marked taken only if the step went in.
#: One row: ``valid`` (the claim held), ``free`` (no step at the position), ``found`` (a
#: signal waited), and its ``id`` and ``payload`` (JSON text) if it was taken (with its
#: step: not if a step took the position meanwhile).
#: A signal committed while this waited for the task's row is not seen (the statement's
#: snapshot is older): the wait then suspends, and the suspension finds it
#: (``workflows.SQL_DUE_IF_SIGNALLED``), as with one sent a moment later.
RECEIVE_SIGNAL = (
    f"WITH valid AS (UPDATE tasks SET fence = fence WHERE {VALID} RETURNING id), "
    "free AS (SELECT v.id FROM valid v WHERE NOT EXISTS (SELECT 1 FROM task_steps s "
    "WHERE s.task_id = v.id AND s.position = :position)), "
    "sig AS (SELECT s.id, s.payload FROM task_signals s JOIN free f ON s.task_id = f.id "
    "WHERE s.name = :name AND s.consumed_position IS NULL ORDER BY s.id LIMIT 1 "
    "FOR UPDATE OF s), "
    "step AS (INSERT INTO task_steps (task_id, position, name, result, recorded_at, attempt) "
    "SELECT :id, :position, CAST(:step AS text), jsonb_build_object('payload', sig.payload), "
    ":now, :attempt FROM sig ON CONFLICT (task_id, position) DO NOTHING RETURNING task_id), "
    "taken AS (UPDATE task_signals SET consumed_at = :now, consumed_position = :position "
    "FROM sig, step WHERE task_signals.id = sig.id AND task_signals.consumed_position IS NULL "
    "RETURNING task_signals.id, task_signals.payload) "
    "SELECT EXISTS (SELECT 1 FROM valid) AS valid, EXISTS (SELECT 1 FROM free) AS free, "
    "EXISTS (SELECT 1 FROM sig) AS found, (SELECT id FROM taken) AS id, "
    "(SELECT payload FROM taken) AS payload"
)

#: Every claim still held, extended in one statement (``:fences``: JSON {task id:
#: fence}). Rows are locked in id order first, as every multi-row write here
#: does, so that a heartbeat and a group commit of the same tasks cannot deadlock.
HEARTBEAT = (
    "WITH f AS (SELECT CAST(key AS bigint) AS id, CAST(value AS bigint) AS fence "
    "FROM jsonb_each_text(CAST(:fences AS jsonb))), "
    "locked AS MATERIALIZED (SELECT t.id, f.fence FROM tasks t JOIN f ON t.id = f.id "
    "WHERE t.fence = f.fence AND t.state = 'RUNNING' AND t.lease_owner = :owner "
    "AND t.lease_expires_at > :now ORDER BY t.id FOR UPDATE OF t) "
    "UPDATE tasks SET lease_expires_at = :lease_expires_at, updated_at = :now FROM locked "
    "WHERE tasks.id = locked.id AND tasks.fence = locked.fence AND tasks.state = 'RUNNING' "
    "AND tasks.lease_owner = :owner AND tasks.lease_expires_at > :now "
    "RETURNING tasks.id, tasks.fence, tasks.lease_expires_at, tasks.cancel_requested_at"
)
#: Successes without effects or children, with their keys and history lines, in
#: one statement (data-modifying CTEs): one round trip for the whole group.
#: ``:batch`` maps each task id to its claim's owner, fence and result (JSON text).
COMPLETE_MANY = (
    "WITH b AS (SELECT CAST(key AS bigint) AS id, value->>'o' AS owner, "
    "CAST(value->>'f' AS bigint) AS fence, CAST(value->>'r' AS jsonb) AS result "
    "FROM jsonb_each(CAST(:batch AS jsonb))), "
    "locked AS MATERIALIZED (SELECT t.id, b.result FROM tasks t JOIN b ON t.id = b.id "
    "WHERE t.state = 'RUNNING' AND t.lease_owner = b.owner AND t.fence = b.fence "
    "AND t.lease_expires_at > :now ORDER BY t.id FOR UPDATE OF t), "
    "done AS (UPDATE tasks SET state = 'SUCCEEDED', result = locked.result, "
    "lease_owner = NULL, lease_expires_at = NULL, updated_at = :now, finished_at = :now "
    "FROM locked WHERE tasks.id = locked.id AND tasks.state = 'RUNNING' "
    "AND tasks.lease_expires_at > :now "
    "RETURNING tasks.id, tasks.attempts, tasks.idempotency_key, tasks.result), "
    "keys AS (INSERT INTO idempotency_keys (key, task_id, recorded_at, result) "
    f"SELECT coalesce(idempotency_key, '{TASK_KEY_PREFIX}' || id), id, :now, result FROM done "
    "ORDER BY id ON CONFLICT (key) DO NOTHING), "
    "events AS (INSERT INTO task_events (task_id, at, state, attempt, detail) "
    "SELECT id, :now, 'SUCCEEDED', attempts, NULL FROM done) "
    "SELECT id, attempts, idempotency_key, result FROM done"
)
#: ``:n`` fresh task ids, ascending. ``nextval`` locks nothing beyond the call, so a
#: submit in a transaction that stays open holds up no other submit (migration 0010
#: replaced a counter row taken FOR UPDATE until commit). The sequence caches no
#: values per session: ids stay close to the order in which submits ran.
ALLOCATE = "SELECT nextval('durablesched_task_seq') AS id FROM generate_series(1, :n) ORDER BY id"
#: The submission lines of exactly the tasks just stored (``:ids``): ids taken together
#: need not be contiguous, and a task another transaction committed in between may lie
#: among them (statements.SUBMITTED_EVENTS, by range, is SQLite's).
SUBMITTED_EVENTS = (
    "INSERT INTO task_events (task_id, at, state, attempt, detail) "
    f"SELECT id, created_at, 'PENDING', 0, '{SUBMITTED}' FROM tasks "
    "WHERE id = ANY(:ids) ORDER BY id"
)
#: Receivers of tasks moved from database ``:source`` take turns (the copies it
#: recorded must be read and written as one step); anyone else goes on.
LOCK_RECEIVING = (
    "SELECT pg_advisory_xact_lock(hashtext('durablesched_copies'), hashtext(CAST(:source AS text)))"
)
#: The channel a PostgreSQL worker LISTENs on; delivered when the sender commits.
CHANNEL = "durablesched"
#: Wake every listening worker once this transaction commits.
NOTIFY = f"SELECT pg_notify('{CHANNEL}', '')"
#: A signal kept and its waiting task woken (``Dialect.deliver_signal``), in one round
#: trip instead of three, after the task's row was locked by a statement of its own (so
#: that this one's snapshot sees a suspension that committed while the lock was
#: awaited: its wait, which this wakes). The signal inserted; the task due now if it
#: waits for it, and then the idle workers told on commit (``NOTIFY``). Its row: the
#: signal's ``id``, and ``woken``.
DELIVER_SIGNAL = (
    "WITH sig AS (INSERT INTO task_signals (task_id, name, payload, sent_at) "
    "VALUES (:id, CAST(:name AS text), CAST(:payload AS jsonb), :now) RETURNING id), "
    "woken AS (UPDATE tasks SET due_at = :now, updated_at = :now "
    "WHERE id = :id AND state = 'PENDING' AND due_at > :now "
    "AND EXISTS (SELECT 1 FROM task_waits w WHERE w.task_id = :id AND w.signal = :name) "
    "RETURNING id) "
    "SELECT (SELECT id FROM sig) AS id, "
    f"(SELECT count(pg_notify('{CHANNEL}', '')) FROM woken) > 0 AS woken"
)
#: The channel waiting task handles LISTEN on: each notification names the tasks its
#: transaction finished, by id, joined by commas ('' for "some": too many to name).
FINISHED_CHANNEL = "durablesched_finished"
NOTIFY_FINISHED = pyformat(f"SELECT pg_notify('{FINISHED_CHANNEL}', :ids)")
#: The ended children's parents woken (``statements.wake_parents``, its rows locked
#: already: ``LOCK_TASKS``) and the waiting handles told, in one statement: the
#: data-modifying WITH runs whatever the SELECT reads.
WAKE_PARENTS_AND_NOTIFY = pyformat(
    f"WITH woken AS ({wake_parents('child_id = ANY(CAST(:ids AS BIGINT[]))')}) "
    f"SELECT pg_notify('{FINISHED_CHANNEL}', :payload)"
)
#: The server's clock, which every host's leases are judged by.
SQL_SERVER_TIME = text("SELECT clock_timestamp()")

#: Our tables and named indexes, which the health check looks for in the catalog.
OUR_TABLES = tuple(sorted(metadata.tables))
OUR_INDEXES = tuple(
    sorted(ix.name for t in metadata.tables.values() for ix in t.indexes if ix.name)
)
#: The sequence of task ids and seqs (ALLOCATE), which the health check looks for too.
OUR_SEQUENCE = task_seq.name
#: The first id above every task's id and seq: where a lost sequence must start again.
SQL_NEXT_FREE_ID = text("SELECT coalesce(max(greatest(id, seq)), 0) + 1 FROM tasks")
#: Each of them in the current schema, with an index's validity.
SQL_CATALOG = text(
    "SELECT c.relname, c.relkind, i.indisvalid, i.indisready FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_index i ON i.indexrelid = c.oid "
    "WHERE n.nspname = current_schema() AND c.relname IN :names"
).bindparams(bindparam("names", expanding=True))

#: Microseconds between two timestamptz columns: EXTRACT gives exact numeric seconds.
ELAPSED_US = "CAST(EXTRACT(EPOCH FROM ({end} - {start})) * 1000000 AS BIGINT)"

#: Attempts that ended per minute of the window (``Console.minute_counts``), the minute
#: taken in UTC whatever the session's time zone.
MINUTE_COUNTS = text(
    "SELECT date_trunc('minute', at AT TIME ZONE 'UTC') AS minute, "
    "sum(CASE WHEN state = 'SUCCEEDED' THEN 1 ELSE 0 END) AS succeeded, "
    "sum(CASE WHEN state = 'SUCCEEDED' THEN 0 ELSE 1 END) AS failed "
    "FROM task_events WHERE at > :since AND at <= :now "
    "AND state IN ('SUCCEEDED', 'RETRY_WAIT', 'FAILED') GROUP BY 1 ORDER BY 1"
)


def integrity(conn: Connection) -> list[Finding]:
    """The catalog's word: our tables, indexes and sequence exist, and every index is valid
    (an interrupted ``CREATE INDEX CONCURRENTLY`` or ``REINDEX`` leaves one that is not)."""
    names = [*OUR_TABLES, *OUR_INDEXES, OUR_SEQUENCE]
    found = {r.relname: r for r in conn.execute(SQL_CATALOG, {"names": names})}
    if not found:
        return []  # no schema at all: the schema check says so
    findings = [
        Finding(
            "integrity",
            f"{kind} {name} is missing",
            "restore it: run `durablesched migrate` on an empty schema and move the tasks "
            "(`durablesched move`), or restore from a backup",
        )
        for kind, names in (("table", OUR_TABLES), ("index", OUR_INDEXES))
        for name in names
        if name not in found
    ]
    if OUR_SEQUENCE not in found and "tasks" in found:
        start = int(conn.execute(SQL_NEXT_FREE_ID).scalar_one())
        findings.append(
            Finding(
                "integrity",
                f"sequence {OUR_SEQUENCE} is missing: no task can be submitted",
                f"recreate it above every task id: CREATE SEQUENCE {OUR_SEQUENCE} AS bigint "
                f"START WITH {start}",
            )
        )
    findings.extend(
        Finding(
            "integrity",
            f"index {name} is not valid",
            f"rebuild it: REINDEX INDEX {name}",
        )
        for name in OUR_INDEXES
        if name in found and not (found[name].indisvalid and found[name].indisready)
    )
    return findings


def borrowed_problem(connection: Any) -> str | None:
    """A caller's ``psycopg`` connection takes a submit in its open transaction, or in the
    one its next statement begins (not in autocommit mode); not in a failed one."""
    status = connection.info.transaction_status.name
    if status == "INTRANS" or (status == "IDLE" and not connection.autocommit):
        return None
    if status == "IDLE":
        return "the psycopg connection is in autocommit mode and not in a transaction"
    if status == "INERROR":
        return "the psycopg connection's transaction failed: roll it back first"
    return f"the psycopg connection is busy (transaction status {status})"


#: ``Store.finished``'s read (``SQLDialect.finished_outcomes``): the ids as one array.
FINISHED_OUTCOMES = pyformat(
    "SELECT i.id, t.name, t.state, t.attempts, t.result, t.last_error, t.finished_at "
    "FROM unnest(CAST(:ids AS BIGINT[])) AS i (id) "
    "LEFT JOIN tasks AS t ON t.id = i.id "
    f"WHERE t.id IS NULL OR t.{TERMINAL_SQL}"
)


# -- after a change of limit per key -------------------------------------------------------------

#: Tasks a change of a queue's limit per key rewrites (``key_waiting``) before the tasks
#: table is vacuumed after it: each rewritten task's old version stays in the claim's
#: index until a vacuum, those of a busy key's backlog at its front, where every claim of
#: the queue steps over them (100,000 cost a claim about 1.2 ms, docs/queues.md), and
#: autovacuum waits for a fifth of the table to be dead.
VACUUM_AFTER = 10_000
#: How long that vacuum waits for the table (another vacuum under way) before it leaves
#: the table to autovacuum.
VACUUM_LOCK_TIMEOUT = "5s"


def vacuum_after_limit_rewrite(engine: Engine, rewritten: int) -> None:
    """``VACUUM (ANALYZE) tasks`` once a committed change of limit per key rewrote
    :data:`VACUUM_AFTER` tasks or more: alone (no transaction may hold a vacuum); it blocks
    no reader or writer of the table. The change stands whatever happens here: a vacuum
    refused (the table's lock held past :data:`VACUUM_LOCK_TIMEOUT`, the connection
    lost) is logged and left to autovacuum; a role that does not own the table gets
    PostgreSQL's own warning and no vacuum."""
    if rewritten < VACUUM_AFTER:
        return
    started = time.monotonic()
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            try:
                conn.exec_driver_sql(f"SET lock_timeout = '{VACUUM_LOCK_TIMEOUT}'")
                conn.exec_driver_sql("VACUUM (ANALYZE) tasks")
                conn.exec_driver_sql("RESET lock_timeout")
            except DBAPIError:
                conn.invalidate()  # its lock_timeout, or a broken connection: not reused
                raise
    except SQLAlchemyError as e:  # none connected (the pool spent), or the vacuum failed
        log.warning(
            "vacuuming tasks after a change of limit per key that rewrote %d tasks failed "
            "(autovacuum will, in time; until then claims step over their old versions): %s",
            rewritten,
            e.orig if isinstance(e, DBAPIError) else e,
        )
        return
    log.info(
        "vacuumed tasks after a change of limit per key that rewrote %d tasks in %.1f s",
        rewritten,
        time.monotonic() - started,
    )


def autocommit(connection: Any) -> None:
    """A psycopg connection in autocommit: a lone read holds no transaction open."""
    connection.rollback()
    connection.autocommit = True


#: PostgreSQL as the store sees it: ``%s``/``%(name)s`` placeholders, times as
#: timestamptz, history written by the claim and group commit themselves.
POSTGRES = SQLDialect(
    name="postgresql",
    claim=_claim,
    claim_keyed=functools.partial(_claim, keyed=True),
    claim_bounded=_claim,
    sync_keys=text(SYNC_KEYS),
    heartbeat=pyformat(HEARTBEAT),
    complete_many=pyformat(COMPLETE_MANY),
    next_due=functools.cache(_next_due),
    insert_task=INSERT_TASK.format(p="%s"),
    allocate=pyformat(ALLOCATE),
    insert_keyed_task=INSERT_KEYED_TASK.format(p="%s"),
    queues_apart=True,
    lock_receiving=text(LOCK_RECEIVING),
    submitted_events=pyformat(SUBMITTED_EVENTS),
    insert_events=INSERT_EVENTS.format(p="%s"),
    record_keys=RECORD_KEYS.format(p="%s"),
    time=as_utc,
    integrity=integrity,
    elapsed_us=ELAPSED_US,
    minute_counts=MINUTE_COUNTS,
    live_queue_counts=SQL_LIVE_QUEUE_COUNTS,
    finished_outcomes=FINISHED_OUTCOMES,
    ids=list,
    wake_parents=pyformat(wake_parents("child_id = ANY(CAST(:ids AS BIGINT[]))")),
    driver=pyformat,
    autocommit=autocommit,
    lock_queues=text(LOCK_QUEUES).bindparams(NAMES),
    lock_keyed_tasks=text(LOCK_KEYED_TASKS),
    after_limit_rewrite=vacuum_after_limit_rewrite,
    lock_tasks=LOCK_TASKS,
    record_step=text(RECORD_STEP),
    receive_signal=text(RECEIVE_SIGNAL),
    deliver_signal=text(DELIVER_SIGNAL),
    notify=text(NOTIFY),
    notify_finished=NOTIFY_FINISHED,
    wake_parents_and_notify=WAKE_PARENTS_AND_NOTIFY,
    writes_history=True,
    borrowed_problem=borrowed_problem,
)

# -- the engine ----------------------------------------------------------------------------------

#: synchronous_commit per durability mode: "normal" may lose the last commits
#: if the server crashes, never corrupts (docs/scaling.md).
SYNCHRONOUS_COMMIT: dict[str, str] = {"full": "on", "normal": "off"}


def create_postgres_engine(
    db: str, *, durability: Durability = "full", pool_size: int = 8, readonly: bool = False
) -> Engine:
    """An engine whose connections read JSONB as text and commit as ``durability`` says;
    with ``readonly``, every transaction is READ ONLY (the server refuses any write)."""
    synchronous_commit = SYNCHRONOUS_COMMIT[check_durability(durability)]
    try:
        import psycopg  # noqa: F401, PLC0415 - optional dependency, checked here for a clear error
    except ImportError:
        raise ConfigurationError(
            "PostgreSQL needs psycopg 3: pip install 'durablesched[postgres]'"
        ) from None
    from psycopg.types.string import TextLoader  # noqa: PLC0415 - optional dependency

    engine = create_engine(postgres_url(db), pool_size=pool_size, max_overflow=64)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # JSON columns come back as the text SQLite gives, parsed in one place.
        dbapi_connection.adapters.register_loader("jsonb", TextLoader)
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        dbapi_connection.execute(f"SET synchronous_commit = {synchronous_commit}")
        if readonly:
            dbapi_connection.execute("SET default_transaction_read_only = on")
        dbapi_connection.autocommit = autocommit

    return engine


class PostgresStore(SQLStore):
    """A :class:`~durablesched.store.Store` in a PostgreSQL database, for workers on many hosts.

    ``db`` is a ``postgresql://`` or ``postgresql+psycopg://`` URL. The schema
    is created or checked as for SQLite (``create=False`` creates nothing: a
    database without the schema is :class:`SchemaMissingError`; ``readonly=True``
    implies it, and runs every transaction READ ONLY). Claims use ``FOR UPDATE SKIP LOCKED``;
    a submit wakes idle workers with NOTIFY when it commits. Lease times are
    judged by the server's clock (:meth:`server_clock`), so hosts whose clocks
    disagree still agree on expiry.
    """

    def __init__(
        self,
        db: str,
        *,
        durability: Durability = "full",
        migrate: bool = False,
        pool_size: int = 8,
        create: bool = True,
        readonly: bool = False,
        verify_schema: bool = True,
    ) -> None:
        engine = create_postgres_engine(
            db, durability=durability, pool_size=pool_size, readonly=readonly
        )
        self.durability = durability
        self.readonly = readonly
        super().__init__(
            engine,
            POSTGRES,
            migrate=migrate and not readonly,
            create=create and not readonly,
            verify_schema=verify_schema,
        )

    def server_time(self) -> datetime:
        """The server's clock, now."""
        with self._read("reading the server's clock") as conn:
            return from_db_time(conn.execute(SQL_SERVER_TIME).scalar_one())

    def server_clock(self) -> ServerClock:
        """A clock that follows the server's, for every worker and submitter on any host."""
        return ServerClock(self.server_time)

    def watch_changes(
        self, poll_interval: float = 0.01, *, safety_poll: float | None = 1.0
    ) -> NotifyWatcher:
        """A LISTEN watcher; ``poll_interval`` is unused (PostgreSQL tells), and
        ``safety_poll`` is :class:`NotifyWatcher`'s wake-up whatever it hears."""
        return NotifyWatcher(self.engine, safety_poll=safety_poll)

    def watch_finished(self) -> FinishListener:
        """A LISTEN on the channel that outcome transactions NOTIFY with the ids they
        finished (:data:`NOTIFY_FINISHED`)."""
        return FinishListener(self.engine)


class NotifyWatcher:
    """LISTENs for submissions (NOTIFY is delivered when the submitter commits).

    It also wakes the worker every ``safety_poll`` seconds (:attr:`SAFETY_POLL`
    by default) whatever it hears, so a lost notification (a dropped connection)
    delays work by at most that; ``safety_poll=None`` turns that off, so that
    only a NOTIFY (or a reconnection) wakes it. A broken connection is
    reopened; it never stops the worker. ``channel`` is the one it LISTENs on.

    Between wake-ups its thread sleeps in the kernel, on the connection's socket
    and a pipe that :meth:`close` writes to (:meth:`_heard`): psycopg's own
    ``notifies(timeout=...)`` wakes ten times a second to poll, which cost an idle
    worker (or a process waiting on handles) 0.4 % of a core.
    """

    #: Seconds between wake-ups when nothing is heard, unless told otherwise.
    SAFETY_POLL = 1.0
    #: Seconds before listening again after the connection broke; a tenth of how long
    #: :meth:`close` waits for the thread.
    _TICK = 0.2
    #: The longest batch (seconds) a consumer that asked for one gets (start_payloads).
    QUIET = 0.25

    def __init__(
        self,
        engine: Engine,
        *,
        safety_poll: float | None = SAFETY_POLL,
        channel: str = CHANNEL,
    ) -> None:
        if safety_poll is not None and safety_poll <= 0:
            raise ConfigurationError(f"safety_poll must be positive or None, got {safety_poll}")
        self._engine = engine
        self._safety_poll = safety_poll
        self._channel = channel
        self._closed = threading.Event()
        self._nudged = threading.Event()
        self._thread: threading.Thread | None = None
        #: Written to by :meth:`close`: ends the thread's sleep on the socket at once.
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._conn: Any = self._listen()
        except BaseException:
            self._close_pipe()
            raise

    def _listen(self) -> Any:
        import psycopg  # noqa: PLC0415 - optional dependency, present if we got here

        with translated(f"listening on {self._channel}"):
            raw = self._engine.raw_connection()
        conn = raw.driver_connection
        assert conn is not None
        raw.detach()  # ours alone, for as long as we listen
        try:
            conn.rollback()
            conn.autocommit = True
            conn.execute(f"LISTEN {self._channel}")
        except psycopg.Error as e:
            conn.close()
            raise StoreError(f"listening on {self._channel} failed: {e}") from e
        return conn

    def start(self, on_change: OnChange) -> None:
        def deliver(_payloads: list[str] | None) -> None:
            on_change(None)  # its answer is not heeded: see nudge()

        self._start(deliver)

    def start_payloads(self, deliver: Callable[[list[str] | None], bool | float | None]) -> None:
        """Call ``deliver(payloads)`` with what each wake-up heard, or None where some
        may have been missed (a reconnection, a safety poll). ``deliver`` answering
        True asks for a batch: the notifications that arrive next wait in the
        connection until :meth:`nudge` (or :attr:`QUIET` seconds, or as many as it
        answered instead of True, if fewer), then come at once."""
        self._start(deliver)

    def _start(self, deliver: Callable[[list[str] | None], bool | float | None]) -> None:
        self._thread = threading.Thread(
            target=self._watch, args=(deliver,), name="durablesched-listen", daemon=True
        )
        self._thread.start()

    def nudge(self) -> None:
        """End a batch asked for by :meth:`start_payloads`'s consumer. (:meth:`start`'s
        never asks: only submissions and cancels notify, never a worker's own group
        commits, so a worker's watcher never keeps quiet.)"""
        self._nudged.set()

    def _watch(self, deliver: Callable[[list[str] | None], bool | float | None]) -> None:
        poll = self._safety_poll if self._safety_poll is not None else float("inf")
        next_poll = time.monotonic() + poll
        while not self._closed.is_set():
            missed = False
            payloads: list[str] = []
            try:
                if self._conn is None:
                    self._conn = self._listen()
                    missed = True  # we may have missed some while away
                # Listening again: tell at once that some may have been missed.
                payloads.extend(self._heard(0 if missed else next_poll - time.monotonic()))
            except Exception as e:  # the connection broke: reopen it
                if self._closed.is_set():
                    return
                log.warning("lost the LISTEN connection, reopening: %s", e)
                self._drop()
                self._closed.wait(self._TICK)
                missed = True
            if time.monotonic() >= next_poll:
                missed = True
            if (missed or payloads) and not self._closed.is_set():
                next_poll = time.monotonic() + poll
                self._nudged.clear()  # before asking: a nudge after the answer is kept
                quiet = deliver(None if missed else payloads)
                if quiet:
                    self._nudged.wait(quiet_for(quiet, self.QUIET))

    def _heard(self, timeout: float) -> list[str]:
        """The payloads of the notifications that came, waiting up to ``timeout`` seconds
        (``math.inf``: until one comes) for the first, asleep on the connection's socket
        (and the stop pipe): then every one read in that go, none waited for."""
        conn = self._conn
        heard = [n.payload for n in conn.notifies(timeout=0)]  # read before, or just come
        if heard or timeout <= 0:
            return heard
        readable([conn.fileno(), self._stop_r], timeout)
        return [n.payload for n in conn.notifies(timeout=0)]

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as e:  # already broken: nothing more to release
                log.debug("closing a broken LISTEN connection: %s", e)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._nudged.set()  # a batch being gathered ends too
        os.write(self._stop_w, b"x")  # and its sleep on the socket
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._TICK * 10)
        self._drop()
        if self._thread is None or not self._thread.is_alive():  # (else it may read it)
            self._close_pipe()

    def _close_pipe(self) -> None:
        os.close(self._stop_r)
        os.close(self._stop_w)


class FinishListener:
    """A :class:`FinishWatcher` on PostgreSQL: LISTENs on :data:`FINISHED_CHANNEL`,
    whose notifications name the tasks their transaction finished. Without a safety
    poll: the waiting handles read at their own bounded interval anyway. Asked for a
    batch, it leaves the next notifications queued in its connection until nudged."""

    def __init__(self, engine: Engine) -> None:
        self._watcher = NotifyWatcher(engine, safety_poll=None, channel=FINISHED_CHANNEL)

    def start(self, on_finished: OnFinished, awaited: Awaited | None = None) -> None:
        """``awaited`` is not used: a notification names the tasks, and their outcomes
        are read by who waits (:meth:`SQLStore.finished`)."""

        def deliver(payloads: list[str] | None) -> bool | float | None:
            if payloads is None or "" in payloads:
                return on_finished(None)
            return on_finished([int(i) for payload in payloads for i in payload.split(",")])

        self._watcher.start_payloads(deliver)

    def nudge(self) -> None:
        self._watcher.nudge()

    def close(self) -> None:
        self._watcher.close()
