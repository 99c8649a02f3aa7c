"""OpenTelemetry tracing: a span around each submit, and one per attempt (docs/tracing.md).

Needs the ``otel`` extra (``pip install 'durablesched[otel]'``, which brings
``opentelemetry-api``; an SDK and an exporter are the application's choice).
``import durablesched`` never imports this module, nor OpenTelemetry: until
:func:`instrument` is called, nothing is traced and nothing is stored.

* **Submit** (``Scheduler.submit``, ``submit_info``, ``submit_many``, Django's
  ``enqueue``): a span of kind PRODUCER, ``durablesched submit <task name>``, a
  child of the caller's current span. Its context goes into each task (under
  ``"*trace"`` in the stored arguments, through the global propagator: W3C
  ``traceparent`` and ``tracestate``, and baggage) and is stored with it.
* **Attempt**: a span of kind CONSUMER, ``durablesched run <task name>``, from
  the moment a task thread starts it to the moment its outcome is committed
  (or known lost), with a *link* to the submit's span; with
  ``instrument(parent=True)`` it is also that span's child. It is the current
  span while the task runs, so what the task traces is part of it, and a child
  task it submits carries its context.

The span names follow the OpenTelemetry messaging conventions' shape
(``<operation> <what>``) with the task name for the ``what``: a task name is
low-cardinality and says more than a queue's name. The attributes are listed in
docs/tracing.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from durablesched.errors import ConfigurationError
from durablesched.records import Claim, ErrorInfo, NewTask, Submitted
from durablesched.tracing import FAILED, LEASE_LOST, RETRY, install, tracing_hook, with_trace

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.util.types import AttributeValue
except ImportError:  # pragma: no cover - the extra is installed wherever tests run
    raise ConfigurationError(
        "durablesched.otel needs opentelemetry-api: pip install 'durablesched[otel]'"
    ) from None

__all__ = ["instrument", "is_instrumented", "uninstrument"]

#: The ``messaging.system`` of every span.
SYSTEM = "durablesched"
#: The ``error.type`` of an attempt whose outcome was refused with no error of its own:
#: its lease had expired (the error the reclaim records).
LEASE_EXPIRED = "durablesched.LeaseExpired"
#: The outcomes an attempt's span marks as an error (status ERROR, ``error.type`` set).
FAILURES = frozenset({RETRY, FAILED, LEASE_LOST})


def instrument(
    tracer_provider: trace.TracerProvider | None = None, *, parent: bool = False
) -> None:
    """Trace every submit and attempt of this process from now on (an earlier call's
    settings are replaced).

    ``tracer_provider`` is the provider to take the tracer from (by default the
    global one, as ``opentelemetry.trace.set_tracer_provider`` sets it, even later).
    With ``parent``, an attempt's span is the child of the submit's span, in the
    same trace, besides linking to it; by default it starts a trace of its own
    and only links to it (docs/tracing.md says why).
    """
    tracer = trace.get_tracer(
        "durablesched",
        _version(),
        tracer_provider=tracer_provider,
        schema_url="https://opentelemetry.io/schemas/1.26.0",
    )
    install(OTelTracer(tracer, parent=parent))


def uninstrument() -> None:
    """Trace nothing from now on. Attempts already running end their spans as usual."""
    if isinstance(tracing_hook.tracer, OTelTracer):
        install(None)


def is_instrumented() -> bool:
    """True between :func:`instrument` and :func:`uninstrument`."""
    return isinstance(tracing_hook.tracer, OTelTracer)


def _version() -> str:
    try:
        return package_version("durablesched")
    except PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"


class OTelTracer:
    """The :class:`durablesched.tracing.Tracer` that makes OpenTelemetry spans."""

    def __init__(self, tracer: trace.Tracer, *, parent: bool = False) -> None:
        self._tracer = tracer
        self._parent = parent

    def submit(
        self,
        name: str,
        build: Callable[[], list[NewTask]],
        store: Callable[[list[NewTask]], list[Submitted]],
        *,
        batch: bool,
    ) -> list[Submitted]:
        attributes: dict[str, AttributeValue] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "submit",
            "durablesched.task.name": name,
        }
        with self._tracer.start_as_current_span(
            f"durablesched submit {name}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            tasks = build()
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier:
                tasks = [with_trace(task, carrier) for task in tasks]
            submitted = store(tasks)
            if span.is_recording() and tasks:
                # One call: the SDK checks and locks per call, not per attribute.
                if batch:
                    span.set_attributes(
                        {
                            "messaging.destination.name": tasks[0].queue,
                            "messaging.batch.message_count": len(tasks),
                        }
                    )
                else:
                    (one,) = submitted
                    span.set_attributes(
                        {
                            "messaging.destination.name": tasks[0].queue,
                            "messaging.message.id": str(one.task_id),
                            "durablesched.task.id": one.task_id,
                            "durablesched.task.created": one.created,
                        }
                    )
            return submitted

    def carry(self, task: NewTask) -> NewTask:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return with_trace(task, carrier)

    def attempt(self, claim: Claim, owner: str) -> AttemptSpan:
        # The submitter's context (baggage included), or nothing: never the context of
        # the thread that happens to run the attempt (a test's, or a request's).
        submitted = propagate.extract(claim.trace) if claim.trace else otel_context.Context()
        creation = trace.get_current_span(submitted).get_span_context()
        links = [Link(creation)] if creation.is_valid else None
        if self._parent:
            start_in = submitted
        else:
            start_in = trace.set_span_in_context(trace.INVALID_SPAN, submitted)
        attributes: dict[str, AttributeValue] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "run",
            "messaging.destination.name": claim.queue,
            "messaging.message.id": str(claim.task_id),
            "messaging.client.id": owner,
            "durablesched.task.id": claim.task_id,
            "durablesched.task.name": claim.name,
            "durablesched.task.attempt": claim.attempt,
            "durablesched.task.max_attempts": claim.max_attempts,
        }
        span = self._tracer.start_span(
            f"durablesched run {claim.name}",
            context=start_in,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        return AttemptSpan(span, trace.set_span_in_context(span, submitted))


class AttemptSpan:
    """One attempt's span: current while the task runs, ended once with its outcome."""

    __slots__ = ("_context", "_ended", "_lock", "span")

    def __init__(self, span: trace.Span, context: otel_context.Context) -> None:
        self.span = span
        self._context = context
        self._lock = threading.Lock()
        self._ended = False

    @contextmanager
    def running(self) -> Iterator[trace.Span]:
        token = otel_context.attach(self._context)
        try:
            yield self.span
        finally:
            otel_context.detach(token)

    def end(self, outcome: str, error: ErrorInfo | None = None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        span = self.span
        if span.is_recording():
            failed = outcome in FAILURES
            attributes: dict[str, AttributeValue] = {"durablesched.task.outcome": outcome}
            if failed:
                attributes["error.type"] = error.type if error else LEASE_EXPIRED
            span.set_attributes(attributes)
            if error is not None:
                # The exception as OpenTelemetry records one, from what the worker stores
                # (an attempt in a child process sends only that).
                span.add_event(
                    "exception",
                    {
                        "exception.type": error.type,
                        "exception.message": error.message,
                        "exception.stacktrace": error.traceback,
                    },
                )
            if failed:
                if error is not None:
                    description = f"{error.type}: {error.message}"
                else:
                    description = "lease lost: another worker reclaimed the task"
                span.set_status(Status(StatusCode.ERROR, description))
        span.end()
