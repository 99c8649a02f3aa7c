"""Settings of the Django tests: a SQLite database and, when reachable, a PostgreSQL one,
each with a durablesched task backend (``default`` and ``pg``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SECRET_KEY = "durablesched-tests"  # noqa: S105 - a test project's
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "durablesched.contrib.django",
    "tests_django.testapp",
]
#: The admin, for its page of tasks (tests_django/test_admin.py).
ROOT_URLCONF = "tests_django.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

#: The test databases' names: a worker started by a test is told them by these variables.
SQLITE_PATH = os.environ.get(
    "DURABLESCHED_DJANGO_SQLITE",
    str(Path(tempfile.gettempdir()) / f"durablesched-django-{os.getpid()}.db"),
)
PG_NAME = os.environ.get("DURABLESCHED_DJANGO_PG", f"durablesched_django_{os.getpid()}")
PG_HOST = os.environ.get("DURABLESCHED_DJANGO_PG_HOST", "127.0.0.1")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": SQLITE_PATH,
        "TEST": {"NAME": SQLITE_PATH},
    },
}
RETRY = {"max_attempts": 2, "initial": 0, "jitter": 0}
#: Tasks with options of their own (OPTIONS["tasks"]).
TASK_OPTIONS = {
    "tests_django.testapp.tasks.stubborn": {"retry": {"max_attempts": 3, "initial": 0}},
    "tests_django.testapp.tasks.slow": {"timeout": 0.05},
}
TASKS = {
    "default": {
        "BACKEND": "durablesched.contrib.django.DurableSchedBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"database": "default", "retry": RETRY, "tasks": TASK_OPTIONS},
    },
}


def _postgres_reachable() -> bool:
    try:
        import psycopg  # noqa: PLC0415
    except ImportError:
        return False
    try:
        psycopg.connect(host=PG_HOST, user="postgres", dbname="test", connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


POSTGRES = _postgres_reachable()
if POSTGRES:
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": PG_NAME,
        "USER": "postgres",
        "HOST": PG_HOST,
        "PORT": "5432",
        "TEST": {"NAME": PG_NAME},
    }
    TASKS["pg"] = {
        "BACKEND": "durablesched.contrib.django.DurableSchedBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"database": "pg", "retry": RETRY, "tasks": TASK_OPTIONS},
    }
