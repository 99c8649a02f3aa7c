"""Every action over SQLite and PostgreSQL, through the same operator API as the CLI:
as a plain form (303 back) and as the page's script posts it (JSON); refusals say why."""

from __future__ import annotations

import html
import re

from sqlalchemy import text

from durablesched import TaskState

from .conftest import LEASE, Dash, failed_task


def state(dash: Dash, task_id: int) -> TaskState | None:
    task = dash.store.get(task_id)
    return None if task is None else task.state


def test_cancel_a_pending_task_as_a_form_and_see_it_back(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    answer = dash.post(f"/tasks/{task_id}/cancel", {"next": f"/tasks/{task_id}"})
    assert answer.status_code == 200  # the 303 followed back to the task page
    assert answer.url.path == f"/tasks/{task_id}"
    assert "Done." in answer.text and 'id="task-state">CANCELLED<' in answer.text
    assert state(dash, task_id) is TaskState.CANCELLED


def test_cancel_retry_and_delete_as_the_script_posts_them(dash: Dash) -> None:
    running = dash.scheduler.submit("slow", {})
    dash.store.claim("w1", 1, dash.clock.now(), LEASE)
    answer = dash.act(f"/tasks/{running}/cancel")
    assert answer.status_code == 200
    assert "cancellation requested" in answer.json()["message"]
    failed = failed_task(dash)
    assert dash.act(f"/tasks/{failed}/retry").json() == {
        "message": f"task {failed}: PENDING, due now"
    }
    assert state(dash, failed) is TaskState.PENDING
    assert dash.act(f"/tasks/{failed}/retry").status_code == 409  # PENDING: nothing to retry
    assert dash.act(f"/tasks/{failed}/delete").status_code == 409  # live: cancel it first
    assert dash.act(f"/tasks/{failed}/cancel").status_code == 200
    assert dash.act(f"/tasks/{failed}/delete").json() == {"message": f"task {failed}: deleted"}
    assert state(dash, failed) is None
    assert dash.client.get(f"/tasks/{failed}").status_code == 404
    gone = dash.act(f"/tasks/{failed}/delete")
    assert gone.status_code == 404 and "no task with id" in gone.json()["error"]
    assert dash.act("/tasks/999999/cancel").status_code == 404
    assert dash.act(f"/tasks/{failed}/explode").status_code == 404
    too_late = dash.act(f"/tasks/{running}/cancel")  # asked before: still running, asked again
    assert too_late.status_code == 200


def test_a_refused_form_shows_why_without_a_traceback(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    page = dash.post(f"/tasks/{task_id}/delete")
    assert page.status_code == 409
    assert "only a finished task" in page.text and "Traceback" not in page.text


def test_bulk_actions_do_each_task_and_count_the_refusals(dash: Dash) -> None:
    waiting = [dash.scheduler.submit("job", {"i": i}) for i in range(3)]
    failed = failed_task(dash)
    answer = dash.act("/tasks/bulk", {"action": "cancel", "ids": [*map(str, waiting), str(failed)]})
    assert answer.json()["message"].startswith("cancel: 3 of 4 task(s) done; 1 refused")
    assert all(state(dash, t) is TaskState.CANCELLED for t in waiting)
    answer = dash.act("/tasks/bulk", {"action": "retry", "ids": [str(waiting[0]), str(failed)]})
    assert answer.json() == {"message": "retry: 2 of 2 task(s) done"}
    answer = dash.act("/tasks/bulk", {"action": "delete", "ids": [str(t) for t in waiting]})
    assert answer.json()["message"].startswith("delete: 2 of 3 task(s) done; 1 refused")
    assert [state(dash, t) for t in waiting] == [TaskState.PENDING, None, None]
    assert dash.act("/tasks/bulk", {"action": "cancel"}).status_code == 400  # none ticked
    assert dash.act("/tasks/bulk", {"action": "drop", "ids": ["1"]}).status_code == 400
    assert dash.act("/tasks/bulk", {"action": "cancel", "ids": ["x"]}).status_code == 400


def test_queue_pause_resume_and_limits(dash: Dash) -> None:
    dash.scheduler.submit("job", {}, queue="mail")
    assert dash.act("/queues/mail/pause").json() == {"message": "queue mail: paused"}
    assert {q.name: q.paused for q in dash.scheduler.queues()}["mail"] is True
    assert dash.store.claim("w1", 1, dash.clock.now(), LEASE) == []  # obeyed at once
    assert dash.act("/queues/mail/resume").status_code == 200
    answer = dash.act("/queues/mail/limits", {"concurrency": "2", "rate": "10/m"})
    assert answer.json() == {"message": "queue mail: concurrency 2, rate 10/m"}
    limits = {q.name: q for q in dash.scheduler.queues()}["mail"]
    assert (limits.concurrency, str(limits.rate), limits.paused) == (2, "10/m", False)
    assert dash.act("/queues/mail/limits", {"concurrency": "", "rate": ""}).status_code == 200
    lifted = {q.name: q for q in dash.scheduler.queues()}["mail"]
    assert (lifted.concurrency, lifted.rate) == (None, None)
    assert dash.act("/queues/mail/limits", {"concurrency": "zero"}).status_code == 400
    assert dash.act("/queues/mail/limits", {"concurrency": "0"}).status_code == 400
    assert "a rate is COUNT/WINDOW" in dash.act("/queues/mail/limits", {"rate": "fast"}).text
    assert dash.act("/queues/nosuch/pause").status_code == 404
    assert dash.act("/queues/mail/drain").status_code == 404


def test_queue_limits_per_key_are_set_lifted_and_kept(dash: Dash) -> None:
    dash.scheduler.submit("job", {}, queue="mail", limit_key="customer:1")
    fields: dict[str, str | list[str]] = {
        "concurrency": "",
        "rate": "",
        "concurrency_per_key": "1",
        "rate_per_key": "5/s",
    }
    answer = dash.act("/queues/mail/limits", fields)
    assert answer.json() == {
        "message": "queue mail: concurrency unlimited, rate unlimited; "
        "per key: concurrency 1, rate 5/s"
    }
    limits = {q.name: q for q in dash.scheduler.queues()}["mail"]
    assert (limits.concurrency_per_key, str(limits.rate_per_key)) == (1, "5/s")
    page = dash.client.get("/queues").text
    assert 'name="concurrency_per_key" value="1"' in page
    assert 'name="rate_per_key" value="5/s"' in page
    # A form without the per-key fields (an older page) leaves them as they are.
    assert dash.act("/queues/mail/limits", {"concurrency": "3", "rate": ""}).status_code == 200
    kept = {q.name: q for q in dash.scheduler.queues()}["mail"]
    assert (kept.concurrency, kept.concurrency_per_key, str(kept.rate_per_key)) == (3, 1, "5/s")
    # Empty per-key fields lift them.
    assert dash.act("/queues/mail/limits", {**fields, "concurrency_per_key": ""}).status_code == 200
    assert dash.act("/queues/mail/limits", {**fields, "rate_per_key": ""}).status_code == 200
    half = {q.name: q for q in dash.scheduler.queues()}["mail"]
    assert (half.concurrency_per_key, half.rate_per_key) == (1, None)


def test_bad_limits_per_key_are_refused_and_change_nothing(dash: Dash) -> None:
    """The guard: a per-key value the queue cannot take is a 400 naming it, and the
    queue's limits stay as they were (nothing is half set)."""
    dash.scheduler.submit("job", {}, queue="mail")
    good: dict[str, str | list[str]] = {
        "concurrency": "2",
        "rate": "10/m",
        "concurrency_per_key": "1",
        "rate_per_key": "5/s",
    }
    assert dash.act("/queues/mail/limits", good).status_code == 200
    before = {q.name: q for q in dash.scheduler.queues()}["mail"]
    for field, value, said in (
        ("concurrency_per_key", "one", "concurrency per key must be a whole number"),
        ("concurrency_per_key", "0", "concurrency per key must be a positive integer"),
        ("concurrency_per_key", "-2", "concurrency per key must be a positive integer"),
        ("rate_per_key", "fast", "a rate is COUNT/WINDOW"),
        ("rate_per_key", "0/s", ""),
    ):
        bad: dict[str, str | list[str]] = {**good, "concurrency": "7", field: value}
        answer = dash.act("/queues/mail/limits", bad)
        assert answer.status_code == 400, (field, value)
        assert said in answer.text
        assert {q.name: q for q in dash.scheduler.queues()}["mail"] == before


def test_schedule_pause_resume_and_run_now(dash: Dash) -> None:
    dash.scheduler.add_schedule("report", name="nightly", cron="0 3 * * *")
    nightly: dict[str, str | list[str]] = {"name": "nightly"}
    assert dash.act("/schedules/pause", nightly).status_code == 200
    assert dash.scheduler.schedules()[0].status == "paused"
    assert dash.act("/schedules/resume", nightly).status_code == 200
    assert dash.scheduler.schedules()[0].status == "active"
    made = dash.act("/schedules/run", nightly).json()["message"]
    (task,) = dash.store.list_tasks(name="report")
    assert made == f"schedule nightly: made task {task.id}"
    assert dash.act("/schedules/run", {"name": "nosuch"}).status_code == 404
    assert dash.act("/schedules/delete", nightly).status_code == 404


def test_actions_take_a_post_only(dash: Dash) -> None:
    task_id = dash.scheduler.submit("job", {})
    assert dash.client.get(f"/tasks/{task_id}/cancel").status_code == 405
    assert state(dash, task_id) is TaskState.PENDING


#: Legal schedule names that a path would misread: a separator, a percent escape of
#: another schedule's name, a query, a fragment, spaces, and what is not ASCII.
AWKWARD = ["a/b", "%76ictim", "weekly?report", "#1", "two words", "Übersicht ☃", "..", "a%2Fb"]
FORM = re.compile(r'<form method="post" action="([^"]*)"[^>]*>(.*?)</form>', re.S)


def forms(page: str) -> list[tuple[str, dict[str, str], str]]:
    """Each form of a page as a browser would post it: its action, hidden fields, button."""
    found = []
    for action, body in FORM.findall(page):
        fields = {
            html.unescape(k): html.unescape(v)
            for k, v in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)"', body)
        }
        button = re.search(r"<button[^>]*>([^<]*)</button>", body)
        found.append((html.unescape(action), fields, button.group(1) if button else ""))
    return found


def test_every_legal_schedule_name_works_and_acts_on_itself(dash: Dash) -> None:
    for name in [*AWKWARD, "victim", "weekly", "a"]:
        dash.scheduler.add_schedule("report", name=name, cron="0 3 * * *")
    page = dash.client.get("/schedules")
    assert page.status_code == 200
    for name in AWKWARD:
        assert html.escape(name, quote=False) in page.text, name
    for name in AWKWARD:
        (action, fields, _) = next(
            f
            for f in forms(dash.client.get("/schedules").text)
            if f[1].get("name") == name and f[2] == "Pause"
        )
        assert name not in action and action == "/schedules/pause"
        assert dash.client.post(action, data=fields).status_code == 200
        statuses = {s.schedule.name: s.status for s in dash.scheduler.schedules()}
        assert statuses[name] == "paused", name
        assert [n for n, s in statuses.items() if s == "paused"] == [name], name
        (action, fields, _) = next(
            f
            for f in forms(dash.client.get("/schedules").text)
            if f[1].get("name") == name and f[2] == "Resume"
        )
        assert dash.client.post(action, data=fields).status_code == 200
        (action, fields, _) = next(
            f
            for f in forms(dash.client.get("/schedules").text)
            if f[1].get("name") == name and f[2] == "Run now"
        )
        made = dash.act(action, {"name": name}).json()["message"]
        assert made.startswith(f"schedule {name}: made task "), made
    assert all(s.status == "active" for s in dash.scheduler.schedules())
    # The task column links to the task list by name, percent-encoded as a query value.
    dash.scheduler.add_schedule("odd&name=x#y", name="odd", cron="0 3 * * *")
    listed = dash.client.get("/schedules").text
    assert 'href="/tasks?name=odd%26name%3Dx%23y"' in listed


def test_a_schedule_action_without_a_name_is_refused(dash: Dash) -> None:
    dash.scheduler.add_schedule("report", name="nightly", cron="0 3 * * *")
    assert dash.act("/schedules/pause").status_code == 400
    assert dash.act("/schedules/pause", {"name": ""}).status_code == 400
    for bad in ("a\x00b", "tab\there"):  # no schedule can be named so (PostgreSQL: NUL)
        for action in ("pause", "resume", "run"):
            answer = dash.act(f"/schedules/{action}", {"name": bad})
            assert answer.status_code == 400, (action, bad)
            assert "control characters" in answer.json()["error"]
    assert dash.scheduler.schedules()[0].status == "active"


def test_cancelling_a_finished_task_says_how_it_ended(dash: Dash) -> None:
    cancelled = dash.scheduler.submit("job", {})
    dash.scheduler.cancel(cancelled)
    answer = dash.act(f"/tasks/{cancelled}/cancel")
    assert answer.status_code == 409
    assert answer.json() == {"error": f"task {cancelled}: already cancelled; nothing changed"}
    failed = failed_task(dash)
    answer = dash.act(f"/tasks/{failed}/cancel")
    assert answer.status_code == 409
    assert answer.json() == {"error": f"task {failed}: too late: it had already finished (FAILED)"}


def test_retry_from_a_step_forgets_the_later_steps_and_requeues(dash: Dash) -> None:
    """``retry --from-step`` from the task page: the steps from N are forgotten, those
    before kept, the task PENDING; refused for a task retry would refuse (the steps of a
    SUCCEEDED workflow are not forgotten) and for a position that is no number."""
    failed = failed_task(dash)
    now = dash.clock.now()
    with dash.store.engine.begin() as conn:
        for position, name in enumerate(["a", "b", "c"]):
            conn.execute(
                text(
                    "INSERT INTO task_steps (task_id, position, name, result, recorded_at, "
                    "attempt) VALUES (:id, :p, :n, '1', :now, 1)"
                ),
                {"id": failed, "p": position, "n": name, "now": dash.store._t(now)},
            )
    page = dash.client.get(f"/tasks/{failed}")
    assert 'name="from_step"' in page.text
    assert dash.act(f"/tasks/{failed}/retry", {"from_step": "x"}).status_code == 400
    answer = dash.act(f"/tasks/{failed}/retry", {"from_step": "1"})
    assert answer.json() == {
        "message": f"task {failed}: PENDING, due now; its steps from 1 on run again"
    }
    assert [s.name for s in dash.store.steps(failed)] == ["a"]
    assert state(dash, failed) is TaskState.PENDING
    done = dash.scheduler.submit("job", {})
    (claim,) = dash.store.claim("w9", 1, dash.clock.now(), LEASE, names=["job"])
    assert dash.store.complete(claim, None, dash.clock.now())
    with dash.store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO task_steps (task_id, position, name, result, recorded_at, attempt) "
                "VALUES (:id, 0, 'a', '1', :now, 1)"
            ),
            {"id": done, "now": dash.store._t(now)},
        )
    refused = dash.act(f"/tasks/{done}/retry", {"from_step": "0"})
    assert refused.status_code == 409 and "only a FAILED or CANCELLED" in refused.json()["error"]
    assert [s.name for s in dash.store.steps(done)] == ["a"]  # kept: nothing was retried
