"""The built-in sinks against real servers: what counts as delivered.

A sink that returns normally makes the relay acknowledge the events for good,
so every way a webhook exchange can go wrong — a redirect, a refused or reset
connection, a reply that never comes, a stalled server — must raise, and only
a fully read 2xx may return. The servers here are real: http.server in a
thread for well-formed replies, raw sockets for the misbehaving ones.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import Message
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from runrelay import Client, LedgerEvent, LedgerKind
from runrelay.relay import Relay
from runrelay.sinks import (
    DeliveryError,
    JsonLinesSink,
    SignatureError,
    WebhookSink,
    batch_json,
    batch_key,
    header_value,
    retry_after,
    sign,
    signing_key,
    verify_signature,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


# -- servers ------------------------------------------------------------------
@dataclass
class Seen:
    method: str
    path: str
    headers: Message[str, str]
    body: bytes


Reply = tuple[int, dict[str, str], bytes]


class _CountingServer(ThreadingHTTPServer):
    connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1  # one call per accepted TCP connection
        super().process_request(request, client_address)


class Server:
    """A keep-alive HTTP/1.1 server that records every request and answers
    with `respond(request)`."""

    def __init__(self, respond: Callable[[Seen], Reply] = lambda _: (200, {}, b"ok")) -> None:
        self.respond = respond
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # lets a stalled handler finish at teardown
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen = Seen(self.command, self.path, self.headers, body)
                with outer.lock:
                    outer.requests.append(seen)
                status, headers, payload = outer.respond(seen)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST  # a followed redirect would arrive as a GET

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = _CountingServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    @property
    def connections(self) -> int:
        return self.httpd.connections

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


@contextmanager
def raw_server(behave: Callable[[socket.socket], None]) -> Iterator[tuple[str, list[bytes]]]:
    """Accepts connections, reads one whole request from each (its body is
    recorded), then hands the socket to `behave` and closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    bodies: list[bytes] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                bodies.append(_read_request(conn))
                behave(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook", bodies
    finally:
        stop.set()
        thread.join()
        listener.close()


def _events(n: int = 3, run_id: str = "r") -> list[LedgerEvent]:
    at = datetime(2024, 5, 1, tzinfo=UTC)
    return [
        LedgerEvent(
            LedgerKind.CLAIMED, i, run_id, i, "t", {"i": i}, f"{run_id}:{i}", at, True, None, None
        )
        for i in range(1, n + 1)
    ]


def _fail(sink: WebhookSink, events: list[LedgerEvent] | None = None) -> DeliveryError:
    with pytest.raises(DeliveryError) as exc:
        sink("lifecycle", events or _events())
    return exc.value


def _status(status: int, headers: dict[str, str] | None = None) -> Callable[[Seen], Reply]:
    return lambda _: (status, headers or {}, b"")


# -- what counts as delivered -------------------------------------------------
@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_a_2xx_is_a_delivery_of_the_json_batch_with_its_key(status: int) -> None:
    events = _events()
    reply = b"" if status == 204 else b'{"ok": true}'
    auth = {"Authorization": "Bearer t"}
    with (
        Server(lambda _: (status, {}, reply)) as server,
        WebhookSink(server.url, headers=auth) as s,
    ):
        s("lifecycle", events)
    [seen] = server.requests
    assert seen.method == "POST" and seen.path == "/hook"
    assert json.loads(seen.body) == json.loads(json.dumps(batch_json("lifecycle", events)))
    assert seen.headers["Idempotency-Key"] == "r:1..r:3"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["Authorization"] == "Bearer t"
    assert seen.headers["webhook-signature"] is None  # unsigned without a secret


def test_an_empty_batch_sends_nothing() -> None:
    with Server() as server, WebhookSink(server.url) as sink:
        sink("lifecycle", [])
    assert server.requests == [] and server.connections == 0


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_delivery_and_is_not_followed(status: int) -> None:
    with Server() as target:
        redirect = _status(status, {"Location": target.url})
        with Server(redirect) as server, WebhookSink(server.url) as sink:
            err = _fail(sink)
        assert target.connections == 0 and target.requests == []
    assert len(server.requests) == 1
    assert not err.permanent and err.status == status and err.retry_at is None
    assert "redirects are not followed" in str(err)
    assert target.url in str(err)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 413, 422])
def test_a_4xx_rejection_is_permanent(status: int) -> None:
    body = b'{"error": "missing field amount"}'
    with Server(lambda _: (status, {}, body)) as server, WebhookSink(server.url) as sink:
        err = _fail(sink)
    assert err.permanent and err.status == status
    assert "missing field amount" in str(err)  # the consumer's reason reaches last_error


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504])
def test_not_now_statuses_and_5xx_are_transient(status: int) -> None:
    with Server(_status(status)) as server, WebhookSink(server.url) as sink:
        err = _fail(sink)
    assert not err.permanent and err.status == status
    assert err.retry_at is None  # no Retry-After: the relay's own backoff


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_sets_retry_at(status: int) -> None:
    with Server(_status(status, {"Retry-After": "120"})) as server, WebhookSink(server.url) as sink:
        before = datetime.now(UTC)
        err = _fail(sink)
        after = datetime.now(UTC)
    assert not err.permanent
    assert err.retry_at is not None
    assert before + timedelta(seconds=120) <= err.retry_at <= after + timedelta(seconds=120)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_http_date_sets_retry_at(status: int) -> None:
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    header = {"Retry-After": format_datetime(when, usegmt=True)}
    with Server(_status(status, header)) as server, WebhookSink(server.url) as sink:
        err = _fail(sink)
    assert err.retry_at == when


def test_retry_after_is_ignored_on_other_statuses() -> None:
    with Server(_status(500, {"Retry-After": "120"})) as server, WebhookSink(server.url) as sink:
        assert _fail(sink).retry_at is None


def test_retry_after_parsing_and_clamping() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert retry_after("30", now) == now + timedelta(seconds=30)
    assert retry_after(" 30 ", now) == now + timedelta(seconds=30)
    assert retry_after("0", now) == now + timedelta(seconds=1)  # never "at once"
    assert retry_after("99999999999", now) == now + timedelta(days=1)  # at most a day
    assert retry_after("Wed, 01 May 2024 12:05:00 GMT", now) == now + timedelta(minutes=5)
    assert retry_after("Wed, 01 May 2024 14:05:00 +0200", now) == now + timedelta(minutes=5)
    assert retry_after("Tue, 30 Apr 2024 12:00:00 GMT", now) == now + timedelta(seconds=1)
    assert retry_after("Fri, 01 May 2026 12:00:00 GMT", now) == now + timedelta(days=1)
    for garbage in (None, "", "soon", "-5", "1.5", "Wed, 99 Foo 2024"):
        assert retry_after(garbage, now) is None, garbage


# -- transport failures -------------------------------------------------------
def test_a_server_slower_than_read_timeout_is_transient() -> None:
    with Server() as server:

        def stall(_: Seen) -> Reply:
            server.release.wait(30)
            return 200, {}, b""

        server.respond = stall
        with WebhookSink(server.url, read_timeout=0.2) as sink:
            err = _fail(sink)
    assert not err.permanent and err.status is None
    assert "timed out" in str(err)
    assert len(server.requests) == 1  # the body did arrive: this is the ambiguous case


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_connection_reset_is_transient() -> None:
    with raw_server(_reset) as (url, bodies), WebhookSink(url) as sink:
        err = _fail(sink)
    assert not err.permanent and err.status is None
    assert len(bodies) == 1 and json.loads(bodies[0])["run_id"] == "r"


def test_a_reply_lost_after_the_body_was_read_is_transient() -> None:
    """The consumer has the whole batch but closes without answering: the
    relay must redeliver (and the consumer dedupe), never assume success."""
    with raw_server(lambda conn: None) as (url, bodies), WebhookSink(url) as sink:
        err = _fail(sink)
    assert not err.permanent and err.status is None
    assert [e["delivery_key"] for e in json.loads(bodies[0])["events"]] == ["r:1", "r:2", "r:3"]


def test_a_reply_cut_off_mid_body_is_transient() -> None:
    def half_reply(conn: socket.socket) -> None:
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"ok":')

    with raw_server(half_reply) as (url, _), WebhookSink(url) as sink:
        err = _fail(sink)
    assert not err.permanent


def _drip(after_headers: bool) -> Callable[[socket.socket], None]:
    """A consumer that answers one byte every 0.2 s, for a minute: in its
    reply's body, or already in its status line and headers. Every read
    gets a byte long before any read timeout."""

    def behave(conn: socket.socket) -> None:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n"
        if after_headers:
            conn.sendall(reply)
            reply = b"x" * 300
        for byte in reply:
            try:
                conn.sendall(bytes([byte]))
            except OSError:  # the sink gave up: the test's proof
                conns_closed.append(True)
                return
            time.sleep(0.2)

    conns_closed: list[bool] = []
    behave.closed = conns_closed  # type: ignore[attr-defined]
    return behave


@pytest.mark.parametrize("after_headers", [True, False], ids=["body", "headers"])
def test_a_reply_that_trickles_in_ends_at_the_requests_deadline(after_headers: bool) -> None:
    """Each read gets a byte in time, so only a deadline for the request as
    a whole ends it: the sink fails the delivery as a timeout and closes the
    connection while the consumer still had bytes to send."""
    drip = _drip(after_headers)
    with raw_server(drip) as (url, bodies), WebhookSink(url, read_timeout=5, deadline=1) as sink:
        err = _fail(sink)
        assert not err.permanent and err.status is None
        assert "timed out" in str(err) and "deadline 1s" in str(err)
        # The sink returned while the consumer was still dripping: the
        # consumer's next write fails on the closed connection.
        sink.close()
    assert drip.closed == [True]  # type: ignore[attr-defined]
    assert len(bodies) == 1


def test_the_timeouts_are_cut_at_the_deadline() -> None:
    sink = WebhookSink("https://example.com/hooks", deadline=2)
    assert (sink.connect_timeout, sink.read_timeout, sink.deadline) == (2.0, 2.0, 2.0)
    assert WebhookSink("https://example.com/hooks").deadline == 60.0


def test_a_refused_connection_is_transient() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with WebhookSink(f"http://127.0.0.1:{port}/hook", connect_timeout=2) as sink:
        err = _fail(sink)
    assert not err.permanent and err.status is None


# -- the connection pool ------------------------------------------------------
def test_deliveries_reuse_one_pooled_connection() -> None:
    with Server() as server, WebhookSink(server.url) as sink:
        sink("lifecycle", _events(run_id="a"))
        sink("lifecycle", _events(run_id="b"))
        sink("observability", _events(run_id="c"))
        assert len(server.requests) == 3
        assert server.connections == 1
        sink.close()  # a closed sink opens a fresh connection when used again
        sink("lifecycle", _events(run_id="d"))
        assert server.connections == 2


def test_one_sink_is_safe_to_share_between_threads() -> None:
    errors: list[BaseException] = []
    with Server() as server, WebhookSink(server.url) as sink:

        def deliver(i: int) -> None:
            try:
                for k in range(5):
                    sink("lifecycle", _events(run_id=f"t{i}-{k}"))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    keys = sorted(s.headers["Idempotency-Key"] for s in server.requests)
    assert keys == sorted(f"t{i}-{k}:1..t{i}-{k}:3" for i in range(4) for k in range(5))


# -- signing ------------------------------------------------------------------
def test_signed_deliveries_verify_on_the_consumer_side() -> None:
    verdicts: list[bool | str] = []

    def consumer(seen: Seen) -> Reply:
        try:
            verdicts.append(verify_signature(SECRET, seen.headers, seen.body))
        except SignatureError as err:
            verdicts.append(str(err))
        return 200, {}, b""

    events = _events()
    with Server(consumer) as server, WebhookSink(server.url, secret=SECRET) as sink:
        sink("lifecycle", events)
        sink("lifecycle", events)  # a redelivery of the same frozen batch
    assert verdicts == [True, True]
    first, again = server.requests
    assert first.headers["webhook-id"] == "r:1..r:3" == first.headers["Idempotency-Key"]
    assert again.headers["webhook-id"] == first.headers["webhook-id"]  # stable
    assert abs(int(first.headers["webhook-timestamp"]) - time.time()) < 3600
    assert first.headers["webhook-signature"].startswith("v1,")


def test_signature_matches_the_standard_webhooks_reference_vector() -> None:
    """The vector the Standard Webhooks reference libraries test against."""
    msg_id, stamp, body = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert sign(signing_key(SECRET), msg_id, stamp, body) == expected
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(stamp), "webhook-signature": expected}
    assert verify_signature(SECRET, headers, body, tolerance=10**10) is True
    with pytest.raises(SignatureError, match="old"):  # a 2021 timestamp, default tolerance
        verify_signature(SECRET, headers, body)


def _signed(secret: str | bytes, body: bytes, stamp: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if stamp is None else stamp
    return {
        "Webhook-Id": "r:1..r:3",
        "Webhook-Timestamp": str(stamp),
        "Webhook-Signature": sign(signing_key(secret), "r:1..r:3", stamp, body),
    }


def test_verify_signature_rejects_tampering_replays_and_wrong_secrets() -> None:
    body = b'{"lane": "lifecycle", "events": [{"payload": {"amount": 100}}]}'
    headers = _signed(SECRET, body)
    assert verify_signature(SECRET, headers, body) is True
    assert verify_signature(SECRET, headers, body.decode()) is True  # str body is UTF-8
    with pytest.raises(SignatureError, match="tampered"):
        verify_signature(SECRET, headers, body.replace(b"100", b"900"))
    with pytest.raises(SignatureError, match="tampered"):
        verify_signature("whsec_" + "A" * 32, headers, body)
    with pytest.raises(SignatureError, match="tampered"):
        verify_signature(SECRET, {**headers, "Webhook-Id": "r:1..r:4"}, body)
    old = _signed(SECRET, body, int(time.time()) - 301)
    with pytest.raises(SignatureError, match="old"):
        verify_signature(SECRET, old, body)
    assert verify_signature(SECRET, old, body, tolerance=3600) is True
    future = _signed(SECRET, body, int(time.time()) + 3600)
    with pytest.raises(SignatureError, match="future"):
        verify_signature(SECRET, future, body)
    for name in ("Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"):
        partial = {k: v for k, v in headers.items() if k != name}
        with pytest.raises(SignatureError, match=name.lower()):
            verify_signature(SECRET, partial, body)
    with pytest.raises(SignatureError, match="unix seconds"):
        verify_signature(SECRET, {**headers, "Webhook-Timestamp": "yesterday"}, body)


def test_verify_signature_accepts_any_matching_v1_entry() -> None:
    body = b"{}"
    headers = _signed(SECRET, body)
    rotated = f"v1,b2xkIHNlY3JldA== v2,xyz {headers['Webhook-Signature']}"
    assert verify_signature(SECRET, {**headers, "Webhook-Signature": rotated}, body)


def test_secrets_are_base64_with_or_without_whsec_or_raw_bytes() -> None:
    assert signing_key(SECRET) == base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    unprefixed = base64.b64encode(b"k" * 31).decode().rstrip("=")
    assert signing_key("whsec_" + unprefixed) == b"k" * 31
    assert signing_key(unprefixed) == b"k" * 31  # as the reference libraries read it
    assert signing_key(b"\x00" * 16) == b"\x00" * 16
    body = b"{}"
    for secret in (unprefixed, b"\xffbytes-of-a-raw-key"):
        assert verify_signature(secret, _signed(secret, body), body)
    for bad in ("", b"", "whsec_", "whsec_!!notbase64!!", "not-base64 secret"):
        with pytest.raises(ValueError, match="secret"):
            signing_key(bad)
    with pytest.raises(TypeError):
        signing_key(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tolerance"):
        verify_signature(SECRET, _signed(SECRET, body), body, tolerance=-1)


@pytest.mark.parametrize(
    "secret",
    [
        "whsec_" + base64.b64encode(b"\x01" * 15).decode(),
        base64.b64encode(b"short").decode(),
        b"x" * 15,
    ],
)
def test_a_key_shorter_than_16_bytes_is_refused(secret: str | bytes) -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        signing_key(secret)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        WebhookSink("https://example.com/hooks", secret=secret)


@pytest.mark.parametrize(
    "secret",
    [SECRET, SECRET.removeprefix("whsec_"), base64.b64encode(os.urandom(32)).decode().rstrip("=")],
    # A fresh random key each run: the ids say which form, not the key, so
    # that a test's id is the same in every run and every process.
    ids=["prefixed", "bare", "random-unpadded"],
)
def test_signed_deliveries_verify_with_the_standard_webhooks_reference_library(
    secret: str,
) -> None:
    """The consumer's side as the Standard Webhooks reference library does it,
    for a prefixed secret, an unprefixed one and one without padding, with
    run ids and delivery keys that are not ASCII."""
    from standardwebhooks.webhooks import Webhook

    events = _events(run_id="注文-é 1%")
    with Server() as server, WebhookSink(server.url, secret=secret) as sink:
        sink("lifecycle", events)
    [seen] = server.requests
    headers = {k: v for k, v in seen.headers.items()}
    assert Webhook(secret).verify(seen.body, headers) == json.loads(seen.body)
    assert verify_signature(secret, seen.headers, seen.body)


# -- bad configuration --------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://example.com/x"}, "http:// or https://"),
        ({"url": "/hooks"}, "http:// or https://"),
        ({"url": "http://"}, "URL"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"read_timeout": float("nan")}, "read_timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": 3, "read_timeout": 60}, "not both"),
        ({"headers": {"Idempotency-Key": "x"}}, "set by the sink"),
        ({"headers": {"webhook-signature": "x"}}, "set by the sink"),
        ({"secret": ""}, "secret"),
        ({"secret": "whsec_%%%"}, "secret"),
        ({"secret": "plain text secret"}, "base64"),
        ({"deadline": 0}, "deadline"),
        ({"deadline": float("inf")}, "deadline"),
    ],
)
def test_bad_webhook_configuration_is_refused(kwargs: dict[str, Any], message: str) -> None:
    kwargs = {"url": "https://example.com/hooks", **kwargs}
    with pytest.raises(ValueError, match=message):
        WebhookSink(**kwargs)


def test_the_old_timeout_parameter_sets_both_timeouts() -> None:
    sink = WebhookSink("https://example.com/hooks", timeout=7)
    assert (sink.connect_timeout, sink.read_timeout) == (7.0, 7.0)
    sink = WebhookSink("https://example.com/hooks")
    assert (sink.connect_timeout, sink.read_timeout) == (5.0, 30.0)


# -- JsonLinesSink ------------------------------------------------------------
def test_jsonl_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"earlier": true}\n')
    sink = JsonLinesSink(path)
    sink("lifecycle", _events(2, "a"))
    sink("observability", _events(1, "b"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"earlier": True}
    assert [(e["lane"], e["delivery_key"]) for e in lines[1:]] == [
        ("lifecycle", "a:1"),
        ("lifecycle", "a:2"),
        ("observability", "b:1"),
    ]


def test_jsonl_needs_an_existing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "events.jsonl"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        JsonLinesSink(missing)
    assert not missing.parent.exists()
    gone = tmp_path / "gone"
    gone.mkdir()
    sink = JsonLinesSink(gone / "events.jsonl")
    gone.rmdir()  # removed after start-up: a transient failure, retried later
    with pytest.raises(DeliveryError, match="does not exist") as exc:
        sink("lifecycle", _events())
    assert not exc.value.permanent


def test_jsonl_write_failure_is_a_delivery_error() -> None:
    """/dev/full fails every write with ENOSPC, like a full disk."""
    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs /dev/full (Linux)")
    with pytest.raises(DeliveryError, match="write failed"):
        JsonLinesSink("/dev/full")("lifecycle", _events())


# -- through a real Relay -----------------------------------------------------
@pytest.fixture
def client(db: psycopg.Connection, db_url: str) -> Iterator[Client]:
    pool = ConnectionPool(db_url, min_size=1, max_size=4, kwargs={"autocommit": True})
    with pool:
        yield Client(pool)


def _ledger(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT delivery_key, state, delivery_attempts, next_attempt_at, last_error"
        " FROM runrelay.ledger WHERE lane = 'lifecycle' AND NOT acked_locally"
        " ORDER BY run_id, seq"
    ).fetchall()


def _make_run(client: Client) -> None:
    client.enqueue_run("r0")
    client.append_events(
        "r0", [{"type": "payment.captured", "payload": {"k": k}} for k in range(3)]
    )


def test_relay_leaves_redirected_events_undelivered_and_retries_them(
    db: psycopg.Connection, client: Client
) -> None:
    _make_run(client)
    # The first retry is due 1-2 s after the failure (_backoff: the base,
    # scaled by 0.5-1): soon enough for the run below to wait for, late
    # enough that the drain's one pass never sees it due, even on a loaded
    # machine.
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 2, retry_max_seconds = 4")
    with Server() as target:
        server = Server(_status(302, {"Location": target.url}))
        with server, WebhookSink(server.url) as sink:
            relay = Relay(client, sink, lanes=["lifecycle"], max_sleep=0.05)
            assert relay.drain("lifecycle") == 0
            rows = _ledger(db)
            assert rows and all(r[1] == "pending" and r[2] == 1 for r in rows)
            assert all(r[4]["status"] == 302 for r in rows)
            assert "redirects are not followed" in rows[0][4]["message"]
            assert relay.stats["delivery_failures"] == len(rows)

            server.respond = _status(200)  # the operator fixed the URL; the retry delivers
            relay.run(until_idle=2.5)
        assert target.requests == []
    delivered = [
        e["delivery_key"] for s in server.requests[1:] for e in json.loads(s.body)["events"]
    ]
    assert delivered == [r[0] for r in rows]
    assert {r[1] for r in _ledger(db)} == {"delivered"}


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_relay_schedules_the_retry_where_retry_after_says(
    db: psycopg.Connection, client: Client, form: str
) -> None:
    _make_run(client)
    when = (datetime.now(UTC) + timedelta(minutes=10)).replace(microsecond=0)
    value = "600" if form == "seconds" else format_datetime(when, usegmt=True)
    with Server(_status(429, {"Retry-After": value})) as server, WebhookSink(server.url) as sink:
        relay = Relay(client, sink, lanes=["lifecycle"])
        before = datetime.now(UTC)
        assert relay.drain("lifecycle") == 0
        after = datetime.now(UTC)
    rows = _ledger(db)
    assert rows and all(r[1] == "pending" and r[2] == 1 for r in rows)
    for _key, _state, _attempts, next_attempt_at, error in rows:
        assert error["status"] == 429
        if form == "seconds":
            assert before + timedelta(seconds=600) <= next_attempt_at
            assert next_attempt_at <= after + timedelta(seconds=600)
        else:
            assert next_attempt_at == when
    assert relay.drain("lifecycle") == 0  # not due again before then
    assert len(server.requests) == 1


# -- what the consumer and the operator see ----------------------------------
def test_header_values_are_ascii_and_give_back_every_key() -> None:
    """Keys with non-ASCII characters, spaces, percent signs and line breaks
    (delivery keys are a producer's choice) go out percent-encoded, and
    unquote gives back the key."""
    from urllib.parse import unquote

    events = _events(2, run_id="注文 é%\r\nX-Injected: 1")
    with Server() as server, WebhookSink(server.url, secret=SECRET) as sink:
        sink("lifecycle", events)
    [seen] = server.requests
    sent = seen.headers["Idempotency-Key"]
    assert sent.isascii() and "\r" not in sent and "\n" not in sent and " " not in sent
    assert seen.headers["X-Injected"] is None
    assert unquote(sent) == f"{events[0].delivery_key}..{events[-1].delivery_key}"
    assert seen.headers["webhook-id"] == sent
    assert verify_signature(SECRET, seen.headers, seen.body)
    assert [e["delivery_key"] for e in json.loads(seen.body)["events"]] == [
        e.delivery_key for e in events
    ]
    plain = _events(1, run_id="order-7")
    assert header_value(batch_key(plain)) == "order-7:1..order-7:1"  # ASCII keys as they are


SECRET_URL = "http://hook-user:pa55w0rd@127.0.0.1:{port}/hook?token=s3cr3t-t0ken"


def _no_url_secrets(text: str) -> None:
    for secret in ("hook-user", "pa55w0rd", "s3cr3t-t0ken"):
        assert secret not in text, text


def test_a_webhook_urls_credentials_and_query_never_reach_errors_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    sink = WebhookSink(SECRET_URL.format(port=port), connect_timeout=2)
    _no_url_secrets(repr(sink))
    _no_url_secrets(str(_fail(sink)))  # refused: nothing listens there any more
    with Server() as server:
        url = SECRET_URL.format(port=server.httpd.server_address[1])
        with caplog.at_level("DEBUG", logger="httpx"), WebhookSink(url) as sink:
            sink("lifecycle", _events())
    assert server.requests[0].path == "/hook?token=s3cr3t-t0ken"  # the real URL was used
    httpx_lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert httpx_lines and "127.0.0.1" in httpx_lines[0]
    for line in httpx_lines:
        _no_url_secrets(line)
    with pytest.raises(ValueError) as bad:
        WebhookSink("ftp://hook-user:pa55w0rd@example.com/?token=s3cr3t-t0ken")
    _no_url_secrets(str(bad.value))


def test_the_cli_turns_httpx_request_lines_off() -> None:
    import logging

    from runrelay import _logging

    _logging.configure("INFO")
    try:
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert not logging.getLogger("httpcore").isEnabledFor(logging.INFO)
    finally:
        _logging.configure("WARNING")


def test_a_relays_stored_error_names_the_url_without_its_secrets(
    db: psycopg.Connection, client: Client
) -> None:
    _make_run(client)
    with Server(_status(503)) as server:
        url = SECRET_URL.format(port=server.httpd.server_address[1])
        with WebhookSink(url) as sink:
            relay = Relay(client, sink, lanes=["lifecycle"], max_sleep=0.05)
            assert relay.drain("lifecycle") == 0
    rows = _ledger(db)
    assert rows and rows[0][4]["status"] == 503
    for row in rows:
        if row[4] is not None:
            _no_url_secrets(json.dumps(row[4]))
            assert "***" in row[4]["message"]


class _SlowSink:
    """A sink that takes `seconds`, like a consumer that answers slowly."""

    def __init__(self, seconds: float, deadline: float | None = None) -> None:
        self.seconds = seconds
        if deadline is not None:
            self.deadline = deadline

    def __call__(self, lane: str, events: Any) -> None:
        time.sleep(self.seconds)


@pytest.mark.parametrize("how", ["sink", "relay"])
def test_a_relay_renews_no_lease_past_the_delivery_deadline(
    db: psycopg.Connection, client: Client, how: str
) -> None:
    """With the sink's deadline (WebhookSink.deadline) or the relay's
    delivery_deadline at 1 s, a 4 s delivery keeps the lease it was claimed
    with and is never renewed; without one it is renewed."""
    _make_run(client)
    if how == "sink":
        relay = Relay(client, _SlowSink(4, deadline=1), lanes=["lifecycle"], lease_seconds=5)
    else:
        relay = Relay(
            client, _SlowSink(4), lanes=["lifecycle"], lease_seconds=5, delivery_deadline=1
        )
    relay.drain("lifecycle")
    assert relay.stats.get("renewals", 0) == 0, relay.stats
    unbounded = Relay(client, _SlowSink(4), lanes=["lifecycle"], lease_seconds=5)
    client.append_events("r0", [{"type": "payment.refunded"}])
    unbounded.drain("lifecycle")
    assert unbounded.stats.get("renewals", 0) >= 1, unbounded.stats


def test_a_delivery_deadline_must_be_positive(client: Client) -> None:
    for bad in (0, -1, "5"):
        with pytest.raises(ValueError, match="delivery_deadline"):
            Relay(client, _SlowSink(0), delivery_deadline=bad)  # type: ignore[arg-type]
