"""Where a Relay delivers: any callable `sink(lane, events)`.

A sink returns normally when the consumer accepted the whole batch; it raises
DeliveryError(permanent=True) when retrying cannot help (the lane is then
blocked until an operator requeues the event), and any other exception for a
transient failure (retried with backoff). Built in: WebhookSink (HTTP POST)
and JsonLinesSink (append to a file).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .types import LedgerEvent

Sink = Callable[[str, Sequence[LedgerEvent]], None]


class DeliveryError(Exception):
    """A delivery failed; `permanent` says whether retrying can help."""

    def __init__(self, message: str, *, permanent: bool = False, status: int | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.status = status


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


class WebhookSink:
    """POST each batch as JSON to `url`.

    Body: {"lane", "run_id", "events": [{event_id, run_id, seq, type, payload,
    delivery_key, created_at}, ...]}. Each event carries its delivery key for
    per-event deduplication; the batch's `Idempotency-Key` header is
    "<first key>..<last key>", stable across redeliveries because batches are
    frozen. 2xx: delivered. 4xx other than 408 and 429: permanent failure.
    Anything else, timeouts and connection errors: transient.
    """

    def __init__(
        self, url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def __call__(self, lane: str, events: Sequence[LedgerEvent]) -> None:
        if not events:
            return
        body = json.dumps(batch_json(lane, events)).encode()
        headers = dict(self.headers)
        headers["Idempotency-Key"] = f"{events[0].delivery_key}..{events[-1].delivery_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as err:
            permanent = 400 <= err.code < 500 and err.code not in (408, 429)
            raise DeliveryError(
                f"{self.url} answered {err.code}", permanent=permanent, status=err.code
            ) from err
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            raise DeliveryError(f"{self.url} unreachable: {err}") from err


class JsonLinesSink:
    """Append each event as one JSON line (with its lane) to a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, lane: str, events: Sequence[LedgerEvent]) -> None:
        lines = "".join(json.dumps({"lane": lane, **event_json(e)}) + "\n" for e in events)
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(lines)
            fh.flush()
