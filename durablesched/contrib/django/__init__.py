"""durablesched as a Django Tasks backend (Django 6's ``django.tasks``): docs/django.md.

In settings::

    INSTALLED_APPS = [..., "durablesched.contrib.django"]
    TASKS = {"default": {"BACKEND": "durablesched.contrib.django.DurableSchedBackend"}}

``manage.py migrate`` creates the queue's tables in the Django database named
by ``OPTIONS["database"]``; ``manage.py durablesched_worker`` runs the tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import django  # noqa: F401 - only to say which extra is missing
except ImportError:  # pragma: no cover - the extra's absence
    raise ImportError(
        "durablesched.contrib.django needs Django 6: pip install 'durablesched[django]'"
    ) from None

if TYPE_CHECKING:
    from durablesched.contrib.django.backend import DurableSchedBackend as DurableSchedBackend
    from durablesched.contrib.django.backend import cancel as cancel
    from durablesched.contrib.django.running import durable as durable

__all__ = ["DurableSchedBackend", "cancel", "durable"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the app package (INSTALLED_APPS) must not load django.tasks
    # before the app registry is ready.
    if name == "durable":
        from durablesched.contrib.django import running  # noqa: PLC0415

        return running.durable
    if name in __all__:
        from durablesched.contrib.django import backend  # noqa: PLC0415

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
