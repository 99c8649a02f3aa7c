"""Every query in docs/sql.md runs against a real queue file."""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durablesched import ErrorInfo, SQLiteStore
from durablesched.records import NewTask

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sql.md"


def test_the_ten_queries_run(tmp_path: Path) -> None:
    queries = re.findall(r"```sql\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert len(queries) == 10
    now = datetime.now(UTC)
    store = SQLiteStore(tmp_path / "q.db")
    store.submit([NewTask(n, {}, now - timedelta(minutes=5), 2) for n in "abcde"], now)
    lease = timedelta(seconds=30)
    claims = store.claim("w", 3, now, lease)
    store.complete(claims[0], 1, now)
    store.fail(claims[1], ErrorInfo("builtins.ValueError", "bad", ""), None, now)
    store.reclaim_expired(now + timedelta(minutes=1), lambda name, attempt: timedelta(0))
    store.close()
    with sqlite3.connect(tmp_path / "q.db") as conn:
        results = [conn.execute(q).fetchall() for q in queries]
    assert dict(results[0]) == {"FAILED": 1, "PENDING": 2, "RETRY_WAIT": 1, "SUCCEEDED": 1}
    assert len(results[1]) == 3
    assert [r[0] for r in results[5]] == ["b"]
    assert len(results[8]) == 1
    assert results[9]
