"""The dashboard's actions: each a POST with a CSRF token, through the same operator API
the CLI uses (``Scheduler`` and the store), refused (403) in read-only mode.

A form posted by the page's script (``X-Requested-With: fetch``) gets JSON back,
``{"message": ...}`` or ``{"error": ...}``; a plain form post is sent back to
where it came from (303) with the outcome in a fixed message, so nothing a
request says is ever shown back as the page's own words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from durablesched.dashboard.filters import BadFilter, read_id
from durablesched.dashboard.reads import DashboardStore
from durablesched.dashboard.security import CSRF_FIELD, cross_site, header, safe_next, same
from durablesched.errors import (
    DurableSchedError,
    InvalidTaskError,
    InvalidTransitionError,
    ScheduleNotFoundError,
    TaskNotFoundError,
)
from durablesched.queues import KEEP, Keep, Rate
from durablesched.records import CancelOutcome
from durablesched.scheduler import Scheduler
from durablesched.states import TaskState

#: At most this many tasks in one bulk action.
BULK_LIMIT = 500
#: What a cancel achieved, in words.
CANCELLED = {
    CancelOutcome.CANCELLED: "cancelled: it had not started and never will",
    CancelOutcome.REQUESTED: "cancellation requested: it is running and was asked to stop",
    CancelOutcome.ENFORCED: "cancellation enforced: its process is stopped after the grace period",
    CancelOutcome.TOO_LATE: "too late: it had already finished",
}


class Refusal(Exception):
    """An action that cannot be done: its HTTP status and why, in one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Operations:
    """What the actions act on: the store, the scheduler over it, and the app's settings."""

    store: DashboardStore
    scheduler: Scheduler
    read_only: bool

    # -- tasks ----------------------------------------------------------------------------------

    def cancel(self, task_id: int) -> str:
        try:
            outcome = self.scheduler.cancel(task_id)
        except TaskNotFoundError as e:
            raise Refusal(404, str(e)) from None
        if outcome is CancelOutcome.TOO_LATE:  # say how it ended, as the CLI does
            record = self.store.get(task_id)
            if record is not None and record.state is TaskState.CANCELLED:
                raise Refusal(409, f"task {task_id}: already cancelled; nothing changed")
            ended = f" ({record.state})" if record is not None else ""
            raise Refusal(409, f"task {task_id}: too late: it had already finished{ended}")
        return f"task {task_id}: {CANCELLED[outcome]}"

    def retry(self, task_id: int, from_step: int | None = None) -> str:
        """A FAILED or CANCELLED task back to PENDING, due now: ``durablesched retry``;
        with ``from_step``, a workflow's steps from that position are forgotten first
        (``retry --from-step``: they run again, those before are kept)."""
        requeue: Callable[..., None] | None = getattr(self.store, "requeue", None)
        if requeue is None:
            raise Refusal(
                501, "this store cannot requeue tasks (the in-memory one has no operator)"
            )
        try:
            # One transaction: a refused requeue (another task holds the key, the task
            # is not FAILED or CANCELLED) forgets no step.
            requeue(task_id, self.scheduler.clock.now(), from_step)
        except TaskNotFoundError as e:
            raise Refusal(404, str(e)) from None
        except InvalidTransitionError as e:
            raise Refusal(409, str(e)) from None
        if from_step is not None:
            return f"task {task_id}: PENDING, due now; its steps from {from_step} on run again"
        return f"task {task_id}: PENDING, due now"

    def delete(self, task_id: int) -> str:
        try:
            self.store.delete_task(task_id)
        except TaskNotFoundError as e:
            raise Refusal(404, str(e)) from None
        except InvalidTransitionError as e:
            raise Refusal(409, str(e)) from None
        return f"task {task_id}: deleted"

    # -- queues ---------------------------------------------------------------------------------

    def _known_queue(self, name: str) -> None:
        if name not in {q.name for q in self.store.queue_limits()}:
            raise Refusal(404, f"no queue named {name!r}")

    def pause_queue(self, name: str) -> str:
        self._known_queue(name)
        self.scheduler.pause_queue(name)
        return f"queue {name}: paused"

    def resume_queue(self, name: str) -> str:
        self._known_queue(name)
        self.scheduler.resume_queue(name)
        return f"queue {name}: resumed"

    def set_limits(
        self,
        name: str,
        concurrency: str,
        rate: str,
        concurrency_per_key: str | None = None,
        rate_per_key: str | None = None,
    ) -> str:
        """A queue's limits from the form's fields: an empty field lifts its limit; a
        per-key field the form did not send leaves that limit as it is."""
        self._known_queue(name)
        limit = _whole("concurrency", concurrency)
        per_key: int | Keep | None = (
            KEEP
            if concurrency_per_key is None
            else _whole("concurrency per key", concurrency_per_key)
        )
        try:
            pace = Rate.parse(rate) if rate.strip() else None
            key_pace: Rate | Keep | None = (
                KEEP
                if rate_per_key is None
                else Rate.parse(rate_per_key)
                if rate_per_key.strip()
                else None
            )
            limits = self.scheduler.set_queue(
                name,
                concurrency=limit,
                rate=pace,
                concurrency_per_key=per_key,
                rate_per_key=key_pace,
            )
        except InvalidTaskError as e:
            raise Refusal(400, str(e)) from None
        shown = limits.concurrency if limits.concurrency is not None else "unlimited"
        said = f"queue {name}: concurrency {shown}, rate {limits.rate or 'unlimited'}"
        if limits.keyed:
            each = limits.concurrency_per_key or "unlimited"
            said += f"; per key: concurrency {each}, rate {limits.rate_per_key or 'unlimited'}"
        return said

    # -- schedules ------------------------------------------------------------------------------

    def pause_schedule(self, name: str) -> str:
        self._schedule(lambda: self.scheduler.pause_schedule(name))
        return f"schedule {name}: paused"

    def resume_schedule(self, name: str) -> str:
        self._schedule(lambda: self.scheduler.resume_schedule(name))
        return f"schedule {name}: resumed"

    def run_schedule(self, name: str) -> str:
        task_id = self._schedule(lambda: self.scheduler.run_schedule_now(name))
        return f"schedule {name}: made task {task_id}"

    def _schedule(self, call: Callable[[], object]) -> object:
        try:
            return call()
        except ScheduleNotFoundError as e:
            raise Refusal(404, str(e)) from None


def from_step(form: FormData) -> int | None:
    """The Retry form's ``from_step`` (a step's position, from 0), or None if left empty."""
    value = str(form.get("from_step") or "").strip()
    if not value:
        return None
    try:
        position = int(value)
    except ValueError:
        raise Refusal(400, f"from step must be a whole number, got {value!r}") from None
    if not 0 <= position <= 2**31 - 1:
        raise Refusal(400, f"from step must be 0 or more, got {position}")
    return position


#: Each task action by its name in the URL and the bulk form.
TASK_ACTIONS: dict[str, Callable[[Operations, int], str]] = {
    "cancel": Operations.cancel,
    "retry": Operations.retry,
    "delete": Operations.delete,
}


async def checked_form(request: Request, ops: Operations) -> FormData:
    """The posted form, after the read-only, origin and CSRF checks (a Refusal if one fails)."""
    if ops.read_only:
        raise Refusal(403, "the dashboard is read-only: actions are refused")
    refused = cross_site(request.scope)
    if refused is not None:
        raise Refusal(403, refused)
    form = await request.form()
    given = form.get(CSRF_FIELD)
    if not isinstance(given, str) or not same(given, request.state.csrf):
        raise Refusal(403, "refused: the form's CSRF token is missing or stale; reload the page")
    return form


async def run_action(
    request: Request, ops: Operations, action: Callable[[FormData], str]
) -> Response:
    """Check, act, and answer as the caller asked (JSON for the script, 303 for a form)."""
    fetch = header(request.scope, b"x-requested-with") == "fetch"
    try:
        form = await checked_form(request, ops)
        message = await run_in_threadpool(action, form)
    except Refusal as e:
        return _refused(request, e.status, str(e), fetch=fetch)
    except DurableSchedError as e:
        return _refused(request, 409, f"{type(e).__name__}: {e}", fetch=fetch)
    if fetch:
        return JSONResponse({"message": message})
    back = safe_next(str(form.get("next") or "/"))
    separator = "&" if "?" in back else "?"
    return RedirectResponse(
        f"{request.scope.get('root_path', '')}{back}{separator}{urlencode({'done': 'ok'})}",
        status_code=303,
    )


def _refused(request: Request, status: int, message: str, *, fetch: bool) -> Response:
    if fetch:
        return JSONResponse({"error": message}, status_code=status)
    templates = request.app.state.templates
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request, "error.html", {"status": status, "message": message}, status_code=status
    )


def task_ids(form: FormData) -> list[int]:
    """The ticked tasks of a bulk form (at most :data:`BULK_LIMIT`)."""
    ids: list[int] = []
    for value in form.getlist("ids"):
        try:
            ids.append(read_id(str(value)))
        except BadFilter as e:
            raise Refusal(400, str(e)) from None
    if not ids:
        raise Refusal(400, "no task was ticked")
    if len(ids) > BULK_LIMIT:
        raise Refusal(400, f"at most {BULK_LIMIT} tasks at once, got {len(ids)}")
    return ids


def bulk(ops: Operations, action: str, ids: list[int]) -> str:
    """One action on many tasks: each done or refused alone; says how many of each."""
    act = TASK_ACTIONS.get(action)
    if act is None:
        raise Refusal(400, f"unknown action {action!r}: cancel, retry or delete")
    done, refused = 0, []
    for task_id in ids:
        try:
            act(ops, task_id)
            done += 1
        except Refusal as e:
            refused.append(str(e))
    message = f"{action}: {done} of {len(ids)} task(s) done"
    if refused:
        message += f"; {len(refused)} refused (the first: {refused[0]})"
    return message


def _whole(what: str, text: str) -> int | None:
    """A form's whole number (None if empty), or a refusal naming the field."""
    if not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise Refusal(400, f"{what} must be a whole number, got {text!r}") from None
