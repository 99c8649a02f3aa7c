"""No pickle, bound parameters everywhere, private files by default."""

from __future__ import annotations

import ast
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from durablesched import SQLiteStore
from durablesched.records import NewTask

from ..conftest import T0

PACKAGE = Path(__file__).resolve().parents[2] / "durablesched"
HOSTILE = [
    "'; DROP TABLE tasks; --",
    'a" OR 1=1 --',
    "x'); DELETE FROM tasks WHERE ('1'='1",
    "name; ATTACH DATABASE '/tmp/evil.db' AS evil;",
    "\\'\"`%_*?[]{}$\n\t\x00end",
    '$."1"',
]


def test_nothing_in_the_package_unpickles_or_evaluates() -> None:
    for source in PACKAGE.rglob("*.py"):
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "marshal", "shelve", "dill"} & {
                    n.split(".")[0] for n in names
                }, source
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec"), source


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_names_keys_and_args_are_stored_verbatim(tmp_path: Path, text: str) -> None:
    path = tmp_path / "h.db"
    store = SQLiteStore(path)
    (s,) = store.submit([NewTask(text, {"v": text, "w": [text]}, T0, 2, text)], T0)
    (again,) = store.submit([NewTask(text, {}, T0, 2, text)], T0)
    assert again.task_id == s.task_id and not again.created
    task = store.get(s.task_id)
    assert task is not None
    assert (task.name, task.args, task.idempotency_key) == (text, {"v": text, "w": [text]}, text)
    (claim,) = store.claim("w" + text, 5, T0, timedelta(seconds=30), names={text})
    assert store.complete(claim, {"echo": text}, T0)
    task = store.get(s.task_id)
    assert task is not None and task.result == {"echo": text}
    assert [t.id for t in store.list_tasks(name=text)] == [s.task_id]
    store.close()
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tasks", "task_events", "idempotency_keys", "durablesched_counters"} <= tables


def test_new_database_files_are_private_unless_asked(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "private.db").close()
    SQLiteStore(tmp_path / "shared.db", file_mode=0o640).close()
    assert (tmp_path / "private.db").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "shared.db").stat().st_mode & 0o777 == 0o640
