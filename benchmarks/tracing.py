"""What tracing costs (docs/tracing.md): no-op tasks submitted one by one, then run by a
worker, in four set-ups measured in the same run.

``python -m benchmarks.tracing [--tasks N] [--rounds R] [--concurrency C] [--base REV]``

* ``base``: the code without tracing (``--base``, by default the newest commit of
  HEAD's history without durablesched/tracing.py), exported from git: what the
  same code without the hook does;
* ``off``: this code, not instrumented (the hook points read None);
* ``noop``: ``durablesched.otel.instrument(NoOpTracerProvider())``: the API's spans,
  which record nothing and carry no context (the cost of ``opentelemetry-api``
  without an SDK);
* ``sdk``: the SDK with a ``BatchSpanProcessor`` to an in-memory exporter: every
  submit and attempt a recorded span, its context stored with the task.

Each set-up runs in a fresh process on a fresh SQLite file (``normal`` durability:
the fsync of ``full`` would hide what the code costs), the set-ups in turn, ``R``
rounds; the figures are medians. Submits are timed apart from runs: a submit's cost
is one span and one context carried, a run's one span and its link.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from .common import ROOT, fresh

SETUPS = ("base", "off", "noop", "sdk")


def measure(setup: str, db: Path, tasks: int, concurrency: int) -> dict[str, Any]:
    """One set-up in this process: submit ``tasks`` no-op tasks, then run them."""
    from durablesched import (  # noqa: PLC0415 - the set-up's own code (base: the old one)
        Scheduler,
        SQLiteStore,
        TaskRegistry,
        TaskState,
        Worker,
    )

    exporter = provider = None
    if setup in ("noop", "sdk"):
        from durablesched import otel  # noqa: PLC0415 - only these set-ups import it

        if setup == "noop":
            from opentelemetry.trace import NoOpTracerProvider  # noqa: PLC0415

            otel.instrument(NoOpTracerProvider())
        else:
            from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
            from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
                InMemorySpanExporter,
            )

            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(exporter))
            otel.instrument(provider)
    registry = TaskRegistry()
    registry.task("noop")(lambda: None)
    store = SQLiteStore(fresh(db), durability="normal")
    scheduler = Scheduler(store, registry=registry)
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(tasks):
        scheduler.submit("noop")
    submitted = time.perf_counter()
    Worker(scheduler, concurrency=concurrency).run(burst=True, burst_wait=0)
    if provider is not None:
        provider.force_flush()  # the spans' export is part of what they cost
    ran, cpu_ran = time.perf_counter(), time.process_time()
    succeeded = len(store.list_tasks(state=TaskState.SUCCEEDED, limit=tasks + 1))
    store.close()
    spans = None
    if provider is not None and exporter is not None:
        spans = len(exporter.get_finished_spans())
        provider.shutdown()
    return {
        "setup": setup,
        "submit_per_s": tasks / (submitted - started),
        "run_per_s": tasks / (ran - submitted),
        # CPU time of the whole process (every thread) per task: what the set-up costs,
        # whatever else the machine is busy with.
        "cpu_us": (cpu_ran - cpu_started) / tasks * 1e6,
        "spans": spans,
        "succeeded": succeeded,
        "imports_opentelemetry": any(m.startswith("opentelemetry") for m in sys.modules),
    }


def base_tree(rev: str | None, into: Path) -> tuple[Path, str]:
    """The package as it was at ``rev`` (default: before tracing), exported from git."""
    if rev is None:
        rev = _before_tracing()
    commit = _git("rev-parse", "--short", rev)
    archive = subprocess.run(  # noqa: S603 - git, with our own arguments
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "durablesched"],  # noqa: S607
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into, commit


def _before_tracing() -> str:
    """The newest commit of HEAD's history without durablesched/tracing.py: on a branch
    that merged main, main's tip; on main after the merge, the main it merged into."""
    for rev in _git("rev-list", "--max-count=500", "HEAD").split():
        has = subprocess.run(  # noqa: S603 - git, with our own arguments
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:durablesched/tracing.py"],  # noqa: S607
            capture_output=True,
            check=False,
        )
        if has.returncode != 0:
            return rev
    raise RuntimeError("no commit without durablesched/tracing.py in the last 500: give --base")


def _git(*args: str) -> str:
    return subprocess.run(  # noqa: S603 - git, with our own arguments
        ["git", "-C", str(ROOT), *args],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def run_one(setup: str, db: Path, tasks: int, concurrency: int, base: Path) -> dict[str, Any]:
    """One set-up in a fresh process (``base`` imports the exported tree first)."""
    path = [str(base)] if setup == "base" else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    done = subprocess.run(  # noqa: S603 - our own module
        [
            sys.executable,
            "-m",
            "benchmarks.tracing",
            "--one",
            setup,
            "--db",
            str(db),
            "--tasks",
            str(tasks),
            "--concurrency",
            str(concurrency),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"set-up {setup} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(
    tasks: int, rounds: int, concurrency: int, rev: str | None = None
) -> tuple[str, dict[str, dict[str, float]]]:
    """Every set-up ``rounds`` times, in turn; the medians, and the base commit measured."""
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SETUPS}
    with tempfile.TemporaryDirectory(prefix="durablesched-tracing-") as tmp:
        base, commit = base_tree(rev, Path(tmp) / "base")
        for _ in range(rounds):
            for setup in SETUPS:
                result = run_one(setup, Path(tmp) / "tasks.db", tasks, concurrency, base)
                assert result["succeeded"] == tasks, result
                results[setup].append(result)
    base_runs = results["base"]

    def against_base(runs: list[dict[str, Any]], key: str) -> float:
        """The median of each round's ratio to the base of the same round (paired: a
        round's set-ups ran one after the other, under the same load)."""
        ratios = [float(r[key]) / float(b[key]) - 1 for r, b in zip(runs, base_runs, strict=True)]
        return statistics.median(ratios)

    medians = {
        setup: {
            "submit_per_s": statistics.median(r["submit_per_s"] for r in runs),
            "submit_vs_base": against_base(runs, "submit_per_s"),
            "run_per_s": statistics.median(r["run_per_s"] for r in runs),
            "run_vs_base": against_base(runs, "run_per_s"),
            "cpu_us": statistics.median(r["cpu_us"] for r in runs),
            "cpu_vs_base": against_base(runs, "cpu_us"),
            "spans": runs[-1]["spans"] or 0,
            "imports_opentelemetry": float(any(r["imports_opentelemetry"] for r in runs)),
        }
        for setup, runs in results.items()
    }
    return commit, medians


def report(commit: str, medians: dict[str, dict[str, float]], tasks: int, rounds: int) -> str:
    lines = [
        f"{tasks:,} no-op tasks, submitted one by one, then run; medians of {rounds} rounds "
        f"(vs base: of each round's ratio); base = {commit}",
        "",
        "| set-up | submits/s | vs base | runs/s | vs base | CPU per task | vs base | spans "
        "| opentelemetry imported |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for setup in SETUPS:
        m = medians[setup]
        lines.append(
            f"| {setup} | {m['submit_per_s']:,.0f} | {m['submit_vs_base']:+.1%} | "
            f"{m['run_per_s']:,.0f} | {m['run_vs_base']:+.1%} | {m['cpu_us']:,.0f} µs | "
            f"{m['cpu_vs_base']:+.1%} | {int(m['spans']):,} | "
            f"{'yes' if m['imports_opentelemetry'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--base", help="the commit to compare with (default: before tracing)")
    parser.add_argument("--one", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.db, args.tasks, args.concurrency)))
        return
    commit, medians = compare(args.tasks, args.rounds, args.concurrency, args.base)
    print(report(commit, medians, args.tasks, args.rounds))


if __name__ == "__main__":
    main()
