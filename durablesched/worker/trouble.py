"""Store errors met by a worker: backed off from, logged once each, given up on in time.

Used by the claim loop (a failed pass: :meth:`StoreTrouble.failed` says how
long to wait, or raises to give up) and by task threads whose group commit
failed (:meth:`StoreTrouble.note`: logged, counted, the outcomes kept for the
loop to record). Owns no thread; its state is guarded by a lock of its own.

A run of errors is a *streak*: it begins with the first error after a pass
that worked, and ends when a pass works again (:meth:`StoreTrouble.recovered`)
or when ``give_up_after`` seconds of the scheduler's clock have passed since
it began. Each distinct error text is logged once per streak; the counts are
logged when the store recovers, and told in the error that gives up.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import datetime, timedelta

from durablesched.errors import CorruptDatabase, SchemaError, StoreError

# The logger name the worker's lines have always carried, whichever module
# logs them: people filter logs by it.
log = logging.getLogger("durablesched.worker")

#: The first backoff after a store error, in seconds; each next one doubles ...
FIRST_BACKOFF = 0.1
#: ... up to this (before jitter).
MAX_BACKOFF = 5.0


def is_permanent(error: StoreError) -> bool:
    """Errors no retry can help: a damaged file, a schema this code cannot use."""
    return isinstance(error, CorruptDatabase | SchemaError)


def backoff(failures: int, rng: random.Random) -> float:
    """Seconds to wait after the ``failures``-th error in a row: doubling from
    FIRST_BACKOFF, capped at MAX_BACKOFF, then drawn between half that and all of
    it, so that workers failing together do not retry together. Below the cap it
    never shrinks from one failure to the next (the lowest draw of the next is the
    highest of this one)."""
    step = min(FIRST_BACKOFF * 2.0 ** min(failures - 1, 32), MAX_BACKOFF)
    return step / 2 + rng.random() * step / 2


class StoreTrouble:
    """The current streak of store errors of one worker."""

    def __init__(
        self, give_up_after: float, rng: random.Random, max_failures: int | None = None
    ) -> None:
        self._give_up_after = timedelta(seconds=give_up_after)
        self._rng = rng
        #: The deprecated count-based limit (``max_store_failures``), if given.
        self._max_failures = max_failures
        self._lock = threading.Lock()
        #: Failed passes of the loop in this streak (what the backoff grows with).
        self.failures = 0
        self._since: datetime | None = None
        #: Each distinct error text of this streak, with how often it was seen.
        self._seen: dict[str, int] = {}

    @property
    def since(self) -> datetime | None:
        """When the current streak began (None: the store works)."""
        return self._since

    def note(self, error: StoreError, now: datetime) -> None:
        """An error met anywhere (a task thread's group commit, say): count it, and
        log it if it is the first of its text in this streak."""
        with self._lock:
            self._note(error, now)

    def failed(self, error: StoreError, now: datetime) -> timedelta:
        """A pass of the loop failed with ``error``: how long to wait before the next.

        Raises ``error`` itself if it is permanent, and a StoreError saying so
        once ``give_up_after`` seconds have passed since the streak began (the
        wait returned is cut so that the last try falls on that moment).
        """
        if is_permanent(error):
            raise error
        with self._lock:
            self._note(error, now)
            self.failures += 1
            assert self._since is not None
            left = self._since + self._give_up_after - now
            too_many = self._max_failures is not None and self.failures > self._max_failures
            if left <= timedelta(0) or too_many:
                elapsed = (now - self._since).total_seconds()
                raise StoreError(
                    f"gave up after {elapsed:.1f}s of store errors "
                    f"({self._summary()}); the last: {error}"
                ) from error
            return min(timedelta(seconds=backoff(self.failures, self._rng)), left)

    def recovered(self, now: datetime) -> None:
        """A pass worked: the streak, if any, is over; say how it went."""
        with self._lock:
            if self._since is None:
                return
            elapsed = (now - self._since).total_seconds()
            log.warning("store working again after %.1fs of errors (%s)", elapsed, self._summary())
            self._since = None
            self.failures = 0
            self._seen = {}

    def _note(self, error: StoreError, now: datetime) -> None:
        if self._since is None:
            self._since = now
        text = str(error)
        seen = self._seen.get(text, 0)
        self._seen[text] = seen + 1
        if seen or is_permanent(error):
            return  # logged already; a permanent one is told by whoever stops on it
        if len(self._seen) == 1:
            log.error(
                "store error: %s (retrying with backoff; giving up after %gs)",
                text,
                self._give_up_after.total_seconds(),
            )
        else:
            log.error("store error: %s (after %s)", text, self._summary(but=text))

    def _summary(self, *, but: str | None = None) -> str:
        """How often each error of the streak was seen: ``'x' 12 times, 'y' once``."""
        parts = [
            f"{text!r} {'once' if n == 1 else f'{n} times'}"
            for text, n in self._seen.items()
            if text != but
        ]
        return ", ".join(parts) or "none"
