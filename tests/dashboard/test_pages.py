"""Every page over SQLite and PostgreSQL: what it shows, its live fragment, its filters,
404 for unknown ids, 400 for bad filters, and escaping of whatever tasks hold."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from durablesched import TaskState, WorkerInfo
from durablesched.dashboard import create_app
from durablesched.dashboard.filters import PAGE_SIZE
from durablesched.dashboard.security import CSP
from durablesched.records import NewTask, TaskQuery
from durablesched.workflows import waits
from durablesched.workflows.steps import FOREVER

from ..conftest import T0
from .conftest import LEASE, LOCAL, Dash, failed_task

PAGES = ["/", "/tasks", "/queues", "/schedules", "/workers"]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_and_its_live_part_answer(dash: Dash, path: str) -> None:
    dash.scheduler.submit("job", {})
    page = dash.client.get(path)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'data-poll="' in page.text and "<html" in page.text
    fragment = dash.client.get(f"{path}?fragment=1", headers={"X-Requested-With": "fetch"})
    assert fragment.status_code == 200
    assert "<html" not in fragment.text  # the live part alone


def test_the_overview_counts_live_tasks_per_queue_and_the_last_hour(dash: Dash) -> None:
    dash.scheduler.submit("job", {}, queue="mail")
    dash.scheduler.submit("job", {}, queue="mail")
    dash.scheduler.set_queue("mail", concurrency=3)
    (claim,) = dash.store.claim("w1", 1, dash.clock.now(), LEASE)
    dash.clock.advance(2)
    assert dash.store.complete(claim, None, dash.clock.now())
    failed_task(dash)
    dash.store.register_worker(
        WorkerInfo("w1", "host", 1, None, 4, "0.1.0", T0, dash.clock.now(), LEASE), T0
    )
    page = dash.client.get("/").text
    assert '<span class="figure" id="workers-alive">1</span>' in page
    assert '<span class="figure ok" id="succeeded-hour">1</span>' in page
    assert '<span class="figure bad" id="failed-hour">2</span>' in page
    assert "<svg" in page and 'class="bad"' in page  # the chart drew failures
    assert "concurrency 3" in page and "?queue=mail" in page


def test_a_task_page_shows_its_attempts_errors_and_timeline(dash: Dash) -> None:
    task_id = failed_task(dash)
    page = dash.client.get(f"/tasks/{task_id}").text
    assert page.count('<tr class="attempt">') == 2
    assert "worker-1" in page and "worker-2" in page
    assert "no &lt;b&gt;such&lt;/b&gt; thing" in page
    assert "raise &lt;x&gt;" in page  # the traceback, escaped
    assert "failed: will retry" in page and ">failed<" in page
    assert '"n": 1' in page.replace("&#34;", '"')


def test_the_timeline_shows_a_lease_and_its_reclaim(dash: Dash) -> None:
    task_id = dash.scheduler.submit("slow", {}, max_attempts=2)
    dash.store.claim("doomed", 1, dash.clock.now(), LEASE)
    page = dash.client.get(f"/tasks/{task_id}").text
    assert "lease of doomed runs until here" in page
    dash.clock.advance(LEASE + timedelta(seconds=1))
    assert (
        "lease expired: waiting for a worker to reclaim it"
        in dash.client.get(f"/tasks/{task_id}").text
    )
    dash.store.reclaim_expired(dash.clock.now(), lambda name, attempt: timedelta(0))
    page = dash.client.get(f"/tasks/{task_id}").text
    assert "lease expired: reclaimed, to retry" in page
    assert "lease of doomed expired at" in page


def test_unknown_ids_are_404_and_bad_filters_400_without_a_traceback(dash: Dash) -> None:
    for path in ("/tasks/999999", f"/tasks/{2**63}", "/tasks/abc", "/nowhere"):
        answer = dash.client.get(path)
        assert answer.status_code == 404, path
        assert "Traceback" not in answer.text
    for query, words in (
        ("state=DONE", "state must be one of"),
        ("created_from=yesterday", "created from must be a time"),
        ("before=nonsense", "before must be a page cursor"),
        ("queue=%3Cbad%3E", "queue must be"),
        ("id=12abc", "a task id is a whole number"),
    ):
        answer = dash.client.get(f"/tasks?{query}")
        assert answer.status_code == 400, query
        assert words in answer.text
        assert "Traceback" not in answer.text
        assert answer.headers["x-frame-options"] == "DENY"


def test_search_by_id_opens_the_task(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    answer = dash.client.get(f"/tasks?id={task_id}", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"].endswith(f"/tasks/{task_id}")
    assert dash.client.get("/tasks?id=424242").status_code == 404


def test_the_list_filters_and_pages_newest_first(dash: Dash) -> None:
    dash.store.submit([NewTask("bulk", {"i": i}, T0, 1) for i in range(PAGE_SIZE + 5)], T0)
    dash.clock.advance(60)
    later = dash.scheduler.submit("mail", {}, key="order-7", queue="mail")
    failed = failed_task(dash, "mail")
    first = dash.client.get("/tasks").text
    assert first.index(f">{failed}</a>") < first.index(f">{later}</a>")  # newest first
    assert 'rel="next"' in first
    older = first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
    second = dash.client.get(older.replace("&amp;", "&")).text
    assert second.count('name="ids"') == PAGE_SIZE + 7 - PAGE_SIZE
    assert 'rel="next"' not in second and ">newest</a>" in second

    def ids(query: str) -> set[str]:
        page = dash.client.get(f"/tasks?{query}").text
        return set(__import__("re").findall(r'name="ids" value="(\d+)"', page))

    assert ids("name=mail") == {str(later), str(failed)}
    assert ids("state=failed") == {str(failed)}
    assert ids("queue=mail") == {str(later)}
    assert ids("key=order-7") == {str(later)}
    until = (T0 + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S")
    assert len(ids(f"created_until={until}")) == PAGE_SIZE
    assert ids(f"created_from={until}&name=mail") == {str(later), str(failed)}


def test_whatever_a_task_holds_is_shown_as_text(dash: Dash) -> None:
    evil = "<script>alert(1)</script>"
    task_id = dash.scheduler.submit(evil, {"html": "<img src=x onerror=alert(2)>"}, key=evil)
    for path in ("/", "/tasks", f"/tasks/{task_id}", f"/tasks?name={evil}"):
        page = dash.client.get(path).text
        assert "<script>alert" not in page and "<img src=x" not in page, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dash.client.get(f"/tasks/{task_id}").text
    # Not even in an error page: the filter that failed is quoted escaped.
    page = dash.client.get("/tasks?state=<script>x</script>").text
    assert "<script>x" not in page


def test_the_queues_page_shows_limits_per_key_and_keys_at_them(dash: Dash) -> None:
    dash.scheduler.set_queue("sync", concurrency_per_key=1, rate_per_key="5/s")
    for key in ("a", "a", "b"):
        dash.scheduler.submit("job", {}, queue="sync", limit_key=key)
    dash.store.claim("w1", 5, dash.clock.now(), LEASE)
    queues = dash.client.get("/queues").text
    assert "1 running 5/s" in queues and "(2 keys at limit)" in queues


def test_queues_schedules_and_workers_pages(dash: Dash) -> None:
    dash.scheduler.submit("job", {}, queue="mail")
    dash.scheduler.set_queue("mail", rate="10/m")
    dash.scheduler.add_schedule("report", name="nightly", cron="0 3 * * *")
    dash.store.register_worker(
        WorkerInfo("w9", "box", 42, {"mail": 2}, 2, "0.1.0", T0, T0, LEASE), T0
    )
    queues = dash.client.get("/queues").text
    assert "mail" in queues and 'value="10/m"' in queues
    schedules = dash.client.get("/schedules").text
    assert "nightly" in schedules and "0 3 * * *" in schedules and "Run now" in schedules
    workers = dash.client.get("/workers").text
    assert "w9" in workers and "mail=2" in workers and ">alive<" in workers
    dash.clock.advance(LEASE * 2)
    assert ">gone<" in dash.client.get("/workers").text


def test_metrics_serve_the_prometheus_text(dash: Dash) -> None:
    dash.scheduler.submit("job", {})
    answer = dash.client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert 'durablesched_tasks{queue="default",state="PENDING"} 1.0' in answer.text


def test_states_are_all_offered_in_the_filter(dash: Dash) -> None:
    page = dash.client.get("/tasks?state=retry_wait").text
    for state in TaskState:
        assert f'<option value="{state.value}"' in page
    assert '<option value="RETRY_WAIT" selected>' in page


#: Bad parameters that once answered 500 (issue 28, item 4), and what the 400 says.
BAD_QUERIES = [
    ("id=%C2%B2", "a task id is a whole number"),  # "²": a digit to str.isdigit
    ("id=%D9%A1%D9%A2", "a task id is a whole number"),  # Arabic-Indic 12
    (f"id={2**63}", "a task id is a whole number"),
    (f"id={10**30}", "a task id is a whole number"),
    ("created_from=0001-01-01T00:00%2B05:00", "created from must be a time"),
    ("created_until=9999-12-31T23:59:59-05:00", "created until must be a time"),
    ("before=2030-01-01T00:00:00Z~12345678901234567890", "before must be a page cursor"),
    (f"before=2030-01-01T00:00:00Z~{2**63}", "before must be a page cursor"),
    ("before=2030-01-01T00:00:00Z~%C2%B2", "before must be a page cursor"),
    ("before=0001-01-01T00:00%2B05:00~1", "before must be a page cursor"),
    ("before=9999-12-31T23:59:59-05:00~1", "before must be a page cursor"),
    ("before=~", "before must be a page cursor"),
    ("key=a%00b", "key 'a\\x00b' contains control characters"),
    ("name=a%00b", "contains control characters"),
    ("queue=a%00b", "queue must be"),
]


@pytest.mark.parametrize(("query", "words"), BAD_QUERIES)
def test_every_bad_parameter_is_a_400_naming_it(dash: Dash, query: str, words: str) -> None:
    dash.scheduler.submit("job", {}, key="k")
    for fragment in ("", "&fragment=1"):
        answer = dash.client.get(f"/tasks?{query}{fragment}")
        assert answer.status_code == 400, query
        assert words in html.unescape(answer.text), answer.text
        assert "Traceback" not in answer.text
        assert answer.headers["content-security-policy"] == CSP


def test_bulk_ids_beyond_64_bits_or_not_ascii_are_a_400(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    for bad in (str(2**63), "9" * 25, "²", "١٢", "-1", " "):
        answer = dash.act("/tasks/bulk", {"action": "cancel", "ids": [str(task_id), bad]})
        assert answer.status_code == 400, bad
        assert "a task id is a whole number" in answer.json()["error"]
    assert dash.store.get(task_id).state is TaskState.PENDING  # type: ignore[union-attr]
    assert dash.act(f"/tasks/{2**63}/cancel").status_code == 404
    assert dash.act(f"/tasks/{10**30}/cancel").status_code == 404


def test_a_500_carries_the_security_headers_and_no_traceback(dash: Dash) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the database went away <script>")

    app = create_app(dash.store, clock=dash.clock)
    dash.store.find_tasks = broken  # type: ignore[method-assign,assignment]
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as client:
        answer = client.get("/tasks")
    assert answer.status_code == 500
    assert answer.headers["content-security-policy"] == CSP
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["cache-control"] == "no-store"
    assert "went away" not in answer.text and "Traceback" not in answer.text


def test_a_task_claimed_ahead_is_told_from_a_running_one(dash: Dash) -> None:
    """Waiting in its worker for a slot: said on its page, the queues and overview
    pages, and the worker's row (claimed ahead, not running)."""
    dash.store.register_worker(WorkerInfo("w9", "box", 42, None, 1, "0.1.0", T0, T0, LEASE), T0)
    first = dash.scheduler.submit("job", {})
    waiting = dash.scheduler.submit("job", {})
    claims = dash.store.claim("w9", 1, dash.clock.now(), LEASE, ahead=1)
    assert [(c.task_id, c.started_at is None) for c in claims] == [(first, False), (waiting, True)]
    page = dash.client.get(f"/tasks/{waiting}").text
    assert 'id="claimed-ahead"' in page and "waiting in w9 for a slot" in page
    assert 'id="claimed-ahead"' not in dash.client.get(f"/tasks/{first}").text
    for path in ("/", "/queues"):
        assert "+1 claimed ahead" in dash.client.get(path).text
    workers = dash.client.get("/workers").text
    assert '<td class="num">1</td>\n<td class="num">1</td>' in workers  # running, ahead


def test_a_workflows_page_lists_its_steps_and_links_its_children(dash: Dash) -> None:
    (parent,) = dash.store.submit([NewTask("flow", {}, T0, 3, None)], T0)
    (claim,) = dash.store.claim("w1", 1, dash.clock.now(), LEASE)
    assert dash.store.record_step(claim, 0, "charge <card>", {"id": "ch_1"}, dash.clock.now())
    kids = dash.store.spawn(claim, 1, "spawn:job", [NewTask("job", {}, T0, 3, None)], T0)
    assert kids is not None
    page = dash.client.get(f"/tasks/{parent.task_id}").text
    assert page.count('<tr class="step">') == 2
    assert "charge &lt;card&gt;" in page and "spawn:job" in page
    assert f'href="/tasks/{kids[0].task_id}"' in page


def test_the_list_says_what_a_suspended_workflow_waits_for(dash: Dash) -> None:
    """A sleep's wake time and a signal wait (its name escaped), each in its row; a task
    merely due later, nothing (docs/dashboard.md)."""
    now = dash.clock.now()
    sleeper, waiter, plain = dash.store.submit(
        [NewTask(n, {}, now, 3, None) for n in ("sleeper", "approval")]
        + [NewTask("send", {}, now + timedelta(days=1), 3, None)],
        now,
    )
    claims = {c.task_id: c for c in dash.store.claim("w1", 2, now, LEASE)}
    wake = now + timedelta(days=3)
    dash.store.suspend(claims[sleeper.task_id], wake, now, detail=waits.sleeping(0, wake))
    name = "<ok>"
    dash.store.suspend(
        claims[waiter.task_id], FOREVER, now, detail=waits.signal(1, name, None), signal=name
    )
    page = dash.client.get("/tasks").text
    cells = dict(re.findall(r'href="/tasks/(\d+)".*?<td class="waits">(.*?)</td>', page, re.S))
    assert cells == {
        str(sleeper.task_id): f"sleep until {wake:%Y-%m-%d %H:%M:%S} UTC",
        str(waiter.task_id): "signal &lt;ok&gt;",
        str(plain.task_id): "",
    }


def test_the_list_pages_both_ways_and_opens_at_its_oldest_end(dash: Dash) -> None:
    dash.store.submit([NewTask("bulk", {"i": i}, T0, 1) for i in range(PAGE_SIZE + 5)], T0)
    every = [t.id for t in dash.store.find_tasks(TaskQuery(), 1000)]

    def shown(page: str) -> list[int]:
        return [int(i) for i in re.findall(r'name="ids" value="(\d+)"', page)]

    def links(page: str) -> dict[str, str]:
        found = re.findall(r'<a href="(/tasks\?[^"]*)"[^>]*>(newest|newer|older|oldest)</a>', page)
        return {label: html.unescape(href) for href, label in found}

    for query in ("", "state=PENDING&"):
        first = dash.client.get(f"/tasks?{query}").text
        assert shown(first) == every[:PAGE_SIZE]
        assert set(links(first)) == {"older", "oldest"}
        oldest = dash.client.get(links(first)["oldest"]).text
        assert shown(oldest) == every[-PAGE_SIZE:]  # the oldest, newest first
        assert set(links(oldest)) == {"newest", "newer"}
        newer = dash.client.get(links(oldest)["newer"]).text
        assert shown(newer) == every[:5]
        assert set(links(newer)) == {"older", "oldest"}
        older = dash.client.get(links(newer)["older"]).text
        assert shown(older) == every[5:]
        assert query in links(older)["newer"]  # the filter stays


def test_the_list_shows_a_failed_tasks_error_and_queues_their_ended_attempts(dash: Dash) -> None:
    failed = failed_task(dash, "flaky", attempts=2)
    dash.scheduler.submit("job", {}, queue="mail")
    (claim,) = dash.store.claim("w1", 1, dash.clock.now(), LEASE, names=["job"])
    dash.store.complete(claim, None, dash.clock.now())
    page = dash.client.get("/tasks").text
    row = page.split(f">{failed}</a>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="error">ValueError: no &lt;b&gt;such&lt;/b&gt; thing</td>' in row
    queues = dash.client.get("/queues").text
    mail = queues.split('id="queue-mail"', 1)[1].split("</tr>", 1)[0]
    assert '<a href="/tasks?queue=mail">mail</a>' in mail
    assert 'href="/tasks?queue=mail&amp;state=SUCCEEDED">1</a>' in mail
    default = queues.split('id="queue-default"', 1)[1].split("</tr>", 1)[0]
    assert 'state=FAILED">1</a>' in default  # its last attempt; the first was retried


def test_the_charts_legend_does_not_style_the_key_cells(dash: Dash) -> None:
    """The legend's swatches were `.key`, the class of the key cells too: a scheduled
    fire's key wrapped one character per line in a .8em-wide box."""
    css = dash.client.get("/static/dashboard.css").text
    assert not re.search(r"(^|[\s,}])\.key\s*\{[^}]*width", css)
    assert 'class="swatch ok"' in dash.client.get("/").text
