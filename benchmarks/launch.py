"""Run a command as our child and report its own rusage.

A child forked straight from the (large) benchmark process can report the
parent's memory as its peak RSS; forked from this small launcher, it cannot.
Prints {"pid": ...} when started and {"status", "cpu", "maxrss_kib"} when done.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType


def main() -> int:
    argv = sys.argv[1:]
    pid = os.fork()
    if pid == 0:
        # Our stdout carries the report; the command's log goes where ours does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.execv(argv[0], argv)  # noqa: S606 - the benchmark's own worker command

    def forward(signum: int, _frame: FrameType | None) -> None:
        os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    print(json.dumps({"pid": pid}), flush=True)
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(
        json.dumps(
            {"status": code, "cpu": usage.ru_utime + usage.ru_stime, "maxrss_kib": usage.ru_maxrss}
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
