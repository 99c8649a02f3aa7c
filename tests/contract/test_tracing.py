"""OpenTelemetry tracing on every backend: the submit's context stored with the task, the
attempt's span linked to it, with its attributes and outcome (docs/tracing.md).

Spans are recorded by the SDK's in-memory exporter through a simple (synchronous)
processor: a span is in the exporter the moment it ends. Nothing sleeps: the clock
is the manual one, and threads are waited for with bounded waits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

from durablesched import (
    CancelOutcome,
    InvalidTaskError,
    ManualClock,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskRegistry,
    TaskState,
    Worker,
    otel,
)
from durablesched.records import TRACE
from durablesched.tracing import tracing_hook

from ..conftest import WAIT, BackendStore

RETRY = RetryPolicy(max_attempts=2, initial=timedelta(minutes=1), jitter=0)


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    try:
        yield provider, exporter
    finally:
        otel.uninstrument()
        provider.shutdown()


@pytest.fixture
def exporter(provider: tuple[TracerProvider, InMemorySpanExporter]) -> InMemorySpanExporter:
    return provider[1]


@pytest.fixture
def app_tracer(provider: tuple[TracerProvider, InMemorySpanExporter]) -> trace.Tracer:
    """The application's own tracer, on the same provider."""
    return provider[0].get_tracer("app")


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = named(exporter, name)
    return span


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def linked(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]


def test_the_attempt_links_to_the_submit_made_inside_the_callers_span(
    store: BackendStore,
    scheduler: Scheduler,
    registry: TaskRegistry,
    exporter: InMemorySpanExporter,
    app_tracer: trace.Tracer,
) -> None:
    seen: list[tuple[dict[str, Any], int]] = []

    @registry.task("mail.send", queue="mail")
    def send(**kwargs: Any) -> None:
        current = trace.get_current_span().get_span_context()
        seen.append((kwargs, current.span_id))

    with app_tracer.start_as_current_span("request") as request:
        task_id = scheduler.submit("mail.send", {"to": "a@example.com"})
    assert Worker(scheduler, owner="w1").run_due() == 1

    submit = one(exporter, "durablesched submit mail.send")
    assert submit.kind is SpanKind.PRODUCER
    assert parent_id(submit) == request.get_span_context().span_id
    assert dict(submit.attributes or {}) == {
        "messaging.system": "durablesched",
        "messaging.operation.type": "send",
        "messaging.operation.name": "submit",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(task_id),
        "durablesched.task.name": "mail.send",
        "durablesched.task.id": task_id,
        "durablesched.task.created": True,
    }

    run = one(exporter, "durablesched run mail.send")
    assert run.kind is SpanKind.CONSUMER
    # Linked, not parented (the default): a trace of its own.
    assert linked(run) == [span_id(submit)]
    assert run.parent is None
    assert dict(run.attributes or {}) == {
        "messaging.system": "durablesched",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(task_id),
        "messaging.client.id": "w1",
        "durablesched.task.id": task_id,
        "durablesched.task.name": "mail.send",
        "durablesched.task.attempt": 1,
        "durablesched.task.max_attempts": 5,
        "durablesched.task.outcome": "succeeded",
    }
    assert run.status.status_code is StatusCode.UNSET
    # The task saw its own arguments only, with its attempt's span current.
    assert seen == [({"to": "a@example.com"}, span_id(run))]
    # Stored apart from the arguments: every read shows the arguments as submitted.
    record = scheduler.get(task_id)
    assert record.args == {"to": "a@example.com"}
    assert record.trace is not None and record.trace["traceparent"].startswith("00-")
    assert f"{span_id(submit):016x}" in record.trace["traceparent"]
    assert scheduler.list_tasks()[0].args == {"to": "a@example.com"}


def test_with_parent_the_attempt_is_the_child_of_the_submit_too(
    scheduler: Scheduler,
    registry: TaskRegistry,
    provider: tuple[TracerProvider, InMemorySpanExporter],
    exporter: InMemorySpanExporter,
) -> None:
    otel.instrument(provider[0], parent=True)
    registry.task("job")(lambda: None)
    scheduler.submit("job")
    Worker(scheduler).run_due()
    submit = one(exporter, "durablesched submit job")
    run = one(exporter, "durablesched run job")
    assert parent_id(run) == span_id(submit)
    assert linked(run) == [span_id(submit)]
    assert run.context is not None and submit.context is not None
    assert run.context.trace_id == submit.context.trace_id


def test_an_attempt_never_takes_the_running_threads_span_as_its_parent(
    scheduler: Scheduler,
    registry: TaskRegistry,
    exporter: InMemorySpanExporter,
    app_tracer: trace.Tracer,
) -> None:
    registry.task("job")(lambda: None)
    with app_tracer.start_as_current_span("before"):
        scheduler.submit("job")
    with app_tracer.start_as_current_span("a test running due tasks"):
        Worker(scheduler).run_due()
    run = one(exporter, "durablesched run job")
    assert run.parent is None
    assert linked(run) == [span_id(one(exporter, "durablesched submit job"))]


def test_a_failure_records_its_exception_and_a_retry_is_a_second_attempt_span(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, exporter: InMemorySpanExporter
) -> None:
    @registry.task("flaky", retry=RETRY)
    def flaky() -> None:
        raise RuntimeError("down")

    task_id = scheduler.submit("flaky")
    worker = Worker(scheduler)
    assert worker.run_due() == 1
    clock.advance(timedelta(minutes=1))
    assert worker.run_due() == 1
    assert scheduler.get(task_id).state is TaskState.FAILED

    submit = one(exporter, "durablesched submit flaky")
    first, second = named(exporter, "durablesched run flaky")
    for span, attempt, outcome in ((first, 1, "retry"), (second, 2, "failed")):
        attributes = span.attributes or {}
        assert attributes["durablesched.task.attempt"] == attempt
        assert attributes["durablesched.task.outcome"] == outcome
        assert attributes["error.type"] == "builtins.RuntimeError"
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "builtins.RuntimeError: down"
        (event,) = span.events
        assert event.name == "exception"
        event_attributes = event.attributes or {}
        assert event_attributes["exception.type"] == "builtins.RuntimeError"
        assert event_attributes["exception.message"] == "down"
        assert "RuntimeError: down" in str(event_attributes["exception.stacktrace"])
        assert linked(span) == [span_id(submit)]  # each attempt links to the one submit


def test_an_outcome_refused_for_a_lost_lease_says_so(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, exporter: InMemorySpanExporter
) -> None:
    started, release = threading.Event(), threading.Event()

    @registry.task("slow", retry=RETRY)
    def slow() -> str:
        started.set()
        release.wait(WAIT)
        return "late"

    task_id = scheduler.submit("slow")
    mine = Worker(scheduler, owner="mine", lease=30)
    other = Worker(scheduler, owner="other", lease=30)
    try:
        assert mine.run_once(clock.now()) == 1
        assert started.wait(WAIT)
        clock.advance(timedelta(seconds=31))  # no heartbeat ran: the lease lapsed
        assert other.reclaim(clock.now()) == 1
        release.set()
        assert mine.wait_idle(WAIT)
    finally:
        release.set()
        assert mine.stop(WAIT)
    assert scheduler.get(task_id).state is TaskState.RETRY_WAIT
    run = one(exporter, "durablesched run slow")
    attributes = run.attributes or {}
    assert attributes["durablesched.task.outcome"] == "lease_lost"
    assert attributes["error.type"] == "durablesched.LeaseExpired"
    assert attributes["messaging.client.id"] == "mine"
    assert run.status.status_code is StatusCode.ERROR
    assert run.events == ()  # it raised nothing: its success came too late


def test_an_acknowledged_cancel_is_cancelled_and_no_error(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, exporter: InMemorySpanExporter
) -> None:
    started = threading.Event()

    @registry.task("long", pass_context=True)
    def long(ctx: TaskContext) -> None:
        started.set()
        ctx.wait_for_cancel(WAIT)
        ctx.raise_if_cancelled()

    task_id = scheduler.submit("long")
    worker = Worker(scheduler)
    try:
        assert worker.run_once(clock.now()) == 1
        assert started.wait(WAIT)
        assert scheduler.cancel(task_id) is CancelOutcome.REQUESTED
        assert worker.wait_idle(WAIT)
    finally:
        assert worker.stop(WAIT)
    run = one(exporter, "durablesched run long")
    assert (run.attributes or {})["durablesched.task.outcome"] == "cancelled"
    assert run.status.status_code is StatusCode.UNSET
    assert "error.type" not in (run.attributes or {})


def test_a_claim_given_back_at_shutdown_is_released(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, exporter: InMemorySpanExporter
) -> None:
    started, release = threading.Event(), threading.Event()

    @registry.task("stubborn")
    def stubborn() -> None:
        started.set()
        release.wait(WAIT)

    task_id = scheduler.submit("stubborn")
    worker = Worker(scheduler)
    try:
        assert worker.run_once(clock.now()) == 1
        assert started.wait(WAIT)
        assert worker.shutdown(grace=0) == 1
    finally:
        release.set()
    # It ends later, its outcome refused (the claim was given back): the store is left
    # alone before the test ends, and the span keeps its first end.
    assert worker.wait_idle(WAIT)
    assert scheduler.get(task_id).state is TaskState.PENDING
    run = one(exporter, "durablesched run stubborn")
    assert (run.attributes or {})["durablesched.task.outcome"] == "released"


def test_a_child_task_links_to_the_attempt_that_submitted_it(
    scheduler: Scheduler, registry: TaskRegistry, exporter: InMemorySpanExporter
) -> None:
    @registry.task("parent", pass_context=True)
    def parent(ctx: TaskContext) -> None:
        ctx.submit("child", {"n": 1})

    registry.task("child")(lambda n: n)
    scheduler.submit("parent")
    assert Worker(scheduler).run_due() == 2
    parent_run = one(exporter, "durablesched run parent")
    child_run = one(exporter, "durablesched run child")
    assert linked(child_run) == [span_id(parent_run)]


def test_submit_many_is_one_span_whose_context_every_task_carries(
    scheduler: Scheduler, registry: TaskRegistry, exporter: InMemorySpanExporter
) -> None:
    registry.task("item")(lambda i=0: i)
    ids = scheduler.submit_many("item", [{"i": 1}, None, {"i": 3}])
    assert Worker(scheduler, concurrency=1).run_due() == 3
    submit = one(exporter, "durablesched submit item")
    attributes = submit.attributes or {}
    assert attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in attributes
    runs = named(exporter, "durablesched run item")
    assert sorted(int(str((r.attributes or {})["durablesched.task.id"])) for r in runs) == ids
    assert all(linked(r) == [span_id(submit)] for r in runs)
    assert [scheduler.get(i).args for i in ids] == [{"i": 1}, {}, {"i": 3}]


def test_an_async_task_runs_inside_its_attempts_span(
    scheduler: Scheduler, registry: TaskRegistry, exporter: InMemorySpanExporter
) -> None:
    seen: list[int] = []

    @registry.task("coro")
    async def coro() -> None:
        seen.append(trace.get_current_span().get_span_context().span_id)

    scheduler.submit("coro")
    Worker(scheduler).run_due()
    assert seen == [span_id(one(exporter, "durablesched run coro"))]


def test_the_submitters_baggage_reaches_the_task(
    scheduler: Scheduler, registry: TaskRegistry, app_tracer: trace.Tracer
) -> None:
    seen: list[object] = []
    registry.task("job")(lambda: seen.append(baggage.get_baggage("tenant")))
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with app_tracer.start_as_current_span("request"):
            scheduler.submit("job")
    finally:
        otel_context.detach(token)
    Worker(scheduler).run_due()
    assert seen == ["acme"]


def test_a_key_already_held_stores_nothing_new_and_says_so(
    scheduler: Scheduler, registry: TaskRegistry, exporter: InMemorySpanExporter
) -> None:
    registry.task("job")(lambda: None)
    first = scheduler.submit("job", key="k")
    assert scheduler.submit("job", key="k") == first
    spans = named(exporter, "durablesched submit job")
    assert [(s.attributes or {})["durablesched.task.created"] for s in spans] == [True, False]


def test_without_a_recording_tracer_nothing_is_stored(
    scheduler: Scheduler, registry: TaskRegistry
) -> None:
    """A no-op provider (the API without an SDK): spans cost next to nothing and no
    context is stored (there is none to store)."""
    otel.instrument(NoOpTracerProvider())
    registry.task("job")(lambda: None)
    task_id = scheduler.submit("job", {})
    assert scheduler.get(task_id).trace is None
    assert Worker(scheduler).run_due() == 1


def test_uninstrument_stops_tracing(
    scheduler: Scheduler, registry: TaskRegistry, exporter: InMemorySpanExporter
) -> None:
    registry.task("job")(lambda: None)
    assert otel.is_instrumented()
    otel.uninstrument()
    assert not otel.is_instrumented() and tracing_hook.tracer is None
    task_id = scheduler.submit("job")
    Worker(scheduler).run_due()
    assert exporter.get_finished_spans() == ()
    assert scheduler.get(task_id).trace is None


def test_a_users_argument_cannot_take_the_reserved_name(
    scheduler: Scheduler, registry: TaskRegistry
) -> None:
    registry.task("job")(lambda **kwargs: None)
    with pytest.raises(InvalidTaskError, match=r"'\*trace' is reserved: durablesched stores"):
        scheduler.submit("job", {TRACE: {"traceparent": "00-forged"}})
    with pytest.raises(InvalidTaskError, match=r"'\*trace' is reserved"):
        scheduler.submit_many("job", [{}, {TRACE: {}}])
    assert scheduler.list_tasks() == []


def test_an_attempt_in_a_child_process_is_traced_by_the_worker(
    scheduler: Scheduler, registry: TaskRegistry, clock: ManualClock, exporter: InMemorySpanExporter
) -> None:
    """The child sends back its error (as stored) and its children (with the context it
    inherited): the worker's span records both."""

    @registry.task("forked", pass_context=True, environment="process", retry=RETRY)
    def forked(ctx: TaskContext) -> None:
        ctx.submit("after")
        if ctx.attempt == 1:
            raise ValueError("child says no")

    registry.task("after")(lambda: None)
    scheduler.submit("forked")
    worker = Worker(scheduler)
    assert worker.run_due() == 1  # the first attempt fails: its child is not stored
    run = one(exporter, "durablesched run forked")
    attributes = run.attributes or {}
    assert (attributes["durablesched.task.outcome"], attributes["error.type"]) == (
        "retry",
        "builtins.ValueError",
    )
    (event,) = run.events
    assert "child says no" in str((event.attributes or {})["exception.stacktrace"])

    clock.advance(timedelta(minutes=1))
    assert worker.run_due() == 2  # the second succeeds, and its child runs
    second = named(exporter, "durablesched run forked")[1]
    assert (second.attributes or {})["durablesched.task.outcome"] == "succeeded"
    assert linked(one(exporter, "durablesched run after")) == [span_id(second)]
