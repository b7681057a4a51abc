"""The Relay loop: deliver the run ledger to a sink, in order.

    relay = Relay(client, WebhookSink("https://example.com/hooks"), batch_size=100)
    relay.run()

Concurrency: `concurrency` delivery slots (threads, default 16), each
running the pass below on its own, so several run lanes are in flight at
once: a consumer that answers in 200 ms gets up to 16 batches every 200 ms
from one relay instead of one. Each run lane stays strictly ordered: a lane
is leased to one claim at a time (the engine's lane lease), so two slots,
like two relays, never hold the same lane, and a lane's next batch is
claimed only when its previous one was acknowledged. A slow or failing
consumer on one lane holds only the slot delivering it; the other slots go
on. Sizing: slots = the batches per second wanted times the consumer's seconds per
batch (each slot delivers one batch at a time); each slot uses one database
connection while it calls, so give the client a pool of at least
concurrency + 2 (runrelay relay does). The sink is called from several
threads at once (WebhookSink and JsonLinesSink are safe to share; a sink of
your own must be too, or run with concurrency=1).

Each pass per lane (a lane the slot found empty is looked at again after
EMPTY_LANE_PAUSE while its other lanes keep it busy, at once when they do
not): claim the batches of up to runs_per_claim runs with due heads
(claim_ledger_runs; each batch frozen at its first claim), deliver each
run's batch to the sink in turn (one sink call per run), then
ack_ledger_runs(..., claim_runs=runs_per_claim) to acknowledge the delivered
ones and claim the next runs' batches in the same round trip, until nothing
is claimed. With runs_per_claim=1: discover one run (claim_ledger with
batch => true), deliver, then ack_ledger(..., claim_next=batch_size) to
acknowledge it and claim the same run's next batch, until the run has
nothing more. Why several runs per call: RUNS_PER_CLAIM. Transport-only
events are acknowledged locally by those claims (kind local_ack) and never
reach the sink; a pass that only acknowledged locally counts as progress, so
the loop comes straight back for more. Slow deliveries renew their leases
from one side thread per relay — the first renewal is scheduled from the
claim's lease_remaining_ms (the lease left when the claim answered), so a
fast delivery never renews; the same thread hands back the batches of a
claim still waiting their turn after WAITING_LIMIT. A sink error becomes fail_ledger
(server-side backoff; blocked when permanent); the other runs of the same
claim go on. With nothing to do the relay sleeps until
ledger_next_due_at or a <schema>_ledger NOTIFY, whichever comes first.

A claim that fails ambiguously (connection lost after COMMIT) is repeated
with the same call_id, which returns exactly what the lost call took. Every
relay call is repeated after a connection error with full-jitter backoff
(runrelay._backoff); a pass that still fails is logged and the loop backs off
and goes on, so the relay outlives a database outage. The LISTEN connection
reconnects with the same backoff. `listen_dsn` may also be a sequence of
DSNs or a callable returning them, as the Worker's (on a sharded install,
runrelay.sharding.shard_listen_dsns(proxy_dsn): one session per shard).

Shutdown (install_signal_handlers): the first SIGINT/SIGTERM or stop()
finishes the delivery in progress, acknowledges what was delivered and hands
back every batch not yet delivered or claimed next (release_ledger, no
attempt charged); a second signal interrupts the delivery at once, hands its
claim's batches back and returns.

Tracing: on a tracing client (`Client(..., tracing=...)`, runrelay.tracing)
each sink call runs in a span "runrelay deliver <lane>" whose parent is the
trace context the batch's run was enqueued with (read in the claim's
statement); the sink finds the span's own context in
runrelay.sinks.trace_headers(), which WebhookSink sends as `traceparent` /
`tracestate` headers, so the consumer's receipt joins the run's trace.

Metrics: given a prometheus_client registry (`metrics=registry`), the relay
also records deliveries, events delivered, failed deliveries, local acks,
lease renewals, lost leases, delivery time and retried calls as
runrelay_relay_* metrics by lane (runrelay.metrics; the `runrelay[metrics]`
extra). Without one nothing of prometheus_client is imported. `stats` counts
the same events either way.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ._backoff import CONNECTION_ERRORS, Backoff, first_line
from ._listen import ListenDsn, Listener, MultiListener, check_listen_dsn, make_listener
from .client import Client
from .contract import LEASE_SECONDS_DEFAULT, MESSAGE_CHARS, channel
from .sinks import DeliveryError, Sink
from .types import LedgerEvent, LedgerFailure, LedgerKind

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .metrics import RelayMetrics
    from .tracing import Tracing

log = logging.getLogger("runrelay.relay")
T = TypeVar("T")

# While another of its lanes keeps a slot busy, the slot looks at a lane whose
# last claim came back empty again only after this many seconds, not on
# every pass: a relay serving both lanes of runs that append only lifecycle
# events would otherwise make an empty claim of the observability lane for
# every batch it delivers. A pass that finds nothing on the lanes it looked
# at looks at the others before the slot goes idle.
EMPTY_LANE_PAUSE = 0.05

# How long the batches of a claim of several runs may wait for the slot's
# deliveries before them (at most a quarter of the lease): past it they are
# handed back (release_ledger) for any slot or relay to deliver, so a
# consumer that hangs on one run holds only that run, as with one run per
# claim. A batch is never renewed while it waits, only while it is delivered.
WAITING_LIMIT = 2.0

# How many runs' batches a slot claims and acknowledges per call by default.
# A run's lifecycle lane usually holds a few events, and every call is a
# commit, flushed on its own when it notifies: one run per call bounds a
# relay by the disk's flushes, not by its work (2 cores, durable commits,
# runs of three events: about 2 000 events/s at one run per call, 4 500 at
# four, 5 400 at sixteen). A slot delivers the runs it claimed one after
# another, so a slow consumer delays the last of them by the others'
# deliveries; runs_per_claim=1 claims one run per call (claim_ledger,
# ack_ledger with claim_next), as before there was a choice.
RUNS_PER_CLAIM = 8


def _default_name() -> str:
    return f"relay-{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def relay_metrics(registry: CollectorRegistry | None) -> RelayMetrics | None:
    """The metrics a relay given `registry` records into; None (and no
    import of prometheus_client) without one."""
    if registry is None:
        return None
    from .metrics import RelayMetrics

    return RelayMetrics.of(registry)


@dataclass(eq=False)
class _Renewal:
    """A delivery in progress whose leases the renewal thread keeps: its
    lane, its events, when the next renewal falls due and when renewing
    stops (the delivery deadline; None: never)."""

    lane: str
    ids: list[int]
    due: float
    stop_at: float | None
    busy: bool = False  # a renewal call for it is being made
    # Not a delivery: the batches of a claim still waiting their turn, handed
    # back (not renewed) when this falls due.
    waiting: _Waiting | None = None


class _Waiting:
    """The batches of a claim of several runs that their slot has not yet
    handed to the sink. The slot takes each before delivering it; once the
    renewal thread gives them up (a delivery before them took too long),
    the slot takes none: they were handed back for any slot or relay."""

    def __init__(self, batches: dict[str, list[int]]) -> None:
        self._lock = threading.Lock()
        self._batches = dict(batches)
        self._open = True

    def take(self, run_id: str) -> bool:
        with self._lock:
            return self._open and self._batches.pop(run_id, None) is not None

    def give_up(self) -> list[int]:
        """The ids of every batch not yet taken; none is taken after this."""
        with self._lock:
            self._open = False
            ids = [i for batch in self._batches.values() for i in batch]
            self._batches = {}
            return ids


class _Renewals:
    """The lease renewals of a relay's deliveries in progress, made by one
    thread. A delivery is added before its sink call and removed after it;
    the thread renews each one whose renewal falls due meanwhile, one call
    at a time, so a delivery that ends first costs no thread and no call.
    Removing a delivery waits for a renewal call of it in progress, so none
    is made after its acknowledgement. The thread starts with the first
    delivery and ends after IDLE_EXIT seconds with none."""

    IDLE_EXIT = 5.0

    def __init__(self, renew: Callable[[_Renewal], bool], *, name: str) -> None:
        self._renew = renew
        self._name = name
        self._cond = threading.Condition()
        self._pending: set[_Renewal] = set()
        self._running = False

    def add(self, renewal: _Renewal) -> None:
        with self._cond:
            self._pending.add(renewal)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
            self._cond.notify_all()

    def remove(self, renewal: _Renewal) -> None:
        with self._cond:
            self._pending.discard(renewal)
            while renewal.busy:
                self._cond.wait()

    def _run(self) -> None:
        with self._cond:
            idle_since = time.monotonic()
            while True:
                now = time.monotonic()
                if not self._pending:
                    if now - idle_since >= self.IDLE_EXIT:
                        self._running = False
                        return
                    self._cond.wait(self.IDLE_EXIT - (now - idle_since))
                    continue
                idle_since = now
                renewal = min(self._pending, key=lambda r: r.due)
                if renewal.due > now:
                    self._cond.wait(renewal.due - now)
                    continue
                renewal.busy = True
                self._cond.release()
                try:
                    keep = self._renew(renewal)
                except BaseException:
                    keep = False
                    log.exception("lease renewal failed")
                finally:
                    self._cond.acquire()
                    renewal.busy = False
                    self._cond.notify_all()
                if not keep:
                    self._pending.discard(renewal)


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
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        listen_dsn: ListenDsn | None = None,
        max_sleep: float = 5.0,
        metrics: CollectorRegistry | None = None,
        delivery_deadline: float | None = None,
        concurrency: int = 16,
        runs_per_claim: int = RUNS_PER_CLAIM,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, not {concurrency!r}")
        if (
            isinstance(runs_per_claim, bool)
            or not isinstance(runs_per_claim, int)
            or not 1 <= runs_per_claim <= 1000
        ):
            raise ValueError(
                f"runs_per_claim must be an integer from 1 to 1000, not {runs_per_claim!r}"
            )
        self.concurrency = concurrency
        self.runs_per_claim = runs_per_claim
        self.client = client
        self.sink = sink
        # How long one sink call may keep its batch's leases renewed: given,
        # else the sink's own request deadline (WebhookSink.deadline), else
        # no bound. Past it the leases run out and the batch is another
        # relay's to redeliver, so a consumer that never finishes its reply
        # cannot hold a lane.
        deadline = (
            delivery_deadline if delivery_deadline is not None else getattr(sink, "deadline", None)
        )
        if deadline is not None and not (isinstance(deadline, int | float) and deadline > 0):
            raise ValueError(f"delivery_deadline must be seconds > 0, not {deadline!r}")
        self.delivery_deadline: float | None = deadline
        self.name = name or _default_name()
        self.lanes = list(lanes)
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds
        check_listen_dsn(listen_dsn)
        self.listen_dsn = listen_dsn
        self.max_sleep = max_sleep
        self._stop = threading.Event()
        self.stats: dict[str, int] = {}
        self._lock = threading.Lock()
        self._signals = 0
        # The events each slot's sink call holds (by thread): handed back
        # when a second signal interrupts delivery.
        self._holding: dict[int, list[int]] = {}
        # The batches each slot's claim has waiting (by thread): handed back
        # too when a second signal interrupts delivery.
        self._waiting: dict[int, _Waiting] = {}
        # Idle slots wait here: a NOTIFY or a slot that claimed work wakes one
        # (which wakes the next if it claims work too), stop() wakes all. One
        # idle slot at a time (the poller) also watches the clock for events
        # falling due; the others wait to be woken, so an idle relay polls
        # as one slot does, however many it has.
        self._wake = threading.Condition()
        self._poller: int | None = None
        self._idle_slots = 0
        self._metrics = relay_metrics(metrics)
        self._tracing: Tracing | None = getattr(client, "tracing", None)
        self._renewals = _Renewals(self._renew, name=f"{self.name}-renew")

    def stop(self) -> None:
        """Finish the deliveries in progress, hand back what is claimed, return."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM: the first stops after the delivery in progress; a
        second interrupts it (KeyboardInterrupt in the main thread), its
        batch is handed back and run() re-raises. Call from the main thread."""

        def handle(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            self._signals += 1
            if self._signals == 1:
                log.info("%s: stopping after the delivery in progress "
                         "(signal again to stop now)", name)  # fmt: skip
                self.stop()
                return
            log.warning("%s again: stopping now; handing back the batch in delivery", name)
            raise KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + n

    # -- loop --------------------------------------------------------------
    def run(self, *, until_idle: float | None = None) -> None:
        """Deliver until stop() (or, with until_idle, until every slot was
        idle that long). The slots are threads; this one listens for
        NOTIFYs and wakes idle slots."""
        listener = make_listener(self.listen_dsn, channel(self.client.schema, "ledger"))
        log.info(
            "relay started",
            extra={
                "relay": self.name,
                "lanes": ",".join(self.lanes),
                "concurrency": self.concurrency,
            },
        )
        # The first slot starts looking; the others start idle and are drawn
        # in by the work it finds (see _idle), so a relay with nothing to do
        # makes one slot's calls, not `concurrency` slots'.
        slots = [
            threading.Thread(
                target=self._slot,
                args=(until_idle, i > 0),
                name=f"{self.name}-slot{i}",
                daemon=True,
            )
            for i in range(self.concurrency)
        ]
        for slot in slots:
            slot.start()
        try:
            while any(s.is_alive() for s in slots):
                woken = self._listen(listener)
                if woken:
                    with self._wake:
                        self._wake.notify(1)
            for slot in slots:
                slot.join()
        except KeyboardInterrupt:
            self._stop.set()
            self._hand_back()
            raise
        finally:
            self._stop.set()
            if listener is not None:
                listener.close()

    def _listen(self, listener: Listener | MultiListener | None) -> bool:
        """Wait (at most max_sleep, or a moment without LISTEN) for a NOTIFY;
        True if one came."""
        if listener is None:
            self._stop.wait(min(self.max_sleep, 0.5))
            return False
        return listener.wait(self.max_sleep, self._stop)

    def _slot(self, until_idle: float | None, start_idle: bool) -> None:
        """One delivery slot: passes over the lanes until stop() (or idle
        for until_idle); between empty passes it waits (_idle)."""
        idle_since = time.monotonic()
        if start_idle and not self._idle(until_idle):
            return
        backoff = Backoff(base=0.2, cap=30.0)
        worked = False
        # When each lane that came back empty is due to be looked at again.
        empty_until: dict[str, float] = {}
        while not self._stop.is_set():
            try:
                settled = self._pass(empty_until)
                if not settled:
                    idle = time.monotonic() - idle_since
                    if until_idle is not None and idle > until_idle:
                        return
                    if worked:
                        # Just after work, this slot waits for the next due
                        # time itself, once: an ack that found its lane's
                        # writer still busy leaves the lane due a moment
                        # later with no NOTIFY, and the poller's sleep was
                        # timed before that.
                        worked = False
                        if self._sleep(until_idle, only_if_due=True):
                            continue
                    if not self._idle(until_idle):
                        return
            except CONNECTION_ERRORS as exc:
                delay = backoff.next()
                self._count("pass_errors")
                if self._metrics is not None:
                    self._metrics.pass_errors.inc()
                log.warning("relay pass failed (%s); retrying in %.1fs",
                            first_line(exc), delay)  # fmt: skip
                self._stop.wait(delay)
                continue
            except Exception:
                # A slot must not die of a surprise (its lanes would wait for
                # their leases to lapse): log it, back off, go on.
                delay = backoff.next()
                log.exception("relay pass failed; retrying in %.1fs", delay)
                self._stop.wait(delay)
                continue
            backoff.reset()
            if settled:
                idle_since = time.monotonic()
                worked = True

    def _pass(self, empty_until: dict[str, float]) -> int:
        """Drain each lane once, but a lane found empty less than
        EMPTY_LANE_PAUSE ago only if the others had nothing either. The
        events settled."""
        now = time.monotonic()
        ready = [lane for lane in self.lanes if empty_until.get(lane, 0.0) <= now]
        settled = self._drain_lanes(ready, empty_until)
        if not settled and len(ready) < len(self.lanes):
            rest = [lane for lane in self.lanes if lane not in ready]
            settled = self._drain_lanes(rest, empty_until)
        return settled

    def _drain_lanes(self, lanes: Sequence[str], empty_until: dict[str, float]) -> int:
        settled = 0
        for lane in lanes:
            n = self.drain(lane)
            settled += n
            if n or len(self.lanes) == 1:
                empty_until.pop(lane, None)
            else:
                empty_until[lane] = time.monotonic() + EMPTY_LANE_PAUSE
        return settled

    def _hand_back(self) -> None:
        """After an interrupted delivery: release its leases so another relay
        delivers the batch now rather than after lease_seconds."""
        with self._lock:
            held = [i for ids in self._holding.values() for i in ids]
            held += [i for waiting in self._waiting.values() for i in waiting.give_up()]
            self._holding = {}
        if not held:
            return
        try:
            self.client.release_ledger(self.name, held)
            log.info("handed back %d events", len(held))
        except Exception as exc:
            log.warning("could not hand back %d events (%s); their leases lapse after %ss",
                        len(held), first_line(exc), self.lease_seconds)  # fmt: skip

    def drain(self, lane: str) -> int:
        """One pass on a lane: claim runs' batches, deliver, ack + claim next
        until there is nothing claimable. Returns the events settled:
        delivered, or acknowledged locally (transport-only events, which a
        claim may answer alone)."""
        if self.runs_per_claim > 1:
            return self._drain_runs(lane)
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
        claimed, settled = self._split(lane, rows)
        if claimed:
            self._draw_in()
        while claimed and not self._stop.is_set():
            ids = [e.event_id for e in claimed]
            run_id = claimed[0].run_id
            try:
                self._deliver(lane, claimed)
            except Exception as exc:
                self._fail(lane, ids, exc)
                return settled
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
            settled += len(acked)
            self._acked(lane, len(acked), len(ids) - len(acked))
            claimed, local = self._split(lane, out)
            settled += local
        if claimed:  # stopping: hand the leases back without charging an attempt
            self.client.release_ledger(self.name, [e.event_id for e in claimed])
        return settled

    def _drain_runs(self, lane: str) -> int:
        """drain() with several runs per call: claim up to runs_per_claim
        runs' batches (claim_ledger_runs), deliver each run's batch in turn,
        then acknowledge what was delivered and claim the next runs in one
        call (ack_ledger_runs), until nothing is claimed. A batch the sink
        refuses is failed (fail_ledger) and the others go on; batches left
        waiting past WAITING_LIMIT are handed back."""
        call_id = uuid.uuid4()
        asked = time.monotonic()
        rows = self._retrying(
            lambda: self.client.claim_ledger_runs(
                self.name,
                lane,
                max_runs=self.runs_per_claim,
                max_events=self.batch_size,
                lease_seconds=self.lease_seconds,
                call_id=call_id,
            )
        )
        claimed, settled = self._split(lane, rows)
        if claimed:
            self._draw_in()
        # Claiming the next runs with each acknowledgement could go on for a
        # whole backlog: after EMPTY_LANE_PAUSE the pass ends, so the slot
        # looks at its other lanes as often as with one run per claim.
        until = asked + EMPTY_LANE_PAUSE
        while claimed and not self._stop.is_set():
            batches: dict[str, list[LedgerEvent]] = {}
            for event in claimed:
                batches.setdefault(event.run_id, []).append(event)
            sent: dict[str, list[int]] = {}  # the batches the sink took
            waiting = _Waiting({r: [e.event_id for e in b] for r, b in batches.items()})
            limit = _Renewal(
                lane,
                [],
                due=asked + min(WAITING_LIMIT, self.lease_seconds / 4),
                stop_at=None,
                waiting=waiting,
            )
            self._renewals.add(limit)
            slot = threading.get_ident()
            with self._lock:
                self._waiting[slot] = waiting
            try:
                for run_id, events in batches.items():
                    if self._stop.is_set() or not waiting.take(run_id):
                        break
                    ids = [e.event_id for e in events]
                    try:
                        self._deliver(lane, events)
                    except Exception as exc:
                        self._fail(lane, ids, exc)
                    else:
                        sent[run_id] = ids
            finally:
                self._renewals.remove(limit)
                with self._lock:
                    self._waiting.pop(slot, None)
            left = waiting.give_up()  # stopping: never handed to the sink
            call_id = uuid.uuid4()
            asked = time.monotonic()
            more = len(self.lanes) == 1 or asked < until
            out = self._retrying(
                partial(
                    self.client.ack_ledger_runs,
                    self.name,
                    [i for ids in sent.values() for i in ids],
                    claim_runs=0 if self._stop.is_set() or not more else self.runs_per_claim,
                    max_events=self.batch_size,
                    lease_seconds=self.lease_seconds,
                    lane=lane,
                    call_id=call_id,
                )
            )
            acked: dict[str, int] = {}
            for event in out:
                if event.kind is LedgerKind.DELIVERED:
                    acked[event.run_id] = acked.get(event.run_id, 0) + 1
            for run_id, ids in sent.items():
                n = acked.get(run_id, 0)
                settled += n
                self._acked(lane, n, len(ids) - n)
            if left:
                self.client.release_ledger(self.name, left)
            claims = [e for e in out if e.kind is not LedgerKind.DELIVERED]
            claimed, local = self._split(lane, claims)
            settled += local
        if claimed:  # stopping: hand the leases back without charging an attempt
            self.client.release_ledger(self.name, [e.event_id for e in claimed])
        return settled

    def _fail(self, lane: str, ids: list[int], exc: Exception) -> None:
        """A batch the sink did not take: fail_ledger (server backoff, or
        the consumer's Retry-After; blocked when permanent)."""
        permanent = isinstance(exc, DeliveryError) and exc.permanent
        # The consumer's Retry-After, if it sent one; None = server backoff.
        retry_at = exc.retry_at if isinstance(exc, DeliveryError) else None
        error: dict[str, Any] = {
            "type": type(exc).__name__,
            "message": str(exc)[:MESSAGE_CHARS],
        }
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
        self._failed(lane, failures)

    def _acked(self, lane: str, delivered: int, lost: int) -> None:
        """One batch acknowledged: `delivered` events delivered, `lost` no
        longer leased by this relay."""
        self._count("delivered", delivered)
        self._count("batches")
        if lost:
            self._count("lost_leases", lost)
        if self._metrics is not None:
            self._metrics.deliveries.labels(lane).inc()
            self._metrics.delivered.labels(lane).inc(delivered)
            if lost:
                self._metrics.lost_leases.labels(lane).inc(lost)

    def _failed(self, lane: str, failures: list[LedgerFailure]) -> None:
        if self._metrics is not None:
            for failure in failures:
                self._metrics.failures.labels(lane, str(failure.outcome)).inc()

    def _split(self, lane: str, rows: list[LedgerEvent]) -> tuple[list[LedgerEvent], int]:
        """The claimed rows to deliver, and how many rows were local acks."""
        local = sum(r.kind is LedgerKind.LOCAL_ACK for r in rows)
        if local:
            self._count("local_acks", local)
            if self._metrics is not None:
                self._metrics.local_acks.labels(lane).inc(local)
        return [r for r in rows if r.kind is LedgerKind.CLAIMED], local

    def _deliver(self, lane: str, events: list[LedgerEvent]) -> None:
        """Call the sink; renew the leases meanwhile if it is slow."""
        remaining = min((e.lease_remaining_ms or 0) for e in events) / 1000.0
        now = time.monotonic()
        renewal = _Renewal(
            lane,
            [e.event_id for e in events],
            # The claim proves the lease covers this long.
            due=now + max(0.5, remaining / 2),
            stop_at=None if self.delivery_deadline is None else now + self.delivery_deadline,
        )
        self._renewals.add(renewal)
        slot = threading.get_ident()
        with self._lock:
            self._holding[slot] = renewal.ids
        try:
            self._call_sink(lane, events)
        finally:
            # Delivered, or failed (fail_ledger, not a hand-back): held no more.
            with self._lock:
                self._holding.pop(slot, None)
            self._renewals.remove(renewal)

    def _call_sink(self, lane: str, events: list[LedgerEvent]) -> None:
        """One sink call, traced and timed."""
        started, result = time.perf_counter(), "error"
        try:
            if self._tracing is None:
                self.sink(lane, events)
            else:
                with self._tracing.deliver(lane, events, self.name):
                    self.sink(lane, events)
            result = "ok"
        finally:
            if self._metrics is not None:
                seconds = time.perf_counter() - started
                self._metrics.delivery_seconds.labels(lane, result).observe(seconds)

    def _renew(self, renewal: _Renewal) -> bool:
        """Renew a delivery's leases, now due (the renewal thread calls
        this); False once its delivery deadline has passed: no more
        renewals. For a claim's waiting batches: hand them back."""
        if renewal.waiting is not None:
            ids = renewal.waiting.give_up()
            if ids:
                self.client.release_ledger(self.name, ids)
                self._count("handed_back", len(ids))
            return False
        if renewal.stop_at is not None and time.monotonic() >= renewal.stop_at:
            log.warning(
                "delivery of %d event(s) on %s passed its deadline of %gs;"
                " its leases are no longer renewed",
                len(renewal.ids), renewal.lane, self.delivery_deadline,
            )  # fmt: skip
            self._renewed(renewal.lane, "deadline")
            return False
        try:
            renewed = self.client.renew_ledger_lease(self.name, renewal.ids, self.lease_seconds)
            self._count("renewals")
            if len(renewed) < len(renewal.ids):
                self._count("renewals_lost")
            self._renewed(renewal.lane, "renewed" if len(renewed) == len(renewal.ids) else "lost")
        except Exception:
            log.warning("lease renewal failed", exc_info=True)
            self._renewed(renewal.lane, "error")
        renewal.due = time.monotonic() + max(0.5, self.lease_seconds / 2)
        return True

    def _renewed(self, lane: str, result: str) -> None:
        if self._metrics is not None:
            self._metrics.renewals.labels(lane, result).inc()

    def _retrying(self, call: Callable[[], T]) -> T:
        """Repeat a call after a connection error, with full-jitter backoff.
        Every relay call is safe to repeat: claims carry a call_id, acks and
        failures are idempotent. After the last try the error goes to run(),
        which backs off and starts a new pass."""
        backoff = Backoff(base=0.1, cap=2.0)
        for attempt in range(6):
            try:
                return call()
            except CONNECTION_ERRORS as exc:
                if self._stop.is_set() or attempt == 5:
                    raise
                delay = backoff.next()
                log.warning("relay call failed (%s); repeating in %.1fs", first_line(exc), delay)
                self._count("call_retries")
                if self._metrics is not None:
                    self._metrics.call_retries.inc()
                time.sleep(delay)
        raise AssertionError("unreachable")

    # -- sleeping ----------------------------------------------------------
    def _draw_in(self) -> None:
        """This slot just claimed work: wake one idle slot to look for more.
        It wakes the next if it claims some too, so a burst draws in every
        slot within a few claims, before any delivery ends (a stuck consumer
        holds one slot, not the relay), and one event costs one extra claim."""
        if self._idle_slots:
            with self._wake:
                self._wake.notify(1)

    def _idle(self, until_idle: float | None = None) -> bool:
        """An idle slot's wait. The first idle slot is the poller: it sleeps
        until the next due event (or max_sleep) and looks again. The others
        wait until woken: by a NOTIFY (run() wakes one), by a slot that
        claimed work (it wakes one more), or by stop(). False: this slot is done
        (with until_idle, nothing woke it for that long)."""
        me = threading.get_ident()
        with self._wake:
            self._idle_slots += 1
            if self._poller is None:
                self._poller = me
        try:
            if self._poller == me:
                try:
                    self._sleep(until_idle)
                finally:
                    with self._wake:
                        self._poller = None
                        # Another slot takes the watch.
                        self._wake.notify(1)
                return True
            with self._wake:
                while not self._stop.is_set():
                    if self._wake.wait(None if until_idle is None else until_idle):
                        return True
                    if until_idle is not None:
                        return False
                return True
        finally:
            with self._wake:
                self._idle_slots -= 1

    def _sleep(self, until_idle: float | None = None, only_if_due: bool = False) -> bool:
        """The poller's wait: until the next due event, a wake-up, stop(),
        or max_sleep (at most until_idle when given). With only_if_due, no
        wait when nothing is due: False."""
        # Only this relay's lanes: another lane's due events are not its work.
        due = self.client.ledger_next_due_at(self.lanes[0] if len(self.lanes) == 1 else None)
        if due is None:
            if only_if_due:
                return False
            timeout = self.max_sleep
        else:
            timeout = (due - datetime.now(UTC)).total_seconds()
            timeout = min(self.max_sleep, max(0.02, timeout))
        if until_idle is not None:
            timeout = min(timeout, until_idle)
        with self._wake:
            if not self._stop.is_set():
                self._wake.wait(timeout)
        return True
