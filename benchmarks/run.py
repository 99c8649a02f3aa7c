"""Run every benchmark in one go and print figures with their ratios to baselines of the same run.

    python -m benchmarks.run            # the full run (several minutes)
    python -m benchmarks.run --smoke    # small sizes: CI's check that the harness still works

Results go to benchmarks/results/ as JSON, a Markdown table and a PNG chart.
Absolute numbers drift on shared machines; the ratios are the contract.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sqlite3
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from . import lock_timeline, ours, peers, pg, queues, raw, whole_path
from .common import interleaved, median, median_rate, round_ratios

RESULTS = Path(__file__).resolve().parent / "results"
#: What each peer lacks, for the table: their figures buy less than ours.
PEER_NOTES = {
    "huey (SqliteHuey consumer, quiet (-q) like ours at --log-level warning; "
    "its default synchronous FULL = ours)": "leases and reclaim "
    "(a task is deleted when dequeued: a killed worker loses it), fencing, task history; "
    "has delayed tasks and retries",
    "litequeue (its default NORMAL, and FULL)": "delayed tasks, lease expiry and reclaim, "
    "retries, a consumer of its own (measured as a put/pop/done loop)",
    "persist-queue SQLiteAckQueue (its default)": "delayed tasks, lease expiry and reclaim, "
    "retries, a consumer of its own (measured as a put/get/ack loop); pickles its items",
    "pgqueuer (PostgreSQL, its defaults: batches of 10, synchronous_commit on = ours)": "fencing "
    "of outcome writes by claim (its completion deletes the job by id, whoever picked it), "
    "database effects committed with success; has a status log",
    "procrastinate (PostgreSQL, its defaults)": "leases with automatic reclaim (stalled jobs "
    "need an operator or a periodic task), fencing, result storage",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="small sizes, for CI")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    args = parser.parse_args(argv)
    size = Sizes(smoke=args.smoke)
    tmp = Path(tempfile.mkdtemp(prefix="durablesched-bench-"))
    figures: dict[str, Any] = {}
    counter = iter(range(1_000_000))

    def db() -> Path:
        return tmp / f"b{next(counter)}.db"

    def step(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        value = fn()
        figures[name] = value
        print(f"  {name}: {_show(value)}  ({time.monotonic() - t0:.1f}s)", flush=True)
        return value

    print(f"durablesched benchmarks ({'smoke' if args.smoke else 'full'}) in {tmp}")
    print("raw sqlite3, same schema and pragmas:")
    for durability in ("full", "normal"):
        step(
            f"raw_1_per_tx_{durability}",
            partial(raw.claim_complete_loop, db(), size.raw, 1, durability),
        )
        step(
            f"raw_32_per_tx_{durability}",
            partial(raw.claim_complete_loop, db(), size.raw, 32, durability),
        )
    step("raw_executemany", lambda: raw.executemany_insert(db(), size.submit_many))
    for durability in ("full", "normal"):
        step(
            f"our_statements_32_per_tx_{durability}",
            partial(raw.our_statements_loop, db(), size.raw, 32, durability),
        )

    print("durablesched:")
    step("submit_single", lambda: ours.submit_single(db(), size.submit_single))
    step("submit_many", lambda: ours.submit_many(db(), size.submit_many))
    step(
        "submit_many_with_args",
        lambda: ours.submit_many(db(), size.submit_many, with_args=True),
    )
    for durability in ("full", "normal"):
        for slots in (1, 8, 32):
            step(
                f"e2e_1proc_{slots}slots_{durability}",
                partial(ours.end_to_end, db(), size.e2e, slots, 1, durability),
            )
    step(
        "e2e_1proc_32slots_full_info_log",
        partial(ours.end_to_end, db(), size.e2e, 32, 1, "full", log_level="info"),
    )
    step(
        "e2e_1proc_8slots_full_process_env",
        partial(ours.end_to_end, db(), size.e2e // 4, 8, 1, "full", environment="process"),
    )
    step("attempt_start_ms", partial(ours.attempt_start_cost, size.attempts))
    for processes in (2, 4):
        step(
            f"e2e_{processes}proc_8slots_full",
            partial(ours.end_to_end, db(), size.e2e, 8, processes, "full"),
        )
    for processes in (1, 4):
        # Target 6's why: who held the write lock, how long, and what each switch cost.
        step(
            f"write_lock_{processes}proc_8slots",
            partial(lock_timeline.timeline, db(), size.e2e, processes, 8),
        )
    claims = ours.claim_latencies(
        db(),
        {f"claim_{pending}_pending": (pending, 0) for pending in size.claim_pending}
        | {f"claim_{size.claim_finished}_finished": (1_000, size.claim_finished)},
        size.claim_samples,
    )
    for name, latency in claims.items():
        step(name, partial(dict, latency))
    step("pickup_idle", lambda: ours.pickup_and_idle(db(), size.pickup, size.idle_seconds))
    step(
        "contention_envelope",
        lambda: ours.contention_envelope(db(), size.contention, size.contention_seconds),
    )
    step("memory_backend_bytes_per_task", lambda: ours.memory_backend(size.memory_tasks))
    _queues(step, size, db)

    found = peers.available()
    print(f"peers ({', '.join(k for k, v in found.items() if v) or 'none installed'}):")
    if found["huey"]:
        for threads in (8, 32):
            step(
                f"huey_consumer_{threads}threads",
                partial(peers.huey_consumer, db(), size.peer, threads),
            )
    if found["litequeue"]:
        step("litequeue_normal", lambda: peers.litequeue_loop(db(), size.peer, "NORMAL"))
        step("litequeue_full", lambda: peers.litequeue_loop(db(), size.peer, "FULL"))
    if found["persistqueue"]:
        step("persistqueue_ackqueue", lambda: peers.persistqueue_loop(tmp / "pq", size.peer))

    _rounds(step, size, db, found)
    _whole_path(step, size, db, found)
    _postgres(step, size, found)

    report = build_report(figures, size, found)
    write(report, args.out, smoke=args.smoke)
    return 0


def _queues(
    step: Callable[[str, Callable[[], Any]], Any], size: Sizes, db: Callable[[], Path]
) -> None:
    """Issue 18's figures: claims over many queues and priorities; queues and limits."""
    spread = {"1k": 1_000, "1M": size.queue_pending}
    step(
        "queue_claim_sqlite",
        lambda: queues.claim_latency_spread(queues.sqlite_stores(db()), spread, size.claim_samples),
    )
    if pg.reachable():
        step(
            "queue_claim_postgres",
            lambda: queues.claim_latency_spread(
                queues.postgres_stores(), spread, size.claim_samples
            ),
        )
    step("queue_rounds", lambda: queues.queue_rounds(db(), size.e2e, size.repeats))


def _whole_path(
    step: Callable[[str, Callable[[], Any]], Any],
    size: Sizes,
    db: Callable[[], Path],
    found: dict[str, bool],
) -> None:
    """Issue 22's figures (``whole_path.py``): the CLI's path with start-up and exit
    against huey's, CPU-bound tasks, and a worker's start-up, each measured from outside
    with its baselines in interleaved rounds. Each measurement's figures print when it
    ends (as with the rounds above, their steps' own times read 0)."""
    print(f"the whole path from outside (issue 22), {size.repeats} interleaved rounds:")
    ratios: dict[str, float] = {}
    for measure in (
        partial(whole_path.user_path, db(), size.path, size.repeats, huey=found["huey"]),
        partial(whole_path.cpu_bound, db(), size.cpu, size.repeats, huey=found["huey"]),
        partial(whole_path.startup, db(), size.startup_pairs),
    ):
        measured, measured_ratios = measure()
        for name, value in measured.items():
            step(name, partial(dict, value))
        ratios |= measured_ratios
    step("whole_path_ratios", lambda: ratios)


def _postgres(
    step: Callable[[str, Callable[[], Any]], Any], size: Sizes, found: dict[str, bool]
) -> None:
    """Issue 7's figures: ours, a raw psycopg loop and the peers on the same server.

    The server shares the machine's 2 cores with every client, which makes
    single runs swing by a third; the end-to-end figures are medians of
    ``size.repeats`` runs, interleaved so that a slow spell hits all systems.
    """
    if not pg.reachable():
        print(f"PostgreSQL: no server at {pg.BASE_URL} (set BENCH_PG): its figures are left out")
        return
    print(f"PostgreSQL ({pg.BASE_URL}), each figure in a schema of its own:")
    step("pg_raw_1_per_statement", partial(pg.raw_loop, size.raw // 4, 1))
    step("pg_raw_32_per_statement", partial(pg.raw_loop, size.raw, 32))
    step("pg_pickup", partial(pg.pickup, size.pickup))
    runs: dict[str, list[float]] = {}
    for _ in range(size.repeats):
        for processes in (1, 4):
            rate = pg.end_to_end(size.e2e, 32, processes)["tasks_per_s"]
            runs.setdefault(f"pg_e2e_{processes}proc_32slots", []).append(rate)
            if found.get("pgqueuer"):
                rate = pg.peer("pgqueuer", size.peer, processes, 32)
                runs.setdefault(f"pg_pgqueuer_{processes}proc", []).append(rate)
    for name, rates in runs.items():
        step(name, partial(median_rate, rates))
    if found.get("procrastinate"):  # about 200 jobs/s: one run of fewer jobs
        for processes in (1, 4):
            step(
                f"pg_procrastinate_{processes}proc",
                partial(pg.peer, "procrastinate", max(size.peer // 5, 100), processes, 32),
            )


#: Target -> (numerator, denominator): the figures measured again in interleaved rounds.
PAIRED = {
    "1": ("e2e_1proc_32slots_full", "huey_consumer_best"),
    "2a": ("e2e_1proc_32slots_full", "raw_32_per_tx_full"),
    "2b": ("e2e_1proc_32slots_normal", "raw_1_per_tx_normal"),
    "3": ("submit_many", "raw_executemany"),
    "6": ("e2e_4proc_8slots_full", "e2e_1proc_8slots_full"),
    "W1a": ("e2e_1proc_32slots_full", "our_statements_32_per_tx_full"),
}


def _rounds(
    step: Callable[[str, Callable[[], Any]], Any],
    size: Sizes,
    db: Callable[[], Path],
    found: dict[str, bool],
) -> None:
    """The figures of targets 1, 2a, 2b, 3, 6 and W1a again, in interleaved rounds.

    On a shared machine speed drifts by a third within minutes, so two figures
    taken minutes apart make a poor ratio; each round measures both sides of
    every ratio back to back, and the targets take the median of the rounds' ratios.
    """
    runs: dict[str, Callable[[], float]] = {
        "raw_executemany": lambda: raw.executemany_insert(db(), size.submit_many),
        "submit_many": lambda: ours.submit_many(db(), size.submit_many),
        "raw_32_per_tx_full": lambda: raw.claim_complete_loop(db(), size.raw, 32, "full"),
        "our_statements_32_per_tx_full": lambda: raw.our_statements_loop(
            db(), size.raw, 32, "full"
        ),
        "e2e_1proc_32slots_full": lambda: _rate_of(ours.end_to_end(db(), size.e2e, 32, 1, "full")),
        "raw_1_per_tx_normal": lambda: raw.claim_complete_loop(db(), size.raw // 4, 1, "normal"),
        "e2e_1proc_32slots_normal": lambda: _rate_of(
            ours.end_to_end(db(), size.e2e, 32, 1, "normal")
        ),
        "e2e_1proc_8slots_full": lambda: _rate_of(ours.end_to_end(db(), size.e2e, 8, 1, "full")),
        "e2e_4proc_8slots_full": lambda: _rate_of(ours.end_to_end(db(), size.e2e, 8, 4, "full")),
    }
    if found["huey"]:
        runs["huey_consumer_best"] = lambda: max(
            peers.huey_consumer(db(), size.peer, threads) for threads in (8, 32)
        )
    print(f"the targets' figures again, {size.repeats} interleaved rounds:")
    rounds = interleaved(runs, size.repeats)
    step("rounds", lambda: {name: median(rates) for name, rates in rounds.items()})
    ratios = round_ratios(PAIRED, rounds)
    step("round_ratios", lambda: ratios)


def _rate_of(result: dict[str, float]) -> float:
    return result["tasks_per_s"]


class Sizes:
    def __init__(self, *, smoke: bool) -> None:
        self.smoke = smoke
        self.raw = 2_000 if smoke else 20_000
        self.submit_single = 300 if smoke else 5_000
        self.submit_many = 5_000 if smoke else 100_000
        self.e2e = 500 if smoke else 20_000
        self.claim_pending = [1_000, 10_000] if smoke else [1_000, 100_000, 1_000_000]
        self.claim_finished = 10_000 if smoke else 1_000_000
        self.claim_samples = 200 if smoke else 1_000
        self.pickup = 20 if smoke else 200
        #: None: until the worker is seen idle (ours.until_quiet), not a fixed period.
        self.idle_seconds = None if smoke else 30.0
        self.memory_tasks = 50_000 if smoke else 1_000_000
        #: Pending tasks over 10 queues and 201 priorities for the queue claim figure.
        self.queue_pending = 10_000 if smoke else 1_000_000
        self.peer = 500 if smoke else 10_000
        self.attempts = 50 if smoke else 1_000
        #: Issue 22: no-op tasks through the CLI's whole path, and CPU-bound tasks.
        self.path = 500 if smoke else 30_000
        self.cpu = 200 if smoke else 4_000
        #: Issue 22: worker start-up against `import sqlalchemy`, measured in pairs.
        self.startup_pairs = 3 if smoke else 15
        self.repeats = 1 if smoke else 3
        #: (submitting processes, worker processes) for the contention envelope.
        self.contention = [(1, 1), (2, 2)] if smoke else [(1, 1), (2, 2), (4, 2), (8, 4), (16, 4)]
        self.contention_seconds = 0.5 if smoke else 3.0


def _rate(figures: dict[str, Any], key: str) -> float:
    value = figures.get(key)
    if isinstance(value, dict):
        return float(value["tasks_per_s"])
    return float(value) if value is not None else float("nan")


def build_report(figures: dict[str, Any], size: Sizes, found: dict[str, bool]) -> dict[str, Any]:
    e2e_full = max(_rate(figures, f"e2e_1proc_{s}slots_full") for s in (1, 8, 32))
    e2e_normal = max(_rate(figures, f"e2e_1proc_{s}slots_normal") for s in (1, 8, 32))
    # The median of interleaved rounds' ratios where measured (see _rounds).
    paired: dict[str, float] = figures.get("round_ratios", {})
    claims = {k: v for k, v in figures.items() if k.startswith("claim_")}
    base_claim = claims[f"claim_{size.claim_pending[0]}_pending"]["p50_us"]
    largest = size.claim_pending[-1]
    targets = [
        (
            "1. e2e 1 process (FULL) / huey consumer (FULL, best of 8 and 32 threads) (rounds)",
            paired.get("1", float("nan")),
            ">=",
            3.0,
        ),
        (
            "2a. e2e 1 process (FULL) / raw 32-per-tx (FULL) (rounds)",
            paired.get("2a", e2e_full / _rate(figures, "raw_32_per_tx_full")),
            ">=",
            0.5,
        ),
        (
            "2b. e2e 1 process (NORMAL) / raw 1-per-tx (NORMAL) (rounds)",
            paired.get("2b", e2e_normal / _rate(figures, "raw_1_per_tx_normal")),
            ">=",
            2.0,
        ),
        (
            "W1a. e2e 1 process, 32 slots (FULL) / durablesched's statements in raw sqlite3, "
            "32 per tx (FULL) (rounds)",
            paired.get("W1a", e2e_full / _rate(figures, "our_statements_32_per_tx_full")),
            ">=",
            0.75,
        ),
        (
            "3. submit_many / raw executemany (rounds)",
            paired.get("3", _rate(figures, "submit_many") / _rate(figures, "raw_executemany")),
            ">=",
            0.7,
        ),
        (
            f"4a. claim p50 {largest} pending / {size.claim_pending[0]} pending",
            claims[f"claim_{largest}_pending"]["p50_us"] / base_claim,
            "<=",
            1.5,
        ),
        (
            f"4b. claim p50 {size.claim_finished} finished / {size.claim_pending[0]} pending",
            claims[f"claim_{size.claim_finished}_finished"]["p50_us"] / base_claim,
            "<=",
            1.5,
        ),
        ("5a. pickup p50 (ms)", figures["pickup_idle"]["pickup_p50_ms"], "<=", 5.0),
        ("5b. pickup p99 (ms)", figures["pickup_idle"]["pickup_p99_ms"], "<=", 50.0),
        (
            "5c. idle worker CPU (% of a core)",
            figures["pickup_idle"]["idle_cpu_percent"],
            "<=",
            1.0,
        ),
        (
            "6. e2e 4 processes / 1 process (8 slots, FULL) (rounds)",
            paired.get(
                "6",
                _rate(figures, "e2e_4proc_8slots_full") / _rate(figures, "e2e_1proc_8slots_full"),
            ),
            ">=",
            1.0,
        ),
        (
            "7. in-memory backend bytes per pending task",
            figures["memory_backend_bytes_per_task"],
            "<=",
            1024.0,
        ),
    ]
    targets += _queue_targets(figures)
    targets += _whole_path_targets(figures)
    if "pg_e2e_1proc_32slots" in figures:
        targets += _pg_targets(figures)
    e2e_32_full = _rate(figures, "e2e_1proc_32slots_full")
    ceiling = _rate(figures, "our_statements_32_per_tx_full")
    context = [
        (
            "durablesched's statements, 32 per tx, in raw sqlite3 (FULL) / raw 32-per-tx (FULL): "
            "the cost of writing history and keys",
            ceiling / _rate(figures, "raw_32_per_tx_full"),
        ),
        (
            "e2e 1 process, 32 slots (FULL) / durablesched's statements in raw sqlite3 (FULL): "
            "how near the worker runs to its own SQL",
            e2e_32_full / ceiling,
        ),
        (
            "e2e 4 queues x 2 slots, each queue's tasks submitted in a block / 1 queue x 8 "
            "slots (rounds): a claim writes four regions of the table's pages (Q2 has them mixed)",
            figures["queue_rounds"]["four_queues_blocks_ratio"],
        ),
    ]
    return {
        "machine": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "smoke": size.smoke,
        "figures": figures,
        "targets": [
            {"target": name, "value": value, "op": op, "goal": goal, "met": _met(value, op, goal)}
            for name, value, op, goal in targets
        ],
        "context": [{"ratio": name, "value": value} for name, value in context],
    }


def _pg_targets(figures: dict[str, Any]) -> list[tuple[str, float, str, float]]:
    """Issue 7's targets: ahead of both PostgreSQL peers at 1 and 4 processes, and scaling."""

    def best_peer(processes: int) -> float:
        rates = [
            _rate(figures, f"pg_{name}_{processes}proc")
            for name in ("pgqueuer", "procrastinate")
            if f"pg_{name}_{processes}proc" in figures
        ]
        return max(rates) if rates else float("nan")

    one, four = _rate(figures, "pg_e2e_1proc_32slots"), _rate(figures, "pg_e2e_4proc_32slots")
    return [
        ("PG1. PostgreSQL e2e 1 process / best peer (1 process)", one / best_peer(1), ">=", 1.0),
        ("PG2. PostgreSQL e2e 4 processes / best peer (4)", four / best_peer(4), ">=", 1.0),
        ("PG3. PostgreSQL e2e 4 processes / 1 process", four / one, ">=", 1.5),
        ("PG4. PostgreSQL pickup p50 (ms)", figures["pg_pickup"]["pickup_p50_ms"], "<=", 10.0),
    ]


def _queue_targets(figures: dict[str, Any]) -> list[tuple[str, float, str, float]]:
    """Issue 18's targets: claims stay flat over many queues and priorities, and queues
    and limits cost little end to end."""
    targets: list[tuple[str, float, str, float]] = []
    for backend in ("sqlite", "postgres"):
        claim = figures.get(f"queue_claim_{backend}")
        if claim is not None:
            targets.append(
                (
                    f"Q1. claim p50, 1M pending over 10 queues x 201 priorities / 1k ({backend})",
                    claim["1M"]["p50_us"] / claim["1k"]["p50_us"],
                    "<=",
                    1.5,
                )
            )
    rounds = figures["queue_rounds"]
    targets += [
        ("Q2. e2e 4 queues x 2 slots / 1 queue x 8 slots, tasks submitted in turn (rounds)",
         rounds["four_queues_ratio"], ">=", 0.9),
        ("Q3. e2e a queue limited to 4, 4 slots / unlimited, 4 slots (rounds)",
         rounds["limit_ratio"], ">=", 0.9),
    ]  # fmt: skip
    return targets


#: Issue 22's targets (``whole_path.py``), numbered as in the issue with a W in front:
#: (key in the whole_path_ratios figure, the target, op, goal).
WHOLE_PATH_TARGETS = (
    ("W2a", "W2a. CPU-bound, 1 process 1 slot / plain loop (rounds)", ">=", 0.9),
    ("W2b", "W2b. CPU-bound, 2 processes / 1 process, 1 slot each (rounds)", ">=", 1.8),
    (
        "W2c_1proc",
        "W2c. CPU-bound, ours (better of 1 and 2 slots) / huey, 1 process (rounds)",
        ">=",
        1.2,
    ),
    ("W2c_2proc", "W2c. CPU-bound, ours / huey, 2 processes (rounds)", ">=", 1.2),
    ("W4", "W4. start-up: exec to first claim / python -c 'import sqlalchemy' (pairs)", "<=", 1.5),
    (
        "W5",
        "W5. the user's path: CLI burst 8 slots / huey 8 threads, start-up and exit included "
        "(rounds)",
        ">=",
        3.0,
    ),
)


def _whole_path_targets(figures: dict[str, Any]) -> list[tuple[str, float, str, float]]:
    """Issue 22's targets: medians of the ratios of interleaved rounds (of pairs, for
    start-up); not measured where huey is missing."""
    ratios: dict[str, float] = figures.get("whole_path_ratios", {})
    return [
        (target, ratios.get(key, float("nan")), op, goal)
        for key, target, op, goal in WHOLE_PATH_TARGETS
    ]


def _met(value: float, op: str, goal: float) -> bool | None:
    if math.isnan(value):  # not measured: a peer is not installed
        return None
    return value >= goal if op == ">=" else value <= goal


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(
            f"{k} ({_show(v)})" if isinstance(v, dict) else f"{k} {_show(v)}"
            for k, v in value.items()
        )
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}"


def write(report: dict[str, Any], out: Path, *, smoke: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "smoke" if smoke else "latest"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# durablesched benchmarks ({stem})",
        "",
        f"Python {report['machine']['python']}, SQLite {report['machine']['sqlite']}, "
        f"{report['machine']['platform']}, {report['machine']['when']}.",
        "",
        "| figure | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {_show(v)} |" for k, v in report["figures"].items()]
    lines += ["", "| target | measured | goal | met |", "| --- | --- | --- | --- |"]
    for t in report["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['value']:.2f} | {t['op']} {t['goal']} | {met} |")
    lines += ["", "| ratio (not a target) | measured |", "| --- | --- |"]
    lines += [f"| {c['ratio']} | {c['value']:.2f} |" for c in report.get("context", [])]
    lines += ["", "| peer | what it lacks that durablesched has |", "| --- | --- |"]
    lines += [f"| {peer} | {lacks} |" for peer, lacks in PEER_NOTES.items()]
    table = "\n".join(lines) + "\n"
    (out / f"{stem}.md").write_text(table)
    print()
    print(table)
    _chart(report, out / f"{stem}.png")


#: The figures the chart shows: throughput of every system.
CHARTED = (
    "e2e_",
    "path_",
    "raw_1",
    "raw_32",
    "our_statements",
    "huey",
    "litequeue",
    "persistqueue",
    "pg_e2e",
    "pg_raw",
    "pg_pgqueuer",
    "pg_procrastinate",
)


def _chart(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415 - optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional
    except ImportError:
        print("(matplotlib not installed: no chart)")
        return
    rates = {k: _rate(report["figures"], k) for k in report["figures"] if k.startswith(CHARTED)}
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rates) + 1))
    ax.barh(list(rates), list(rates.values()))
    ax.set_xlabel("tasks per second (no-op tasks)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"chart: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
