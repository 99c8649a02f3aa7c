"""croniter and cronsim against the daylight-saving rules of docs/schedules.md.

    PYTHONPATH=. python -m benchmarks.cron_libraries   (needs the bench extra: croniter)

Each library iterates with its own time-zone handling from a start time; the
expected fire times are the rules': a repeated time fires once, at its first
occurrence; a missing time fires once, at the jump. Then how fast each walks a
month of minutes. The table in docs/schedules.md ("Why cronsim") is this output.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import croniter
import cronsim


def u(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc,arg-type]


# (case, zone, expression, start in local wall-clock time, expected fires in UTC)
CASES: list[tuple[str, str, str, datetime, list[datetime]]] = [
    ("Berlin spring, 30 2 * * *: at the jump", "Europe/Berlin", "30 2 * * *",
     datetime(2026, 3, 28, 3), [u(2026, 3, 29, 1), u(2026, 3, 30, 0, 30)]),
    ("Berlin spring, 0 2 * * *", "Europe/Berlin", "0 2 * * *",
     datetime(2026, 3, 28, 3), [u(2026, 3, 29, 1), u(2026, 3, 30, 0)]),
    ("Berlin spring, */30 * * * *", "Europe/Berlin", "*/30 * * * *",
     datetime(2026, 3, 29, 1, 10),
     [u(2026, 3, 29, 0, 30), u(2026, 3, 29, 1), u(2026, 3, 29, 1, 30)]),
    ("Berlin fall, 30 2 * * *: once", "Europe/Berlin", "30 2 * * *",
     datetime(2026, 10, 24, 3), [u(2026, 10, 25, 0, 30), u(2026, 10, 26, 1, 30)]),
    ("Berlin fall, */30 * * * *: not again", "Europe/Berlin", "*/30 * * * *",
     datetime(2026, 10, 25, 1, 40),
     [u(2026, 10, 25, 0), u(2026, 10, 25, 0, 30), u(2026, 10, 25, 2)]),
    ("New York spring, 30 2 * * *", "America/New_York", "30 2 * * *",
     datetime(2026, 3, 7, 3), [u(2026, 3, 8, 7), u(2026, 3, 9, 6, 30)]),
    ("New York fall, 30 1 * * *: once", "America/New_York", "30 1 * * *",
     datetime(2026, 10, 31, 3), [u(2026, 11, 1, 5, 30), u(2026, 11, 2, 6, 30)]),
    ("New York fall, 0 * * * *: not again", "America/New_York", "0 * * * *",
     datetime(2026, 10, 31, 23, 30), [u(2026, 11, 1, 4), u(2026, 11, 1, 5), u(2026, 11, 1, 7)]),
    ("New York spring, 0 * * * *", "America/New_York", "0 * * * *",
     datetime(2026, 3, 8, 0, 30), [u(2026, 3, 8, 6), u(2026, 3, 8, 7), u(2026, 3, 8, 8)]),
]  # fmt: skip


def fires(library: str, zone: str, expression: str, start: datetime, n: int) -> list[datetime]:
    aware = start.replace(tzinfo=ZoneInfo(zone))
    found: list[datetime] = []
    if library == "croniter":
        it: Any = croniter.croniter(expression, aware)
        found = [it.get_next(datetime).astimezone(UTC) for _ in range(n)]
    else:
        sim = cronsim.CronSim(expression, aware)
        found = [next(sim).astimezone(UTC) for _ in range(n)]
    return found


def month_of_minutes(library: str) -> float:
    start = datetime(2026, 1, 1)
    began = time.perf_counter()
    if library == "croniter":
        it: Any = croniter.croniter("* * * * *", start)
        for _ in range(43_200):
            it.get_next(datetime)
    else:
        sim = cronsim.CronSim("* * * * *", start)
        for _ in range(43_200):
            next(sim)
    return time.perf_counter() - began


def main() -> None:
    print("| case (2026) | croniter | cronsim |")
    print("| --- | --- | --- |")
    for case, zone, expression, start, expected in CASES:
        cells = []
        for library in ("croniter", "cronsim"):
            got = fires(library, zone, expression, start, len(expected))
            cells.append("right" if got == expected else "wrong: " + ", ".join(
                g.strftime("%m-%d %H:%M") for g in got))  # fmt: skip
        print(f"| {case} | {cells[0]} | {cells[1]} |")
    for library in ("croniter", "cronsim"):
        seconds = month_of_minutes(library)
        print(f"{library}: a month of minutes, naive wall-clock time: {seconds:.2f} s")


if __name__ == "__main__":
    main()
