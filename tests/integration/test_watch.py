"""Noticing other processes' commits: inotify where there is one, polling otherwise."""

from __future__ import annotations

import gc
import os
import resource
import sqlite3
import sys
import threading
import time
import weakref
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from durablesched import Scheduler, SQLiteStore, StoreError, TaskRegistry, Worker
from durablesched.readable import readable
from durablesched.records import ErrorInfo, Finished, NewTask
from durablesched.states import TaskState
from durablesched.store.protocol import Outcomes
from durablesched.store.sql import inotify as inotify_module
from durablesched.store.sql import sqlite as sqlite_module
from durablesched.store.sql.inotify import DirectoryWatch, watch_directory
from durablesched.store.sql.sqlite import DataVersionWatcher

from ..conftest import T0, WAIT


class Seen:
    """What a watcher reported: commits seen, and the error it stopped on."""

    def __init__(self) -> None:
        self.commit = threading.Event()
        self.failed = threading.Event()
        self.errors: list[Exception] = []

    def __call__(self, error: Exception | None) -> None:
        if error is None:
            self.commit.set()
        else:
            self.errors.append(error)
            self.failed.set()


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


@linux
def test_directory_watch_reports_matching_files_only(tmp_path: Path) -> None:
    watch = watch_directory(tmp_path, "jobs.db")
    assert isinstance(watch, DirectoryWatch)
    try:
        assert watch.wait(0) is False
        (tmp_path / "other.txt").write_text("x")
        assert watch.wait(0) is False  # an event, but not ours
        (tmp_path / "jobs.db-wal").write_text("x")
        assert watch.wait(WAIT) is True
        watch.interrupt()
        assert watch.wait(WAIT) is False  # returns at once, with nothing to report
    finally:
        watch.close()


@linux
def test_directory_watch_hears_a_change_queued_past_one_read(tmp_path: Path) -> None:
    """A wake-up takes the queued events in one read (64 KiB): a matching file's event
    queued behind more of other files' is taken by the wait's next read, not lost."""
    watch = watch_directory(tmp_path, "jobs.db")
    assert isinstance(watch, DirectoryWatch)
    try:
        for i in range(400):  # about 120 KiB of events: more than one read holds
            (tmp_path / f"{i:03d}{'x' * 200}").write_text("x")
        (tmp_path / "jobs.db-wal").write_text("x")
        assert watch.wait(WAIT) is True
        assert watch.wait(0) is False  # all taken
    finally:
        watch.close()


@linux
def test_directory_watch_waits_on_past_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another file's change does not end a wait: a database beside busy files (another
    database, a log) would otherwise have its watcher read at each of their writes."""
    watch = watch_directory(tmp_path, "jobs.db")
    assert isinstance(watch, DirectoryWatch)
    polls = 0
    waiting_again = threading.Event()

    def counted(fds: list[int], timeout: float) -> set[int]:
        nonlocal polls
        polls += 1
        if polls == 2:
            waiting_again.set()  # the other file's event taken, the wait went on
        return readable(fds, timeout)

    monkeypatch.setattr(inotify_module, "readable", counted)
    seen: list[bool] = []
    waiter = threading.Thread(target=lambda: seen.append(watch.wait(WAIT)))
    try:
        (tmp_path / "other.txt").write_text("x")
        waiter.start()
        assert waiting_again.wait(WAIT), f"the wait ended at the other file's event: {seen}"
        (tmp_path / "jobs.db-wal").write_text("x")
        waiter.join(WAIT)
        assert seen == [True]
    finally:
        watch.interrupt()
        if waiter.is_alive():
            waiter.join(WAIT)
        watch.close()


def test_directory_watch_waits_on_a_descriptor_past_1024(tmp_path: Path) -> None:
    """``select`` refuses descriptors numbered 1,024 or more, which a server holding many
    connections gives its watch: the wait polls, and hears the change all the same."""
    watch = watch_directory(tmp_path, "jobs.db")
    assert isinstance(watch, DirectoryWatch)
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = 1500
    if limits[0] <= high:
        assert limits[1] == resource.RLIM_INFINITY or limits[1] > high, limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (high + 1, limits[1]))
    try:
        os.dup2(watch._fd, high)
        os.close(watch._fd)
        watch._fd = high
        assert not watch.wait(0)
        (tmp_path / "jobs.db-wal").write_text("x")
        assert watch.wait(WAIT)
    finally:
        watch.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


@pytest.mark.parametrize("inotify", [True, False])
def test_watcher_sees_another_connections_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if not inotify:
        monkeypatch.setattr(sqlite_module, "watch_directory", lambda *_: None)
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes(poll_interval=0.005)
    assert watcher.uses_inotify is (inotify and sys.platform.startswith("linux"))
    seen = Seen()
    watcher.start(seen)
    try:
        other = SQLiteStore(tmp_path / "jobs.db")
        other.submit([NewTask("t", {}, T0, 1)], T0)
        other.close()
        assert seen.commit.wait(WAIT)
        assert seen.errors == []
    finally:
        watcher.close()
        store.close()


@linux
def test_a_commit_being_written_is_looked_at_per_millisecond_not_per_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit writes the WAL a page at a time; reading data_version after each
    write (as the watcher once did: about 150 reads for this commit) costs the
    worker's process CPU for nothing, since the commit is not visible until it ends."""
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes()
    assert watcher.uses_inotify
    reads = 0
    read = watcher._read

    def counted() -> int:
        nonlocal reads
        reads += 1
        return read()

    monkeypatch.setattr(watcher, "_read", counted)
    seen = Seen()
    watcher.start(seen)
    try:
        other = SQLiteStore(tmp_path / "jobs.db")
        pad = "x" * 1000
        started = time.monotonic()
        # About 3 MB in one transaction: hundreds of WAL writes.
        other.submit([NewTask("t", {"pad": pad}, T0, 1) for _ in range(3000)], T0)
        assert seen.commit.wait(WAIT)
        elapsed = time.monotonic() - started
        other.close()
        # At most one look after each settling pause, one on the first write, and
        # one on an event that ends a backoff: two per pause at worst.
        assert reads <= 2 * elapsed / watcher.SETTLE + 2, (reads, elapsed)
        assert seen.errors == []
    finally:
        watcher.close()
        store.close()


@linux
def test_a_commit_whose_fsync_outlasts_the_backoff_is_still_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's last WAL write is reported before its fsync ends, and what makes it
    visible (the shared-memory index) is not reported at all: a slow fsync used to leave
    the commit unseen until the next once-a-second check (here: never)."""
    monkeypatch.setattr(DataVersionWatcher, "FILE_CHECK_INTERVAL", 3600.0)
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes()
    assert watcher.uses_inotify
    read = watcher._read
    unchanged = read()
    visible_after: list[float] = []

    def lagging() -> int:  # the commit stays invisible for 0.3 s after its first write
        if not visible_after:
            return unchanged
        return read() if time.monotonic() > visible_after[0] else unchanged

    monkeypatch.setattr(watcher, "_read", lagging)
    seen = Seen()
    watcher.start(seen)
    other = SQLiteStore(tmp_path / "jobs.db")
    try:
        visible_after.append(time.monotonic() + 0.3)
        other.submit([NewTask("t", {}, T0, 1)], T0)
        assert seen.commit.wait(WAIT)
        assert seen.errors == []
    finally:
        other.close()
        watcher.close()
        store.close()


@linux
def test_a_commit_written_with_the_one_just_seen_is_still_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commits written back to back: the watcher takes both's WAL writes in one
    look, and the first is visible when it reads while the second still waits for its
    fsync. Seeing the first used to end the looking: the second stayed unheard until the
    once-a-second check (a 1 s p99 wake-up of a waiting handle; here: never)."""
    monkeypatch.setattr(DataVersionWatcher, "FILE_CHECK_INTERVAL", 3600.0)
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes()
    assert watcher.uses_inotify
    read = watcher._read
    unchanged = read()
    second_visible_at: list[float] = []

    def lagging() -> int:  # after the writes: the first commit at once, the second later
        if not second_visible_at:
            return unchanged
        return read() if time.monotonic() > second_visible_at[0] else unchanged - 1

    monkeypatch.setattr(watcher, "_read", lagging)
    commits: list[Exception | None] = []
    second = threading.Event()

    def seen(error: Exception | None) -> None:
        commits.append(error)
        if len(commits) == 2:
            second.set()

    other = SQLiteStore(tmp_path / "jobs.db")
    try:
        other.submit([NewTask("t", {}, T0, 1)], T0)
        other.submit([NewTask("t", {}, T0, 1)], T0)
        second_visible_at.append(time.monotonic() + 0.1)
        watcher.start(seen)  # both commits' writes are waiting: one look takes them
        assert second.wait(WAIT), commits
        assert commits == [None, None]
    finally:
        other.close()
        watcher.close()
        store.close()


@linux
def test_a_busy_consumer_hears_nothing_until_it_nudges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DataVersionWatcher, "QUIET", 60.0)  # only a nudge ends the quiet
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes()
    first, second = threading.Event(), threading.Event()

    def on_change(error: Exception | None) -> bool:
        assert error is None
        if first.is_set():
            second.set()
            return False
        first.set()
        return True  # busy: keep quiet

    watcher.start(on_change)
    other = SQLiteStore(tmp_path / "jobs.db")
    try:
        other.submit([NewTask("t", {}, T0, 1)], T0)
        assert first.wait(WAIT)
        other.submit([NewTask("t", {}, T0, 1)], T0)
        assert not second.wait(0.3)  # a prompt watcher reports within milliseconds
        watcher.nudge()
        assert second.wait(WAIT)
    finally:
        other.close()
        watcher.close()
        store.close()


@linux
def test_a_full_worker_quiets_its_watcher_and_wakes_it_when_a_slot_frees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full worker's own commits would otherwise wake its watcher a few times each;
    once a slot frees with nothing claimed, a submit elsewhere must reach it at once."""
    monkeypatch.setattr(DataVersionWatcher, "QUIET", 60.0)  # only a nudge ends the quiet
    registry = TaskRegistry()
    started, release, ran = threading.Event(), threading.Event(), threading.Event()

    @registry.task("hold")
    def hold() -> None:
        started.set()
        release.wait(WAIT)

    @registry.task("quick")
    def quick() -> None:
        ran.set()

    store = SQLiteStore(tmp_path / "jobs.db")
    worker = Worker(Scheduler(store, registry=registry), concurrency=1, lease=600)
    # No pass of its own within the test's wait (it looks for expired leases
    # every second): only the watcher can bring the second submit to it.
    worker._reclaim_interval = timedelta(seconds=60)
    quiet = threading.Event()
    answer = worker._on_change

    def spy(error: Exception | None) -> bool:
        busy = answer(error)
        if busy:
            quiet.set()
        return busy

    monkeypatch.setattr(worker, "_on_change", spy)
    looked = threading.Event()  # a pass found nothing to claim with the slot free
    run_once = worker.run_once

    def counted(now: datetime | None = None) -> int:
        claimed = run_once(now)
        if claimed == 0 and worker.active_count == 0:
            looked.set()
        return claimed

    monkeypatch.setattr(worker, "run_once", counted)
    other_store = SQLiteStore(tmp_path / "jobs.db")
    other = Scheduler(other_store)  # another process, in effect
    worker.start()
    try:
        other.submit("hold")
        assert started.wait(WAIT)
        other.submit("quick", delay=3600)  # a commit elsewhere while every slot is taken
        assert quiet.wait(WAIT)
        looked.clear()  # the first pass, before "hold", found nothing too
        release.set()
        assert worker.wait_idle(WAIT)
        # Past the pass that freeing the slot caused: only a wake can bring more.
        assert looked.wait(WAIT)
        other.submit("quick")
        assert ran.wait(WAIT)  # not after the 60 s quiet
    finally:
        release.set()
        assert worker.stop()
        other_store.close()
        store.close()


def test_watcher_reports_a_removed_file(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes(poll_interval=0.005)
    seen = Seen()
    watcher.start(seen)
    try:
        (tmp_path / "jobs.db").unlink()
        assert seen.failed.wait(WAIT)
        assert isinstance(seen.errors[0], StoreError)
        assert "removed or replaced" in str(seen.errors[0])
    finally:
        watcher.close()
        store.close()


def test_a_driver_error_reading_data_version_is_reported_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher reads ``data_version`` on a raw pooled connection, whose errors are
    the driver's own: one escaping would end the watch's thread in silence, and its
    worker would hear no commit again. It must reach the consumer as a StoreError."""
    monkeypatch.setattr(sqlite_module, "watch_directory", lambda *_: None)
    store = SQLiteStore(tmp_path / "jobs.db")
    watcher = store.watch_changes(poll_interval=0.005)
    assert isinstance(watcher, DataVersionWatcher)

    class Broken:
        def cursor(self) -> object:
            raise sqlite3.OperationalError("disk I/O error")

        def close(self) -> None:
            pass

    real, watcher._conn = watcher._conn, Broken()  # type: ignore[assignment]
    seen = Seen()
    watcher.start(seen)
    try:
        assert seen.failed.wait(WAIT)
        assert isinstance(seen.errors[0], StoreError)
        assert "disk I/O error" in str(seen.errors[0])
    finally:
        watcher.close()
        assert real is not None
        real.close()
        store.close()


def test_a_file_removed_before_the_watch_starts_is_still_reported(tmp_path: Path) -> None:
    """The file's identity is taken when the store opens it, not when watching starts."""
    store = SQLiteStore(tmp_path / "jobs.db")
    (tmp_path / "jobs.db").unlink()
    watcher = store.watch_changes(poll_interval=0.005)
    seen = Seen()
    watcher.start(seen)
    try:
        assert seen.failed.wait(WAIT)
        assert "removed or replaced" in str(seen.errors[0])
    finally:
        watcher.close()
        store.close()


def test_finished_lines_notice_line_ids_given_again(tmp_path: Path) -> None:
    """SQLite's finish watcher reads the history's lines after the last it read. Once
    the newest lines are deleted (a deleted task's), their ids are given again: a look
    that went on from the old id would miss a task finishing on those lines. It must
    name the task, or say that any may have finished (None)."""
    store = SQLiteStore(tmp_path / "jobs.db")
    other = SQLiteStore(tmp_path / "jobs.db")
    lines = store.watch_finished()  # not started: each look made here, in turn
    try:
        first, second = (t.task_id for t in other.submit([NewTask("t", {}, T0, 1)] * 2, T0))
        (claim,) = other.claim("w", 1, T0, timedelta(seconds=30))
        other.complete(claim, None, T0)
        assert lines._finished_since() == {first}
        other.delete_task(first)  # the newest lines go: their ids are free again
        (claim,) = other.claim("w", 1, T0, timedelta(seconds=30))
        assert claim.task_id == second
        other.complete(claim, None, T0)
        heard = lines._finished_since()
        assert heard is None or second in heard, heard
    finally:
        lines.close()
        other.close()
        store.close()


def test_a_failed_look_says_any_task_may_have_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's finish watcher notices commits by its look at the history (one statement
    in place of ``data_version``). A look that fails must neither stop the watch nor
    lose a finish: it says that any task may have finished (None), and the next look
    goes on from the last line it read."""
    store = SQLiteStore(tmp_path / "jobs.db")
    other = SQLiteStore(tmp_path / "jobs.db")
    lines = store.watch_finished()  # not started: each look made here, in turn
    try:
        (task,) = (t.task_id for t in other.submit([NewTask("t", {}, T0, 1)], T0))
        (claim,) = other.claim("w", 1, T0, timedelta(seconds=30))
        other.complete(claim, None, T0)

        def broken() -> bool:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(lines, "_look", broken)
        assert lines._watched_look() is True  # noticed: something may have changed
        assert lines._take() is None  # any task may have finished
        monkeypatch.undo()
        assert lines._watched_look() is True
        assert lines._take() == {task}  # nothing skipped: the look went on from its line
        assert lines._watched_look() is False  # nothing written since
        assert lines._take() == set()
    finally:
        lines.close()
        other.close()
        store.close()


def test_a_watched_look_is_made_only_after_another_connection_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most writes the change watcher hears are of a commit not yet visible, or of none:
    ``data_version`` unchanged since the last look says so for less than a look costs,
    and the look is not made. A commit by another connection is looked at."""
    store = SQLiteStore(tmp_path / "jobs.db")
    other = SQLiteStore(tmp_path / "jobs.db")
    lines = store.watch_finished()  # not started: each look made here, in turn
    looks: list[bool] = []
    real = lines._look

    def counted() -> bool:
        looks.append(real())
        return looks[-1]

    monkeypatch.setattr(lines, "_look", counted)
    try:
        assert lines._watched_look() is False  # the first is made: nothing was read yet
        assert lines._watched_look() is False
        assert looks == [False]  # the second was not made
        (task,) = (t.task_id for t in other.submit([NewTask("t", {}, T0, 1)], T0))
        (claim,) = other.claim("w", 1, T0, timedelta(seconds=30))
        other.complete(claim, None, T0)
        assert lines._watched_look() is True
        assert lines._take() == {task}
        assert looks == [False, True]
    finally:
        lines.close()
        other.close()
        store.close()


def test_a_commit_landing_during_a_look_is_looked_at_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``data_version`` is read before the look: a commit that lands after the look's
    statement changes it, and the next watched look reads that commit's lines."""
    store = SQLiteStore(tmp_path / "jobs.db")
    other = SQLiteStore(tmp_path / "jobs.db")
    lines = store.watch_finished()  # not started: each look made here, in turn
    (task,) = (t.task_id for t in other.submit([NewTask("t", {}, T0, 1)], T0))
    real = lines._look

    def then_a_commit() -> bool:
        looked = real()
        monkeypatch.undo()
        (claim,) = other.claim("w", 1, T0, timedelta(seconds=30))
        other.complete(claim, None, T0)
        return looked

    monkeypatch.setattr(lines, "_look", then_a_commit)
    try:
        lines._watched_look()
        assert lines._take() == set()  # the look ran before the commit
        assert lines._watched_look() is True
        assert lines._take() == {task}
    finally:
        lines.close()
        other.close()
        store.close()


def test_finished_lines_begin_at_the_newest_line(tmp_path: Path) -> None:
    """Tasks that finished before the watch began are not news to it (nor read: the
    history is long); those finishing after are."""
    store = SQLiteStore(tmp_path / "jobs.db")
    old, new = (t.task_id for t in store.submit([NewTask("t", {}, T0, 1)] * 2, T0))
    (claim,) = store.claim("w", 1, T0, timedelta(seconds=30))
    assert claim.task_id == old
    store.complete(claim, None, T0)
    lines = store.watch_finished()
    try:
        assert lines._finished_since() == set()
        (claim,) = store.claim("w", 1, T0, timedelta(seconds=30))
        store.complete(claim, None, T0)
        assert lines._finished_since() == {new}
    finally:
        lines.close()
        store.close()


class Waiting:
    """Whether a task is waited on, as the waiting handles answer it (an object of its
    own: whether the watcher still holds it once closed can be seen)."""

    def __init__(self, ids: set[int]) -> None:
        self.ids = ids

    def __call__(self, task_id: int) -> bool:
        return task_id in self.ids


def test_finished_lines_read_the_outcomes_of_awaited_tasks_only(tmp_path: Path) -> None:
    """Started with ``awaited`` (by waiting handles), SQLite's finish watcher reads with its
    look the outcomes of the tasks that finished and are waited on, and reports those
    alone: not a task nobody here waits on, nor one whose row is no longer finished
    (requeued since its finishing line); each as ``Store.finished`` reads it, but for
    ``finished_at``: succeeded, failed, cancelled, or gone (None). The handles then read
    nothing themselves."""
    store = SQLiteStore(tmp_path / "jobs.db")
    other = SQLiteStore(tmp_path / "jobs.db")
    lines = store.watch_finished()  # not started: each look made here, in turn
    lease = timedelta(seconds=30)
    try:
        ids = [t.task_id for t in other.submit([NewTask("t", {}, T0, 1)] * 6, T0)]
        awaited, _unawaited, cancelled, requeued, failed, gone = ids
        waiting = Waiting({awaited, cancelled, requeued, failed, gone})
        lines._read_outcomes(waiting)
        for claim in other.claim("w", 2, T0, lease):
            other.complete(claim, {"x": claim.task_id}, T0)
        other.request_cancel(cancelled, T0)
        for claim in other.claim("w", 3, T0, lease):
            other.fail(claim, ErrorInfo("builtins.ValueError", f"no {claim.task_id}", ""), None, T0)
        other.requeue(requeued, T0)  # its FAILED line stays; its row is PENDING again
        raw = sqlite3.connect(tmp_path / "jobs.db")  # the row gone, its lines left
        with raw:
            raw.execute("DELETE FROM tasks WHERE id = ?", (gone,))
        raw.close()
        expected = store.finished({awaited, cancelled, failed, gone})
        found = lines._finished_since()
        assert isinstance(found, Outcomes)
        assert found == {i: f and f._replace(finished_at=None) for i, f in expected.items()}
        assert all(type(f) is Finished for f in found.values() if f is not None)
        done, stopped, lost = found[awaited], found[cancelled], found[failed]
        assert done is not None and (done.state, done.result) == (
            TaskState.SUCCEEDED,
            {"x": awaited},
        )
        assert stopped is not None and stopped.state is TaskState.CANCELLED
        assert lost is not None and lost.state is TaskState.FAILED
        assert lost.last_error is not None and lost.last_error.message == f"no {failed}"
        assert found[gone] is None
        assert done.finished_at is None  # not read: no wait's outcome holds it
        assert found.cost > 0  # what the look cost: the next batch is spread by it
        assert lines._finished_since() == {}  # nothing written since
    finally:
        lines.close()
        other.close()
    try:  # back in the pool, the connection no longer holds the waiting handles
        held = weakref.ref(waiting)
        del waiting
        gc.collect()
        assert held() is None
    finally:
        store.close()
