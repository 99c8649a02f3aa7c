"""A process that submits tasks one transaction at a time for a while (contention test)."""

from __future__ import annotations

import json
import sys
import time

from durablesched import Scheduler
from durablesched.store.opening import open_store


def main() -> int:
    db, seconds = sys.argv[1], float(sys.argv[2])
    store = open_store(db)
    scheduler = Scheduler(store)
    ids: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ids.append(scheduler.submit("record", {"n": len(ids)}))
    print(json.dumps({"ids": ids, "busy_retries": store.busy_retries}))
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
