"""The Django app: ``manage.py migrate`` creates and upgrades the queue's tables.

Through a ``post_migrate`` step rather than a Django migration: durablesched's
schema has its own history (Alembic, ``durablesched migrate``), and a step that
brings the database to the installed durablesched's head on every ``migrate``
needs no new Django migration per schema revision, cannot fall out of step
with the package, and runs when Django's test runner creates a test database.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class DurableSchedConfig(AppConfig):
    name = "durablesched.contrib.django"
    label = "durablesched"
    verbose_name = "durablesched"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(migrate_queue_tables, sender=self, dispatch_uid="durablesched")


def migrate_queue_tables(sender: Any, using: str, verbosity: int = 1, **kwargs: Any) -> None:
    """Bring the queue's tables in database ``using`` to head, if a durablesched backend
    keeps its tasks there."""
    from django.tasks import task_backends  # noqa: PLC0415 - once apps are ready

    from durablesched.contrib.django.backend import DurableSchedBackend  # noqa: PLC0415
    from durablesched.contrib.django.database import migrate_schema  # noqa: PLC0415

    databases = {
        backend.database
        for backend in task_backends.all()
        if isinstance(backend, DurableSchedBackend)
    }
    if using in databases:
        revision = migrate_schema(using)
        if verbosity >= 1:
            print(f"  durablesched: queue tables in database {using!r} at revision {revision}")
