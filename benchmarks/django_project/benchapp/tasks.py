"""The benchmark's task: it does nothing, so the queue's own cost is what is measured."""

from __future__ import annotations

from django.tasks import task


@task()  # type: ignore[untyped-decorator]  # Django is untyped
def noop() -> None:
    return None
