"""``readable``: a sleep on file descriptors that takes any descriptor number and any
timeout (``select`` stops at descriptor 1,024; ``poll`` takes a C int of milliseconds),
and the process environment's wait on its child's pipe, made with it. Pipes written
before the wait: nothing sleeps."""

from __future__ import annotations

import math
import os
import resource

import pytest

from durablesched import MemoryStore, Scheduler, TaskRegistry
from durablesched.readable import readable
from durablesched.testing import run_due

from ..conftest import WAIT


@pytest.mark.parametrize("timeout", [0.0, 0.0004, 5.0, 1e12, math.inf])
def test_a_readable_descriptor_ends_the_wait_whatever_the_timeout(timeout: float) -> None:
    quiet_r, quiet_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        os.write(ready_w, b"x")
        assert readable([quiet_r, ready_r], timeout) == {ready_r}
    finally:
        for fd in (quiet_r, quiet_w, ready_r, ready_w):
            os.close(fd)


def test_nothing_readable_is_an_empty_set_after_the_timeout() -> None:
    quiet_r, quiet_w = os.pipe()
    try:
        assert readable([quiet_r], 0) == set()
    finally:
        os.close(quiet_r)
        os.close(quiet_w)


def test_a_descriptor_numbered_past_1024_is_waited_on() -> None:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = 1500
    if limits[0] <= high:
        assert limits[1] == resource.RLIM_INFINITY or limits[1] > high, limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (high + 1, limits[1]))
    read, write = os.pipe()
    try:
        os.dup2(read, high)
        assert readable([high], 0) == set()
        os.write(write, b"x")
        assert readable([high], 0) == {high}
    finally:
        os.close(high)
        os.close(read)
        os.close(write)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


registry = TaskRegistry()


@registry.task("child.add", environment="process")
def child_add(a: int) -> int:
    return a + 1


def test_a_process_task_runs_while_descriptors_past_1023_are_open() -> None:
    """The worker waits on the pipe from a task's child process: opened past descriptor
    1,023 (a server holding many connections), ``select`` refused it and the attempt
    failed."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limits[0] <= 2048:
        assert limits[1] == resource.RLIM_INFINITY or limits[1] > 2048, limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (2049, limits[1]))
    held = [os.open(os.devnull, os.O_RDONLY)]
    try:
        while held[-1] < 1100:  # every lower descriptor taken: the pipe comes past them
            held.append(os.dup(held[0]))
        scheduler = Scheduler(MemoryStore(), registry=registry)
        handle = scheduler.enqueue(child_add, 1)
        assert run_due(scheduler) == 1
        assert handle.result(timeout=WAIT) == 2
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
