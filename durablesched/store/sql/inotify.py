"""Linux inotify on one directory: wake at once when a database file is written.

Lets an idle worker sleep in the kernel instead of polling, and still notice
another process's commit within a millisecond. Where inotify is missing (not
Linux, no libc, watch limit reached), callers fall back to polling.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import time
from pathlib import Path

from durablesched.readable import readable

IN_MODIFY = 0x002
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class DirectoryWatch:
    """Changes to files in ``directory`` whose names start with ``prefix``."""

    def __init__(self, directory: Path, prefix: str) -> None:
        # The process's own symbols, libc's among them: looking libc up by name
        # (ctypes.util.find_library) runs ldconfig in a child process at every start.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        mask = IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_TO
        if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            errno = ctypes.get_errno()
            os.close(fd)
            raise OSError(errno, f"inotify_add_watch failed on {directory}")
        self._fd = fd
        self._prefix = os.fsencode(prefix)
        # A pipe to interrupt wait() from another thread when the watch closes.
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True as soon as a matching file changes.

        Other files' changes do not end the wait: a directory shared with files
        written often (another database, a log) would otherwise wake the watcher,
        and make it read the database, at each of their writes.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            ready = readable([self._fd, self._stop_r], left)
            if self._fd not in ready:
                return False
            if self._relevant():
                return True
            if self._stop_r in ready or time.monotonic() >= deadline:
                return False

    def _relevant(self) -> bool:
        """Take the queued events, in one read: True if one names a matching file. Events
        past the read's 64 KiB (two thousand of them) stay queued, and the next wait
        takes them at once; not reading again until the queue is empty spares each
        wake-up the read that finds it so (an exception's cost)."""
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:  # taken by a read before this one
            return False
        offset = 0
        while offset + _EVENT.size <= len(data):
            _wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            if name.startswith(self._prefix):
                return True
            offset += _EVENT.size + length
        return False

    def interrupt(self) -> None:
        """Make a wait() in another thread return now."""
        os.write(self._stop_w, b"x")

    def close(self) -> None:
        for fd in (self._fd, self._stop_r, self._stop_w):
            os.close(fd)


def watch_directory(directory: Path, prefix: str) -> DirectoryWatch | None:
    """A watch, or None where inotify cannot be had (the caller then polls)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return DirectoryWatch(directory, prefix)
    except (OSError, AttributeError):
        return None
