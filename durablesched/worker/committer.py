"""The committer: a thread of its own that records outcomes, so task threads never wait.

Started by ``Worker.run`` when the worker claims ahead (``ahead > 0``), stopped
as the loop ends. A task thread hands its outcome over and takes its next
claim at once (one waiting ahead, if any); this thread leads the group commits
(:class:`GroupCommit`), whose transaction also claims into the room the
outcomes free and ahead of it: all but one whose attempt was all the worker
held, recorded by its own thread (it has nothing else to run). No lock is held
while it records.
"""

from __future__ import annotations

import threading

from durablesched.worker.commit import GroupCommit


class Committer:
    """Runs :meth:`GroupCommit.drain` on its own thread whenever outcomes are pending."""

    def __init__(self, commit: GroupCommit, name: str) -> None:
        self._commit = commit
        self._name = name
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._commit.detached = True
        self._thread.start()

    def stop(self) -> None:
        """Hand the commits back to the threads that end attempts, and end the thread
        (the outcomes it leaves pending are recorded by the next drain)."""
        thread = self._thread
        if thread is None:
            return
        with self._commit.changed:
            self._commit.detached = False
            self._stop = True
            self._commit.changed.notify_all()
        thread.join()
        self._thread = None
        self._commit.drain()

    def _run(self) -> None:
        changed = self._commit.changed
        while True:
            with changed:
                while not self._stop and not self._commit.pending:
                    changed.wait()
                if self._stop:
                    return
            # A failure is kept and retried (GroupCommit.error): the claim loop backs
            # off from it; here, wait for the next outcome or the loop's next drain.
            if not self._commit.drain(wait=True):
                with changed:
                    if not self._stop:
                        changed.wait(0.05)
