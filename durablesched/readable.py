"""A thread's sleep in the kernel until a file descriptor is readable (a database
socket, an inotify descriptor, a stop pipe, a task's child process's pipe).

``poll``, not ``select``: ``select`` refuses descriptors numbered 1,024 or more, and a
server holding many connections opens its watches past that.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence

#: The longest one ``poll`` sleeps (milliseconds): it takes a C int. Callers loop.
_LONGEST_MS = 2**31 - 1


def readable(fds: Sequence[int], timeout: float) -> set[int]:
    """Those of ``fds`` readable (or closed at the other end, or in error: the caller's
    read then says which) once one is, or none after ``timeout`` seconds (rounded up to
    a millisecond; ``math.inf`` or more than some 24 days: that long, the most one
    ``poll`` sleeps, and callers wait again)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    ms = _LONGEST_MS if timeout == math.inf else min(max(0, math.ceil(timeout * 1000)), _LONGEST_MS)
    return {fd for fd, _ in poller.poll(ms)}
