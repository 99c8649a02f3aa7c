"""Durable workflows (issue 31's targets), on SQLite and PostgreSQL.

- ``steps``: W workflows of S no-op steps drained by one worker of C slots
  (``--concurrency``, 4): steps per second.
- ``dbos``: the same W workflows of S no-op ``@DBOS.step`` steps through DBOS (3.4+,
  ``pip install dbos``; left out, with the reason, when it is not installed), as a
  DBOS user writes them (``benchmarks/dbos_workflows.py``): enqueued on a queue at
  DBOS's defaults and run by one DBOS process, in a process of its own, timed from
  the first enqueue to the last ``get_result()``. On SQLite at DBOS's defaults
  (SQLite's rollback journal) and with the file put in WAL mode first; on
  PostgreSQL in a schema of its own in the same database (``dbos_bench_<pid>``,
  dropped after each side). In K rounds (``--dbos-rounds``, 2) whose order of sides
  alternates (round 1: ours first; round 2: DBOS first; ...), each side on a fresh
  start: a fresh file per side on SQLite; on PostgreSQL DBOS's schema made anew,
  ours with the earlier rounds' workflows purged, and before every side a
  ``VACUUM ANALYZE`` and a ``CHECKPOINT`` (what the side before left behind is
  cleaned and written out first, not during the next side's run). Steps per second
  of each side over all its rounds (steps / seconds), and ours over DBOS's:
  targets >= 4 (defaults) and >= 2 (WAL) on SQLite, >= 3 on PostgreSQL.
- ``chain``: the same work as chained child tasks (each step a task that enqueues the
  next, in its success transaction): seconds per step, and ``step_cost_ratio``, a
  workflow step's cost over a chained task's: target <= 1.5.
- ``signal``: a signal sent to a workflow suspended waiting for it (through a store of
  its own, as another process sends it), to the workflow's end on an idle worker (its
  outcome's commit, stamped by ``after_commit``), p50 and p99 in ms: targets p50 <= 10
  ms, p99 <= 50 ms. Also to the resumed attempt's start and to its wait's return. In K
  rounds (``--signal-rounds``, 5) of ``--rounds`` signals: each round's p50 and p99 are
  printed beside the figures over all samples, so that a noisy machine shows.
  ``--only signal`` measures this alone (seconds, not minutes).
- ``sleeping``: the claim of one due task (claim and complete, one at a time) with
  N sleeping workflows in the table (PENDING, due in three days: what a suspended
  workflow is) against an empty table, p50 in ms and their ratio: target <= 1.1.
  ``ask_ratio``: the same with the claim asking for 4 (a worker's free slots) while
  one is due (docs/workflows.md: such a claim reads on through the sleeping rows).
  ``turn_ratio`` and ``turn_ask_ratio``: the same two claims made in turn with a queue
  of the same table that holds none (after a ``VACUUM ANALYZE`` on PostgreSQL: the new
  rows' statistics, as autovacuum takes them), so that both share the machine's drift
  (the table figures are timed minutes apart).
- ``waiting``: the claim of one due task with N workflows suspended waiting for a
  signal in its queue (``--waiting``, 10,000: each claimed and suspended by
  ``Store.suspend`` with its signal's name, PENDING due at the end of time with its
  wait recorded, as ``ctx.wait_for_signal`` leaves it), against a queue that holds
  none, p50 in ms and their ratio: target <= 1.1. In K rounds (``--waiting-rounds``,
  3), each in queues of its own: after a vacuum, N ordinary tasks run (claimed and
  completed) in a third queue and the N workflows suspended; then the three queues
  claimed in turn (one claim each, the order reversed every other turn, so that all
  three share what else the machine does), right after the suspensions
  (``ratio_before_vacuum``; on PostgreSQL the dead rows of the N claims still in the
  claim's index) and after a ``VACUUM ANALYZE`` (``ratio``: what autovacuum keeps).
  ``ratio_before_vacuum_same_claims`` is the queue with the workflows against the one
  that ran as many ordinary tasks (the same claims behind it, without the waiting);
  ``ran_ratio_before_vacuum`` that one against the queue with none. Each figure is
  the median of the rounds'.
- ``replay``: a workflow that recorded R steps, from its claim to its next step (the
  checkpoints read and replayed), ms, the median of five workflows: target <= 50 ms for
  R = 1,000.
- ``sleeping`` times its table without the workflows first, ``waiting`` its queues in
  turn, each after a few untimed claims (a cold connection would flatter the ratio).

    python -m benchmarks.workflows [--pg URL] [--workflows W] [--steps S]
        [--sleeping N] [--waiting N] [--waiting-rounds K] [--rounds K] [--replay R]
        [--no-dbos] [--dbos-rounds K] [--concurrency C] [--signal-rounds K] [--only signal]
        [--out FILE]

Run it on a quiet machine: timings are meaningless while other work runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from durablesched import Scheduler, TaskContext, TaskRegistry, TaskState, Worker, open_store
from durablesched.records import DEFAULT_QUEUE, NewTask, Outcome
from durablesched.store.protocol import Store
from durablesched.workflows.steps import FOREVER

from .common import ROOT, bench_env, fresh

registry = TaskRegistry()


def _noop() -> None:
    return None


@registry.task("bench.flow", pass_context=True)
def flow(ctx: TaskContext, steps: int) -> int:
    for i in range(steps):
        ctx.step(f"s{i}", _noop)
    return steps


@registry.task("bench.link", pass_context=True)
def link(ctx: TaskContext, left: int) -> int:
    if left > 1:
        ctx.enqueue(link, left - 1)
    return left


#: For ``signal``: when each resumed attempt of ``bench.approval`` started, and when its
#: wait returned the signal (perf_counter seconds), by task id. The attempt that suspends
#: never gets past its wait, so only the resumed one writes here.
RESUMED: dict[int, tuple[float, float]] = {}


@registry.task("bench.approval", pass_context=True)
def approval(ctx: TaskContext) -> Any:
    started = time.perf_counter()
    payload = ctx.wait_for_signal("go")
    RESUMED[ctx.task_id] = (started, time.perf_counter())
    return payload


@registry.task("bench.job")
def job() -> None:
    return None


#: Slots of the one worker that drains the steps (``--concurrency``). DBOS at its defaults
#: runs every enqueued workflow at once (its queue has no limit): where commits are
#: slow (a loaded server), more of ours in flight share them too.
CONCURRENCY = 4
#: Replays timed per backend: their median is the figure.
REPLAY_SAMPLES = 5
#: What the claims of ``sleeping``'s ``ask_`` figures ask for, with one task due: a
#: worker's claim for its free slots when fewer are due.
ASK = 4
#: Rounds of the claim with workflows waiting on signals (``--waiting-rounds``): the figures
#: are their medians.
WAITING_ROUNDS = 3
#: Rounds of the signal's figure (``--signal-rounds``), each of ``--rounds`` samples.
SIGNAL_ROUNDS = 5


def _drain(scheduler: Scheduler, concurrency: int = CONCURRENCY) -> None:
    Worker(scheduler, concurrency=concurrency).run(burst=True, burst_wait=0.0)


def steps_and_chain(
    db: str, workflows: int, steps: int, concurrency: int = CONCURRENCY
) -> dict[str, float]:
    flow_s = flow_seconds(db, workflows, steps, concurrency)
    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    try:
        scheduler.submit_many("bench.link", [{"left": steps}] * workflows)
        started = time.perf_counter()
        _drain(scheduler, concurrency)
        chain_s = time.perf_counter() - started
    finally:
        store.close()
    total = workflows * steps
    return {
        "steps_per_s": total / flow_s,
        "step_s": flow_s / total,
        "chained_task_s": chain_s / total,
        "step_cost_ratio": (flow_s / total) / (chain_s / total),
    }


def dbos_installed() -> bool:
    return importlib.util.find_spec("dbos") is not None


def dbos_steps(url: str, workflows: int, steps: int, schema: str | None = None) -> float:
    """DBOS's steps per second for the same work, in a process of its own."""
    command = [sys.executable, "-m", "benchmarks.dbos_workflows", "--url", url,
               "--workflows", str(workflows), "--steps", str(steps)]  # fmt: skip
    if schema is not None:
        command += ["--schema", schema]
    done = subprocess.run(  # noqa: S603 - our own script, fixed arguments
        command,
        check=False,
        cwd=ROOT,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode:
        raise RuntimeError(f"DBOS's run failed: {done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return float(figures["steps"]) / float(figures["seconds"])


def flow_seconds(db: str, workflows: int, steps: int, concurrency: int = CONCURRENCY) -> float:
    """Ours: seconds for W workflows of S no-op steps, drained by one worker."""
    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    try:
        scheduler.submit_many("bench.flow", [{"steps": steps}] * workflows)
        started = time.perf_counter()
        _drain(scheduler, concurrency)
        return time.perf_counter() - started
    finally:
        store.close()


def _settle(name: str, db: str) -> None:
    """Before a side: PostgreSQL's dead rows cleaned and its dirty pages written now,
    not during the next side's run (SQLite: each side has a fresh file)."""
    if name == "sqlite":
        return
    with closing(psycopg.connect(_plain(db), autocommit=True)) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def _plain(db: str) -> str:
    """The URL without its query (DBOS's own schema, not our search path)."""
    return urlsplit(db)._replace(query="").geturl()


def _ours_fresh(name: str, db: str, round_: int) -> str:
    """Where our side of a round runs: a fresh file on SQLite; on PostgreSQL the
    database, with the earlier rounds' finished workflows purged."""
    if name == "sqlite":
        return str(fresh(Path(db).with_name(f"ours-{round_}.db")))
    store = open_store(db)
    try:
        store.purge(datetime.now().astimezone() + timedelta(seconds=1))
    finally:
        store.close()
    return db


def _dbos_once(name: str, db: str, workflows: int, steps: int) -> dict[str, float]:
    """DBOS's side of a round, on a fresh start: steps/s by configuration."""
    if name == "sqlite":
        defaults = fresh(Path(db).with_name("dbos-defaults.db"))
        wal = fresh(Path(db).with_name("dbos-wal.db"))
        with closing(sqlite3.connect(wal)) as conn:  # kept by the file from now on
            conn.execute("PRAGMA journal_mode=WAL")
        return {
            "defaults": dbos_steps(f"sqlite:///{defaults}", workflows, steps),
            "wal": dbos_steps(f"sqlite:///{wal}", workflows, steps),
        }
    url = _plain(db)
    schema = f"dbos_bench_{os.getpid()}"
    try:
        return {"defaults": dbos_steps(url, workflows, steps, schema)}
    finally:
        with closing(psycopg.connect(url, autocommit=True)) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _rate(per_round: list[float], workflows: int, steps: int) -> float:
    """Steps per second over all rounds (from each round's steps per second)."""
    total = workflows * steps
    return total * len(per_round) / sum(total / r for r in per_round)


def side_by_side(  # noqa: PLR0917 - the run's settings, in this order
    name: str, db: str, workflows: int, steps: int, rounds: int, concurrency: int = CONCURRENCY
) -> dict[str, Any]:
    """Ours and DBOS's steps per second in ``rounds`` rounds of alternating order."""
    if not dbos_installed():
        return {"skipped": "dbos is not installed (pip install 'dbos>=3.4')"}
    ours: list[float] = []
    theirs: dict[str, list[float]] = {}
    total = workflows * steps
    for round_ in range(rounds):
        sides = ["ours", "dbos"] if round_ % 2 == 0 else ["dbos", "ours"]
        for side in sides:
            _settle(name, db)
            if side == "ours":
                where = _ours_fresh(name, db, round_)
                ours.append(total / flow_seconds(where, workflows, steps, concurrency))
            else:
                for kind, rate in _dbos_once(name, db, workflows, steps).items():
                    theirs.setdefault(kind, []).append(rate)
    mine = _rate(ours, workflows, steps)
    figures: dict[str, Any] = {
        "rounds": rounds,
        "order": "alternating, ours first in round 1",
        "ours_concurrency": concurrency,
        "ours_steps_per_s": mine,
        "ours_per_round": ours,
    }
    for kind, rates in theirs.items():
        rate = _rate(rates, workflows, steps)
        figures[f"{kind}_steps_per_s"] = rate
        figures[f"{kind}_per_round"] = rates
        figures[f"ratio_{kind}"] = mine / rate
    return figures


def signal_latency(db: str, samples: int, rounds: int = SIGNAL_ROUNDS) -> dict[str, Any]:
    """``rounds`` rounds of ``samples`` signals each, one at a time, every one to a workflow
    suspended waiting for it on an idle worker of one slot. The signal is sent as another
    process sends it: through a store of its own (its own connection; no in-process
    wake-up of the worker), so that the worker hears of it as it would in production.

    Each sample is timed from the call of ``Scheduler.signal`` to three points: the
    resumed attempt's start (``started``: claimed, its function called), its wait's
    return with the payload (``resumed``: the checkpoints read, the signal taken and its
    step committed) and its outcome's commit (``ended``, stamped by ``after_commit``: the
    figure the target is about). Per round its p50 and p99; over all samples p50 and
    p99 and the median of the rounds' p50s and p99s (their spread shows the machine's
    noise). The first sample of the run pays for warming up and is left out."""
    ended: dict[int, float] = {}
    done = threading.Condition()

    def stamp(outcome: Outcome, state: TaskState | None, _now: datetime) -> None:
        if state is TaskState.SUCCEEDED:
            with done:
                ended[outcome.claim.task_id] = time.perf_counter()
                done.notify_all()

    store = open_store(db)
    sending = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    sender = Scheduler(sending)
    worker = Worker(scheduler, concurrency=1, after_commit=stamp)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    taken: list[dict[str, float]] = []
    try:
        for _ in range(rounds * samples + 1):
            task_id = scheduler.submit("bench.approval")
            while scheduler.get(task_id).state is not TaskState.PENDING or not (
                scheduler.history(task_id)[-1].detail or ""
            ).startswith("suspended"):
                time.sleep(0.001)  # until it has suspended: then the signal's latency
            time.sleep(0.002)  # the worker back to idle after the suspension's commit
            sent = time.perf_counter()
            sender.signal(task_id, "go", 1)
            with done:
                if not done.wait_for(_ended(ended, task_id), timeout=60):
                    raise SystemExit(f"task {task_id} did not resume within 60 s of its signal")
            started, resumed = RESUMED[task_id]
            taken.append(
                {
                    "started": (started - sent) * 1000,
                    "resumed": (resumed - sent) * 1000,
                    "ended": (ended[task_id] - sent) * 1000,
                }
            )
    finally:
        worker.stop()
        thread.join(30)
        store.close()
        sending.close()
    taken = taken[1:]  # the first pays for warming up
    figures: dict[str, Any] = {"samples": len(taken), "rounds": rounds}
    for point in ("started", "resumed", "ended"):
        values = [t[point] for t in taken]
        by_round = [values[i * samples : (i + 1) * samples] for i in range(rounds)]
        figures[point] = {
            "p50_ms": statistics.median(values),
            "p99_ms": _p99(values),
            "median_round_p50_ms": statistics.median(statistics.median(r) for r in by_round),
            "median_round_p99_ms": statistics.median(_p99(r) for r in by_round),
        }
        if point == "ended":
            figures["p50_ms"] = figures[point]["p50_ms"]
            figures["p99_ms"] = figures[point]["p99_ms"]
            figures["rounds_p50_ms"] = [round(statistics.median(r), 2) for r in by_round]
            figures["rounds_p99_ms"] = [round(_p99(r), 2) for r in by_round]
    return figures


def _ended(ended: dict[int, float], task_id: int) -> Callable[[], bool]:
    return lambda: task_id in ended


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _warm_up(store: Store, rounds: int) -> None:
    """Claims not timed, so that the first figure does not pay for a cold connection and
    cache while the one it is compared with does not."""
    _claim_p50(store, max(1, rounds // 5))


def _claim_p50(store: Store, rounds: int, ask: int = 1) -> float:
    """The claim of the default queue, asking for ``ask`` tasks with one due: p50 in ms."""
    times = []
    for _ in range(rounds):
        now = datetime.now().astimezone()
        store.submit([NewTask("bench.job", {}, now, 3, None)], now)
        started = time.perf_counter()
        claims = store.claim(
            "bench", ask, now, timedelta(seconds=30), ["bench.job"], queues={DEFAULT_QUEUE: ask}
        )
        times.append((time.perf_counter() - started) * 1000)
        for claim in claims:
            store.record_and_claim(
                [Outcome(claim, result=None)], now, owner="bench", limit=0, lease=timedelta(30)
            )
    return statistics.median(times)


def sleeping_claim(db: str, sleeping: int, rounds: int) -> dict[str, float]:
    store = open_store(db)
    try:
        _warm_up(store, rounds)
        empty = _claim_p50(store, rounds)
        empty_ask = _claim_p50(store, rounds, ask=ASK)
        wake = datetime.now().astimezone() + timedelta(days=3)
        batch = 10_000
        for first in range(0, sleeping, batch):
            count = min(batch, sleeping - first)
            store.submit(
                [NewTask("bench.flow", {"steps": 1}, wake, 3, None)] * count,
                datetime.now().astimezone(),
            )
        full = _claim_p50(store, rounds)
        full_ask = _claim_p50(store, max(1, rounds // 10), ask=ASK)
        # In turn with a queue of the same table that holds none, after what autovacuum
        # does in time (statistics of the new rows): both claims share the machine's drift.
        _vacuum(db)
        queues = [DEFAULT_QUEUE, "bench-no-sleeping"]
        _interleaved_p50(store, queues, max(1, rounds // 5))  # warm-up, not timed
        turns = _interleaved_p50(store, queues, rounds)
        ask_turns = _interleaved_p50(store, queues, max(1, rounds // 5), ask=ASK)
    finally:
        store.close()
    return {
        "empty_p50_ms": empty,
        "sleeping_p50_ms": full,
        "ratio": full / empty,
        "ask_empty_p50_ms": empty_ask,
        "ask_sleeping_p50_ms": full_ask,
        "ask_ratio": full_ask / empty_ask,
        "turn_ratio": turns[queues[0]] / turns[queues[1]],
        "turn_ask_ratio": ask_turns[queues[0]] / ask_turns[queues[1]],
    }


def waiting_claim(
    db: str, waiting: int, rounds: int, repeats: int = WAITING_ROUNDS
) -> dict[str, Any]:
    """The claim with ``waiting`` workflows suspended waiting for a signal, in ``repeats``
    rounds, each in queues of its own (so an earlier round's rows are outside the
    claim's walk): the queue with the waiting workflows, one that ran as many ordinary
    tasks (claimed and completed) and one that holds none. After a vacuum, both
    runs, then the three claimed in turn right after (PostgreSQL: the runs' dead
    rows in the claim's index) and after a vacuum. The figures are the medians of the
    rounds' figures."""
    store = open_store(db)
    per_round = []
    try:
        for r in range(repeats):
            queues = [f"bench-waiting-{r}", f"bench-ran-{r}", f"bench-none-{r}"]
            _vacuum(db)
            _interleaved_p50(store, queues, max(1, rounds // 5))  # warm-up, not timed
            _run(store, queues[1], waiting, suspend=False)
            _run(store, queues[0], waiting, suspend=True)
            before = _interleaved_p50(store, queues, rounds)
            _vacuum(db)
            after = _interleaved_p50(store, queues, rounds)
            per_round.append(
                {
                    "waiting_p50_ms": after[queues[0]],
                    "empty_p50_ms": after[queues[2]],
                    "ratio": after[queues[0]] / after[queues[2]],
                    "before_vacuum_p50_ms": before[queues[0]],
                    "ran_before_vacuum_p50_ms": before[queues[1]],
                    "empty_before_vacuum_p50_ms": before[queues[2]],
                    "ratio_before_vacuum": before[queues[0]] / before[queues[2]],
                    "ratio_before_vacuum_same_claims": before[queues[0]] / before[queues[1]],
                    "ran_ratio_before_vacuum": before[queues[1]] / before[queues[2]],
                }
            )
    finally:
        store.close()
    figures: dict[str, Any] = {
        key: statistics.median(f[key] for f in per_round) for key in per_round[0]
    }
    figures["rounds"] = per_round
    return figures


def _run(store: Store, queue: str, count: int, *, suspend: bool) -> None:
    """``count`` tasks of ``queue`` submitted and claimed, a thousand at a time, and then
    suspended waiting for signal 'go' (``suspend``, as ``ctx.wait_for_signal`` leaves
    them: PENDING, due at the end of time, the wait recorded) or completed."""
    name = "bench.approval" if suspend else "bench.job"
    lease = timedelta(minutes=10)
    for first in range(0, count, 1_000):
        now = datetime.now().astimezone()
        n = min(1_000, count - first)
        store.submit([NewTask(name, {}, now, 3, None, queue=queue)] * n, now)
        claims = store.claim("bench", n, now, lease, [name], queues={queue: n})
        if suspend:
            for claim in claims:
                store.suspend(claim, FOREVER, now, detail="waiting for signal 'go'", signal="go")
        else:
            outcomes = [Outcome(claim, result=None) for claim in claims]
            store.record_and_claim(outcomes, now, owner="bench", limit=0, lease=lease)


def _interleaved_p50(
    store: Store, queues: list[str], rounds: int, ask: int = 1
) -> dict[str, float]:
    """The claim asking for ``ask`` with one due task in each of ``queues`` in turn (the
    order reversed every other turn), ``rounds`` turns: each queue's p50 in ms. Taken in
    turn, the queues share whatever else the machine and the server do meanwhile."""
    times: dict[str, list[float]] = {q: [] for q in queues}
    for turn in range(rounds):
        for queue in queues if turn % 2 == 0 else queues[::-1]:
            times[queue].append(_claim_in(store, queue, ask))
    return {q: statistics.median(t) for q, t in times.items()}


def _claim_in(store: Store, queue: str, ask: int = 1) -> float:
    """A due task submitted to ``queue``, then claimed asking for ``ask`` (timed, ms)
    and completed."""
    now = datetime.now().astimezone()
    store.submit([NewTask("bench.job", {}, now, 3, None, queue=queue)], now)
    started = time.perf_counter()
    claims = store.claim(
        "bench", ask, now, timedelta(seconds=30), ["bench.job"], queues={queue: ask}
    )
    took = (time.perf_counter() - started) * 1000
    outcomes = [Outcome(claim, result=None) for claim in claims]
    store.record_and_claim(outcomes, now, owner="bench", limit=0, lease=timedelta(seconds=30))
    return took


def _vacuum(db: str) -> None:
    """PostgreSQL: the dead rows of what came before cleaned, as autovacuum does in
    time (each claimed and suspended workflow left two in the claim's index)."""
    if db.startswith("postgres"):
        with closing(psycopg.connect(_plain(db), autocommit=True)) as conn:
            conn.execute("VACUUM ANALYZE")


def replay(db: str, recorded: int, samples: int = REPLAY_SAMPLES) -> dict[str, Any]:
    """The median of ``samples`` workflows' replays (one sample can be a checkpoint's or
    a page cache's outlier), each its own task with ``recorded`` steps."""
    store = open_store(db)
    scheduler = Scheduler(store, registry=registry)
    took = []
    try:
        for _ in range(samples):
            now = datetime.now().astimezone()
            store.submit([NewTask("bench.replayed", {}, now, 3, None)], now)
            (claim,) = store.claim("bench", 1, now, timedelta(minutes=10), ["bench.replayed"])
            for i in range(recorded):
                store.record_step(claim, i, f"s{i}", {"i": i}, now)
            started = time.perf_counter()
            ctx = TaskContext(claim, scheduler)
            for i in range(recorded):
                ctx.step(f"s{i}", _noop)
            took.append((time.perf_counter() - started) * 1000)
    finally:
        store.close()
    return {"steps": recorded, "replay_ms": statistics.median(took), "samples_ms": took}


def run(
    databases: dict[str, str],
    *,
    workflows: int,
    steps: int,
    sleeping: int,
    rounds: int,
    recorded: int,
    waiting: int = 10_000,
    waiting_rounds: int = WAITING_ROUNDS,
    dbos: bool = True,
    dbos_rounds: int = 2,
    concurrency: int = CONCURRENCY,
    only: str | None = None,
    signal_rounds: int = SIGNAL_ROUNDS,
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, db in databases.items():
        if only == "signal":
            figures[name] = {"signal": signal_latency(db, rounds, signal_rounds)}
            continue
        ours = steps_and_chain(db, workflows, steps, concurrency)
        figures[name] = {"steps": ours}
        if dbos:
            figures[name]["dbos"] = side_by_side(
                name, db, workflows, steps, dbos_rounds, concurrency
            )
        figures[name].update(
            signal=signal_latency(db, rounds, signal_rounds),
            replay=replay(db, recorded),
            waiting=waiting_claim(db, waiting, rounds, waiting_rounds),
            sleeping=sleeping_claim(db, sleeping, rounds),
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="a PostgreSQL URL (an empty database) to measure too")
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sleeping", type=int, default=1_000_000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument(
        "--waiting-rounds",
        type=int,
        default=WAITING_ROUNDS,
        help="rounds of the claim with workflows waiting on signals (their medians)",
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--replay", type=int, default=1000)
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS's side out")
    parser.add_argument(
        "--concurrency", type=int, default=CONCURRENCY, help="slots of the worker running steps"
    )
    parser.add_argument(
        "--dbos-rounds", type=int, default=2, help="rounds of ours and DBOS's, order alternating"
    )
    parser.add_argument(
        "--signal-rounds", type=int, default=SIGNAL_ROUNDS, help="rounds of --rounds signals"
    )
    parser.add_argument(
        "--only", choices=["signal"], help="measure only this figure (seconds, not minutes)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        databases = {"sqlite": str(Path(tmp) / "workflows.db")}
        if args.pg:
            databases["postgres"] = args.pg
        figures = run(
            databases,
            workflows=args.workflows,
            steps=args.steps,
            sleeping=args.sleeping,
            waiting=args.waiting,
            waiting_rounds=args.waiting_rounds,
            rounds=args.rounds,
            recorded=args.replay,
            dbos=not args.no_dbos,
            dbos_rounds=args.dbos_rounds,
            concurrency=args.concurrency,
            only=args.only,
            signal_rounds=args.signal_rounds,
        )
    text = json.dumps(figures, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
