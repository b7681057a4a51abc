"""The Relay loop: deliver the run ledger to a sink, in order.

    relay = Relay(client, WebhookSink("https://example.com/hooks"), batch_size=100)
    relay.run()

Each pass per lane: discover a run with a due head (claim_ledger with
batch => true, so a batch is frozen at its first claim), deliver the batch to
the sink, then ack_ledger(..., claim_next=batch_size) to acknowledge it and
claim the same run's next batch in the same round trip, until the run has
nothing more. Slow deliveries renew their leases from a side thread — the first
renewal is scheduled from the claim's lease_remaining_ms, so a fast delivery
never renews. A sink error becomes fail_ledger (server-side backoff; blocked
when permanent). With nothing to do the relay sleeps until
ledger_next_due_at or a runrelay_ledger NOTIFY, whichever comes first.

A claim that fails ambiguously (connection lost after COMMIT) is repeated
with the same call_id, which returns exactly what the lost call took.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import psycopg

from .client import Client
from .sinks import DeliveryError, Sink
from .types import LedgerEvent, LedgerKind

log = logging.getLogger("runrelay.relay")
T = TypeVar("T")


def _default_name() -> str:
    return f"relay-{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Relay:
    """Delivers ledger events of both lanes to `sink`."""

    def __init__(
        self,
        client: Client,
        sink: Sink,
        *,
        name: str | None = None,
        lanes: Sequence[str] = ("lifecycle", "observability"),
        batch_size: int = 100,
        lease_seconds: int = 30,
        listen_dsn: str | None = None,
        max_sleep: float = 5.0,
    ) -> None:
        self.client = client
        self.sink = sink
        self.name = name or _default_name()
        self.lanes = list(lanes)
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds
        self.listen_dsn = listen_dsn
        self.max_sleep = max_sleep
        self._stop = threading.Event()
        self.stats: dict[str, int] = {}
        self._lock = threading.Lock()

    def stop(self) -> None:
        self._stop.set()

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + n

    # -- loop --------------------------------------------------------------
    def run(self, *, until_idle: float | None = None) -> None:
        """Deliver until stop() (or, with until_idle, until idle that long)."""
        listener = self._listen()
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                delivered = sum(self.drain(lane) for lane in self.lanes)
                if delivered:
                    idle_since = time.monotonic()
                    continue
                if until_idle is not None and time.monotonic() - idle_since > until_idle:
                    return
                self._sleep(listener)
        finally:
            if listener is not None:
                listener.close()

    def drain(self, lane: str) -> int:
        """One pass on a lane: claim a run's batch, deliver, ack + claim next
        until that run has nothing claimable. Returns events delivered."""
        call_id = uuid.uuid4()
        rows = self._retrying(
            lambda: self.client.claim_ledger(
                self.name,
                lane,
                max_events=self.batch_size,
                lease_seconds=self.lease_seconds,
                batch=True,
                call_id=call_id,
            )
        )
        claimed = self._split(rows)
        delivered = 0
        while claimed and not self._stop.is_set():
            ids = [e.event_id for e in claimed]
            run_id = claimed[0].run_id
            try:
                self._deliver(lane, claimed)
            except Exception as exc:
                permanent = isinstance(exc, DeliveryError) and exc.permanent
                # The consumer's Retry-After, if it sent one; None = server backoff.
                retry_at = exc.retry_at if isinstance(exc, DeliveryError) else None
                error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:2000]}
                if isinstance(exc, DeliveryError) and exc.status is not None:
                    error["status"] = exc.status
                failures = self._retrying(
                    partial(
                        self.client.fail_ledger,
                        self.name,
                        ids,
                        error,
                        retry_at=retry_at,
                        permanent=permanent,
                    )
                )
                self._count("blocked" if permanent else "delivery_failures", len(failures))
                return delivered
            out = self._retrying(
                partial(
                    self.client.ack_ledger,
                    self.name,
                    run_id,
                    ids,
                    claim_next=self.batch_size,
                    lease_seconds=self.lease_seconds,
                    batch=True,
                )
            )
            acked = [e for e in out if e.kind is LedgerKind.DELIVERED]
            delivered += len(acked)
            self._count("delivered", len(acked))
            self._count("batches")
            if len(acked) < len(ids):
                self._count("lost_leases", len(ids) - len(acked))
            claimed = self._split(out)
        if claimed:  # stopping: hand the leases back without charging an attempt
            self.client.release_ledger(self.name, [e.event_id for e in claimed])
        return delivered

    def _split(self, rows: list[LedgerEvent]) -> list[LedgerEvent]:
        local = sum(r.kind is LedgerKind.LOCAL_ACK for r in rows)
        if local:
            self._count("local_acks", local)
        return [r for r in rows if r.kind is LedgerKind.CLAIMED]

    def _deliver(self, lane: str, events: list[LedgerEvent]) -> None:
        """Call the sink; renew the leases meanwhile if it is slow."""
        remaining = min((e.lease_remaining_ms or 0) for e in events) / 1000.0
        done = threading.Event()
        ids = [e.event_id for e in events]

        def renew() -> None:
            wait = max(0.5, remaining / 2)  # the claim proves the lease covers this long
            while not done.wait(wait):
                try:
                    renewed = self.client.renew_ledger_lease(self.name, ids, self.lease_seconds)
                    self._count("renewals")
                    if len(renewed) < len(ids):
                        self._count("renewals_lost")
                except Exception:
                    log.warning("lease renewal failed", exc_info=True)
                wait = max(0.5, self.lease_seconds / 2)

        renewer = threading.Thread(target=renew, name=f"{self.name}-renew", daemon=True)
        renewer.start()
        try:
            self.sink(lane, events)
        finally:
            done.set()
            renewer.join()

    def _retrying(self, call: Callable[[], T]) -> T:
        """Repeat a call after a connection error. Every relay call is safe to
        repeat: claims carry a call_id, acks and failures are idempotent."""
        for attempt in range(6):
            try:
                return call()
            except psycopg.OperationalError:
                if self._stop.is_set() or attempt == 5:
                    raise
                log.warning("relay call failed; repeating", exc_info=True)
                time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    # -- sleeping ----------------------------------------------------------
    def _listen(self) -> psycopg.Connection[Any] | None:
        if not self.listen_dsn:
            return None
        try:
            conn = psycopg.connect(self.listen_dsn, autocommit=True)
            conn.execute("LISTEN runrelay_ledger")
            return conn
        except psycopg.Error:
            log.warning("LISTEN unavailable; sleeping on ledger_next_due_at only", exc_info=True)
            return None

    def _sleep(self, listener: psycopg.Connection[Any] | None) -> None:
        due = self.client.ledger_next_due_at()
        if due is None:
            timeout = self.max_sleep
        else:
            timeout = (due - datetime.now(UTC)).total_seconds()
            timeout = min(self.max_sleep, max(0.02, timeout))
        if listener is None:
            self._stop.wait(timeout)
            return
        try:
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                pass
        except psycopg.Error:
            self._stop.wait(timeout)
