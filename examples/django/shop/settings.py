"""A shop that sends a receipt in the background, with durablesched as its task backend."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"  # noqa: S105 - an example project's
DEBUG = True  # Django logs each task's start and finish to the console in DEBUG
USE_TZ = True
# The worker logs in this zone, as the durablesched CLI does in UTC: set it, or Django's
# default (America/Chicago) puts its lines six hours away from everything else.
TIME_ZONE = "UTC"
INSTALLED_APPS = ["durablesched.contrib.django", "orders"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "shop.sqlite3")),
        # Transactions that read before they enqueue take the write lock up front.
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
TASKS = {
    "default": {
        "BACKEND": "durablesched.contrib.django.DurableSchedBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"database": "default", "retry": {"max_attempts": 3, "initial": 1}},
    }
}
