"""The dashboard's defences over SQLite and PostgreSQL: the token on every request, the
login cookie, CSRF on every action, read-only mode, headers, and mounting."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from durablesched import ConfigurationError, TaskState
from durablesched.dashboard import create_app
from durablesched.dashboard.security import CSP

from .conftest import LOCAL, Dash, form_csrf

TOKEN = "s3cret-token"  # noqa: S105 - the tests' own token


def test_every_response_carries_the_security_headers(dash: Dash) -> None:
    for path in ("/", "/tasks", "/tasks/424242", "/tasks?state=x", "/static/dashboard.css"):
        headers = dash.client.get(path).headers
        assert headers["content-security-policy"] == CSP, path
        assert "'unsafe-inline'" not in CSP and "default-src 'self'" in CSP
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"


def test_pages_hold_no_inline_script(dash: Dash) -> None:
    dash.scheduler.submit("job", {})
    page = dash.client.get("/tasks/1").text
    assert page.count("<script") == 1 and '<script src="/static/dashboard.js" defer>' in page
    assert " on" + "click=" not in page and "style=" not in page


def test_an_action_without_the_csrf_token_changes_nothing(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    dash.client.get("/")  # the cookie is set
    for data in ({}, {"csrf": "forged"}, {"csrf": ""}):
        answer = dash.client.post(f"/tasks/{task_id}/cancel", data=data)
        assert answer.status_code == 403
        assert "CSRF" in answer.text
    # The right token from another site (its Origin) is refused too.
    answer = dash.client.post(
        f"/tasks/{task_id}/cancel",
        data={"csrf": dash.csrf()},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403
    # A token without its cookie (another browser's) is refused.
    token = dash.csrf()
    dash.client.cookies.clear()
    assert dash.client.post(f"/tasks/{task_id}/cancel", data={"csrf": token}).status_code == 403
    task = dash.store.get(task_id)
    assert task is not None and task.state is TaskState.PENDING
    assert dash.act(f"/tasks/{task_id}/cancel").status_code == 200  # with both: done


def test_limits_per_key_without_the_csrf_token_change_nothing(dash: Dash) -> None:
    dash.scheduler.submit("job", {}, queue="mail")
    dash.client.get("/")  # the cookie is set
    fields: dict[str, str | list[str]] = {
        "concurrency": "",
        "rate": "",
        "concurrency_per_key": "1",
        "rate_per_key": "5/s",
    }
    for csrf in ({}, {"csrf": "forged"}, {"csrf": ""}):
        answer = dash.client.post("/queues/mail/limits", data={**csrf, **fields})
        assert answer.status_code == 403
    answer = dash.client.post(
        "/queues/mail/limits",
        data={"csrf": dash.csrf(), **fields},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403
    mail = {q.name: q for q in dash.scheduler.queues()}["mail"]
    assert (mail.concurrency_per_key, mail.rate_per_key) == (None, None)
    assert dash.act("/queues/mail/limits", fields).status_code == 200  # with both: done


def test_the_csrf_cookie_is_http_only_and_strict(dash: Dash) -> None:
    cookie = dash.client.get("/").headers["set-cookie"]
    assert cookie.startswith("durablesched_csrf=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie


def test_read_only_hides_and_refuses_every_action(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {}, queue="mail")
    dash.scheduler.add_schedule("report", name="nightly", cron="0 3 * * *")
    app = create_app(dash.store, read_only=True, clock=dash.clock)
    with TestClient(app, base_url=LOCAL) as client:
        for path in ("/", "/tasks", f"/tasks/{task_id}", "/queues", "/schedules"):
            page = client.get(path).text
            assert 'method="post"' not in page, path
            assert "read-only" in page
        csrf = client.cookies["durablesched_csrf"]
        for path, data in (
            (f"/tasks/{task_id}/cancel", {}),
            ("/tasks/bulk", {"action": "cancel", "ids": str(task_id)}),
            ("/queues/mail/pause", {}),
            ("/queues/mail/limits", {"concurrency": "1"}),
            ("/schedules/run", {"name": "nightly"}),
            ("/schedules/pause", {"name": "nightly"}),
        ):
            answer = client.post(path, data={"csrf": csrf, **data})
            assert answer.status_code == 403, path
            assert "read-only" in answer.text
    assert dash.store.get(task_id).state is TaskState.PENDING  # type: ignore[union-attr]
    assert not any(q.paused for q in dash.scheduler.queues())
    assert dash.store.list_tasks(name="report") == []


def test_with_a_token_every_request_needs_it(dash: Dash) -> None:
    with TestClient(create_app(dash.store, token=TOKEN, clock=dash.clock)) as client:
        for path in ("/", "/tasks", "/tasks/1", "/queues", "/workers", "/metrics", "/?fragment=1"):
            assert client.get(path).status_code == 401, path
        assert client.post("/tasks/1/cancel", data={"csrf": "x"}).status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
        assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert (
            client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        )
        # A browser asking for a page is sent to the login form, which needs no token.
        answer = client.get(
            "/tasks?state=FAILED", headers={"Accept": "text/html"}, follow_redirects=False
        )
        assert answer.status_code == 303
        assert answer.headers["location"] == "/login?next=%2Ftasks%3Fstate%3DFAILED"
        assert client.get("/login").status_code == 200
        assert client.get("/static/dashboard.css").status_code == 200


def test_logging_in_sets_a_strict_http_only_cookie_that_never_holds_the_token(dash: Dash) -> None:
    with TestClient(create_app(dash.store, token=TOKEN, clock=dash.clock)) as client:
        csrf = form_csrf(client.get("/login").text)
        wrong = client.post("/login", data={"csrf": csrf, "token": "guess", "next": "/tasks"})
        assert wrong.status_code == 401 and "not the dashboard" in wrong.text
        no_csrf = client.post("/login", data={"token": TOKEN, "next": "/tasks"})
        assert no_csrf.status_code == 403
        answer = client.post(
            "/login",
            data={"csrf": csrf, "token": TOKEN, "next": "/tasks"},
            follow_redirects=False,
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/tasks"
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith("durablesched_session=")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
        assert client.get("/tasks").status_code == 200  # the cookie is enough
        # Logging out ends it, on the server: the cookie replayed is refused.
        session = client.cookies["durablesched_session"]
        client.post("/logout", data={"csrf": form_csrf(client.get("/tasks").text)})
        assert client.get("/tasks").status_code == 401
        client.cookies.delete("durablesched_session")
        client.cookies.set("durablesched_session", session)
        assert client.get("/tasks").status_code == 401


def test_login_never_sends_anyone_to_another_site(dash: Dash) -> None:
    with TestClient(create_app(dash.store, token=TOKEN, clock=dash.clock)) as client:
        for target in ("//evil.example/x", "https://evil.example", "\\\\evil", "tasks"):
            client.cookies.delete("durablesched_session")
            csrf = form_csrf(client.get("/login").text)
            answer = client.post(
                "/login",
                data={"csrf": csrf, "token": TOKEN, "next": target},
                follow_redirects=False,
            )
            assert answer.headers["location"] == "/", target


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty"):
        create_app(None, token=" ")  # type: ignore[arg-type]  # noqa: S106 - refused


def test_mounted_under_a_path_links_and_cookies_stay_under_it(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    dashboard = create_app(dash.store, token=TOKEN, clock=dash.clock)
    host = Starlette(routes=[Mount("/ops", app=dashboard)])
    with TestClient(host) as client:
        login = client.get("/ops/tasks", headers={"Accept": "text/html"}, follow_redirects=False)
        assert login.headers["location"] == "/ops/login?next=%2Ftasks"
        assert "Path=/ops" in login.headers["set-cookie"]
        assert 'action="/ops/login"' in client.get("/ops/login").text
        csrf = form_csrf(client.get("/ops/login").text)
        answer = client.post("/ops/login", data={"csrf": csrf, "token": TOKEN, "next": "/tasks"})
        assert answer.url.path == "/ops/tasks"
        page = answer.text
        csrf = form_csrf(page)  # bound to the session now
        assert f'href="/ops/tasks/{task_id}"' in page and 'href="/ops/static/dashboard.css"' in page
        assert 'data-poll="/ops/tasks"' in page
        assert client.get("/ops/static/dashboard.js").status_code == 200
        cancelled = client.post(
            f"/ops/tasks/{task_id}/cancel", data={"csrf": csrf, "next": f"/tasks/{task_id}"}
        )
        assert cancelled.url.path == f"/ops/tasks/{task_id}"
        assert 'id="task-state">CANCELLED<' in cancelled.text
        assert client.get("/tasks").status_code == 404  # nothing outside the mount


def test_without_a_token_only_loopback_host_names_are_served(dash: Dash) -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends
    its own name as Host; without a token, that name gets a 400, never the queue."""
    task_id = dash.scheduler.submit("job", {})
    csrf = dash.csrf()
    for host in ("rebind.evil.example:8803", "rebind.evil.example", "localhost.evil", ""):
        answer = dash.client.get(f"/tasks/{task_id}", headers={"Host": host})
        assert answer.status_code == 400, host
        assert "host name" in answer.text and "job" not in answer.text
        assert answer.headers["content-security-policy"] == CSP
        posted = dash.client.post(
            f"/tasks/{task_id}/cancel",
            data={"csrf": csrf},
            headers={"Host": host, "Origin": f"http://{host}"},
        )
        assert posted.status_code == 400, host
    assert dash.store.get(task_id).state is TaskState.PENDING  # type: ignore[union-attr]
    for host in ("localhost:8787", "127.0.0.1:8787", "[::1]:8787", "LOCALHOST", "127.0.0.1"):
        assert dash.client.get("/tasks", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_are_the_names_a_proxy_is_asked_for(dash: Dash) -> None:
    app = create_app(dash.store, clock=dash.clock, allowed_hosts=["queue.internal"])
    with TestClient(app, base_url="http://queue.internal") as client:
        assert client.get("/tasks").status_code == 200
        assert client.get("/tasks", headers={"Host": "queue.internal:443"}).status_code == 200
        assert client.get("/tasks", headers={"Host": "localhost"}).status_code == 200
        assert client.get("/tasks", headers={"Host": "evil.example"}).status_code == 400
    # With a token, any name is served (the token is the defence) unless names are given.
    with TestClient(create_app(dash.store, token=TOKEN, clock=dash.clock)) as client:
        bearer = {"Authorization": f"Bearer {TOKEN}", "Host": "queue.example"}
        assert client.get("/tasks", headers=bearer).status_code == 200
    app = create_app(dash.store, token=TOKEN, clock=dash.clock, allowed_hosts=["queue.example"])
    with TestClient(app) as client:
        bearer = {"Authorization": f"Bearer {TOKEN}", "Host": "evil.example"}
        assert client.get("/tasks", headers=bearer).status_code == 400
    with pytest.raises(ConfigurationError, match="list of host names"):
        create_app(dash.store, allowed_hosts="queue.internal")
