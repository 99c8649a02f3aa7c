"""Settings of the benchmark project: ``BENCH_DB`` (a SQLite file) and ``BENCH_BACKEND``
("durablesched" or "db", django-tasks-db's). Both on SQLite in WAL mode with
``synchronous=FULL``, transactions begun IMMEDIATE."""

from __future__ import annotations

import os

SECRET_KEY = "durablesched-bench"  # noqa: S105 - a benchmark's
USE_TZ = True
BACKEND = os.environ.get("BENCH_BACKEND", "durablesched")
INSTALLED_APPS = [
    "durablesched.contrib.django" if BACKEND == "durablesched" else "django_tasks_db",
    "benchmarks.django_project.benchapp",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["BENCH_DB"],
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
        },
    }
}
TASKS = {
    "default": {
        "BACKEND": "durablesched.contrib.django.DurableSchedBackend"
        if BACKEND == "durablesched"
        else "django_tasks_db.DatabaseBackend",
    }
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {
        "durablesched": {"handlers": ["null"], "level": "WARNING", "propagate": False},
        "django_tasks_db": {"handlers": ["null"], "level": "WARNING", "propagate": False},
        "django_tasks": {"handlers": ["null"], "level": "WARNING", "propagate": False},
        # Django's own line per task start and finish (its signal receivers), for both
        # backends alike: plain durablesched's worker runs at --log-level warning too.
        "django.tasks": {"handlers": ["null"], "level": "WARNING", "propagate": False},
    },
}
