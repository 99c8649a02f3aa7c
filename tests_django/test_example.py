"""examples/django: the commands its README gives run, and the receipt task runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests_django.conftest import WAIT

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "django"


def _manage(*args: str, db: Path) -> str:
    env = {**os.environ, "SHOP_DB": str(db), "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_the_example_shop_sends_its_receipt(tmp_path: Path) -> None:
    db = tmp_path / "shop.sqlite3"
    assert "durablesched: queue tables in database 'default'" in _manage("migrate", db=db)
    assert "receipt task 1 enqueued" in _manage("place_order", "ada@example.com", db=db)
    out = _manage("durablesched_worker", "--burst", db=db)
    assert "success: task 1 (orders.tasks.send_receipt)" in out
    assert "Task id=1 path=orders.tasks.send_receipt state=SUCCESSFUL" in out
    assert "burst done: nothing remains" in out
    # The README's command-line look at the same tasks runs as written.
    (command,) = re.findall(r"`(durablesched [^`]+)`", (EXAMPLE / "README.md").read_text())
    words = command.replace("shop.sqlite3", str(db)).split()
    shown = subprocess.run(
        [sys.executable, "-m", "durablesched", *words[1:]],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "orders.tasks.send_receipt" in shown.stdout


def test_the_example_settings_name_a_time_zone() -> None:
    """Django's default zone is America/Chicago: the worker's log lines would be hours
    away from the durablesched CLI's UTC."""
    settings = (EXAMPLE / "shop" / "settings.py").read_text()
    assert 'TIME_ZONE = "UTC"' in settings
