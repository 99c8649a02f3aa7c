"""Django's enqueue() traced (docs/tracing.md): the submit's context is stored with the task,
and neither the TaskResult nor the admin page shows it among the arguments."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

from durablesched import otel
from durablesched.contrib.django.database import store_for
from durablesched.records import TRACE
from tests_django.conftest import work
from tests_django.testapp.tasks import send

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    try:
        yield provider, exporter
    finally:
        otel.uninstrument()
        provider.shutdown()


def test_enqueue_stores_its_context_and_the_result_shows_only_the_arguments(
    alias: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    with provider.get_tracer("view").start_as_current_span("POST /signup"):
        result = send.using(backend=alias).enqueue("a@example.com", subject="hi")
    with store_for(alias).engine.connect() as conn:
        stored = conn.execute(text("SELECT args FROM tasks WHERE id = :id"), {"id": int(result.id)})
        raw = stored.scalar_one()
    assert TRACE in (raw if isinstance(raw, dict) else json.loads(raw))
    read = send.using(backend=alias).get_result(result.id)
    assert (read.args, read.kwargs) == (["a@example.com"], {"subject": "hi"})

    work(alias, "--queue", "emails")
    finished = {s.name: s for s in exporter.get_finished_spans()}
    submit = finished["durablesched submit tests_django.testapp.tasks.send"]
    run = finished["durablesched run tests_django.testapp.tasks.send"]
    assert submit.parent is not None
    assert submit.parent.span_id == finished["POST /signup"].context.span_id  # type: ignore[union-attr]
    assert [link.context.span_id for link in run.links] == [submit.context.span_id]  # type: ignore[union-attr]
    assert (run.attributes or {})["durablesched.task.outcome"] == "succeeded"


def test_the_admin_page_shows_the_arguments_without_the_context(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    with store_for("default").engine.begin() as conn:
        for table in ("task_events", "idempotency_keys", "tasks"):
            conn.execute(text(f"DELETE FROM {table}"))
    provider, _ = spans
    with provider.get_tracer("view").start_as_current_span("POST /signup"):
        result = send.using(backend="default").enqueue("a@example.com")
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    page = client.get(f"/admin/durablesched/task/{result.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "a@example.com" in html
    assert "*trace" not in html and "traceparent" not in html
