"""A process that submits no-op tasks one transaction at a time (the contention envelope)."""

from __future__ import annotations

import json
import sys
import time

from durablesched import Scheduler, SQLiteStore


def main() -> int:
    db, seconds = sys.argv[1], float(sys.argv[2])
    store = SQLiteStore(db)
    scheduler = Scheduler(store)
    submitted = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        scheduler.submit("noop")
        submitted += 1
    print(json.dumps({"submitted": submitted, "busy_retries": store.busy_retries}))
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
