"""A read-only admin page of the queue's tasks: filtered lists, and each task's history
and errors. Loaded by Django's admin when ``django.contrib.admin`` is installed.

Nothing can be added, changed or deleted here: the queue's rows change only
through durablesched (a worker, ``cancel``, the CLI). The rows are read from
the database of the project's durablesched backend (``TASKS["default"]`` if it
is one, else the first that is).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.tasks import task_backends
from django.utils.html import format_html, format_html_join

from durablesched.contrib.django.backend import DurableSchedBackend
from durablesched.contrib.django.models import Task, TaskEvent
from durablesched.records import split_trace


def queue_database() -> str:
    """The Django database alias holding the tasks the admin shows."""
    backends = [b for b in task_backends.all() if isinstance(b, DurableSchedBackend)]
    chosen = next((b for b in backends if b.alias == "default"), backends[0] if backends else None)
    return chosen.database if chosen is not None else "default"


if TYPE_CHECKING:  # the admin's classes are generic to the type checker only
    EventInline = admin.TabularInline[TaskEvent, Task]
    TaskModelAdmin = admin.ModelAdmin[Task]
else:
    EventInline = admin.TabularInline
    TaskModelAdmin = admin.ModelAdmin


class ReadOnly:
    """No add, change or delete: view only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TaskEventInline(ReadOnly, EventInline):
    model = TaskEvent
    fk_name = "task"
    extra = 0
    can_delete = False
    verbose_name = "history line"
    verbose_name_plural = "history"
    fields = ("at", "state", "attempt", "detail", "error_type")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskEvent]:
        return super().get_queryset(request).using(queue_database())


@admin.register(Task)
class TaskAdmin(ReadOnly, TaskModelAdmin):
    list_display = ("id", "name", "state", "queue", "priority", "attempts", "due_at", "finished_at")
    list_filter = ("state", "queue", "name")
    search_fields = ("name", "idempotency_key")
    inlines = (TaskEventInline,)
    fields = (
        ("id", "name"),
        ("state", "queue", "priority"),
        ("attempts", "max_attempts"),
        ("created_at", "due_at", "finished_at"),
        ("lease_owner", "lease_expires_at", "cancel_requested_at"),
        "arguments",
        "result",
        "errors",
        "idempotency_key",
    )
    readonly_fields = (
        "id", "name", "state", "queue", "priority", "attempts", "max_attempts", "created_at",
        "due_at", "finished_at", "lease_owner", "lease_expires_at", "cancel_requested_at",
        "arguments", "result", "errors", "idempotency_key",
    )  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        return super().get_queryset(request).using(queue_database())

    @admin.display(description="args")
    def arguments(self, task: Task) -> str:
        """The arguments as submitted: without the trace context stored beside them."""
        args, _ = split_trace(task.args if isinstance(task.args, dict) else {})
        return json.dumps(args, ensure_ascii=False)

    @admin.display(description="errors (one per failed attempt)")
    def errors(self, task: Task) -> str:
        failed = task.events.using(queue_database()).filter(error__isnull=False).order_by("id")
        rows = [
            (e.attempt, error.get("type", ""), error.get("traceback") or error.get("message"))
            for e in failed
            if (error := e.error) is not None  # the filter's promise, to the type checker
        ]
        if not rows and task.last_error:
            error = task.last_error
            rows = [(task.attempts, error.get("type", ""), error.get("traceback") or "")]
        if not rows:
            return "none"
        return format_html(
            "<div>{}</div>",
            format_html_join("", "<p>attempt {}: <strong>{}</strong></p><pre>{}</pre>", rows),
        )
