"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright.

The server is uvicorn in a thread on a port of its own; each test waits on what
the page shows (Playwright's ``expect``, bounded), never on a sleep. Skipped
where the browser is missing, except in CI, where ``scripts/test`` installs it
and a missing one fails.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from durablesched import ErrorInfo, Scheduler, SQLiteStore, TaskState
from durablesched.dashboard import create_app
from durablesched.store.sql.store import SQLStore
from durablesched.workflows import waits
from durablesched.workflows.steps import FOREVER

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("DURABLESCHED_CHROMIUM", "/usr/bin/chromium")
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
#: Every wait on the page, in milliseconds: a live part refreshes every 2 s.
WAIT_MS = 10_000
TOKEN = "browser-token"  # noqa: S105 - the test's own token
LEASE = timedelta(seconds=60)


@contextmanager
def serving(app: object) -> Iterator[str]:
    """``app`` served by uvicorn in a thread; yields its base URL. The socket listens
    before the thread starts, so the first request waits in its backlog, not on us."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(app, log_level="warning", access_log=False)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        message = f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLStore]:
    s = SQLiteStore(tmp_path / "browser.db")
    yield s
    s.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    p = context.new_page()
    problems: list[str] = []
    # A script or style the CSP refused, or any script error, fails the test (a 401 the
    # login form answers a wrong token with is the browser's only expected error line).
    p.on(
        "console",
        lambda m: (
            problems.append(m.text) if m.type == "error" and "status of 401" not in m.text else None
        ),
    )
    p.on("pageerror", lambda e: problems.append(str(e)))
    p.set_default_timeout(WAIT_MS)
    yield p
    context.close()
    assert problems == []


def failed_twice(store: SQLStore, scheduler: Scheduler) -> int:
    task_id = scheduler.submit("flaky", {"n": 3}, max_attempts=2)
    for attempt in (1, 2):
        now = scheduler.clock.now()
        (claim,) = store.claim(f"worker-{attempt}", 1, now, LEASE, names=["flaky"])
        error = ErrorInfo("builtins.ValueError", f"bad try {attempt}", "Traceback: boom")
        store.fail(claim, error, now if attempt == 1 else None, scheduler.clock.now())
    return task_id


def test_the_overview_shows_queues_chart_and_workers(store: SQLStore, page: Page) -> None:
    scheduler = Scheduler(store)
    scheduler.submit("send", {}, queue="mail")
    failed_twice(store, scheduler)
    with serving(create_app(store)) as url:
        page.goto(url)
        expect(page).to_have_title("Overview · durablesched")
        expect(page.locator("table").get_by_role("link", name="mail")).to_be_visible()
        expect(page.locator("svg.chart")).to_be_visible()
        expect(page.locator("#failed-hour")).to_have_text("2")


def test_filtering_the_task_list(store: SQLStore, page: Page) -> None:
    scheduler = Scheduler(store)
    for n in range(3):
        scheduler.submit("send", {"n": n}, queue="mail")
    scheduler.submit("<script>report</script>", {})
    with serving(create_app(store)) as url:
        page.goto(f"{url}/tasks")
        expect(page.locator("table.tasks tbody tr")).to_have_count(4)
        expect(page.get_by_text("<script>report</script>")).to_be_visible()  # shown as text
        form = page.locator("#task-filters")
        form.get_by_label("Name").fill("send")
        form.get_by_label("State").select_option("PENDING")
        form.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(
            f"{url}/tasks?state=PENDING&queue=&name=send&key=&created_from=&created_until="
        )
        expect(page.locator("table.tasks tbody tr")).to_have_count(3)
        expect(page.locator("td.name").first).to_have_text("send")


def test_the_task_list_says_what_a_suspended_workflow_waits_for(
    store: SQLStore, page: Page
) -> None:
    scheduler = Scheduler(store)
    sleeper = scheduler.submit("sleeper")
    waiter = scheduler.submit("approval")
    scheduler.submit("send", delay=timedelta(days=1))
    now = datetime.now(UTC)
    claims = {c.task_id: c for c in store.claim("w", 2, now, LEASE, ["sleeper", "approval"])}
    wake = now + timedelta(days=3)
    store.suspend(claims[sleeper], wake, now, detail=waits.sleeping(0, wake))
    detail = waits.signal(1, "approved", None)
    store.suspend(claims[waiter], FOREVER, now, detail=detail, signal="approved")
    with serving(create_app(store)) as url:
        page.goto(f"{url}/tasks")
        rows = page.locator("table.tasks tbody tr")
        expect(page.get_by_role("columnheader", name="waits for")).to_be_visible()
        expect(rows.filter(has_text="sleeper").locator("td.waits")).to_have_text(
            f"sleep until {wake:%Y-%m-%d %H:%M:%S} UTC"
        )
        expect(rows.filter(has_text="approval").locator("td.waits")).to_have_text("signal approved")
        expect(rows.filter(has_text="send").locator("td.waits")).to_have_text("")


def test_a_task_with_retries_shows_each_attempt(store: SQLStore, page: Page) -> None:
    scheduler = Scheduler(store)
    task_id = failed_twice(store, scheduler)
    with serving(create_app(store)) as url:
        page.goto(f"{url}/tasks/{task_id}")
        attempts = page.locator("tr.attempt")
        expect(attempts).to_have_count(2)
        expect(attempts.nth(0)).to_contain_text("worker-1")
        expect(attempts.nth(1)).to_contain_text("worker-2")
        attempts.nth(1).get_by_text("builtins.ValueError: bad try 2").click()
        expect(attempts.nth(1).locator("pre.traceback")).to_have_text("Traceback: boom")
        expect(page.locator("ol.timeline li.claim")).to_have_count(2)


def test_cancelling_a_pending_task_changes_its_state_live(store: SQLStore, page: Page) -> None:
    scheduler = Scheduler(store)
    clicked = scheduler.submit("send", {})
    elsewhere = scheduler.submit("send", {})
    with serving(create_app(store)) as url:
        page.goto(f"{url}/tasks/{clicked}")
        page.evaluate("window.loadedOnce = true")  # gone if the page reloads
        expect(page.locator("#task-state")).to_have_text("PENDING")
        page.get_by_role("button", name="Cancel").click()
        expect(page.locator("#task-state")).to_have_text("CANCELLED")
        expect(page.locator("#flash")).to_contain_text("cancelled: it had not started")
        assert page.evaluate("window.loadedOnce") is True
        # Cancelled by someone else (the CLI, another tab): the open page sees it by itself.
        page.goto(f"{url}/tasks/{elsewhere}")
        page.evaluate("window.loadedOnce = true")
        expect(page.locator("#task-state")).to_have_text("PENDING")
        scheduler.cancel(elsewhere)
        expect(page.locator("#task-state")).to_have_text("CANCELLED")
        assert page.evaluate("window.loadedOnce") is True
    task = store.get(clicked)
    assert task is not None and task.state is TaskState.CANCELLED


def test_a_bulk_action_asks_first(store: SQLStore, page: Page) -> None:
    scheduler = Scheduler(store)
    ids = [scheduler.submit("send", {"n": n}) for n in range(3)]
    questions: list[str] = []

    def answer(dialog: object) -> None:
        questions.append(dialog.message)  # type: ignore[attr-defined]
        if len(questions) == 1:
            dialog.dismiss()  # type: ignore[attr-defined]
        else:
            dialog.accept()  # type: ignore[attr-defined]

    page.on("dialog", answer)
    with serving(create_app(store)) as url:
        page.goto(f"{url}/tasks")
        page.get_by_label(f"task {ids[0]}").check()
        page.get_by_label(f"task {ids[1]}").check()
        bulk = page.locator("#bulk p.bulk")
        bulk.get_by_role("button", name="Cancel").click()  # dismissed: nothing happens
        bulk.get_by_role("button", name="Cancel").click()
        expect(page.locator("#flash")).to_have_text("cancel: 2 of 2 task(s) done")
    assert questions == ["Cancel the 2 ticked task(s)?"] * 2
    assert [store.get(i).state for i in ids] == [  # type: ignore[union-attr]
        TaskState.CANCELLED,
        TaskState.CANCELLED,
        TaskState.PENDING,
    ]


def test_logging_in_with_the_token(store: SQLStore, page: Page) -> None:
    Scheduler(store).submit("send", {})
    with serving(create_app(store, token=TOKEN)) as url:
        page.goto(f"{url}/tasks")
        expect(page).to_have_url(f"{url}/login?next=%2Ftasks")
        page.get_by_label("Token").fill("wrong")
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("alert")).to_have_text("That token is not the dashboard's.")
        page.get_by_label("Token").fill(TOKEN)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(f"{url}/tasks")
        expect(page.locator("table.tasks tbody tr")).to_have_count(1)
        page.get_by_role("button", name="Log out").click()
        expect(page).to_have_url(f"{url}/login")
