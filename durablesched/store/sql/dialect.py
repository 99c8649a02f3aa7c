"""What the store must know about a database: its own statements and how it binds values.

Each database's module (:mod:`.sqlite`, :mod:`.postgres`) builds one
:class:`SQLDialect` from its statements; the store runs whichever it is given,
and knows neither database by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, TextClause

from durablesched.records import Finding


def pyformat(sql: str) -> str:
    """``:name`` placeholders as psycopg's ``%(name)s`` (the statements hold no ``%``)."""
    assert "%" not in sql and "::" not in sql, sql
    return re.sub(r"(?<![\w:]):(\w+)", r"%(\1)s", sql)


@dataclass(frozen=True)
class SQLDialect:
    """The statements and conversions that differ between the databases.

    The hot-path statements (claim, heartbeat, group commit) are handed straight
    to the driver: SQLAlchemy's work per statement costs more than the statement
    (docs/performance.md). They are written with ``:name`` placeholders.
    """

    name: str
    #: The claim from ``arms`` queues (``:q0``, ``:l0`` ... each queue and how many
    #: of it at most), ``:limit`` in all, limited to ``names`` names (``:n0`` ...) if
    #: not 0, as the database's own SQL with ``:name`` placeholders.
    claim: Callable[[int, int], str]
    heartbeat: str
    complete_many: str
    #: The earliest due time after ``:now``, filtered by names and by queues (flags).
    next_due: Callable[[bool, bool], TextClause]
    insert_task: str
    #: The submission lines of the tasks just stored: ids ``:first`` to ``:last``
    #: (statements.SUBMITTED_EVENTS), or exactly ``:ids`` where ids taken together need
    #: not be contiguous (a sequence that others take from too).
    submitted_events: str
    insert_events: str
    record_keys: str
    #: How a datetime is bound: text on SQLite, timestamptz on PostgreSQL.
    time: Callable[[datetime], Any]
    #: The database's own consistency check, in a read transaction: what it found.
    integrity: Callable[[Connection], list[Finding]]
    #: The exact number of microseconds from time ``{start}`` to time ``{end}`` (two
    #: columns), an integer: metrics' run times, compared with bounds exactly.
    elapsed_us: str
    #: Per minute of ``task_events.at`` in (``:since``, ``:now``], oldest first: the
    #: minute (its start as text or time), SUCCEEDED lines, and RETRY_WAIT or FAILED
    #: lines (``Console.minute_counts``), through ``ix_task_events_at``.
    minute_counts: TextClause
    #: Per queue and state, the live tasks and the oldest due (``queue_info(finished=False)``).
    live_queue_counts: TextClause
    #: Of the task ids ``:ids`` (one parameter, bound by :attr:`ids`), rows ``(id, name,
    #: state, attempts, result, last_error, finished_at)`` of the finished tasks and, with
    #: state NULL, of the ids no task has (``Store.finished``): one statement that costs
    #: what it finds, not what it asks about; as the driver takes it (a hot path).
    finished_outcomes: str
    #: How a list of task ids is bound to one parameter.
    ids: Callable[[list[int]], Any]
    #: ``statements.wake_parents`` for the ended children ``:ids`` (bound by :attr:`ids`),
    #: as the driver takes it: every transaction that ends tasks runs it.
    wake_parents: str
    #: The task list's index for a state filter, by state (``Console.find_tasks``),
    #: where the database's planner must be told: what follows ``FROM tasks``, and a
    #: term to add to the state's (see ``statements.sql_find_tasks``).
    find_hints: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: A ``:name`` statement as the driver takes it.
    driver: Callable[[str], str] = str
    #: Puts a driver connection of this database's engine in autocommit: each statement
    #: its own transaction (``Transactions._lone_rows``). SQLite's engine's are already.
    autocommit: Callable[[Any], None] = lambda _connection: None
    #: ``:n`` fresh task ids (and ``seq`` values) as rows, ascending, taken without a
    #: lock that outlasts the statement (a sequence), as the driver takes it; None:
    #: the counter row (``statements.SQL_ALLOCATE``), where one writer at a time is
    #: the database's rule anyway.
    allocate: str | None = None
    #: :data:`insert_task` for one task with a key, storing nothing (and returning no
    #: row) if a key-holding task has the key; None: keys are looked up first, with
    #: no concurrent writer to race (SQLite). A transaction still open that holds the
    #: key makes this wait for it to end: the only enqueue that waits on another.
    insert_keyed_task: str | None = None
    #: A new queue's row is made in a short transaction of its own, not the caller's:
    #: so that two open transactions submitting to a new queue never wait on each other.
    queues_apart: bool = False
    #: Run first when receiving moved tasks from database ``:source``: receivers of the
    #: same source take turns (its copies table rows), no one else waits.
    lock_receiving: TextClause | None = None
    #: :data:`claim` that also counts the starts of the queues limited per key in
    #: ``:keyed`` (an array of names), whose rows it takes first, on their keys' rows,
    #: and returns one more column per task: whether its key is to be brought up to date
    #: by :data:`sync_keys` after it. None: the database's triggers count a claim's
    #: starts (SQLite).
    claim_keyed: Callable[[int, int], str] | None = None
    #: The claim written with ``bound``, a literal no arm's limit exceeds, for a planner
    #: that reads a literal LIMIT but guesses a parameter's (PostgreSQL's generic plan
    #: of a prepared statement): ``(arms, names, keyed, bound)``. None: ``claim`` and
    #: ``claim_keyed`` are the statements for every limit.
    claim_bounded: Callable[[int, int, bool, int], str] | None = None
    #: Brings keys (``:queues``, ``:keys``, two lists in order) up to date in a claim's
    #: transaction, as the triggers do after any other change of a keyed task.
    sync_keys: TextClause | None = None
    #: Run in a claim before counting what limited queues (``:names``) run: many
    #: hosts claim at once on PostgreSQL; SQLite has one writer anyway.
    lock_queues: TextClause | None = None
    #: Run first in a change of a queue's limit per key (``:name``), before its row is
    #: taken: takes the queue's live tasks with a limit key, so that every change of them
    #: under way has committed (and is seen) when their keys' heads are chosen afresh.
    #: None: one writer at a time (SQLite).
    lock_keyed_tasks: TextClause | None = None
    #: Run after a change of a queue's limit per key has committed, with the engine and
    #: how many tasks it rewrote (their ``key_waiting``): where old row versions stay in
    #: the claim's index until a vacuum (PostgreSQL), vacuums the tasks table when they
    #: are many. None: nothing is left behind (SQLite rewrites in place).
    after_limit_rewrite: Callable[[Engine, int], None] | None = None
    #: Run first in a transaction that records outcomes (and starts, signals): takes the
    #: rows of every task it writes (``:ids``) and of the parents of those that may end
    #: (``:children``: a child's end wakes its parent), all in id order, so that no two
    #: such transactions deadlock; SQLite has one writer anyway. As the driver takes it,
    #: both lists bound by :attr:`ids` (a group commit runs it).
    lock_tasks: str | None = None
    #: A step's checkpoint in one statement: the claim's task locked and checked valid
    #: (``VALID``), and the checkpoint inserted unless its position is recorded; a row
    #: if it was. One round trip a step where each costs one (PostgreSQL); None: the
    #: two statements of :mod:`.workflows` (SQLite: in-process, nothing to save).
    record_step: TextClause | None = None
    #: A wait taking its signal in one statement (``Store.receive_signal``): one row of
    #: ``valid``, ``free`` (no step at the wait's position), ``found`` (a signal waited)
    #: and the taken signal's ``id`` and ``payload`` (NULL if none was taken). None: the
    #: statements of :mod:`.workflows` (SQLite: in-process, nothing to save).
    receive_signal: TextClause | None = None
    #: A signal kept and its task woken if it waits for it, with :attr:`notify` then, in
    #: one statement run once the task's row is locked: a row of the signal's ``id`` and
    #: ``woken``. None: the statements of :mod:`.signals` (SQLite).
    deliver_signal: TextClause | None = None
    #: Run in a transaction whose commit should wake idle workers elsewhere.
    notify: TextClause | None = None
    #: Run in a transaction that finished tasks (``:ids``, their ids joined by commas):
    #: wakes the handles waiting on them elsewhere (``Store.watch_finished``). As the
    #: driver takes it (a group commit runs it).
    notify_finished: str | None = None
    #: :attr:`wake_parents` and :attr:`notify_finished` in one statement (``:ids``,
    #: ``:now``, and ``:payload``: what :attr:`notify_finished` takes as ``:ids``), one
    #: round trip less for every transaction that ends tasks. None: the two apart.
    wake_parents_and_notify: str | None = None
    #: The claim and group-commit statements write their own history lines and keys.
    writes_history: bool = False
    #: Where no INSERT trigger on tasks keeps a new task's limit key (SQLite, migration
    #: 0017): :data:`insert_task` for a task with a limit key, through a view whose
    #: trigger keeps it (tasks of a batch in id order, as an INSERT trigger would) ...
    insert_keyed_row: str | None = None
    #: ... and the statement run (by position: the task's id) after a task with a limit
    #: key was inserted otherwise (debounced): it fires the UPDATE trigger. None: the
    #: database's INSERT trigger keeps the key.
    touch_new_key: str | None = None
    #: Why a caller's own driver connection cannot take a submit in its transaction
    #: (none open, or a failed one), or None if it can (:mod:`.borrowed`).
    borrowed_problem: Callable[[Any], str | None] | None = None

    def claim_for(self, arms: int, names: int, keyed: bool = False, most: int = 1) -> str:
        """The claim as the driver takes it (cached: queues and names rarely change);
        ``keyed``: :data:`claim_keyed`; ``most``: the largest of its arms' limits, rounded
        up to a power of two for :data:`claim_bounded` (a statement per power, not per
        limit: a few, each prepared by the driver once it has run a few times)."""
        bound = 1 << max(most - 1, 0).bit_length() if self.claim_bounded is not None else 0
        key = (self.name, arms, names, keyed, bound)
        cached = _CLAIMS.get(key)
        if cached is None:
            if self.claim_bounded is not None:
                sql = self.claim_bounded(arms, names, keyed, bound)
            else:
                make = self.claim_keyed if keyed and self.claim_keyed is not None else self.claim
                sql = make(arms, names)
            cached = _CLAIMS[key] = self.driver(sql)
        return cached

    def prepared(self, sql: str) -> str:
        """A shared ``:name`` statement (``statements``, ``totals``) as the driver takes it,
        converted once: the group commit's statements run through the driver, not
        SQLAlchemy's compilation of each call (docs/performance.md)."""
        key = (self.name, sql)
        cached = _PREPARED.get(key)
        if cached is None:
            cached = _PREPARED[key] = self.driver(sql)
        return cached


_CLAIMS: dict[tuple[str, int, int, bool, int], str] = {}
_PREPARED: dict[tuple[str, str], str] = {}


def names_in(names: int) -> str:
    """``AND name IN (:n0, :n1, ...)`` for ``names`` names, or nothing for 0."""
    return f"AND name IN ({', '.join(f':n{i}' for i in range(names))})" if names else ""
