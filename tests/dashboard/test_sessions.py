"""Logins and CSRF over SQLite and PostgreSQL (issue 28, item 3): a session per login
that the server expires and revokes at logout, wrong tokens throttled per client, CSRF
tokens bound to the browser and its session, no cross-site POST (Origin: null,
Sec-Fetch-Site)."""

from __future__ import annotations

from datetime import timedelta

from starlette.testclient import TestClient

from durablesched import TaskState
from durablesched.dashboard import create_app
from durablesched.dashboard.security import SESSION_SECONDS, Throttle

from .conftest import Dash, form_csrf

TOKEN = "s3cret-token-of-the-tests"  # noqa: S105 - the tests' own token


def client_for(dash: Dash, address: str = "198.51.100.7") -> TestClient:
    return TestClient(
        create_app(dash.store, token=TOKEN, clock=dash.clock), client=(address, 40000)
    )


def use_session(client: TestClient, value: str) -> None:
    """Send ``value`` as the session cookie (in place of any the jar holds)."""
    client.cookies.delete("durablesched_session")
    client.cookies.set("durablesched_session", value)


def log_in(client: TestClient, token: str = TOKEN) -> int:
    csrf = form_csrf(client.get("/login").text)
    answer = client.post("/login", data={"csrf": csrf, "token": token}, follow_redirects=False)
    return answer.status_code


def test_each_login_is_a_new_session_that_the_server_expires(dash: Dash) -> None:
    with client_for(dash) as client:
        assert log_in(client) == 303
        first = client.cookies["durablesched_session"]
        client.cookies.delete("durablesched_session")
        assert log_in(client) == 303
        second = client.cookies["durablesched_session"]
        assert first != second and TOKEN not in first
        expiry, nonce, mac = second.split(".")
        assert int(expiry) == int(dash.clock.now().timestamp()) + SESSION_SECONDS
        assert len(nonce) >= 24 and len(mac) == 64
        # A session cookie is its MAC's: a later expiry written into it is refused.
        forged = f"{int(expiry) + 3600}.{nonce}.{mac}"
        for value in (forged, f"{expiry}.{nonce}x.{mac}", "garbage", "1.2.3", first[:-1]):
            use_session(client, value)
            assert client.get("/tasks").status_code == 401, value
        use_session(client, second)
        assert client.get("/tasks").status_code == 200
        # The server ends it after 12 hours, whatever the browser keeps.
        dash.clock.advance(timedelta(seconds=SESSION_SECONDS - 1))
        assert client.get("/tasks").status_code == 200
        dash.clock.advance(timedelta(seconds=1))
        assert client.get("/tasks").status_code == 401


def test_logging_out_revokes_that_session_only(dash: Dash) -> None:
    with client_for(dash) as one, client_for(dash) as other:
        assert log_in(one) == 303 and log_in(other) == 303
        kept = one.cookies["durablesched_session"]
        one.post("/logout", data={"csrf": form_csrf(one.get("/tasks").text)})
        use_session(one, kept)
        assert one.get("/tasks").status_code == 401  # replayed after logout
        assert other.get("/tasks").status_code == 200  # another login lives on


def test_wrong_tokens_are_throttled_per_client(dash: Dash) -> None:
    with client_for(dash) as guesser, client_for(dash, "203.0.113.9") as someone:
        for _ in range(Throttle.LIMIT):
            assert log_in(guesser, "guess") == 401
        # Now even the right token is refused: a guess would otherwise still be answered.
        csrf = form_csrf(guesser.get("/login").text)
        answer = guesser.post("/login", data={"csrf": csrf, "token": TOKEN})
        assert answer.status_code == 429 and int(answer.headers["retry-after"]) == 300
        bearer = guesser.get("/tasks", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 429
        assert "too many wrong tokens" in bearer.text
        # Another client is not held up by it.
        assert log_in(someone) == 303
        dash.clock.advance(timedelta(seconds=Throttle.WINDOW))
        assert log_in(guesser) == 303


def test_wrong_bearer_tokens_count_too(dash: Dash) -> None:
    with client_for(dash) as client:
        for _ in range(Throttle.LIMIT):
            assert client.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401
        right = client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 429


def test_csrf_tokens_are_bound_to_the_browser_and_its_session(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    with client_for(dash) as client:
        assert log_in(client) == 303
        # A pair an attacker chose (cookie and field alike) is no token: double submit is gone.
        chosen = "a" * 43
        client.cookies.set("durablesched_csrf", chosen)
        answer = client.post(f"/tasks/{task_id}/cancel", data={"csrf": chosen})
        assert answer.status_code == 403
        old = form_csrf(client.get("/tasks").text)
        # A new login (a new session) makes the old session's tokens stale.
        client.cookies.delete("durablesched_session")
        assert log_in(client) == 303
        assert client.post(f"/tasks/{task_id}/cancel", data={"csrf": old}).status_code == 403
        task = dash.store.get(task_id)
        assert task is not None and task.state is TaskState.PENDING
        fresh = form_csrf(client.get("/tasks").text)
        assert fresh != old
        assert client.post(f"/tasks/{task_id}/cancel", data={"csrf": fresh}).status_code == 200


def test_cross_site_posts_are_refused_however_they_are_dressed(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    csrf = dash.csrf()
    for headers in (
        {"Origin": "null"},
        {"Origin": "https://evil.example"},
        {"Origin": "http://localhost.evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://localhost"},
    ):
        answer = dash.client.post(f"/tasks/{task_id}/cancel", data={"csrf": csrf}, headers=headers)
        assert answer.status_code == 403, headers
        assert "another site" in answer.text
    task = dash.store.get(task_id)
    assert task is not None and task.state is TaskState.PENDING
    same_origin = {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"}
    answer = dash.client.post(f"/tasks/{task_id}/cancel", data={"csrf": csrf}, headers=same_origin)
    assert answer.status_code == 200


def test_login_and_logout_refuse_cross_site_posts(dash: Dash) -> None:
    with client_for(dash) as client:
        csrf = form_csrf(client.get("/login").text)
        answer = client.post(
            "/login",
            data={"csrf": csrf, "token": TOKEN},
            headers={"Sec-Fetch-Site": "cross-site"},
        )
        assert answer.status_code == 403 and "durablesched_session" not in client.cookies
        assert log_in(client) == 303
        csrf = form_csrf(client.get("/tasks").text)
        answer = client.post("/logout", data={"csrf": csrf}, headers={"Origin": "null"})
        assert answer.status_code == 403
        assert client.get("/tasks").status_code == 200  # still logged in
