"""The read-only admin page of tasks: a filtered list, and a task's history and errors."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from sqlalchemy import text

from durablesched.contrib.django.database import store_for
from tests_django.conftest import work
from tests_django.testapp.tasks import add, boom, send

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

LIST = "/admin/durablesched/task/"


@pytest.fixture
def client() -> Client:
    with store_for("default").engine.begin() as conn:  # the queue, empty (as `alias` does)
        for table in ("task_events", "idempotency_keys", "tasks"):
            conn.execute(text(f"DELETE FROM {table}"))
    admin = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.force_login(admin)
    return client


def _ids(html: str, ids: list[str]) -> set[str]:
    """Which of ``ids`` the list page links to."""
    return {i for i in ids if f'href="{LIST}{i}/change/' in html}


def test_the_list_filters_by_state_queue_and_name(client: Client) -> None:
    alias = "default"  # the admin shows the default backend's tasks
    ok = add.using(backend=alias).enqueue(1, 2)
    bad = boom.using(backend=alias).enqueue("no")
    mail = send.using(backend=alias).enqueue("a@example.com")
    work(alias, "--queue", "default")
    ids = [ok.id, bad.id, mail.id]
    page = client.get(LIST)
    assert page.status_code == 200
    assert _ids(page.content.decode(), ids) == set(ids)
    for query, expected in [
        ("state__exact=SUCCEEDED", {ok.id}),
        ("state__exact=FAILED", {bad.id}),
        ("queue__exact=emails", {mail.id}),
        ("name__exact=tests_django.testapp.tasks.boom", {bad.id}),
    ]:
        page = client.get(f"{LIST}?{query}")
        assert page.status_code == 200, query
        assert _ids(page.content.decode(), ids) == expected, query


def test_a_task_s_page_shows_its_history_and_each_error(client: Client) -> None:
    bad = boom.using(backend="default").enqueue("no luck")
    work("default")  # two attempts (OPTIONS retry), both fail
    page = client.get(f"{LIST}{bad.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count("builtins.ValueError") >= 2  # the history's lines and the errors
    assert "attempt 1:" in html and "attempt 2:" in html and "no luck" in html
    assert "claimed by" in html and "RETRY_WAIT" in html and "FAILED" in html


def test_nothing_can_be_added_changed_or_deleted(client: Client) -> None:
    task = add.using(backend="default").enqueue(1, 1)
    assert client.get(f"{LIST}add/").status_code == 403
    assert client.post(f"{LIST}{task.id}/change/", {"state": "SUCCEEDED"}).status_code == 403
    assert client.post(f"{LIST}{task.id}/delete/", {"post": "yes"}).status_code == 403
    stored = store_for("default").get(int(task.id))
    assert stored is not None and stored.state.value == "PENDING"
