"""Save a PNG of each dashboard page under docs/images/ (docs/dashboard.md shows them).

A demo database is made in a temporary directory: three queues (one paused and
limited), tasks that succeeded over the last hour, failures and retries, a task
whose lease expired and was reclaimed, waiting and running tasks, two schedules
and two workers. The dashboard is served by uvicorn in a thread and each page is
opened in Debian's headless Chromium through Playwright.

``python scripts/screenshots.py [--out docs/images] [--chromium /usr/bin/chromium]``
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from durablesched import ErrorInfo, ManualClock, Scheduler, SQLiteStore, WorkerInfo
from durablesched.dashboard import create_app

ROOT = Path(__file__).resolve().parents[1]
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LEASE = timedelta(seconds=30)
TRACEBACK = """Traceback (most recent call last):
  File "app/tasks.py", line 42, in send_invoice
    response = client.post(url, json=invoice)
  File "app/http.py", line 17, in post
    raise TimeoutError(f"{url} did not answer in 10s")
TimeoutError: https://billing.example.com/api did not answer in 10s
"""


def demo(store: SQLiteStore, now: datetime) -> int:
    """Fill ``store`` as an hour of a small shop's queue; the id of the task to show."""
    rng = random.Random(7)
    clock = ManualClock(now - timedelta(minutes=59))
    scheduler = Scheduler(store, clock=clock)
    scheduler.set_queue("mail", concurrency=4)
    scheduler.set_queue("reports", rate="10/m")
    error = ErrorInfo("TimeoutError", "https://billing.example.com/api did not answer", TRACEBACK)
    for minute in range(59):
        start = now - timedelta(minutes=59 - minute)
        clock.advance(max((start - clock.now()).total_seconds(), 0))
        for _ in range(rng.randint(20, 60)):
            name, queue = rng.choice(
                [("send_email", "mail"), ("resize_image", "default"), ("send_invoice", "default")]
            )
            scheduler.submit(name, {"id": rng.randint(1000, 9999)}, queue=queue, max_attempts=3)
        claims = store.claim(f"worker-{minute % 2 + 1}", 100, clock.now(), LEASE)
        clock.advance(rng.uniform(0.5, 3))
        for claim in claims:
            if rng.random() < 0.04:
                store.fail(claim, error, clock.now() + timedelta(seconds=30), clock.now())
            else:
                store.complete(claim, {"ok": True}, clock.now())
    # Invoices that failed for good: the filtered list shows them with their errors.
    refused = ErrorInfo("billing.CardDeclined", "card ending 4242 was declined", TRACEBACK)
    for n in range(6):
        scheduler.submit("send_invoice", {"invoice": 4700 + n}, max_attempts=1)
        (claim,) = store.claim("worker-1", 1, clock.now(), LEASE, names=["send_invoice"])
        clock.advance(0.3)
        store.fail(claim, error if n % 2 else refused, None, clock.now())
    # The task the page shows: failed, reclaimed after a lost lease, then succeeded.
    shown = scheduler.submit(
        "send_invoice", {"invoice": 4711, "to": "ada@example.com"}, priority=100
    )
    (first,) = store.claim("worker-1", 1, clock.now(), LEASE, names=["send_invoice"])
    clock.advance(2.4)
    store.fail(first, error, clock.now(), clock.now())
    store.claim("worker-2", 1, clock.now(), LEASE, names=["send_invoice"])
    clock.advance(LEASE + timedelta(seconds=1))
    store.reclaim_expired(clock.now(), lambda name, attempt: timedelta(0))
    (third,) = store.claim("worker-1", 1, clock.now(), LEASE, names=["send_invoice"])
    clock.advance(0.8)
    store.complete(third, {"sent": True, "message_id": "<4711@example.com>"}, clock.now())
    for n in range(40):
        scheduler.submit("build_report", {"month": n % 12 + 1}, queue="reports")
    store.claim("worker-2", 3, clock.now(), LEASE, names=["build_report"])
    scheduler.pause_queue("reports")
    scheduler.add_schedule("build_report", name="nightly-report", cron="0 3 * * *")
    scheduler.add_schedule("send_email", name="digest", every=3600, args={"kind": "digest"})
    scheduler.run_schedule_now("digest")
    for n, queues in ((1, None), (2, {"mail": 4, "reports": 2})):
        slots = 8 if queues is None else sum(queues.values())
        store.register_worker(
            WorkerInfo(
                f"worker-{n}",
                "app-1",
                4100 + n,
                queues,
                slots,
                "0.1.0",
                now - timedelta(hours=3),
                now,
                LEASE,
            ),
            now,
        )
    return shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "demo.db")
        now = datetime.now(UTC)
        shown = demo(store, now)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        config = uvicorn.Config(create_app(store), log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        pages = {
            "overview": "/",
            "tasks": "/tasks",
            "tasks-filtered": "/tasks?name=send_invoice&state=FAILED",
            "task": f"/tasks/{shown}",
            "queues": "/queues",
            "schedules": "/schedules",
            "workers": "/workers",
        }
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                for name, path in pages.items():
                    page.goto(url + path)
                    if name == "task":
                        page.locator("tr.attempt details").first.locator("summary").click()
                    target = args.out / f"dashboard-{name}.png"
                    page.screenshot(path=str(target), full_page=not name.startswith("tasks"))
                    print(f"saved {target.relative_to(ROOT)}")
                browser.close()
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
