"""Issue 27's dashboard guards, each with the test that fails without it: the token
compared whole (not a prefix, not a longer string), every field a page shows escaped,
and logout refused without the form's CSRF token (a cross-site logout)."""

from __future__ import annotations

from datetime import timedelta

from starlette.testclient import TestClient

from durablesched import ErrorInfo
from durablesched.dashboard import create_app
from durablesched.records import WorkerInfo

from ..conftest import T0
from .conftest import Dash, form_csrf

TOKEN = "s3cret-token-for-guards"  # noqa: S105 - the tests' own token
LEASE = timedelta(seconds=30)


def test_the_token_is_compared_whole(dash: Dash) -> None:
    for given in (TOKEN[:-1], TOKEN[:1], TOKEN + "x", TOKEN.upper(), ""):
        # A client each: wrong tokens are throttled per client (a guard of its own).
        with TestClient(create_app(dash.store, token=TOKEN, clock=dash.clock)) as client:
            bearer = {"Authorization": f"Bearer {given}"}
            assert client.get("/tasks", headers=bearer).status_code == 401, given
            csrf = form_csrf(client.get("/login").text)
            login = client.post("/login", data={"csrf": csrf, "token": given, "next": "/"})
            assert login.status_code == 401, given
            assert client.get("/tasks").status_code == 401, given
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert client.get("/tasks", headers=bearer).status_code == 200


def mark(field: str) -> str:
    """Markup that must reach the page as text: one element per field, so a field
    shown raw names itself."""
    return f"<x-{field}>"


def test_every_field_a_page_shows_is_escaped(dash: Dash) -> None:
    done = dash.scheduler.submit(mark("name"), {"a": mark("args")}, key=mark("key"))
    (claim,) = dash.store.claim(mark("owner"), 1, dash.clock.now(), LEASE)
    dash.store.complete(claim, {"r": mark("result")}, dash.clock.now())
    failed = dash.scheduler.submit("failing", {}, max_attempts=1)
    (claim,) = dash.store.claim("w1", 1, dash.clock.now(), LEASE)
    error = ErrorInfo(mark("type"), mark("message"), "Traceback:\n" + mark("traceback"))
    dash.store.fail(claim, error, None, dash.clock.now())
    running = dash.scheduler.submit("long", {})
    dash.store.claim(mark("lease_owner"), 1, dash.clock.now(), LEASE)
    dash.store.register_worker(
        WorkerInfo(mark("worker"), mark("host"), 42, None, 2, mark("version"), T0, T0, LEASE),
        T0,
    )
    dash.scheduler.add_schedule(mark("task"), name=mark("schedule"), cron="0 3 * * *")
    pages = {
        path: dash.client.get(path).text
        for path in (
            "/",
            "/tasks",
            f"/tasks/{done}",
            f"/tasks/{failed}",
            f"/tasks/{running}",
            "/workers",
            "/schedules",
        )
    }
    fields = ["name", "args", "key", "owner", "result", "type", "message", "traceback"]
    fields += ["lease_owner", "worker", "host", "version", "task", "schedule"]
    for field in fields:
        raw = mark(field)
        escaped = raw.replace("<", "&lt;").replace(">", "&gt;")
        assert any(escaped in page for page in pages.values()), f"{field} is not shown"
        for path, page in pages.items():
            assert raw not in page, f"{field} shown raw on {path}"


def test_logout_without_the_forms_csrf_token_is_refused(dash: Dash) -> None:
    with TestClient(create_app(dash.store, token=TOKEN, clock=dash.clock)) as client:
        csrf = form_csrf(client.get("/login").text)
        client.post("/login", data={"csrf": csrf, "token": TOKEN, "next": "/"})
        assert client.get("/tasks").status_code == 200
        for form in ({}, {"csrf": "x" * 43}):
            answer = client.post("/logout", data=form, follow_redirects=False)
            assert answer.status_code == 403, form
            assert "set-cookie" not in answer.headers, form
            assert client.get("/tasks").status_code == 200, form  # still logged in
        csrf = form_csrf(client.get("/tasks").text)
        answer = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
        assert answer.status_code == 303
        assert client.get("/tasks").status_code == 401
