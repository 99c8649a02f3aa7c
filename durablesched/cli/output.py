"""How commands print: aligned tables for people, JSON for scripts, times in UTC."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from durablesched.records import ErrorInfo, TaskRecord


def jsonable(value: Any) -> Any:
    """``value`` with times, errors and states turned into what JSON can hold."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, ErrorInfo):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    return value


def print_json(value: Any) -> None:
    print(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


def when(value: datetime | None) -> str:
    """A time in UTC to the millisecond, so that rows from any host line up."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, a rule under the headers; None shows as ``-``."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def record_dict(task: TaskRecord) -> dict[str, Any]:
    """Every field of a task, in the record's order (``show`` prints them all)."""
    return {f.name: getattr(task, f.name) for f in fields(task)}
