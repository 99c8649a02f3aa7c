"""The queue's tables as Django sees them, read-only, for the admin page (admin.py).

Unmanaged models over durablesched's own ``tasks`` and ``task_events``
(docs/schema.md): Django never creates, migrates or flushes them, and nothing
here writes them; the queue's own code does. The module also makes Django send
this app ``post_migrate`` (apps.py), which it does only for apps with models.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class Task(models.Model):
    """A row of ``tasks``: one task, as durablesched stores it."""

    id = models.BigIntegerField(primary_key=True)
    seq = models.BigIntegerField()
    name = models.TextField()
    args = models.JSONField()
    state = models.TextField()
    due_at = models.DateTimeField()
    attempts = models.IntegerField()
    max_attempts = models.IntegerField()
    lease_owner = models.TextField(null=True)
    lease_expires_at = models.DateTimeField(null=True)
    fence = models.IntegerField()
    cancel_requested_at = models.DateTimeField(null=True)
    result = models.JSONField(null=True)
    last_error = models.JSONField(null=True)
    idempotency_key = models.TextField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    environment = models.TextField(null=True)
    queue = models.TextField()
    priority = models.IntegerField()

    class Meta:
        managed = False
        db_table = "tasks"
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"task {self.id} ({self.name})"


class TaskEvent(models.Model):
    """A row of ``task_events``: one line of a task's history."""

    id = models.BigIntegerField(primary_key=True)
    task = models.ForeignKey(
        Task, on_delete=models.DO_NOTHING, db_column="task_id", related_name="events"
    )
    at = models.DateTimeField()
    state = models.TextField()
    attempt = models.IntegerField()
    detail = models.TextField(null=True)
    error = models.JSONField(null=True)

    class Meta:
        managed = False
        db_table = "task_events"
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.state} at {self.at}"

    @property
    def error_type(self) -> Any:
        return (self.error or {}).get("type")
