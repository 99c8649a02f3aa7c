"""What a suspended workflow waits for, said where tasks are listed (``durablesched ls``,
the dashboard's task list): a sleep's wake time, a signal's name and timeout, or how
many of its awaited children have ended.

A suspension's history line says it (``Store.suspend``'s ``detail``): the lines are
written here (:func:`sleeping`, :func:`signal`, :func:`children`, :func:`first_child`)
and read back here (:func:`waiting_for`), so the two cannot drift apart. A listing
reads the last line of every suspended candidate in one read
(``Store.latest_events``) and the awaited children's ends in one more
(``Store.finished``): two reads however many tasks are listed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from durablesched.records import TaskRecord
from durablesched.states import TaskState
from durablesched.store.protocol import Store

#: Every suspension's line starts so (then what it waits for).
PREFIX = "suspended at step "

_LINE = re.compile(r"suspended at step (?P<position>\d+): (?P<what>.*)\Z", re.DOTALL)
_SLEEP = re.compile(r"sleeping until (?P<at>\S+)\Z")
_SIGNAL = re.compile(r"waiting for signal (?P<name>'.*'|\".*\")(?: until (?P<at>\S+))?\Z")
_CHILDREN = re.compile(r"waiting for children \[(?P<ids>[\d, ]*)\] \(\d+ ended\)\Z")
_FIRST = re.compile(r"waiting for the first of children \[(?P<ids>[\d, ]*)\]\Z")


def sleeping(position: int, wake: datetime) -> str:
    return f"{PREFIX}{position}: sleeping until {wake.isoformat()}"


def signal(position: int, name: str, deadline: datetime | None) -> str:
    until = "" if deadline is None else f" until {deadline.isoformat()}"
    return f"{PREFIX}{position}: waiting for signal {name!r}{until}"


def children(position: int, ids: Sequence[int], ended: int) -> str:
    return f"{PREFIX}{position}: waiting for children {list(ids)} ({ended} ended)"


def first_child(position: int, ids: Sequence[int]) -> str:
    return f"{PREFIX}{position}: waiting for the first of children {list(ids)}"


@dataclass(frozen=True)
class Wait:
    """What one suspended workflow waits for, read from its suspension's line."""

    #: "sleep", "signal", "children" or "first".
    kind: str
    #: The wake time of a sleep, a signal's timeout (None: none).
    until: datetime | None = None
    #: The signal's name.
    name: str | None = None
    #: The awaited children's ids.
    ids: tuple[int, ...] = ()

    def describe(self, ended: int, when: Callable[[datetime], str]) -> str:
        """In words, ``ended`` of its children ended, times shown by ``when``."""
        if self.kind == "sleep":
            assert self.until is not None
            return f"sleep until {when(self.until)}"
        if self.kind == "signal":
            timeout = "" if self.until is None else f" (timeout {when(self.until)})"
            return f"signal {self.name}{timeout}"
        count = len(set(self.ids))
        if self.kind == "children":
            return f"children {ended} of {count}"
        return f"first of {count} children ({ended} ended)"


def parse(detail: str | None) -> Wait | None:
    """The wait a suspension's history line names, or None for any other line."""
    line = _LINE.match(detail or "")
    if line is None:
        return None
    what = line["what"]
    if found := _SLEEP.match(what):
        return Wait("sleep", until=_time(found["at"]))
    if found := _SIGNAL.match(what):
        return Wait("signal", until=_time(found["at"]), name=ast.literal_eval(found["name"]))
    for kind, pattern in (("children", _CHILDREN), ("first", _FIRST)):
        if found := pattern.match(what):
            ids = tuple(int(i) for i in found["ids"].split(",") if i.strip())
            return Wait(kind, ids=ids)
    return None


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def waiting_for(
    store: Store, tasks: Iterable[TaskRecord], now: datetime, when: Callable[[datetime], str]
) -> dict[int, str]:
    """For each of ``tasks`` suspended by a workflow and not yet due (a due one waits
    for a worker, as its due time says), what it waits for, in words. Two reads."""
    candidates = [t.id for t in tasks if t.state is TaskState.PENDING and t.due_at > now]
    if not candidates:
        return {}
    waits = {
        task_id: wait
        for task_id, event in store.latest_events(candidates).items()
        if event.state is TaskState.PENDING and (wait := parse(event.detail)) is not None
    }
    awaited = {i for w in waits.values() for i in w.ids}
    ended = {i for i, f in store.finished(awaited).items() if f is not None} if awaited else set()
    return {
        task_id: wait.describe(len(set(wait.ids) & ended), when) for task_id, wait in waits.items()
    }
