"""The ledger's promise under concurrency: per run and lane, the acknowledged
sequence is exactly the appended sequence; a consumer that dedupes by delivery
key sees every event once, in order; redeliveries happen only after a
takeover, and never more than the taken-over batch.

Producers append random streams to many runs while several relays claim (head
or batch), deliver to an in-memory sink, then ack (with claim-next), fail,
release or "crash" (walk away from their leases). A thief relay whose clock
runs ahead takes expired leases over.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg

from runrelay.demo import UNDELIVERED
from sqlapi import call

Connect = Callable[..., psycopg.Connection]
LANES = ("lifecycle", "observability")


class Sink:
    """What a consumer received, in order, per (run, lane)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.by_key: dict[str, list[str]] = defaultdict(list)  # delivery_key -> relays
        self.taken_over: set[str] = set()  # keys the clock-ahead relay ever claimed

    def deliver(self, relay: str, lane: str, rows: list[dict[str, Any]]) -> None:
        with self.lock:
            for row in rows:
                self.received[(row["run_id"], lane)].append(row["delivery_key"])
                self.by_key[row["delivery_key"]].append(relay)


def test_concurrent_relays_deliver_every_run_lane_in_order(
    db: psycopg.Connection, connect: Connect
) -> None:
    runs = [f"run-{i}" for i in range(25)]
    for run_id in runs:
        call(db, "enqueue_run", run_id=run_id, queue="ledger-test")
    stop_producing = time.monotonic() + 6
    sink = Sink()
    counters: dict[str, int] = defaultdict(int)
    errors: list[BaseException] = []
    done = threading.Event()

    def producer(n: int) -> None:
        conn = connect()
        rng = random.Random(100 + n)
        try:
            while time.monotonic() < stop_producing:
                run_id = rng.choice(runs)
                events = [
                    {
                        "type": f"e{rng.randrange(1000)}",
                        "lane": rng.choice(LANES),
                        "transport_only": rng.random() < 0.1,
                        "payload": {"n": n},
                    }
                    for _ in range(rng.randint(1, 6))
                ]
                call(conn, "append_events", run_id=run_id, events=events)
                time.sleep(rng.random() * 0.01)
        except BaseException as exc:
            errors.append(exc)

    def relay(name: str, clock_ahead: bool) -> None:
        conn = connect()
        if clock_ahead:
            conn.execute("SET runrelay.clock_offset = '1 hour'")
        rng = random.Random(name)
        try:
            while not done.is_set():
                lane = rng.choice(LANES)
                batch = rng.random() < 0.5
                rows = call(
                    conn,
                    "claim_ledger",
                    relay=name,
                    lane=lane,
                    batch=batch,
                    max_events=rng.choice([1, 5, 50]),
                    lease_seconds=30,
                    call_id=uuid.uuid4(),
                )
                claimed = [r for r in rows if r["kind"] == "claimed"]
                if not claimed:
                    time.sleep(0.005)
                    continue
                while claimed:
                    if clock_ahead:
                        with sink.lock:
                            sink.taken_over.update(r["delivery_key"] for r in claimed)
                    counters["claims"] += 1
                    action = rng.random()
                    ids = [r["event_id"] for r in claimed]
                    run_id = claimed[0]["run_id"]
                    if action < 0.06 and not clock_ahead:
                        counters["crash"] += 1  # walk away: the lease must expire
                        break
                    if action < 0.12:
                        counters["release"] += 1
                        call(conn, "release_ledger", relay=name, event_ids=ids)
                        break
                    if action < 0.2:
                        counters["fail"] += 1
                        call(
                            conn,
                            "fail_ledger",
                            relay=name,
                            event_ids=ids,
                            error={"transient": True},
                            retry_at="2000-01-01T00:00:00Z",
                        )
                        break
                    sink.deliver(name, lane, claimed)
                    out = call(
                        conn,
                        "ack_ledger",
                        relay=name,
                        run_id=run_id,
                        event_ids=ids,
                        claim_next=rng.choice([0, 1, 10]),
                        batch=batch,
                    )
                    delivered = {r["event_id"] for r in out if r["kind"] == "delivered"}
                    counters["acked"] += len(delivered)
                    if delivered != set(ids):
                        # Taken over meanwhile: only a prefix can have been ours.
                        counters["ack_partial"] += 1
                    claimed = [r for r in out if r["kind"] == "claimed"]
                    counters["continued"] += bool(claimed)
        except BaseException as exc:
            errors.append(exc)

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(3)]
    relays = [threading.Thread(target=relay, args=(f"relay-{n}", False)) for n in range(3)]
    relays.append(threading.Thread(target=relay, args=("thief", True)))
    for t in producers + relays:
        t.start()
    for t in producers:
        t.join()
    # Let relays drain; the thief takes over whatever crashed relays left.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if db.execute(UNDELIVERED).fetchone() == (0,):
            break
        time.sleep(0.1)
    done.set()
    for t in relays:
        t.join()
    assert not errors, errors[:3]
    assert db.execute(UNDELIVERED).fetchone() == (0,), db.execute(
        "SELECT run_id, lane, seq, state, transport_only, lease_owner, lease_expires_at,"
        " next_attempt_at FROM runrelay.ledger WHERE state <> 'delivered'"
    ).fetchall()
    for key in ("crash", "release", "fail", "continued", "acked"):
        assert counters[key] > 0, counters

    appended: dict[tuple[str, str], list[tuple[str, bool, bool]]] = defaultdict(list)
    for run_id, lane, key, transport, local in db.execute(
        "SELECT run_id, lane, delivery_key, transport_only, acked_locally"
        " FROM runrelay.ledger ORDER BY run_id, lane, seq"
    ):
        appended[(run_id, lane)].append((key, transport, local))
    for stream, events in appended.items():
        while events and events[-1][1] and not events[-1][2]:
            events.pop()  # a resting trailing transport-only event
        deliverable = [k for k, transport, local in events if not local]
        assert all(not transport for _, transport, local in events if not local), stream
        received = sink.received.get(stream, [])
        first_seen: list[str] = []
        seen: set[str] = set()
        for key in received:
            if key not in seen:
                seen.add(key)
                first_seen.append(key)
        assert first_seen == deliverable, stream
        # A transport-only event is never delivered to the consumer.
        local_keys = {k for k, t, local in events if local}
        assert not (seen & local_keys), stream
    redelivered = {k: v for k, v in sink.by_key.items() if len(v) > 1}
    for key, relays_seen in redelivered.items():
        # An event is redelivered only if the thief took its lease over at
        # some point (and delivered it, or failed or released it back, after
        # which any relay - even the first - delivers it again).
        assert key in sink.taken_over, (key, relays_seen)
