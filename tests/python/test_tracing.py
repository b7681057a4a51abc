"""OpenTelemetry tracing (runrelay.tracing, docs/operations.md "Tracing")
against a real server, real loops and a real HTTP consumer, with the SDK's
in-memory exporter: one trace from a run's enqueue to the consumer's receipt,
the parent of every span, what the spans say, bulk enqueues with contexts of
their own, the SQL-level setting other languages use, and what tracing must
not change: the round trips, and the statements of a client that does not
trace."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from devtools.round_trips import frontend_round_trips, traced
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runrelay import (
    AsyncClient,
    ClaimedAttempt,
    Client,
    EnqueueItem,
    InvalidArgument,
    LedgerKind,
    _operations,
)
from runrelay.relay import Relay
from runrelay.sinks import JsonLinesSink, WebhookSink, trace_headers
from runrelay.tracing import Tracing, current_trace_context
from runrelay.worker import AsyncWorker, Job, Worker, left, log_finished

W3C = TraceContextTextMapPropagator()


# -- fixtures -------------------------------------------------------------------
@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


@pytest.fixture
def client(db: psycopg.Connection, db_url: str, provider: TracerProvider) -> Iterator[Client]:
    """A tracing client on its own connection; retries come back at once."""
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.01")
    with Client(db_url, tracing=provider) as c:
        yield c


class Consumer:
    """A real HTTP consumer: records each request's trace headers and, as an
    instrumented consumer would, handles it in a SERVER span whose parent is
    the context the request carried."""

    def __init__(self, provider: TracerProvider) -> None:
        tracer = provider.get_tracer("consumer")
        self.headers: list[dict[str, str]] = []
        self.lines: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                carrier = {k.lower(): v for k, v in self.headers.items()}
                with tracer.start_as_current_span(
                    "consumer receive", context=W3C.extract(carrier), kind=SpanKind.SERVER
                ):
                    outer.headers.append(carrier)
                    outer.lines.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def consumer(provider: TracerProvider) -> Iterator[Consumer]:
    c = Consumer(provider)
    yield c
    c.close()


# -- reading spans ----------------------------------------------------------------
def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def traceparent_ids(traceparent: str) -> tuple[int, int]:
    _version, trace_hex, span_hex, _flags = traceparent.split("-")
    return int(trace_hex, 16), int(span_hex, 16)


def attribute(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {})[name]


def by_run(spans: tuple[ReadableSpan, ...], prefix: str) -> dict[str, ReadableSpan]:
    return {attribute(s, "runrelay.run_id"): s for s in named(spans, prefix)}


def stored_context(db: psycopg.Connection, run_id: str) -> Any:
    row = db.execute(
        "SELECT trace_context FROM runrelay.runs WHERE run_id = %s", [run_id]
    ).fetchone()
    assert row is not None
    return row[0]


# -- one trace, end to end ----------------------------------------------------------
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-calls"])
def test_one_trace_from_enqueue_through_retries_to_the_consumers_receipt(
    db: psycopg.Connection,
    client: Client,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    consumer: Consumer,
    fused: bool,
) -> None:
    app = provider.get_tracer("app")
    with app.start_as_current_span("handle request") as request:
        result = client.enqueue_run("t1", queue="mail", payload={"n": 1})
    assert result.created

    def handler(job: Job) -> Any:
        with app.start_as_current_span("send the mail"):
            if job.attempt.attempt == 1:
                raise ValueError("smtp down")
        return {"sent": True}

    Worker(client, handler, queues=["mail"], poll_interval=0.05, fused=fused).run(until_idle=2.0)
    with WebhookSink(consumer.url) as sink:
        Relay(client, sink, lanes=["lifecycle"], max_sleep=0.05).run(until_idle=1.0)

    spans = exporter.get_finished_spans()
    assert {trace_id(s) for s in spans} == {request.get_span_context().trace_id}

    (enqueue,) = named(spans, "runrelay enqueue")
    assert enqueue.name == "runrelay enqueue mail"
    assert enqueue.kind is SpanKind.PRODUCER
    assert parent_id(enqueue) == request.get_span_context().span_id
    assert dict(enqueue.attributes or {}) == {
        "messaging.system": "runrelay",
        "messaging.operation.type": "send",
        "messaging.destination.name": "mail",
        "runrelay.run_id": "t1",
        "runrelay.created": True,
    }
    # The run keeps the enqueue span's context.
    traceparent = stored_context(db, "t1")["traceparent"]
    assert traceparent_ids(traceparent) == (trace_id(enqueue), span_id(enqueue))

    runs = sorted(named(spans, "runrelay run"), key=lambda s: attribute(s, "runrelay.attempt"))
    assert [s.name for s in runs] == ["runrelay run mail"] * 2
    assert all(s.kind is SpanKind.CONSUMER and parent_id(s) == span_id(enqueue) for s in runs)
    first, second = runs
    assert (first.attributes or {})["runrelay.outcome"] == "retry_scheduled"
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (first.events[0].attributes or {})["exception.message"] == "smtp down"
    assert dict(second.attributes or {}) == {
        "messaging.system": "runrelay",
        "messaging.operation.type": "process",
        "messaging.destination.name": "mail",
        "runrelay.run_id": "t1",
        "runrelay.attempt": 2,
        "runrelay.worker": (second.attributes or {})["runrelay.worker"],
        "runrelay.outcome": "completed",
    }
    assert second.status.status_code is StatusCode.UNSET
    # The handler's own spans are children of its attempt's span.
    work = named(spans, "send the mail")
    assert sorted(parent_id(s) or 0 for s in work) == sorted(span_id(s) for s in runs)

    delivers = named(spans, "runrelay deliver")
    assert delivers, "nothing delivered"
    assert all(s.kind is SpanKind.PRODUCER and parent_id(s) == span_id(enqueue) for s in delivers)
    delivered = [e for d in delivers for e in (d.attributes or {})["runrelay.event_types"]]
    assert delivered == [
        "run.queued", "run.started", "run.retry_scheduled", "run.started", "run.completed",
    ]  # fmt: skip
    # The consumer received each delivery's own context, and its span joined.
    assert len(consumer.headers) == len(delivers)
    sent = [traceparent_ids(h["traceparent"]) for h in consumer.headers]
    assert sorted(sent) == sorted((trace_id(d), span_id(d)) for d in delivers)
    receipts = named(spans, "consumer receive")
    assert sorted(parent_id(s) or 0 for s in receipts) == sorted(span_id(d) for d in delivers)


def test_a_delivery_span_says_what_it_delivered(
    client: Client, exporter: InMemorySpanExporter, consumer: Consumer
) -> None:
    client.enqueue_run("t2", queue="q")
    client.append_events("t2", [{"type": "note.a"}, {"type": "note.b", "delivery_key": "k-b"}])
    with WebhookSink(consumer.url) as sink:
        Relay(client, sink, lanes=["lifecycle"], batch_size=10, name="relay-t").run(until_idle=1.0)
    (deliver,) = named(exporter.get_finished_spans(), "runrelay deliver")
    attributes = dict(deliver.attributes or {})
    assert deliver.name == "runrelay deliver lifecycle"
    sent = tuple(event["event_id"] for event in consumer.lines[0]["events"])
    assert attributes.pop("runrelay.event_ids") == sent
    assert attributes == {
        "messaging.system": "runrelay",
        "messaging.operation.type": "send",
        "messaging.destination.name": "lifecycle",
        "messaging.batch.message_count": 3,
        "runrelay.run_id": "t2",
        "runrelay.relay": "relay-t",
        "runrelay.seqs": (1, 2, 3),
        "runrelay.event_types": ("run.queued", "note.a", "note.b"),
        "runrelay.delivery_keys": ("t2:1", "t2:2", "k-b"),
    }


def test_a_failed_delivery_is_an_error_span_and_the_retry_stays_in_the_trace(
    client: Client, exporter: InMemorySpanExporter
) -> None:
    client.enqueue_run("t3")
    calls: list[dict[str, str]] = []

    def flaky(lane: str, events: Any) -> None:
        calls.append(trace_headers())
        if len(calls) == 1:
            raise RuntimeError("consumer down")

    relay = Relay(client, flaky, lanes=["lifecycle"], max_sleep=0.05)
    relay.run(until_idle=2.0)
    spans = exporter.get_finished_spans()
    (enqueue,) = named(spans, "runrelay enqueue")
    failed, ok = named(spans, "runrelay deliver")
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert ok.status.status_code is StatusCode.UNSET
    assert parent_id(failed) == parent_id(ok) == span_id(enqueue)
    assert [traceparent_ids(c["traceparent"]) for c in calls] == [
        (trace_id(s), span_id(s)) for s in (failed, ok)
    ]
    assert trace_headers() == {}, "the headers are the delivery's only"


def test_the_json_lines_sink_writes_the_delivery_context_on_each_line(
    client: Client, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    client.enqueue_run("t4")
    client.append_events("t4", [{"type": "note"}])
    out = tmp_path / "events.jsonl"
    Relay(client, JsonLinesSink(out), lanes=["lifecycle"], batch_size=10).run(until_idle=1.0)
    (deliver,) = named(exporter.get_finished_spans(), "runrelay deliver")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["run.queued", "note"]
    assert {traceparent_ids(line["traceparent"]) for line in lines} == {
        (trace_id(deliver), span_id(deliver))
    }


def test_the_async_worker_runs_each_attempt_in_a_span_of_the_runs_trace(
    db: psycopg.Connection, db_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = provider.get_tracer("app")

    async def scenario() -> None:
        async with AsyncClient(db_url, tracing=provider) as aclient:
            await aclient.enqueue_run("a1", queue="aq")
            await aclient.enqueue_run("a2", queue="aq")

            async def handler(job: Job) -> Any:
                with app.start_as_current_span(f"work {job.run_id}"):
                    await asyncio.sleep(0.01)
                return {}

            worker = AsyncWorker(aclient, handler, queues=["aq"], batch_size=2, poll_interval=0.05)
            await worker.run(until_idle=0.5)

    asyncio.run(scenario())
    spans = exporter.get_finished_spans()
    enqueues = by_run(spans, "runrelay enqueue")
    runs = by_run(spans, "runrelay run")
    works = {s.name.split()[-1]: s for s in named(spans, "work")}
    for run_id in ("a1", "a2"):
        assert parent_id(runs[run_id]) == span_id(enqueues[run_id])
        assert trace_id(runs[run_id]) == trace_id(enqueues[run_id])
        assert (runs[run_id].attributes or {})["runrelay.outcome"] == "completed"
        assert parent_id(works[run_id]) == span_id(runs[run_id])
    assert trace_id(enqueues["a1"]) != trace_id(enqueues["a2"]), "two enqueues, two traces"


def test_an_attempt_whose_outcome_no_write_answered_ends_as_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A job leaving the worker without an answered write (the write failed
    for good) ends its span once, as an error without an outcome; the span
    of a run handed back at shutdown may be ended by either side first."""
    attempt = ClaimedAttempt("x1", 1, uuid.uuid4(), "q", {}, None, datetime.now(UTC))
    job = Job(attempt)
    job.span = Tracing(provider).run(attempt, "w1")
    left([job])
    log_finished(job, "completed")  # too late: the span has ended
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert "runrelay.outcome" not in (span.attributes or {})


# -- bulk enqueue ----------------------------------------------------------------------
def test_a_bulk_enqueue_gives_items_its_span_unless_they_bring_their_own(
    db: psycopg.Connection, client: Client, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = provider.get_tracer("app")
    with app.start_as_current_span("request b") as other:
        own = current_trace_context()
    assert own is not None
    results = client.enqueue_runs(
        [
            EnqueueItem("b1", queue="bulk"),
            EnqueueItem("b2", queue="bulk", trace_context=own),
            {"run_id": "b3", "queue": "bulk"},
        ]
    )
    assert [r.created for r in results] == [True, True, True]
    (enqueue,) = named(exporter.get_finished_spans(), "runrelay enqueue")
    assert enqueue.name == "runrelay enqueue bulk"
    assert dict(enqueue.attributes or {}) == {
        "messaging.system": "runrelay",
        "messaging.operation.type": "send",
        "messaging.destination.name": "bulk",
        "messaging.batch.message_count": 3,
        "runrelay.created_count": 3,
    }
    batch = (trace_id(enqueue), span_id(enqueue))
    assert traceparent_ids(stored_context(db, "b1")["traceparent"]) == batch
    assert stored_context(db, "b2") == own
    assert traceparent_ids(own["traceparent"]) == (
        other.get_span_context().trace_id,
        other.get_span_context().span_id,
    )
    assert traceparent_ids(stored_context(db, "b3")["traceparent"]) == batch
    assert client.run_trace_context("b2") == own

    Worker(client, lambda job: {}, queues=["bulk"], poll_interval=0.05).run(until_idle=0.5)
    runs = by_run(exporter.get_finished_spans(), "runrelay run")
    assert parent_id(runs["b1"]) == parent_id(runs["b3"]) == span_id(enqueue)
    assert parent_id(runs["b2"]) == other.get_span_context().span_id
    assert trace_id(runs["b2"]) == other.get_span_context().trace_id


def test_a_bulk_enqueue_over_several_queues_names_none(
    client: Client, exporter: InMemorySpanExporter
) -> None:
    client.enqueue_runs([EnqueueItem("m1", queue="x"), EnqueueItem("m2", queue="y")])
    (enqueue,) = exporter.get_finished_spans()
    assert enqueue.name == "runrelay enqueue"
    assert "messaging.destination.name" not in (enqueue.attributes or {})


def test_an_untraced_client_stores_the_contexts_items_bring(
    db: psycopg.Connection, db_url: str
) -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with Client(db_url) as plain:
        plain.enqueue_runs(
            [EnqueueItem("u1", trace_context={"traceparent": tp}), EnqueueItem("u2")]
        )
    assert stored_context(db, "u1") == {"traceparent": tp}
    assert stored_context(db, "u2") is None


# -- the SQL-level mechanism (any language) -------------------------------------------
def test_a_producer_in_any_language_sets_the_context_with_set_local(
    db: psycopg.Connection,
    db_url: str,
    client: Client,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    """What docs/operations.md tells producers in other languages: SET LOCAL
    runrelay.trace_context in the enqueue's transaction, plain SQL."""
    app = provider.get_tracer("app")
    with app.start_as_current_span("producer in another language") as producer:
        carrier = current_trace_context()
    with psycopg.connect(db_url) as conn, conn.transaction():
        conn.execute("SELECT set_config('runrelay.trace_context', %s, true)", [json.dumps(carrier)])
        conn.execute("SELECT * FROM runrelay.enqueue_run('s1', queue => 'sq')")
        conn.execute(
            "SELECT * FROM runrelay.enqueue_runs(%s)",
            [
                json.dumps(
                    [
                        {"run_id": "s2", "queue": "sq"},
                        {"run_id": "s3", "queue": "sq", "trace_context": None},
                    ]
                )
            ],
        )
    assert stored_context(db, "s1") == stored_context(db, "s2") == carrier
    assert stored_context(db, "s3") is None

    Worker(client, lambda job: {}, queues=["sq"], poll_interval=0.05).run(until_idle=0.5)
    runs = by_run(exporter.get_finished_spans(), "runrelay run")
    for run_id in ("s1", "s2"):
        assert parent_id(runs[run_id]) == producer.get_span_context().span_id
        assert trace_id(runs[run_id]) == producer.get_span_context().trace_id
    assert runs["s3"].parent is None, "no context: the attempt starts its own trace"


def test_a_malformed_context_is_rejected_and_nothing_is_written(
    db: psycopg.Connection, db_url: str
) -> None:
    with psycopg.connect(db_url) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised, conn.transaction():
            conn.execute('SET LOCAL runrelay.trace_context = \'{"traceparent": "00-xyz"}\'')
            conn.execute("SELECT * FROM runrelay.enqueue_run('bad-1')")
        assert raised.value.diag.column_name == "runrelay.trace_context"
    with Client(db_url) as plain, pytest.raises(InvalidArgument) as typed:
        plain.enqueue_runs(
            [EnqueueItem("bad-2"), EnqueueItem("bad-3", trace_context={"traceparent": "no"})]
        )
    assert "items[1].trace_context" in str(typed.value)
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)


# -- what tracing must not change ----------------------------------------------------
def test_a_traced_enqueue_that_fails_records_the_error_and_leaves_no_setting(
    db: psycopg.Connection, db_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with psycopg.connect(db_url) as conn:
        client = Client(conn, tracing=provider)
        with conn.transaction():
            client.enqueue_run("in-tx", conn=conn)
            left = conn.execute("SELECT current_setting('runrelay.trace_context', true)")
            assert left.fetchone() == ("",), "a traced call clears the setting it made"
            # A plain enqueue after it in the same transaction carries nothing.
            conn.execute("SELECT * FROM runrelay.enqueue_run('plain-in-tx')")
        with pytest.raises(InvalidArgument):
            client.enqueue_run("in-tx", payload={"other": 1})
    assert stored_context(db, "in-tx") is not None
    assert stored_context(db, "plain-in-tx") is None
    ok, failed = exporter.get_finished_spans()
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]


def _round_trips(conn: psycopg.Connection, call: Callable[[], Any]) -> int:
    with traced(conn) as out:
        call()
    return frontend_round_trips(out[0])


def test_traced_calls_are_one_round_trip_each(
    db: psycopg.Connection, db_url: str, provider: TracerProvider
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        client = Client(conn, tracing=provider)
        trips = {
            "enqueue_run": _round_trips(conn, lambda: client.enqueue_run("rt1")),
            "enqueue_runs": _round_trips(conn, lambda: client.enqueue_runs([EnqueueItem("rt2")])),
        }
        (claim,) = client.claim_attempts("w", max_runs=1)
        trips["settle_and_claim"] = _round_trips(
            conn, lambda: client.settle_and_claim([claim], "w", max_runs=1)
        )
        trips["claim_attempts"] = _round_trips(conn, lambda: client.claim_attempts("w"))
        events: list[Any] = []
        trips["claim_ledger"] = _round_trips(
            conn, lambda: events.extend(client.claim_ledger("r", max_events=10, batch=True))
        )
        ids = [e.event_id for e in events if e.kind is LedgerKind.CLAIMED]
        trips["ack_ledger"] = _round_trips(
            conn, lambda: client.ack_ledger("r", events[0].run_id, ids, claim_next=10, batch=True)
        )
    assert trips == dict.fromkeys(trips, 1)


def _sent(conn: psycopg.Connection, call: Callable[[], Any]) -> str:
    """The text of what the client sent (Parse messages carry the SQL)."""
    with traced(conn) as out:
        call()
    return "\n".join(line for line in out[0].splitlines() if line.startswith("F\t"))


def test_only_a_tracing_client_sends_anything_new(
    db: psycopg.Connection, db_url: str, provider: TracerProvider
) -> None:
    with psycopg.connect(db_url, autocommit=True, prepare_threshold=None) as conn:
        plain = Client(conn, prepare_threshold=None)
        tracing = Client(conn, prepare_threshold=None, tracing=provider)
        plain_enqueue = _sent(conn, lambda: plain.enqueue_run("p1"))
        plain_claim = _sent(conn, lambda: plain.claim_attempts("w"))
        traced_enqueue = _sent(conn, lambda: tracing.enqueue_run("p2"))
        traced_claim = _sent(conn, lambda: tracing.claim_attempts("w"))
        # Untraced, every statement is the plain call of its function.
        for name, op in _operations.OPERATIONS.items():
            assert plain._queries[name] == op.query("runrelay").as_string(conn)
    for text in (plain_enqueue, plain_claim):
        assert "trace_context" not in text and "set_config" not in text
    assert 'SELECT * FROM "runrelay"."claim_attempts"(' in plain_claim
    assert "runrelay.trace_context" in traced_enqueue
    assert '"runrelay"."run_trace_context"' in traced_claim


# The statement of run_trace_context that reads the run.
PROBE = "SELECT r.trace_context FROM runs AS r"


def test_the_trace_lookup_is_one_primary_key_probe_per_claimed_run(
    db: psycopg.Connection, plans: Callable[[], list[str]], provider: TracerProvider
) -> None:
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   created_at, updated_at, trace_context)
        SELECT 'pk-' || i, 'pq', 'queued', '{}', now() - interval '1 minute', 3, now(), now(),
               '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
        FROM generate_series(1, 20000) AS i
        """
    )
    db.execute("ANALYZE runrelay.runs")
    client = Client(db, tracing=provider)
    for _ in range(7):  # past PL/pgSQL's switch to generic plans
        claimed = client.claim_attempts("w", ["pq"], max_runs=5)
    plans()
    claimed = client.claim_attempts("w", ["pq"], max_runs=5)
    assert len(claimed) == 5 and all(c.trace_context for c in claimed)
    probes = [p for p in plans() if PROBE in p]
    assert len(probes) == 5, probes
    for plan in probes:
        assert "Index Scan using runs_pkey on runs" in plan, plan
        assert "Seq Scan" not in plan, plan

    # The relay's: one probe per claimed run, however many events.
    client.append_events("pk-1", [{"type": "n"}] * 9)
    plans()
    events = client.claim_ledger("r", run_id="pk-1", max_events=10, batch=True)
    assert len(events) == 10 and all(e.trace_context for e in events)
    assert len([p for p in plans() if PROBE in p]) == 1


# -- without OpenTelemetry -------------------------------------------------------------
def test_without_opentelemetry_nothing_imports_it_and_tracing_says_what_to_install(
    db: psycopg.Connection, db_url: str
) -> None:
    program = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from runrelay import Client\n"
        "from runrelay.relay import Relay\n"
        "from runrelay.worker import Worker\n"
        "import runrelay.cli, runrelay.sinks\n"
        f"client = Client({db_url!r})\n"
        "client.enqueue_run('no-otel')\n"
        "Worker(client, lambda job: None).run(until_idle=0.1)\n"
        "Relay(client, lambda lane, events: None).run(until_idle=0.1)\n"
        "try:\n"
        f"    Client({db_url!r}, tracing=True)\n"
        "except ImportError as err:\n"
        "    print(err)\n"
        "prefixes = ('opentelemetry.', 'runrelay.tracing')\n"
        "loaded = [m for m in sys.modules if m.startswith(prefixes)]\n"
        "print(sorted(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    message, loaded = done.stdout.strip().splitlines()
    assert message.startswith("tracing needs opentelemetry-api: pip install 'runrelay[tracing]'")
    assert loaded == "[]"
    assert db.execute("SELECT status FROM runrelay.runs").fetchall() == [("completed",)]


def test_a_client_given_no_provider_uses_the_global_one(db_url: str) -> None:
    """tracing=True: spans go to whatever provider the application installs,
    even after the client was made (here: none, so no span and no context)."""
    with Client(db_url, tracing=True) as c:
        c.enqueue_run("global-1")
        assert c.run_trace_context("global-1") is None


# -- the command line -----------------------------------------------------------------
TRACED_APP = '''
"""A worker's application that sets up OpenTelemetry's SDK, as an
application (or opentelemetry-instrument) does, and records what trace each
handler ran in."""
import json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())


def handle(job):
    context = trace.get_current_span().get_span_context()
    with open(os.environ["SEEN"], "a") as seen:
        seen.write(json.dumps([job.run_id, format(context.trace_id, "032x")]) + "\\n")


async def handle_async(job):
    handle(job)
'''


@pytest.mark.parametrize("flags", [[], ["--async"]], ids=["sync", "async"])
def test_runrelay_worker_tracing_continues_each_runs_trace(
    db: psycopg.Connection, db_url: str, tmp_path: Path, flags: list[str]
) -> None:
    """`runrelay worker --tracing` traces with the global TracerProvider: the
    handler runs in a span of the trace the run was enqueued in (without
    the flag it would run outside any trace: trace id 0)."""
    import os
    import signal
    import time

    handler = "handle_async" if flags else "handle"
    (tmp_path / "tracedapp.py").write_text(TRACED_APP)
    seen = tmp_path / "seen.jsonl"
    trace_id = uuid.uuid4().hex
    with db.transaction():
        db.execute(
            "SELECT set_config('runrelay.trace_context', %s, true)",
            [json.dumps({"traceparent": f"00-{trace_id}-{'1' * 16}-01"})],
        )
        db.execute("SELECT runrelay.enqueue_run('cli-traced')")
    worker = subprocess.Popen(
        [sys.executable, "-m", "runrelay.cli", "worker", f"tracedapp:{handler}", "--tracing",
         "--poll-interval", "0.1", "--database-url", db_url, *flags],
        cwd=tmp_path,
        env={**os.environ, "SEEN": str(seen)},
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not seen.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert [json.loads(line) for line in seen.read_text().splitlines()] == [
        ["cli-traced", trace_id]
    ]
