"""Real worker processes on one database (a SQLite file, or a PostgreSQL schema), observed
through the database."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from sqlalchemy import text

from durablesched import Scheduler
from durablesched.store.opening import open_store
from durablesched.store.sql.store import SQLStore
from durablesched.store.sql.urls import is_postgres_url

from .app import registry

ROOT = Path(__file__).resolve().parents[2]
#: Upper bound of every wait for another process, in seconds.
DEADLINE = 30.0


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Workers:
    """Starts worker processes and cleans up every one of them."""

    def __init__(self, db: str, out: Path) -> None:
        self.db = db
        self.out = out
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def start(
        self, *args: str, concurrency: int = 4, lease: float = 1.0
    ) -> subprocess.Popen[bytes]:
        log = (self.out / f"worker-{len(self.procs)}.log").open("wb")
        self._logs.append(log)
        env = {**os.environ, "DS_TEST_DIR": str(self.out), "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durablesched",
                "worker",
                "--db",
                str(self.db),
                "--app",
                "tests.processes.app:registry",
                "--concurrency",
                str(concurrency),
                "--lease",
                str(lease),
                *args,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def wait_started(self, proc: subprocess.Popen[bytes]) -> None:
        """Until the worker logs its start line (its signal handlers are in place by then)."""
        index = self.procs.index(proc)
        wait_for(lambda: "worker " in self.log(index), f"worker {index} to start")

    def chaos(
        self, *args: str, workers: int, seconds: float, rng: random.Random, least: int = 0
    ) -> tuple[list[subprocess.Popen[bytes]], int]:
        """``workers`` workers (``args``, 4 slots, 1 s leases), one SIGKILLed every 300 ms
        for ``seconds``, and on until ``least`` were killed (each once up: a start-up can
        outlast 300 ms on a loaded machine, where ``seconds`` would hold fewer kills), and
        replaced; the live ones, and how many were killed."""
        live = [self.start(*args, concurrency=4, lease=1) for _ in range(workers)]
        kills = 0
        ends = time.monotonic() + seconds
        while time.monotonic() < ends or kills < least:
            time.sleep(0.3)
            victim = live.pop(rng.randrange(len(live)))
            self.wait_started(victim)
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            kills += 1
            live.append(self.start(*args, concurrency=4, lease=1))
        return live, kills

    def drain_and_stop(
        self, db: str, live: list[subprocess.Popen[bytes]], tasks: int, seconds: float
    ) -> None:
        """Until ``tasks`` tasks are finished (at most ``seconds``), then SIGTERM the live
        workers, each of which must exit 0."""
        deadline = time.monotonic() + seconds
        while (done := count(db, "state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')")) < tasks:
            assert time.monotonic() < deadline, f"only {done} of {tasks} finished"
            time.sleep(0.1)
        for proc in live:
            self.wait_started(proc)
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            assert proc.wait(30) == 0

    def log(self, index: int) -> str:
        return (self.out / f"worker-{index}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(DEADLINE)
        for log in self._logs:
            log.close()


def query(db: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (``?`` placeholders) read with the database's own driver."""
    if is_postgres_url(db):
        import psycopg  # noqa: PLC0415 - only for PostgreSQL

        with psycopg.connect(db) as conn:
            return [
                tuple(r)
                for r in conn.execute(sql.replace("%", "%%").replace("?", "%s"), params).fetchall()
            ]
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(sql, params).fetchall()


def count(db: str, where: str) -> int:
    return int(query(db, f"SELECT count(*) FROM tasks WHERE {where}")[0][0])


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database the processes share: a SQLite file, or a PostgreSQL schema of its own."""
    url = (
        str(request.getfixturevalue("pg_url"))
        if request.param == "postgres"
        else str(tmp_path / "jobs.db")
    )
    store = open_store(url)
    assert isinstance(store, SQLStore)
    with store.engine.begin() as conn:
        conn.execute(
            text("CREATE TABLE ledger (task_id INTEGER PRIMARY KEY, attempt INTEGER, pid INTEGER)")
        )
    store.close()
    return url


@pytest.fixture
def workers(db: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(db, tmp_path)
    yield w
    w.stop_all()
    # Shown by pytest only when the test failed: what each worker said.
    for index in range(len(w.procs)):
        print(f"--- worker-{index}.log ---\n{w.log(index)}")


@pytest.fixture
def scheduler(db: str) -> Iterator[Scheduler]:
    store = open_store(db)
    yield Scheduler(store, registry=registry)
    store.close()
