"""A worker process whose host clock is wrong by SKEW seconds (a stand-in for another host).

python -m tests.processes.skewed_worker SKEW durablesched-worker-arguments...
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

from freezegun import freeze_time

from durablesched.cli.main import main

if __name__ == "__main__":
    skew = float(sys.argv[1])
    # tick=True: the skewed clock runs at the normal rate, as a real wrong clock does.
    with freeze_time(datetime.now(UTC) + timedelta(seconds=skew), tick=True):
        raise SystemExit(main(sys.argv[2:]))
