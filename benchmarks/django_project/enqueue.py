"""Enqueue N no-op tasks through Django's API (``Task.enqueue()``, each its own commit) and
print how long that took, in seconds."""

from __future__ import annotations

import sys
import time

import django

django.setup()

from benchmarks.django_project.benchapp.tasks import noop  # noqa: E402 - after setup

count = int(sys.argv[1])
noop.enqueue()  # the first opens the store (durablesched) or warms the ORM: not timed
started = time.perf_counter()
for _ in range(count - 1):
    noop.enqueue()
print(time.perf_counter() - started)
