"""Limits per key (issue 32): what a claim costs with a busy key's backlog ahead, and what
the per-key machinery costs a queue that does not use it.

``python -m benchmarks.limit_keys [--tasks N] [--keys K] [--busy B] [--claims C]
[--claim-rounds R] [--plain N] [--rounds R] [--pg URL]``

1. **Busy key.** ``--tasks`` pending tasks in one queue over ``--keys`` limit keys, one
   of which (the busy key) holds ``--busy`` of them ahead of every other (a higher
   priority, due first), with a concurrency per key of 1 and the busy key running
   one; beside it a queue of as many tasks without limit keys (filled the same way,
   its first task running too). Both are built first, then ``--claims`` claims of 10
   on each (a keyed one takes 10 other keys' heads, never the busy key's) are timed
   in turn, in ``--claim-rounds`` rounds: a block of claims on one queue, then as
   many on the other, which goes first turning each round. Reported: the median of
   the rounds' ratios (the keyed block's median claim over the plain one's), their
   quartiles and range. Target: a ratio of at most 1.5 at 1,000,000 tasks, 10,000
   keys, 100,000 busy. The limit per key is set after the fill (the time it took is
   printed): on PostgreSQL that change rewrites every keyed task and so vacuums the
   table after it (``postgres.vacuum_after_limit_rewrite``). On PostgreSQL the claims
   are timed again after ``VACUUM ANALYZE tasks`` of both (see :func:`vacuum`).
2. **Plain queue.** ``--plain`` tasks without keys submitted and drained through the
   store (claims of 32 and group commits of their successes, one thread) with the
   triggers on ``tasks`` (migrations 0013 and 0017) in place and dropped: what a queue
   without limit keys pays for them (target: at most 5 %). For the whole change, run
   ``python -m benchmarks.run`` (the worker throughput) on main and on this branch.

3. **Debounce.** ``--debounce-rate`` submits a second with
   ``debounce=("doc:7", 30 s)`` for ``--debounce-seconds`` (paced by the system
   clock, as a busy caller would): the submit rate reached, and that one task exists,
   due 30 s after the last submit, with its arguments (target: 1,000 a second for
   10 s runs once, 30 s after the last). Then a worker's claim 1 ms before that due
   time takes nothing and one at it takes the task.

On SQLite in a temporary file (``durability=normal``); with ``--pg URL``, also on
PostgreSQL, each database in a fresh schema of that server, dropped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import text

from durablesched import PostgresStore, QueueLimits, Scheduler, SQLiteStore
from durablesched.records import NewTask, Outcome
from durablesched.store.sql.store import SQLStore

from .common import NOW, fresh

LEASE = timedelta(minutes=10)
BATCH = 10_000
DROP_TRIGGERS = {
    "sqlite": [  # no INSERT trigger since migration 0017
        "DROP TRIGGER durablesched_limit_key_update",
        "DROP TRIGGER durablesched_limit_key_claim",  # a claim's change (migration 0020)
        "DROP TRIGGER durablesched_limit_key_leave",
        "DROP TRIGGER durablesched_limit_key_delete",
    ],
    "postgresql": [
        "DROP TRIGGER durablesched_limit_key_insert ON tasks",
        "DROP TRIGGER durablesched_limit_key_update ON tasks",
        "DROP TRIGGER durablesched_limit_key_delete ON tasks",
    ],
}


def fill(store: SQLStore, tasks: int, keys: int, busy: int, keyed: bool) -> None:
    """``tasks`` pending tasks in queue q: ``busy`` first (priority 5, due first) under
    key ``busy``, the rest spread over ``keys - 1`` other keys (no keys unless ``keyed``);
    then the limit per key, and one of the busy key running."""
    others = max(keys - 1, 1)

    def task(i: int) -> NewTask:
        if i < busy:
            return NewTask("t", {}, NOW, 1, None, "{}", "q", 5, "busy" if keyed else None)
        key = f"key:{i % others}" if keyed else None
        return NewTask("t", {}, NOW + timedelta(seconds=1), 1, None, "{}", "q", 0, key)

    for start in range(0, tasks, BATCH):
        store.submit([task(i) for i in range(start, min(tasks, start + BATCH))], NOW)
    if keyed:
        # Set after the fill: each key's head is chosen once, by the change of limit
        # (on PostgreSQL followed by its vacuum of the table: it rewrites every keyed task).
        began = time.perf_counter()
        store.put_queue(QueueLimits("q", concurrency_per_key=1), NOW)
        print(f"limit per key set on {tasks:,} tasks in {time.perf_counter() - began:.1f}s")
    (first,) = store.claim("w", 1, NOW + timedelta(seconds=5), LEASE)
    assert first.priority == 5


def claim_times(store: SQLStore, claims: int, keyed: bool, first: int = 0) -> list[float]:
    """Seconds per claim of 10, ``claims`` of them (with keys: none of the busy key's), the
    first at ``first`` seconds after the others' start."""
    times = []
    for i in range(first, first + claims):
        now = NOW + timedelta(seconds=10 + i)
        start = time.perf_counter()
        taken = store.claim("w", 10, now, LEASE)
        times.append(time.perf_counter() - start)
        assert len(taken) == 10
        assert not keyed or all(c.priority == 0 for c in taken), "a busy key's task started"
    return times


def in_turn(
    stores: dict[bool, SQLStore], claims: int, rounds: int, first: int = 0
) -> tuple[dict[bool, list[float]], list[float]]:
    """``claims`` claims of 10 on each store (keyed or not), timed in ``rounds`` rounds: a
    round times a block of claims on one store, then as many on the other, which goes
    first turning each round, so a slow spell of a shared machine hits both sides of a
    round's ratio. Returns every claim's seconds per store and each round's ratio of the
    two blocks' medians (keyed over plain)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    ratios = []
    block = max(claims // rounds, 1)
    for r in range(rounds):
        offset = first + r * block
        order = (True, False) if r % 2 == 0 else (False, True)
        found = {keyed: claim_times(stores[keyed], block, keyed, offset) for keyed in order}
        for keyed, block_times in found.items():
            times[keyed] += block_times
        ratios.append(statistics.median(found[True]) / statistics.median(found[False]))
    return times, ratios


def vacuum(store: SQLStore) -> None:
    """PostgreSQL: ``VACUUM ANALYZE tasks``, as autovacuum would in time: of both tables,
    the plain one's as built too (its statistics known, as the keyed one's are after the
    vacuum that follows its change of limit)."""
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE tasks"))


def busy_key(
    name: str,
    open_store: Callable[[], SQLStore],
    *,
    tasks: int,
    keys: int,
    busy: int,
    claims: int,
    rounds: int,
) -> None:
    """Both queues filled (the keyed one with the busy key's backlog ahead, the plain one
    with as many tasks without keys), then their claims timed in turn (:func:`in_turn`)."""
    stores: dict[bool, SQLStore] = {}
    try:
        for keyed in (False, True):
            stores[keyed] = open_store()
            start = time.perf_counter()
            fill(stores[keyed], tasks, keys, busy, keyed)
            built = time.perf_counter() - start
            print(
                f"{name}, {'busy key' if keyed else 'no keys'}: built {tasks:,} tasks in "
                f"{built:.1f}s"
            )
        found = [("", *in_turn(stores, claims, rounds))]
        if stores[True].dialect.name == "postgresql":
            for store in stores.values():
                vacuum(store)
            found.append((" (after VACUUM)", *in_turn(stores, claims, rounds, first=claims)))
    finally:
        for store in stores.values():
            store.close()
    for when, times, ratios in found:
        med = {keyed: statistics.median(t) * 1000 for keyed, t in times.items()}
        spread = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"{name}{when}: claim of 10 (median of {len(times[True])} each, in turn): "
            f"{med[True]:.2f} ms with the busy key ahead, {med[False]:.2f} ms without keys"
        )
        print(
            f"{name}{when}: a claim with a busy key of {busy:,} ahead costs "
            f"{statistics.median(ratios):.2f}x one without keys (median of {len(ratios)} "
            f"rounds' ratios; quartiles {spread[0]:.2f}-{spread[2]:.2f}, range "
            f"{min(ratios):.2f}-{max(ratios):.2f}; target <= 1.5)"
        )


def drain_rate(store: SQLStore, n: int) -> float:
    """Tasks a second: submit ``n`` plain tasks, then claim 32 and record their successes
    in group commits until none is left."""
    start = time.perf_counter()
    for first in range(0, n, BATCH):
        store.submit([NewTask("t", {}, NOW, 1) for _ in range(min(BATCH, n - first))], NOW)
    claims = store.claim("w", 32, NOW, LEASE)
    done = 0
    while claims:
        done += len(claims)
        _, claims = store.record_and_claim(
            [Outcome(c) for c in claims], NOW, owner="w", limit=32, lease=LEASE
        )
    assert done == n
    return n / (time.perf_counter() - start)


def plain_queue(name: str, open_store: Callable[[], SQLStore], n: int, rounds: int) -> None:
    rates: dict[str, list[float]] = {"triggers": [], "dropped": []}
    for _ in range(rounds):
        for case, found in rates.items():
            store = open_store()
            try:
                if case == "dropped":
                    with store.engine.begin() as conn:
                        for sql in DROP_TRIGGERS[store.dialect.name]:
                            conn.execute(text(sql))
                found.append(drain_rate(store, n))
            finally:
                store.close()
    with_, without = statistics.median(rates["triggers"]), statistics.median(rates["dropped"])
    print(
        f"{name}, plain queue ({n:,} tasks, median of {rounds}): {with_:.0f} tasks/s with the "
        f"limit-key triggers, {without:.0f} without: {(1 - with_ / without) * 100:+.1f} % "
        "cost (target <= 5 %)"
    )


def debounce(name: str, open_store: Callable[[], SQLStore], rate: int, seconds: float) -> None:
    store = open_store()
    try:
        scheduler = Scheduler(store)
        wait = timedelta(seconds=30)
        ids = set()
        start = time.perf_counter()
        n = 0
        last = None
        while (elapsed := time.perf_counter() - start) < seconds:
            if n >= elapsed * rate:  # ahead of the pace: wait for the clock
                time.sleep(min(0.001, n / rate - elapsed))
                continue
            last = scheduler.clock.now()
            ids.add(scheduler.submit("index", {"n": n}, debounce=("doc:7", wait)))
            n += 1
        took = time.perf_counter() - start
        assert last is not None and len(ids) == 1, ids
        (task_id,) = ids
        task = scheduler.get(task_id)
        tasks = len(store.list_tasks(limit=10))
        due_after_last = (task.due_at - last).total_seconds()
        early = store.claim("w", 10, task.due_at - timedelta(milliseconds=1), LEASE)
        on_time = store.claim("w", 10, task.due_at, LEASE)
    finally:
        store.close()
    print(
        f"{name}, debounce: {n:,} submits in {took:.1f}s ({n / took:.0f}/s, asked "
        f"{rate}/s): {tasks} task, due {due_after_last:.3f}s after the last submit, with its "
        f"arguments {task.args}; claimed {len(early)} before then and {len(on_time)} at it"
    )
    assert tasks == 1 and task.args == {"n": n - 1} and (len(early), len(on_time)) == (0, 1)


@contextlib.contextmanager
def pg_schemas(base: str) -> Iterator[Callable[[], SQLStore]]:
    """Stores on fresh schemas of ``base``, each dropped on exit."""
    import psycopg  # noqa: PLC0415 - optional: only with --pg

    made: list[str] = []

    def open_store() -> SQLStore:
        name = f"bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {name}")
        made.append(name)
        sep = "&" if "?" in base else "?"
        return PostgresStore(f"{base}{sep}options={quote(f'-csearch_path={name}')}")

    try:
        yield open_store
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            for name in made:
                admin.execute(f"DROP SCHEMA {name} CASCADE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--busy", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=200, help="claims of 10 per queue")
    parser.add_argument(
        "--claim-rounds", type=int, default=20, help="rounds the claims are timed in, in turn"
    )
    parser.add_argument("--plain", type=int, default=20_000, help="tasks per plain-queue run")
    parser.add_argument("--rounds", type=int, default=3, help="plain-queue runs of each kind")
    parser.add_argument("--debounce-rate", type=int, default=1_000, help="submits a second")
    parser.add_argument("--debounce-seconds", type=float, default=10.0)
    parser.add_argument("--pg", metavar="URL", help="also on this PostgreSQL server")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000_000))

        def open_sqlite() -> SQLStore:
            path = fresh(Path(tmp) / f"keys{next(counter)}.db")
            return SQLiteStore(path, durability="normal")

        sizes = {
            "tasks": args.tasks,
            "keys": args.keys,
            "busy": args.busy,
            "claims": args.claims,
            "rounds": args.claim_rounds,
        }
        busy_key("SQLite", open_sqlite, **sizes)
        plain_queue("SQLite", open_sqlite, args.plain, args.rounds)
        debounce("SQLite", open_sqlite, args.debounce_rate, args.debounce_seconds)
    if args.pg:
        with pg_schemas(args.pg) as open_pg:
            busy_key("PostgreSQL", open_pg, **sizes)
            plain_queue("PostgreSQL", open_pg, args.plain, args.rounds)
            debounce("PostgreSQL", open_pg, args.debounce_rate, args.debounce_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
