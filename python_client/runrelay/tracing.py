"""OpenTelemetry tracing: one trace from a run's enqueue to the consumer's receipt.

    client = Client(pool, tracing=True)        # the global TracerProvider
    client = Client(pool, tracing=provider)    # or this one
    client.enqueue_run("r1", queue="email")    # span "runrelay enqueue email"
    Worker(client, handler).run()              # span "runrelay run email" per attempt
    Relay(client, WebhookSink(url)).run()      # span "runrelay deliver lifecycle" per batch

A tracing client's enqueue opens a PRODUCER span and gives the run that
span's W3C trace context, which the database keeps with the run
(runs.trace_context). A Worker or AsyncWorker on a tracing client reads it in
the statement of its claim and runs each handler attempt in a CONSUMER span
whose parent it is, so retries, waits and resumes of one run all hang off
the same trace; a Relay does the same for each delivered batch (a PRODUCER
span), and hands the delivery span's context to the sink
(runrelay.sinks.trace_headers): WebhookSink sends it as `traceparent` /
`tracestate` headers, so the consumer's own span joins the trace, and
JsonLinesSink writes it into each line. docs/operations.md ("Tracing") has
the span names and attributes and the SQL mechanism for other languages.

Tracing adds no round trip, and a client without tracing sends exactly the
statements it always sends. This module needs opentelemetry-api (the
`runrelay[tracing]` extra); nothing else in the package imports it, so
tracing off costs nothing and needs nothing installed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import sinks
from .types import ClaimedAttempt, LedgerEvent

SYSTEM = "runrelay"
# Only W3C Trace Context travels with a run (traceparent, tracestate): the
# shape the database checks, whatever propagators the application set up.
_PROPAGATOR = TraceContextTextMapPropagator()


def _version() -> str:
    try:
        return version("runrelay")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "unknown"


def current_trace_context(context: Context | None = None) -> dict[str, str] | None:
    """The W3C trace context of `context` (default: the current one) as a
    run keeps it, {"traceparent": ..., "tracestate"?: ...}; None without a
    valid span. Pass it as `EnqueueItem(..., trace_context=...)` to give a
    run of a bulk enqueue its own parent."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier or None


def parent_context(trace_context: Mapping[str, Any] | None) -> Context:
    """The context whose (remote) span is a run's stored trace context; an
    empty one, so a new trace starts, when there is none."""
    if not trace_context:
        return Context()
    carrier = {k: v for k, v in trace_context.items() if isinstance(v, str)}
    return _PROPAGATOR.extract(carrier, context=Context())


class RunSpan:
    """The span of one handler attempt: started before the handler, the
    current span while it runs (the handler's own spans are its children),
    ended once the attempt's outcome is written. end() is idempotent and
    thread-safe: a run handed back at shutdown may be ended by the stopping
    worker while its handler still runs."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._lock = threading.Lock()
        self._ended = False

    @contextmanager
    def current(self) -> Iterator[None]:
        with trace.use_span(
            self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield

    def end(self, outcome: Any, failure: BaseException | None = None) -> None:
        """End the span: `outcome` is what the write answered (None: no
        write answered, an error); `failure` the handler's exception (or its
        on_waiting step's), recorded with an error status."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        if outcome is None:
            self.span.set_status(Status(StatusCode.ERROR, "the attempt's outcome was not written"))
        else:
            self.span.set_attribute("runrelay.outcome", str(outcome))
        if failure is not None:
            self.span.record_exception(failure)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"))
        self.span.end()


class Tracing:
    """The spans of a tracing client and of the loops on it. Made by
    `Client(..., tracing=...)`; the loops find it as `client.tracing`."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        # Without a provider, the global one, looked up at each span (a
        # provider installed after this client was made is used too).
        self.tracer = trace.get_tracer("runrelay", _version(), tracer_provider=tracer_provider)

    # -- producers -------------------------------------------------------------
    @contextmanager
    def enqueue(
        self, function: str, values: Mapping[str, Any]
    ) -> Iterator[tuple[Span, dict[str, str] | None]]:
        """The PRODUCER span of one enqueue_run or enqueue_runs call, current
        for the call, and its trace context, which the runs keep; an
        exception is recorded on it and passes on."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
        }
        if function == "enqueue_run":
            queues = {values["queue"]}
            attributes["runrelay.run_id"] = values["run_id"]
        else:
            items = values["items"]
            queues = {item.get("queue", "default") for item in items}
            attributes["messaging.batch.message_count"] = len(items)
        name = "runrelay enqueue"
        if len(queues) == 1:
            (queue,) = queues
            name = f"{name} {queue}"
            attributes["messaging.destination.name"] = queue
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield span, current_trace_context()

    @staticmethod
    def enqueued(span: Span, result: Any) -> None:
        """What the enqueue answered: whether the run was created (a repeat
        keeps the trace context it was created with), or how many were."""
        if isinstance(result, list):
            span.set_attribute("runrelay.created_count", sum(r.created for r in result))
        else:
            span.set_attribute("runrelay.created", bool(result.created))

    # -- workers ---------------------------------------------------------------
    def run(self, attempt: ClaimedAttempt, worker: str) -> RunSpan:
        """Start the CONSUMER span of one handler attempt, its parent the
        run's trace context."""
        span = self.tracer.start_span(
            f"runrelay run {attempt.queue}",
            context=parent_context(attempt.trace_context),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": attempt.queue,
                "runrelay.run_id": attempt.run_id,
                "runrelay.attempt": attempt.attempt,
                "runrelay.worker": worker,
            },
        )
        return RunSpan(span)

    # -- relays ----------------------------------------------------------------
    @contextmanager
    def deliver(self, lane: str, events: Sequence[LedgerEvent], relay: str) -> Iterator[Span]:
        """The PRODUCER span of one delivery (a batch of one run's events),
        its parent the run's trace context, current for the sink call, whose
        trace context the sink reads from runrelay.sinks.trace_headers(). A
        sink's exception is recorded on it and passes on."""
        first = events[0]
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": lane,
            "messaging.batch.message_count": len(events),
            "runrelay.run_id": first.run_id,
            "runrelay.relay": relay,
            "runrelay.event_ids": [e.event_id for e in events],
            "runrelay.seqs": [e.seq for e in events],
            "runrelay.event_types": [e.type for e in events],
            "runrelay.delivery_keys": [e.delivery_key for e in events],
        }
        with (
            self.tracer.start_as_current_span(
                f"runrelay deliver {lane}",
                context=parent_context(first.trace_context),
                kind=SpanKind.PRODUCER,
                attributes=attributes,
            ) as span,
            sinks.delivering(current_trace_context() or {}),
        ):
            yield span


__all__ = ["RunSpan", "Tracing", "current_trace_context", "parent_context"]
