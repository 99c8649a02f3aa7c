"""Start-up must stay cheap (issue 22): ``import durablesched``, ``--help`` and ``--version``
load no SQLAlchemy or Alembic; a worker on an up-to-date SQLite database loads no
Alembic, nothing of PostgreSQL's (ours or SQLAlchemy's) and not the in-memory store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import durablesched

PROBE = """
import contextlib, io, json, sys

import durablesched
from durablesched.cli.main import main
from durablesched.cli.parser import build_parser

for argv in (["--help"], ["--version"], *([name, "--help"] for name in build_parser().commands)):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def test_help_of_every_command_and_version_import_neither_sqlalchemy_nor_alembic() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "durablesched" in loaded
    assert not loaded & {"sqlalchemy", "alembic"}


OPEN_AND_RUN = """
import json, sys
from durablesched import Scheduler, TaskRegistry, TaskState, Worker, open_store

registry = TaskRegistry()
registry.task("noop")(lambda: None)
scheduler = Scheduler(open_store(sys.argv[1]), registry=registry)
task_id = scheduler.submit("noop")
Worker(scheduler).run(burst=True, burst_wait=0)
assert scheduler.get(task_id).state is TaskState.SUCCEEDED
scheduler.store.close()
unwanted = ("alembic", "durablesched.store.sql.postgres", "sqlalchemy.dialects.postgresql",
            "psycopg", "durablesched.store.memory")
print(json.dumps(sorted(name for name in sys.modules if name.startswith(unwanted))))
"""


def test_a_worker_on_an_up_to_date_sqlite_file_loads_no_alembic_postgres_or_memory_store(
    tmp_path: Path,
) -> None:
    db = tmp_path / "jobs.db"
    durablesched.SQLiteStore(db).close()  # created at head (that migration loads Alembic)
    result = subprocess.run(
        [sys.executable, "-c", OPEN_AND_RUN, str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_head_revision_is_the_newest_migration_script() -> None:
    from durablesched.store.sql.migrate import HEAD_REVISION, head_revision  # noqa: PLC0415

    assert head_revision() == HEAD_REVISION, (
        "a migration was added: set HEAD_REVISION in durablesched/store/sql/migrate.py"
    )
