"""Where a Relay delivers: any callable `sink(lane, events)`.

A sink returns normally only when the consumer has durably accepted the whole
batch: the relay then acknowledges the events and never offers them again. It
raises DeliveryError(permanent=True) when retrying cannot help (the lane is
then blocked until an operator requeues the event), and any other exception
for a transient failure (retried with backoff; DeliveryError.retry_at, when
set, is the moment the consumer asked to be retried at). Built in:
WebhookSink (HTTP POST, optionally signed in the Standard Webhooks format) and
JsonLinesSink (append to a file, fsynced).

verify_signature() is the consumer's half of the signing: it checks the
`webhook-*` headers of a request against its raw body.

Tracing: a Relay on a tracing client (runrelay.tracing) runs each sink call
inside its delivery span and makes that span's W3C trace context available
to the sink as trace_headers() ({"traceparent", "tracestate"?}; {} when not
traced). WebhookSink sends them as HTTP headers, so the consumer's own span
joins the run's trace; JsonLinesSink adds them to each line; a custom sink
passes them on however its consumer takes them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Protocol

import httpcore
import httpx

from .types import LedgerEvent

Sink = Callable[[str, Sequence[LedgerEvent]], None]

# 4xx replies that mean "not now" rather than "never": 408 Request Timeout,
# 409 Conflict (a consumer still processing an earlier attempt of the same
# Idempotency-Key answers it), 425 Too Early, 429 Too Many Requests. Every
# other 4xx says the request itself is unacceptable, so repeating it is futile.
TRANSIENT_4XX = frozenset({408, 409, 425, 429})
# Replies whose Retry-After header sets the next attempt (RFC 9110 §10.2.3).
RETRY_AFTER_STATUSES = frozenset({429, 503})
RETRY_AFTER_MIN = timedelta(seconds=1)
RETRY_AFTER_MAX = timedelta(days=1)
# Headers the sink computes itself; a caller-supplied one would be overwritten
# or would contradict the signature, so it is refused up front.
_RESERVED_HEADERS = frozenset(
    {"idempotency-key", "webhook-id", "webhook-timestamp", "webhook-signature", "content-length"}
)
_SECRET_PREFIX = "whsec_"
_MIN_KEY_BYTES = 16
# A WebhookSink request's total deadline, seconds (connect, send, read).
DEFAULT_DEADLINE = 60.0
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
_ERROR_BODY_CHARS = 200
# The monotonic instant the WebhookSink request in progress (this thread's)
# must end by; None outside a request.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "runrelay_request_deadline", default=None
)
_TRACE_HEADERS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "runrelay_trace_headers", default=None
)


def trace_headers() -> dict[str, str]:
    """The W3C trace context of the delivery in progress, as HTTP headers
    ({"traceparent": ..., "tracestate"?: ...}): set by a tracing Relay
    around each sink call, {} otherwise."""
    return dict(_TRACE_HEADERS.get() or {})


@contextlib.contextmanager
def delivering(headers: Mapping[str, str]) -> Iterator[None]:
    """trace_headers() answers `headers` inside the block (this thread or
    task only)."""
    token = _TRACE_HEADERS.set(dict(headers))
    try:
        yield
    finally:
        _TRACE_HEADERS.reset(token)


class DeliveryError(Exception):
    """A delivery failed.

    `permanent` says retrying cannot help (the relay blocks the lane);
    `status` is the HTTP status when there was a reply; `retry_at` (UTC) is
    when the consumer asked to be retried (Retry-After), None for the relay's
    own backoff.
    """

    def __init__(
        self,
        message: str,
        *,
        permanent: bool = False,
        status: int | None = None,
        retry_at: datetime | None = None,
    ):
        super().__init__(message)
        self.permanent = permanent
        self.status = status
        self.retry_at = retry_at


class SignatureError(ValueError):
    """A webhook request failed signature verification (or could not be
    verified: a header is missing or malformed, the timestamp is outside the
    tolerance). The message says which."""


def event_json(event: LedgerEvent) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "run_id": event.run_id,
        "seq": event.seq,
        "type": event.type,
        "payload": event.payload,
        "delivery_key": event.delivery_key,
        "created_at": event.created_at.isoformat(),
    }


def batch_json(lane: str, events: Sequence[LedgerEvent]) -> dict[str, Any]:
    return {
        "lane": lane,
        "run_id": events[0].run_id if events else None,
        "events": [event_json(e) for e in events],
    }


def batch_key(events: Sequence[LedgerEvent]) -> str:
    """ "<first delivery_key>..<last delivery_key>": the same on every
    redelivery, because a batch is frozen at its first claim."""
    return f"{events[0].delivery_key}..{events[-1].delivery_key}"


# -- signing ----------------------------------------------------------------
def signing_key(secret: str | bytes) -> bytes:
    """The HMAC key of a secret, as the Standard Webhooks libraries read it:
    a str is base64, with or without the `whsec_` prefix (and with or
    without padding); bytes are the key itself. A str that is not base64, or
    a key shorter than 16 bytes, is refused with ValueError: a secret the
    reference libraries would read differently, or one short enough to
    guess, never signs anything."""
    if isinstance(secret, bytes):
        key = secret
    elif isinstance(secret, str):
        encoded = secret[len(_SECRET_PREFIX) :] if secret.startswith(_SECRET_PREFIX) else secret
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                "secret: a text secret is base64 (whsec_<base64>, as Standard Webhooks"
                " secrets are); pass the raw key as bytes otherwise"
            ) from None
    else:
        raise TypeError(f"secret must be str or bytes, not {type(secret).__name__}")
    if len(key) < _MIN_KEY_BYTES:
        raise ValueError(
            f"secret: the key must be at least {_MIN_KEY_BYTES} bytes (got {len(key)});"
            ' generate one with: python -c "import base64, os;'
            " print('whsec_' + base64.b64encode(os.urandom(32)).decode())\""
        )
    return key


def header_value(text: str) -> str:
    """`text` as an HTTP header value that every client and server accepts:
    printable ASCII stays as it is, and every other character (non-ASCII,
    controls, space) and `%` itself are percent-encoded as UTF-8. Reversible
    with urllib.parse.unquote; an ASCII delivery key without `%` or spaces is
    sent unchanged."""
    return "".join(
        c if "!" <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
        for c in text
    )


def redacted_url(url: str | httpx.URL) -> str:
    """`url` safe to show in logs and stored errors: a password or user
    name is replaced by `***`, and so is the query string (tokens live
    there). The scheme, host, port and path stay."""
    parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    shown = parsed.copy_with(username=None, password=None, query=None, fragment=None)
    text = str(shown)
    if parsed.userinfo:
        text = text.replace("://", "://***@", 1)
    if parsed.query:
        text += "?***"
    return text


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


class _Headers(Protocol):
    def items(self) -> Iterable[tuple[str, Any]]: ...


def verify_signature(
    secret: str | bytes,
    headers: _Headers,
    body: bytes | str,
    tolerance: float = 300,
) -> bool:
    """Check a signed webhook request: returns True, or raises SignatureError.

    `headers` is any mapping-like object with items() (a dict, an
    http.server/email Message, httpx/Starlette/Werkzeug headers); names are
    matched case-insensitively. `body` is the raw request body exactly as
    received — re-serialised JSON will not match. The request is accepted
    when `webhook-timestamp` is within `tolerance` seconds of this machine's
    clock (either way) and any `v1,` entry of the space-separated
    `webhook-signature` matches. It fails closed: every rejection raises, so a
    forgotten check of the return value cannot let a forgery through. Dedupe
    on `webhook-id` (the batch key) and the events' delivery keys: a batch can
    be delivered more than once.
    """
    key = signing_key(secret)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float):
        raise TypeError("tolerance must be a number of seconds")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError("tolerance must be a finite number of seconds >= 0")
    raw = body.encode("utf-8") if isinstance(body, str) else body
    if not isinstance(raw, bytes | bytearray):
        raise TypeError(f"body must be bytes or str, not {type(body).__name__}")
    found = {str(name).lower(): str(value) for name, value in headers.items()}
    missing = [
        h for h in ("webhook-id", "webhook-timestamp", "webhook-signature") if not found.get(h)
    ]
    if missing:
        raise SignatureError(f"missing header(s): {', '.join(missing)}")
    stamp = found["webhook-timestamp"].strip()
    if not stamp.isascii() or not stamp.isdigit():
        raise SignatureError(f"webhook-timestamp is not unix seconds: {stamp[:40]!r}")
    skew = time.time() - int(stamp)
    if abs(skew) > tolerance:
        when = "old" if skew > 0 else "far in the future"
        raise SignatureError(
            f"webhook-timestamp {stamp} is {abs(skew):.0f}s {when} (tolerance {tolerance:g}s):"
            " a replayed request, or a clock out of sync"
        )
    expected = sign(key, found["webhook-id"], int(stamp), bytes(raw)).encode("ascii")
    for candidate in found["webhook-signature"].split():
        if candidate.startswith("v1,") and hmac.compare_digest(candidate.encode(), expected):
            return True
    raise SignatureError("no webhook-signature entry matches the body (wrong secret or tampered)")


# -- Retry-After -----------------------------------------------------------
def retry_after(value: str | None, now: datetime | None = None) -> datetime | None:
    """The moment a Retry-After value names, as UTC, clamped to
    [now + 1 s, now + 1 day]. Both forms: delta-seconds ("120") and HTTP-date
    ("Wed, 21 Oct 2015 07:28:00 GMT"). None when absent or unparseable (the
    relay then uses the server's backoff)."""
    if value is None:
        return None
    now = now or datetime.now(UTC)
    text = value.strip()
    if text.isascii() and text.isdigit():
        at = now + timedelta(seconds=min(int(text), RETRY_AFTER_MAX.total_seconds()))
    else:
        try:
            at = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if at.tzinfo is None:  # "-0000" zone: RFC 5322 says UTC with no local offset known
            at = at.replace(tzinfo=UTC)
        at = at.astimezone(UTC)
    return min(max(at, now + RETRY_AFTER_MIN), now + RETRY_AFTER_MAX)


# -- sinks ------------------------------------------------------------------
def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, not {value!r}")
    return float(value)


# -- a total deadline per request ------------------------------------------
# httpx bounds each wait for the network (connect, each write, each read),
# not a request as a whole: a consumer that sends one byte of its reply
# every half second never trips a read timeout and holds the lane forever.
# The sink's connections therefore read and write through streams that cut
# every wait at the deadline of the request in progress (_DEADLINE), so the
# request ends when its deadline passes, whatever the server does.
def _bounded(timeout: float | None, timed_out: type[Exception]) -> float | None:
    end = _DEADLINE.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise timed_out("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._backend.connect_tcp(host, port, bounded, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _RedactUrls(logging.Filter):
    """Rewrites the URLs in httpx's log records (its per-request INFO line
    names the full URL) to their redacted form, for whoever turns those
    lines on: a webhook URL's credentials and query never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, httpx.URL) for a in record.args):
            record.args = tuple(
                redacted_url(a) if isinstance(a, httpx.URL) else a for a in record.args
            )
        return True


_URL_FILTER = _RedactUrls()


def _deadline_transport() -> httpx.HTTPTransport:
    """httpx's own transport, its connections made through _DeadlineBackend."""
    transport = httpx.HTTPTransport()
    pool = transport._pool
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
        raise RuntimeError(
            f"httpcore {httpcore.__version__}: its connection pool has no network backend"
            " to wrap; WebhookSink cannot bound its requests"
        )
    pool._network_backend = _DeadlineBackend(pool._network_backend)
    return transport


class WebhookSink:
    """POST each batch as JSON to `url`.

    Body: {"lane", "run_id", "events": [{event_id, run_id, seq, type, payload,
    delivery_key, created_at}, ...]}. Each event carries its delivery key for
    per-event deduplication; the batch's `Idempotency-Key` header is
    "<first key>..<last key>", stable across redeliveries because batches are
    frozen.

    Delivered only on a 2xx whose response was read to its end. Redirects are
    never followed (a client following a 302/303 would re-send a POST as a
    body-less GET and report success): any 3xx is a transient failure. 4xx
    other than 408, 409, 425 and 429: permanent. 5xx, other statuses,
    timeouts, refused/reset/closed connections: transient. On 429 and 503 a
    Retry-After header becomes DeliveryError.retry_at.

    With `secret`, each request is signed the Standard Webhooks way
    (`webhook-id` = the batch key, `webhook-timestamp`, `webhook-signature`);
    consumers check it with verify_signature(). When the relay traces, the
    delivery span's W3C trace context goes in `traceparent` and `tracestate`
    headers (replacing any given in `headers`). One pooled, thread-safe
    httpx.Client per sink keeps connections alive between batches; close() it
    (or use the sink as a context manager) when done.

    `deadline` bounds each request as a whole — connecting, sending and
    reading the reply to its end — however slowly the server trickles bytes:
    past it the delivery fails as a timeout (retried by the relay's backoff),
    and a Relay stops renewing the batch's leases at the same moment.
    `connect_timeout` bounds opening a connection, `read_timeout` each wait
    for the server (sending the body, or the next bytes of the reply); both
    are cut at the deadline. The older `timeout=` sets both.

    Header values are ASCII: `Idempotency-Key` and `webhook-id` carry the
    batch key percent-encoded where it is not printable ASCII (header_value;
    urllib.parse.unquote gives it back), and the signature covers exactly
    the value sent. The URL's user, password and query string never appear
    in an error, a stored last_error or a log line (redacted_url).
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        headers: dict[str, str] | None = None,
        secret: str | bytes | None = None,
        timeout: float | None = None,
        deadline: float = DEFAULT_DEADLINE,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError) as err:
            # Not echoed: a URL that does not parse cannot be redacted.
            raise ValueError(f"url is not a valid URL: {err}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(
                f"url must be an http:// or https:// URL with a host, not {redacted_url(parsed)!r}"
            )
        if timeout is not None:
            if (connect_timeout, read_timeout) != (5.0, 30.0):
                raise ValueError("pass timeout= or connect_timeout=/read_timeout=, not both")
            connect_timeout = read_timeout = timeout
        self.deadline = _seconds("deadline", deadline)
        self.connect_timeout = min(_seconds("connect_timeout", connect_timeout), self.deadline)
        self.read_timeout = min(_seconds("read_timeout", read_timeout), self.deadline)
        extra = dict(headers or {})
        for name, value in extra.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("headers must map str to str")
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"headers: {name!r} is set by the sink itself")
        self._key = None if secret is None else signing_key(secret)
        self.url = url
        self.shown_url = redacted_url(parsed)
        self.headers = {"Content-Type": "application/json", **extra}
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    # The client is built on first use, so constructing a sink does no I/O
    # (building an SSL context reads the CA bundle).
    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                if _URL_FILTER not in logging.getLogger("httpx").filters:
                    logging.getLogger("httpx").addFilter(_URL_FILTER)
                self._client = httpx.Client(
                    transport=_deadline_transport(),
                    follow_redirects=False,
                    timeout=httpx.Timeout(
                        connect=self.connect_timeout,
                        read=self.read_timeout,
                        write=self.read_timeout,
                        pool=self.connect_timeout,
                    ),
                )
            return self._client

    def close(self) -> None:
        """Close the pooled connections; a later delivery opens new ones."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return f"WebhookSink({self.shown_url!r}, deadline={self.deadline:g})"

    def __enter__(self) -> WebhookSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _redact(self, err: BaseException) -> str:
        """An error's text with this sink's URL (and its credentials and
        query) replaced by the redacted form."""
        text = str(err)
        parsed = httpx.URL(self.url)
        for secret in (self.url, parsed.query.decode(), parsed.password, parsed.username):
            if secret:
                text = text.replace(secret, "***")
        return text

    def __call__(self, lane: str, events: Sequence[LedgerEvent]) -> None:
        if not events:
            return
        body = json.dumps(batch_json(lane, events)).encode()
        key = header_value(batch_key(events))
        headers = dict(self.headers)
        traced = trace_headers()
        if traced:
            headers = {k: v for k, v in headers.items() if k.lower() not in traced} | traced
        headers["Idempotency-Key"] = key
        if self._key is not None:
            # The timestamp is per attempt and the id per batch, as the
            # Standard Webhooks spec has it: a redelivery is re-signed.
            stamp = int(time.time())
            headers["webhook-id"] = key
            headers["webhook-timestamp"] = str(stamp)
            headers["webhook-signature"] = sign(self._key, key, stamp, body)
        where = f"POST {self.shown_url}"
        token = _DEADLINE.set(time.monotonic() + self.deadline)
        try:
            with self._http().stream("POST", self.url, content=body, headers=headers) as reply:
                head = b""
                for chunk in reply.iter_raw():  # to the end: a cut-off reply is no receipt
                    if len(head) < _ERROR_BODY_CHARS:
                        head += chunk[: _ERROR_BODY_CHARS - len(head)]
        except httpx.TimeoutException as err:
            raise DeliveryError(
                f"{where}: timed out ({type(err).__name__}: {self._redact(err)};"
                f" deadline {self.deadline:g}s)"
            ) from None
        except httpx.TransportError as err:
            # Refused, reset, closed before or in the middle of the reply:
            # the consumer may or may not have the batch; redeliver.
            raise DeliveryError(f"{where}: {type(err).__name__}: {self._redact(err)}") from None
        finally:
            _DEADLINE.reset(token)
        status = reply.status_code
        if 200 <= status < 300:
            return
        answer = f"{where} answered {status} {reply.reason_phrase}".rstrip()
        if 300 <= status < 400:
            location = reply.headers.get("Location", "(no Location header)")
            raise DeliveryError(
                f"{answer}: redirects are not followed (Location: {location});"
                " the events were not delivered — point the sink at the final URL",
                status=status,
            )
        retry_at = (
            retry_after(reply.headers.get("Retry-After"))
            if status in RETRY_AFTER_STATUSES
            else None
        )
        detail = head.decode("utf-8", "replace").strip()
        raise DeliveryError(
            f"{answer}{': ' + detail if detail else ''}",
            permanent=400 <= status < 500 and status not in TRANSIENT_4XX,
            status=status,
            retry_at=retry_at,
        )


class JsonLinesSink:
    """Append each event as one JSON line (with its lane) to a file.

    A batch is written with one write, flushed and fsynced before the call
    returns, so an acknowledged event survives a crash of this machine. A
    failed write is cut back off the file, so a retry does not leave a torn
    line behind. The file's directory must exist. When the relay traces,
    each line also carries the delivery's trace context (`traceparent`, and
    `tracestate` when there is one).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(
                f"JsonLinesSink: directory {str(self.path.parent)!r} does not exist"
                f" (for {str(self.path)!r}); create it first"
            )
        self._lock = threading.Lock()

    def __call__(self, lane: str, events: Sequence[LedgerEvent]) -> None:
        if not events:
            return
        traced = trace_headers()
        text = "".join(json.dumps({"lane": lane, **event_json(e), **traced}) + "\n" for e in events)
        data = text.encode("utf-8")
        where = f"JsonLinesSink {str(self.path)!r}"
        with self._lock:
            created = not self.path.exists()
            try:
                fd = os.open(self.path, _APPEND_FLAGS, 0o666)
            except FileNotFoundError as err:
                raise DeliveryError(
                    f"{where}: directory {str(self.path.parent)!r} does not exist"
                ) from err
            except OSError as err:
                raise DeliveryError(f"{where}: cannot open: {err}") from err
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError as err:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    raise DeliveryError(f"{where}: write failed: {err}") from err
            finally:
                os.close(fd)
            if created:  # the new directory entry must survive a crash too
                _fsync_dir(self.path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
