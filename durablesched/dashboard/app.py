"""The dashboard's ASGI app: :func:`create_app` over a store, its routes in one list."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from durablesched.clock import Clock
from durablesched.dashboard import actions, reads
from durablesched.dashboard.actions import Operations, Refusal, run_action
from durablesched.dashboard.chart import throughput_chart
from durablesched.dashboard.filters import (
    LAST_PAGE,
    MAX_ID,
    PAGE_SIZE,
    BadFilter,
    cursor,
    read_filters,
    read_id,
)
from durablesched.dashboard.reads import DashboardStore
from durablesched.dashboard.security import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Guard,
    client_of,
    cookie_header,
    cross_site,
    safe_next,
    same,
)
from durablesched.errors import ConfigurationError, InvalidTaskError
from durablesched.records import OLDEST
from durablesched.scheduler import Scheduler
from durablesched.states import TERMINAL, TaskState
from durablesched.submission import check_name
from durablesched.workflows.waits import waiting_for

HERE = Path(__file__).parent
#: How often an open page asks for its live part again, in milliseconds (docs/dashboard.md).
POLL_MS = 2000
#: The actions' method: every route that changes anything takes a POST only.
POST = ["POST"]


class Pages:
    """The dashboard's handlers over one store: its pages, logging in, its actions."""

    def __init__(
        self, store: DashboardStore, scheduler: Scheduler, *, token: str | None, read_only: bool
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.token = token
        self.read_only = read_only
        self.ops = Operations(store, scheduler, read_only)
        self.minutes = reads.MinuteCache()
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        env.filters["when"] = _when
        env.filters["ago"] = _ago
        env.filters["seconds"] = _seconds
        env.filters["as_json"] = reads.as_json
        self.templates = Jinja2Templates(env=env, context_processors=[_links])

    def page(self, request: Request, name: str, live: str, context: dict[str, Any]) -> Response:
        """The page ``name``, or its live part ``live`` alone when the script asks for it."""
        context = {
            "read_only": self.read_only,
            "csrf": request.state.csrf,
            "csrf_field": CSRF_FIELD,
            "login_needed": request.state.login_needed,
            "poll_ms": POLL_MS,
            "live": live,
            "done": request.query_params.get("done") == "ok",
            **context,
        }
        if request.query_params.get("fragment") == "1":
            return self.templates.TemplateResponse(request, live, context)
        return self.templates.TemplateResponse(request, name, context)

    async def overview(self, request: Request) -> Response:
        now = self.scheduler.clock.now()
        data = await run_in_threadpool(reads.overview, self.store, now, self.minutes)
        context = {"o": data, "chart": throughput_chart(data.minutes, data.now)}
        return self.page(request, "overview.html", "overview_live.html", context)

    async def tasks(self, request: Request) -> Response:
        wanted = request.query_params.get("id", "").strip()
        try:
            if wanted:
                found_id = read_id(wanted)
                return RedirectResponse(request.url_for("task", task_id=found_id), 303)
            asked = read_filters(request.query_params)
        except BadFilter as e:
            raise HTTPException(400, str(e)) from None
        found = await run_in_threadpool(self.store.find_tasks, asked.query, PAGE_SIZE + 1)
        query = asked.query
        more = len(found) > PAGE_SIZE
        # Walking back (after): the rows are the oldest after the cursor, and the extra
        # one is the newest; walking on (before, or from the top): the oldest is extra.
        shown = (found[1:] if more else found) if query.after else found[:PAGE_SIZE]
        newer = more if query.after else query.before is not None
        older = query.after != OLDEST if query.after else more
        first, last = (shown[0], shown[-1]) if shown else (None, None)
        now = self.scheduler.clock.now()
        waits = await run_in_threadpool(waiting_for, self.store, shown, now, _when)
        context = {
            "tasks": shown,
            "waits": waits,
            "asked": asked,
            "first_link": asked.link(before=None, after=None) if newer else None,
            "newer_link": asked.link(before=None, after=cursor(first.created_at, first.id))
            if newer and first
            else None,
            "next_link": asked.link(after=None, before=cursor(last.created_at, last.id))
            if older and last
            else None,
            "last_link": asked.link(before=None, after=LAST_PAGE) if older else None,
            "states": [s.value for s in TaskState],
            "terminal": {s.value for s in TERMINAL},
            "can_retry": hasattr(self.store, "requeue"),
        }
        return self.page(request, "tasks.html", "tasks_live.html", context)

    async def task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        if task_id > MAX_ID:
            raise HTTPException(404, f"no task with id {task_id}")
        data = await run_in_threadpool(
            lambda: reads.task_page(self.store, task_id, self.scheduler.clock.now())
        )
        if data is None:
            raise HTTPException(404, f"no task with id {task_id}")
        context = {
            "p": data,
            "t": data.task,
            "duration": reads.duration,
            "terminal": data.task.state in TERMINAL,
            "can_retry": hasattr(self.store, "requeue")
            and data.task.state in (TaskState.FAILED, TaskState.CANCELLED),
        }
        return self.page(request, "task.html", "task_live.html", context)

    async def queues(self, request: Request) -> Response:
        now = self.scheduler.clock.now()
        infos = await run_in_threadpool(self.store.queue_info, now, finished=False)
        ended = await run_in_threadpool(reads.ended_attempts, self.store)
        context = {"queues": infos, "ended": ended}
        return self.page(request, "queues.html", "queues_live.html", context)

    async def schedules(self, request: Request) -> Response:
        infos = await run_in_threadpool(reads.schedules, self.store)
        return self.page(request, "schedules.html", "schedules_live.html", {"schedules": infos})

    async def workers(self, request: Request) -> Response:
        now = self.scheduler.clock.now()
        found = await run_in_threadpool(reads.workers, self.store, now)
        return self.page(
            request, "workers.html", "workers_live.html", {"workers": found, "now": now}
        )

    async def metrics(self, request: Request) -> Response:
        try:
            import durablesched.metrics as prometheus  # noqa: PLC0415 - optional extra
        except ConfigurationError as e:
            return PlainTextResponse(f"{e}\n", status_code=501)
        body = await run_in_threadpool(
            prometheus.metrics_text, self.store, clock=self.scheduler.clock
        )
        return Response(body, media_type=prometheus.CONTENT_TYPE)

    # -- logging in -------------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        target = safe_next(request.query_params.get("next"))
        root = request.scope.get("root_path", "")
        if not self.token or (request.state.authorised and request.method == "GET"):
            return RedirectResponse(f"{root}{target}", 303)
        wrong = False
        if request.method == "POST":
            refused = cross_site(request.scope)
            if refused is not None:
                raise HTTPException(403, refused)
            guard: Guard = request.state.guard
            client, now = client_of(request.scope), guard.now()
            wait = guard.throttle.wait(client, now)
            if wait:
                return PlainTextResponse(
                    f"too many wrong tokens from this address: try again in {wait:.0f} s\n",
                    status_code=429,
                    headers={"retry-after": str(max(1, round(wait)))},
                )
            form = await request.form()
            target = safe_next(str(form.get("next") or "/"))
            if not same(str(form.get(CSRF_FIELD) or ""), request.state.csrf):
                raise HTTPException(403, "refused: the form's CSRF token is missing or stale")
            if same(str(form.get("token") or ""), self.token):
                response = RedirectResponse(f"{root}{target}", 303)
                session = guard.sessions.issue(now)
                cookie = cookie_header(
                    request.scope, SESSION_COOKIE, session, max_age=SESSION_SECONDS
                )
                response.raw_headers.append((b"set-cookie", cookie))
                return response
            guard.throttle.failed(client, now)
            wrong = True
        context = {"csrf": request.state.csrf, "csrf_field": CSRF_FIELD, "next": target}
        return self.templates.TemplateResponse(
            request, "login.html", {**context, "wrong": wrong}, status_code=401 if wrong else 200
        )

    async def logout(self, request: Request) -> Response:
        refused = cross_site(request.scope)
        if refused is not None:
            raise HTTPException(403, refused)
        form = await request.form()
        if not same(str(form.get(CSRF_FIELD) or ""), request.state.csrf):
            raise HTTPException(403, "refused: the form's CSRF token is missing or stale")
        guard: Guard = request.state.guard
        jar_value = request.cookies.get(SESSION_COOKIE)
        now = guard.now()
        session = guard.sessions.check(jar_value, now)
        if session is not None:
            guard.sessions.revoke(*session, now)
        response = RedirectResponse(f"{request.scope.get('root_path', '')}/login", 303)
        response.raw_headers.append(
            (b"set-cookie", cookie_header(request.scope, SESSION_COOKIE, "", max_age=0))
        )
        return response

    # -- actions ---------------------------------------------------------------------------------

    async def task_action(self, request: Request) -> Response:
        name = request.path_params["action"]
        task_id = request.path_params["task_id"]
        act = actions.TASK_ACTIONS.get(name)
        if act is None:
            raise HTTPException(404, f"no action {name!r}")

        def do(form: FormData) -> str:
            if task_id > MAX_ID:
                raise Refusal(404, f"no task with id {task_id}")
            step = actions.from_step(form) if name == "retry" else None
            if step is not None:  # retry --from-step: a workflow's later steps run again
                return self.ops.retry(task_id, step)
            return act(self.ops, task_id)

        return await run_action(request, self.ops, do)

    async def bulk_action(self, request: Request) -> Response:
        def do(form: FormData) -> str:
            return actions.bulk(self.ops, str(form.get("action") or ""), actions.task_ids(form))

        return await run_action(request, self.ops, do)

    async def queue_action(self, request: Request) -> Response:
        name = request.path_params["name"]
        action = request.path_params["action"]

        def do(form: FormData) -> str:
            if action == "pause":
                return self.ops.pause_queue(name)
            if action == "resume":
                return self.ops.resume_queue(name)
            concurrency = str(form.get("concurrency") or "")
            per_key, key_rate = form.get("concurrency_per_key"), form.get("rate_per_key")
            return self.ops.set_limits(
                name,
                concurrency,
                str(form.get("rate") or ""),
                None if per_key is None else str(per_key),
                None if key_rate is None else str(key_rate),
            )

        if action not in ("pause", "resume", "limits"):
            raise HTTPException(404, f"no action {action!r}")
        return await run_action(request, self.ops, do)

    async def schedule_action(self, request: Request) -> Response:
        """A schedule's action: the name is the form's ``name`` field, never a part of the
        path, so that any legal name (``a/b``, ``%76``, ``x?y``, ``#1``) acts on itself."""
        action = request.path_params["action"]
        doers = {
            "pause": self.ops.pause_schedule,
            "resume": self.ops.resume_schedule,
            "run": self.ops.run_schedule,
        }
        if action not in doers:
            raise HTTPException(404, f"no action {action!r}")

        def do(form: FormData) -> str:
            name = form.get("name")
            if not isinstance(name, str) or not name:
                raise Refusal(400, "the form names no schedule (its name field is empty)")
            try:  # a name no schedule can have (NUL, which PostgreSQL refuses): a 400
                check_name(name, "schedule name")
            except InvalidTaskError as e:
                raise Refusal(400, str(e)) from None
            return doers[action](name)

        return await run_action(request, self.ops, do)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.query_params.get("fragment") == "1" or exc.status_code == 405:
            return PlainTextResponse(f"{exc.detail}\n", status_code=exc.status_code)
        return self.templates.TemplateResponse(
            request,
            "error.html",
            {"status": exc.status_code, "message": exc.detail},
            status_code=exc.status_code,
        )


def create_app(
    store: DashboardStore,
    *,
    token: str | None = None,
    read_only: bool = False,
    clock: Clock | None = None,
    allowed_hosts: Iterable[str] = (),
) -> Starlette:
    """The dashboard over ``store``, as an ASGI app to serve or mount.

    With ``token``, every request must carry it (``Authorization: Bearer``, or the
    cookie the login form sets); with ``read_only``, every action is hidden and
    refused (403). Without a token it answers only requests for a loopback host name
    (``localhost``, ``127.0.0.1``, ``[::1]``) or one of ``allowed_hosts`` (the names a
    proxy in front of it is asked for); with a token, any name unless ``allowed_hosts``
    names some. The store stays the caller's: the app never closes it.
    ``clock`` is for tests (the store's own clock by default, as ``Scheduler``'s).
    """
    if token is not None and not token.strip():
        raise ConfigurationError("the dashboard's token must not be empty")
    if isinstance(allowed_hosts, str):
        raise ConfigurationError(
            f"allowed_hosts is a list of host names, got the string {allowed_hosts!r}"
        )
    pages = Pages(store, Scheduler(store, clock=clock), token=token, read_only=read_only)
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/tasks", pages.tasks, name="tasks"),
        Route("/tasks/bulk", pages.bulk_action, methods=POST),
        Route("/tasks/{task_id:int}", pages.task, name="task"),
        Route(
            "/tasks/{task_id:int}/{action:str}",
            pages.task_action,
            methods=["POST"],
            name="task_action",
        ),
        Route("/queues", pages.queues, name="queues"),
        Route(
            "/queues/{name:str}/{action:str}",
            pages.queue_action,
            methods=["POST"],
            name="queue_action",
        ),
        Route("/schedules", pages.schedules, name="schedules"),
        Route(
            "/schedules/{action:str}",
            pages.schedule_action,
            methods=POST,
            name="schedule_action",
        ),
        Route("/workers", pages.workers, name="workers"),
        Route("/metrics", pages.metrics, name="metrics"),
        Route("/login", pages.login, methods=["GET", "POST"], name="login"),
        Route("/logout", pages.logout, methods=["POST"], name="logout"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                Guard,
                token=token,
                allowed_hosts=frozenset(allowed_hosts),
                now=lambda: pages.scheduler.clock.now().timestamp(),
            )
        ],
        exception_handlers={HTTPException: pages.http_error},
    )
    app.state.templates = pages.templates
    return app


def _links(request: Request) -> dict[str, Any]:
    """``href(name, **params)`` for templates: a route's path, under wherever the app is
    mounted (a path, not a URL: the host a proxy was asked for stays the browser's)."""

    def href(route: str, /, **params: Any) -> str:
        return str(request.url_for(route, **params).path)

    return {"href": href}


def _when(value: datetime | None) -> str:
    """A time as UTC to the second (milliseconds where they matter: the timeline)."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def _seconds(value: float | timedelta | None) -> str:
    """A span in words: 850 ms, 12.3 s, 4 min 5 s, 2 h 3 min."""
    if value is None:
        return "-"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def _ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "-"
    delta = (now - value).total_seconds()
    return f"{_seconds(delta)} ago" if delta >= 0 else f"in {_seconds(-delta)}"
