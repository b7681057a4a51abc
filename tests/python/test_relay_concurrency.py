"""One relay, several run lanes in flight: real servers, real threads.

Each run lane stays strictly ordered; a consumer stuck or failing on one
lane stalls no other; deliveries really overlap (a barrier only several
concurrent sink calls can pass); shutdown lets in-flight batches finish."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from faults import wait_for
from runrelay import Client, LedgerEvent
from runrelay.cli import build_parser
from runrelay.relay import EMPTY_LANE_PAUSE, WAITING_LIMIT, Relay
from runrelay.sinks import DeliveryError


def _runs(client: Client, n: int, events: int = 4) -> list[str]:
    ids = [f"r{i:02d}" for i in range(n)]
    for run_id in ids:
        client.enqueue_run(run_id)
        client.append_events(run_id, [{"type": f"e{k}"} for k in range(events)])
        client.append_events(
            run_id, [{"type": f"o{k}", "lane": "observability"} for k in range(events)]
        )
    return ids


def _start(relay: Relay, **kwargs: Any) -> threading.Thread:
    thread = threading.Thread(target=relay.run, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


def _undelivered(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM runrelay.ledger WHERE state <> 'delivered'").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("runs_per_claim", [1, 8])
def test_every_lane_stays_in_order_and_nothing_is_lost_with_many_slots(
    db: psycopg.Connection, client: Client, runs_per_claim: int
) -> None:
    _runs(client, 30)
    seen: list[tuple[str, str, int]] = []
    lock = threading.Lock()
    rng = random.Random(7)

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        time.sleep(rng.random() * 0.02)
        with lock:
            seen.extend((e.run_id, lane, e.seq) for e in events)

    relay = Relay(
        client, sink, concurrency=8, max_sleep=0.05, batch_size=2, runs_per_claim=runs_per_claim
    )
    relay.run(until_idle=1.0)
    by_lane: dict[tuple[str, str], list[int]] = defaultdict(list)
    for run_id, lane, seq in seen:
        by_lane[(run_id, lane)].append(seq)
    for lane, seqs in by_lane.items():
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)), (lane, seqs)
    assert len(seen) == len({(r, s) for r, _, s in seen})  # nothing twice
    assert _undelivered(db) == 0


def test_deliveries_overlap_up_to_the_concurrency(client: Client) -> None:
    """Four sink calls must be in flight at once to pass the barrier: one
    relay with four slots passes it; one with a single slot cannot."""
    _runs(client, 8, events=1)
    barrier = threading.Barrier(4, timeout=20)
    passed: list[int] = []

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        if len(passed) < 4:
            passed.append(barrier.wait())

    # One run per claim: four slots' claims, not one slot's claim of all eight.
    relay = Relay(
        client, sink, concurrency=4, max_sleep=0.05, lanes=["lifecycle"], runs_per_claim=1
    )
    relay.run(until_idle=1.0)
    assert sorted(passed) == [0, 1, 2, 3]
    assert not barrier.broken


def test_a_stuck_consumer_on_one_lane_stalls_no_other(
    db: psycopg.Connection, client: Client
) -> None:
    ids = _runs(client, 12, events=2)
    stuck = ids[0]
    release = threading.Event()
    delivered: set[str] = set()

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        if events[0].run_id == stuck:
            assert release.wait(60)
        delivered.update(e.delivery_key for e in events)

    relay = Relay(client, sink, concurrency=4, max_sleep=0.05)
    thread = _start(relay)
    try:
        others = db.execute(
            "SELECT delivery_key FROM runrelay.ledger WHERE run_id <> %s", (stuck,)
        ).fetchall()
        wait_for(lambda: {k for (k,) in others} <= delivered)
        # Every other run was delivered while the stuck one's lanes wait.
        row = db.execute(
            "SELECT count(*) FROM runrelay.ledger WHERE run_id = %s AND state = 'delivered'",
            (stuck,),
        ).fetchone()
        assert row == (0,)
    finally:
        release.set()
    wait_for(lambda: _undelivered(db) == 0)
    relay.stop()
    thread.join(30)
    assert not thread.is_alive()


def test_a_failing_consumer_on_one_run_delays_no_other(
    db: psycopg.Connection, client: Client
) -> None:
    ids = _runs(client, 10, events=2)
    bad = ids[3]
    failures: list[str] = []

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        if events[0].run_id == bad:
            failures.append(lane)
            raise DeliveryError("consumer down for this one")

    relay = Relay(client, sink, concurrency=4, max_sleep=0.05)
    thread = _start(relay)
    try:
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM runrelay.ledger"
                    " WHERE run_id <> %s AND state <> 'delivered'",
                    (bad,),
                ).fetchone()
                == (0,)
            )
        )
        assert failures
        row = db.execute(
            "SELECT count(*) FROM runrelay.ledger WHERE run_id = %s AND state = 'delivered'", (bad,)
        ).fetchone()
        assert row == (0,)
    finally:
        relay.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_stop_lets_the_batches_in_flight_finish_and_hands_nothing_on(
    db: psycopg.Connection, client: Client
) -> None:
    _runs(client, 6, events=1)
    started = threading.Semaphore(0)
    release = threading.Event()

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        started.release()
        assert release.wait(60)

    relay = Relay(client, sink, concurrency=3, max_sleep=0.05, lanes=["lifecycle"])
    thread = _start(relay)
    for _ in range(3):
        assert started.acquire(timeout=30)  # three batches in flight
    relay.stop()
    release.set()
    thread.join(30)
    assert not thread.is_alive()
    # The three were acknowledged; nothing is left leased to this relay.
    rows = db.execute(
        "SELECT count(*) FILTER (WHERE state = 'delivered'),"
        " count(*) FILTER (WHERE state = 'leased' AND lease_owner = %s)"
        " FROM runrelay.ledger WHERE lane = 'lifecycle'",
        (relay.name,),
    ).fetchone()
    assert rows is not None and rows[0] >= 3 and rows[1] == 0


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_concurrency_must_be_a_positive_integer(client: Client, bad: Any) -> None:
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        Relay(client, lambda lane, events: None, concurrency=bad)


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_the_relay_command_refuses_a_bad_concurrency(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["relay", "--jsonl", "/dev/null", "--concurrency", bad])
    assert exit_.value.code == 2
    assert "--concurrency" in capsys.readouterr().err
    args = build_parser().parse_args(["relay", "--jsonl", "/dev/null"])
    assert args.concurrency == 16


def test_an_idle_relay_polls_as_one_slot_does(db_url: str) -> None:
    """With nothing to deliver, sixteen slots make the calls of one: one
    slot watches for due events, the others wait to be woken."""
    calls: list[str] = []
    client = Client(db_url, on_call=lambda fn, _s: calls.append(fn))
    relay = Relay(client, lambda lane, events: None, concurrency=16, max_sleep=0.2)
    relay.run(until_idle=1.5)
    # One slot: a pass (two lanes) per 0.2 s sleep over 1.5 s is about 16
    # claims; sixteen polling slots would make about 250.
    assert calls.count("claim_ledger") < 40, calls.count("claim_ledger")


def _lanes_claimed(client: Client, times: list[float] | None = None) -> list[str]:
    """The lane of every claim_ledger call the client makes from now on
    (and, given `times`, the monotonic time of each)."""
    lanes: list[str] = []
    claim = client.claim_ledger

    def counted(relay: str, lane: str = "lifecycle", *args: Any, **kwargs: Any) -> Any:
        lanes.append(lane)
        if times is not None:
            times.append(time.monotonic())
        return claim(relay, lane, *args, **kwargs)

    client.claim_ledger = counted  # type: ignore[method-assign]
    return lanes


def test_a_lane_found_empty_is_claimed_again_after_a_pause_while_another_keeps_the_slot_busy(
    db: psycopg.Connection, client: Client
) -> None:
    """Runs with lifecycle events only, one slot serving both lanes: each
    batch is a claim and an ack of the lifecycle lane, and the empty
    observability lane is asked about every EMPTY_LANE_PAUSE, not after
    every batch."""
    ids = [f"r{i:02d}" for i in range(40)]
    for run_id in ids:
        client.enqueue_run(run_id)
        client.append_events(run_id, [{"type": "e1"}, {"type": "e2"}])
    batches: list[str] = []

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        time.sleep(0.01)
        batches.append(events[0].run_id)

    times: list[float] = []
    lanes = _lanes_claimed(client, times)
    # Counted on claim_ledger: one run per claim (a claim of several runs
    # ends its pass after the same pause: the next test).
    relay = Relay(client, sink, concurrency=1, max_sleep=0.05, runs_per_claim=1)
    relay.run(until_idle=0.5)
    assert sorted(batches) == ids and _undelivered(db) == 0
    # The claims up to the last one of the lifecycle lane: while work remained.
    last = len(lanes) - lanes[::-1].index("lifecycle")
    busy = lanes[:last]
    # One look at the empty lane per EMPTY_LANE_PAUSE of that period (and
    # one as it starts), not one per batch: the 40 batches take about 0.5 s
    # on a quiet machine, so about 10 looks, not 40. The bound is the
    # period's own length, so a loaded machine, whose batches take longer,
    # is held to the same rule rather than to a figure from a quiet one.
    period = times[last - 1] - times[0]
    looks = busy.count("observability")
    assert looks <= period / EMPTY_LANE_PAUSE + 2, (looks, period)


def test_a_lane_found_empty_is_not_starved_by_a_busy_one(
    db: psycopg.Connection, client: Client
) -> None:
    """While one slot works through a long lifecycle backlog, an
    observability event appended meanwhile is delivered long before the
    backlog ends."""
    ids = [f"r{i:02d}" for i in range(60)]
    for run_id in ids:
        client.enqueue_run(run_id)
    delivered: list[str] = []

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        if lane == "lifecycle":
            time.sleep(0.02)
        delivered.append(lane)

    relay = Relay(client, sink, concurrency=1, max_sleep=0.05)
    thread = _start(relay, until_idle=0.5)
    try:
        wait_for(lambda: "lifecycle" in delivered, 20, "the first lifecycle batch")
        client.append_events(ids[0], [{"type": "o1", "lane": "observability"}])
        wait_for(lambda: "observability" in delivered, 20, "the observability event")
        # 60 lifecycle batches take at least 1.2 s; the look at the other
        # lane comes every 0.05 s.
        assert delivered.count("lifecycle") < 40, delivered.count("lifecycle")
    finally:
        thread.join(30)
    assert _undelivered(db) == 0


def test_until_idle_ends_a_quiet_relay_without_waiting_out_max_sleep(client: Client) -> None:
    """With nothing to deliver, run(until_idle=0.3) returns after about
    that long: the watching slot's sleep is bounded by until_idle too, not
    by max_sleep (a minute here)."""
    relay = Relay(client, lambda lane, events: None, max_sleep=60)
    thread = _start(relay, until_idle=0.3)
    thread.join(20)
    assert not thread.is_alive()


def test_deliveries_share_one_renewal_thread_and_slow_ones_are_each_renewed(
    db: psycopg.Connection, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty fast deliveries start no thread of their own (the relay's one
    renewal thread serves them all), and two slow deliveries in flight at
    once each have their leases renewed by it."""
    ids = _runs(client, 30, events=1)
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    delivered: list[str] = []
    relay = Relay(client, lambda lane, events: delivered.append(events[0].run_id), name="r",
                  concurrency=1, lanes=["lifecycle"])  # fmt: skip
    relay.run(until_idle=0.3)
    assert len(delivered) >= 30
    assert started.count("r-renew") <= 1, started.count("r-renew")
    assert _undelivered_on(db, "lifecycle") == 0

    client.append_events(ids[0], [{"type": "slow"}])
    client.append_events(ids[1], [{"type": "slow"}])
    both = threading.Barrier(2, timeout=20)
    # One run per claim: the two slow runs in two slots at once.
    relay = Relay(client, lambda lane, events: None, name="s", concurrency=2,
                  lanes=["lifecycle"], lease_seconds=2, runs_per_claim=1)  # fmt: skip

    def slow(lane: str, events: list[LedgerEvent]) -> None:
        both.wait()  # both deliveries in flight
        # Held until the renewal thread has renewed both (each is first due
        # half a lease, 1 s, after its claim).
        wait_for(lambda: relay.stats.get("renewals", 0) >= 2, 20, "a renewal of each delivery")

    relay.sink = slow
    relay.run(until_idle=0.3)
    assert relay.stats.get("renewals", 0) >= 2, relay.stats
    assert relay.stats.get("renewals_lost", 0) == 0, relay.stats
    assert _undelivered_on(db, "lifecycle") == 0


def _undelivered_on(db: psycopg.Connection, lane: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM runrelay.ledger WHERE state <> 'delivered' AND lane = %s", [lane]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_claim_of_several_runs_gives_each_run_its_own_sink_call_in_order(
    db: psycopg.Connection, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot claiming five runs a call: every sink call holds one run's
    batch, each lane arrives whole and in order, and the acknowledgements
    really carry several runs each (one commit for them)."""
    _runs(client, 12, events=3)
    calls: list[tuple[str, str, list[int]]] = []
    acked_runs: list[int] = []
    ack = client.ack_ledger_runs

    def counting(relay: str, event_ids: Any, *args: Any, **kwargs: Any) -> Any:
        out = ack(relay, event_ids, *args, **kwargs)
        acked_runs.append(len({e.run_id for e in out if e.kind == "delivered"}))
        return out

    monkeypatch.setattr(client, "ack_ledger_runs", counting)

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        assert len({e.run_id for e in events}) == 1, events
        calls.append((lane, events[0].run_id, [e.seq for e in events]))

    relay = Relay(client, sink, concurrency=1, runs_per_claim=5, max_sleep=0.05)
    relay.run(until_idle=0.5)
    assert _undelivered(db) == 0
    by_lane: dict[tuple[str, str], list[int]] = defaultdict(list)
    for lane, run_id, seqs in calls:
        by_lane[(lane, run_id)].extend(seqs)
    for key, seqs in by_lane.items():
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)), (key, seqs)
    assert len(by_lane) == 24
    assert max(acked_runs) == 5, acked_runs
    assert relay.stats["batches"] == len(calls)


def test_batches_waiting_behind_a_hung_delivery_are_handed_back(
    db: psycopg.Connection, client: Client
) -> None:
    """A slot's claim of six runs whose first delivery hangs: the five
    waiting are handed back after the waiting limit and another slot
    delivers them while the first still hangs; nothing is delivered twice."""
    _runs(client, 6, events=1)
    release = threading.Event()
    hung: list[str] = []
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        with lock:
            first = not hung
            if first:
                hung.append(events[0].run_id)
            seen.extend((e.run_id, e.seq) for e in events)
        if first:
            assert release.wait(60)

    relay = Relay(client, sink, concurrency=2, runs_per_claim=6, max_sleep=0.05,
                  lanes=["lifecycle"])  # fmt: skip
    thread = _start(relay)
    try:
        started = time.monotonic()
        wait_for(lambda: len({r for r, _ in seen}) == 6, 30, "the five other runs")
        assert time.monotonic() - started >= WAITING_LIMIT * 0.9
        assert relay.stats.get("handed_back", 0) >= 1, relay.stats
        # And acknowledged (each slot acknowledges after its claim's
        # deliveries), all while the first delivery still hangs.
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM runrelay.ledger WHERE lane = 'lifecycle'"
                    " AND run_id <> %s AND state <> 'delivered'",
                    (hung[0],),
                ).fetchone()
                == (0,)
            ),
            30,
            "the other runs acknowledged",
        )
        assert not release.is_set()
    finally:
        release.set()
    wait_for(lambda: _undelivered_on(db, "lifecycle") == 0)
    relay.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert len(seen) == len(set(seen)), seen


@pytest.mark.parametrize("bad", [0, -1, 1001, True, 2.0])
def test_runs_per_claim_must_be_an_integer_from_1_to_1000(client: Client, bad: Any) -> None:
    with pytest.raises(ValueError, match="runs_per_claim must be an integer from 1 to 1000"):
        Relay(client, lambda lane, events: None, runs_per_claim=bad)


def test_the_relay_command_passes_runs_per_claim_and_refuses_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["relay", "--jsonl", "/dev/null", "--runs-per-claim", "3"])
    assert args.runs_per_claim == 3
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["relay", "--jsonl", "/dev/null", "--runs-per-claim", "0"])
    assert exit_.value.code == 2
