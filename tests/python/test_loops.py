"""The Worker and Relay loops against a real server and a real HTTP receiver."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from conftest import alembic, create_database, drop_database, handed_back, run_in_thread
from runrelay import AsyncClient, ClaimedAttempt, Client, LedgerEvent
from runrelay._listen import listen_statement
from runrelay.contract import CHANNEL_KINDS, channel
from runrelay.dashboard.live import Notifications
from runrelay.demo import UNDELIVERED
from runrelay.relay import Relay
from runrelay.sinks import DeliveryError, JsonLinesSink, WebhookSink
from runrelay.worker import (
    AsyncWorker,
    Job,
    Retry,
    Snooze,
    Suspend,
    Worker,
    claimed_job,
)

Connect = Callable[..., psycopg.Connection]


@pytest.fixture
def calls() -> Counter[str]:
    return Counter()


@pytest.fixture
def client(db: psycopg.Connection, db_url: str, calls: Counter[str]) -> Iterator[Client]:
    pool = ConnectionPool(db_url, min_size=1, max_size=8, kwargs={"autocommit": True})
    with pool:
        yield Client(pool, on_call=lambda fn, _s: calls.update([fn]))


def _wait_for(
    predicate: Callable[[], bool],
    timeout: float = 20.0,
    state: Callable[[], object] | None = None,
) -> None:
    """Wait until predicate() holds; on a timeout the error shows state()."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(
        "condition not reached in time" + (f": {state()!r}" if state is not None else "")
    )


def _statuses(db: psycopg.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())


# -- Worker -------------------------------------------------------------------
def test_worker_maps_handler_outcomes_to_writes(db: psycopg.Connection, client: Client) -> None:
    def handler(job: Job) -> Any:
        kind = job.payload["kind"]
        if kind == "boom":
            raise ValueError("nope")
        if kind == "retry" and job.attempt.attempt == 1:
            raise Retry("later", after=0.05)
        if kind == "sleep" and job.resume is None:
            raise Suspend.sleep(0.2)
        if kind == "event" and job.resume is None:
            raise Suspend.event("go")
        return {"kind": kind, "resume": job.resume}

    for kind in ("ok", "boom", "retry", "sleep", "event"):
        client.enqueue_run(kind, payload={"kind": kind}, max_attempts=2)
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05")
    worker = Worker(client, handler, concurrency=3, poll_interval=0.05, heartbeat_every=0.2)
    thread, done = run_in_thread(worker)
    _wait_for(lambda: _statuses(db).get("event") == "waiting")
    assert client.signal_run("event", "go", {"v": 1}) == "resumed"
    _wait_for(lambda: all(s in ("completed", "failed") for s in _statuses(db).values()))
    worker.stop()
    thread.join(10)
    done.result(timeout=1)
    assert _statuses(db) == {
        "ok": "completed", "boom": "failed", "retry": "completed",
        "sleep": "completed", "event": "completed",
    }  # fmt: skip
    results = dict(db.execute("SELECT run_id, result FROM runrelay.runs").fetchall())
    assert results["event"]["resume"] == {"name": "go", "payload": {"v": 1}}
    assert results["sleep"]["resume"] == {"slept": True}
    (error,) = db.execute("SELECT error FROM runrelay.runs WHERE run_id = 'boom'").fetchone()
    assert (error["type"], error["message"]) == ("ValueError", "nope")
    # The handler's traceback is kept, ending at the line that raised.
    assert error["traceback"].rstrip().endswith("ValueError: nope")
    assert 'raise ValueError("nope")' in error["traceback"]


def test_worker_stops_a_cancelled_handler_through_its_heartbeat(
    db: psycopg.Connection, client: Client
) -> None:
    started, saw_cancel = threading.Event(), threading.Event()

    def handler(job: Job) -> Any:
        started.set()
        if job.cancelled.wait(10):
            saw_cancel.set()
        return {"finished": True}

    client.enqueue_run("long")
    worker = Worker(client, handler, concurrency=1, poll_interval=0.05, heartbeat_every=0.1)
    thread, _ = run_in_thread(worker)
    assert started.wait(10)
    assert client.cancel_run("long") in ("cancelled", "cancel_requested")
    assert saw_cancel.wait(5)
    worker.stop()
    thread.join(10)
    assert _statuses(db) == {"long": "cancelled"}
    assert worker.stats.get("heartbeat:cancelled") == 1
    assert worker.stats.get("complete:cancelled") == 1


@pytest.mark.parametrize("fused", [True, False])
def test_batched_worker_completes_with_one_call_per_batch(
    db: psycopg.Connection, client: Client, calls: Counter[str], fused: bool
) -> None:
    for i in range(40):
        client.enqueue_run(f"b{i}")
    worker = Worker(
        client,
        lambda job: {"i": job.run_id},
        concurrency=10,
        batch_size=10,
        poll_interval=0.05,
        fused=fused,
    )
    worker.run(until_idle=0.5)
    assert set(_statuses(db).values()) == {"completed"}
    assert calls["complete_attempt"] == 0
    if fused:  # each batch settled, and the next one claimed, in one call
        assert calls["complete_attempts"] == 0
        assert 4 <= calls["settle_and_claim"] <= 40
        return
    assert calls["settle_and_claim"] == 0
    assert 4 <= calls["complete_attempts"] <= 40
    assert calls["complete_attempts"] < calls["claim_attempts"] + 1


# A handler's relative deadline for each run, and where the run keeps it.
DEADLINES = {
    "sleep": "(r.wait ->> 'until')::timestamptz",
    "event": "(r.wait ->> 'timeout_at')::timestamptz",
    "detached": "(r.wait ->> 'timeout_at')::timestamptz",
    "retry": "r.run_at",
    "snooze": "r.run_at",
    # Sleeps after a heartbeat renewed the lease: the heartbeat's reading.
    "beat": "(r.wait ->> 'until')::timestamptz",
}


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_until_idle_ends_a_quiet_worker_without_waiting_out_its_poll_interval(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """run(until_idle=0.3) with an hour's poll interval: the worker looks
    again when the idle time is up (after finishing its one run), not an
    hour later."""
    Client(db_url).enqueue_run("only")
    done: list[str] = []

    def handler(job: Job) -> None:
        done.append(job.run_id)

    async def ahandler(job: Job) -> None:
        done.append(job.run_id)

    def run() -> None:
        if flavor == "sync":
            Worker(Client(db_url), handler, poll_interval=3600, maintenance=False).run(
                until_idle=0.3
            )
            return

        async def main() -> None:
            async with AsyncClient(db_url) as client:
                await AsyncWorker(client, ahandler, poll_interval=3600, maintenance=False).run(
                    until_idle=0.3
                )

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert done == ["only"]
    assert _statuses(db) == {"only": "completed"}


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_relative_deadlines_follow_the_database_clock_not_the_hosts(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """Suspend.sleep/event/detached, Retry(after=) and Snooze(after=) count
    their seconds from the database clock: the worker's sessions see it two
    hours ahead of this host, and each deadline still lands `after` seconds
    past the claim — between the claim's and the write's database time.
    lease_seconds=1 is granted as 5 by the server; the worker must read the
    clock off the lease it was granted, not the one it asked for."""
    after = 600
    renewed: dict[str, bool] = {}  # run_id -> a heartbeat's reading replaced the claim's

    def outcome(job: Job) -> Any:
        kind = job.payload["kind"]
        if job.attempt.attempt > 1 or job.resume is not None:
            return {"again": True}  # a deadline that has already passed ends here
        if kind in ("sleep", "beat"):
            return Suspend.sleep(after)
        if kind == "event":
            return Suspend.event("go", timeout=after)
        if kind == "detached":
            return Suspend.detached("runner", timeout=after)
        if kind == "retry":
            return Retry("later", after=after)
        return Snooze(after=after)

    def finish(job: Job) -> Any:
        result = outcome(job)
        if isinstance(result, BaseException):
            raise result
        return result

    def handler(job: Job) -> Any:
        if job.payload["kind"] == "beat":
            claimed = job.clock
            _wait_for(lambda: job.clock != claimed)
            renewed[job.run_id] = True
        return finish(job)

    async def ahandler(job: Job) -> Any:
        if job.payload["kind"] == "beat":
            claimed = job.clock
            while job.clock == claimed:
                await asyncio.sleep(0.02)  # pytest's timeout bounds this
            renewed[job.run_id] = True
        return finish(job)

    ahead = psycopg.conninfo.make_conninfo(db_url, options="-c runrelay.clock_offset=7200s")
    for kind in DEADLINES:
        db.execute(
            "SELECT runrelay.enqueue_run(%s, payload => %s::jsonb, max_attempts => 3)",
            (kind, json.dumps({"kind": kind})),
        )
    if flavor == "sync":
        with Client(ahead) as client:
            Worker(
                client, handler, concurrency=6, lease_seconds=1, heartbeat_every=0.1,
                poll_interval=0.05,
            ).run(until_idle=0.3)  # fmt: skip
    else:

        async def main() -> None:
            async with AsyncClient(ahead) as client:
                await AsyncWorker(
                    client, ahandler, concurrency=6, lease_seconds=1, heartbeat_every=0.1,
                    poll_interval=0.05,
                ).run(until_idle=0.3)  # fmt: skip

        asyncio.run(main())
    for kind, deadline in DEADLINES.items():
        row = db.execute(
            f"SELECT r.status, a.claimed_at, {deadline} - make_interval(secs => %s), r.updated_at"
            " FROM runrelay.runs AS r JOIN runrelay.attempts AS a USING (run_id)"
            " WHERE r.run_id = %s AND a.attempt = 1",
            (after, kind),
        ).fetchone()
        assert row is not None
        status, claimed_at, start, written_at = row
        assert status == ("queued" if kind in ("retry", "snooze") else "waiting"), (kind, row)
        assert claimed_at <= start <= written_at, (kind, row)
    assert renewed == {"beat": True}


def test_a_job_keeps_the_reading_that_puts_the_database_clock_furthest_ahead() -> None:
    """Every reading of the database clock arrives late, so a reading that
    says less than the best one advanced to its arrival is ignored; the lease
    length a reading is taken with is the one the server granted (5..300 s)."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    attempt = ClaimedAttempt("r", 1, uuid.uuid4(), "q", {}, None, t0 + timedelta(seconds=30))
    job = claimed_job(attempt, 30)
    start = job.started
    assert job.clock == (t0, start)
    job.saw_lease(t0 + timedelta(seconds=33), 30, start + 5)  # 3 s on, seen 5 s on
    assert job.clock == (t0, start)
    job.saw_lease(t0 + timedelta(seconds=40), 30, start + 5)  # 10 s on, seen 5 s on
    assert job.clock == (t0 + timedelta(seconds=10), start + 5)
    job.saw_lease(t0 + timedelta(seconds=320), 1000, start + 6)  # granted 300 s, not 1000
    assert job.clock == (t0 + timedelta(seconds=20), start + 6)
    assert Job(attempt).db_now().tzinfo is not None  # no reading: this host's clock


def test_graceful_shutdown_releases_unfinished_work(db: psycopg.Connection, client: Client) -> None:
    release = threading.Event()
    client.enqueue_run("stuck", max_attempts=3)
    worker = Worker(
        client, lambda job: release.wait(30), concurrency=1, poll_interval=0.05, shutdown_grace=0.3
    )
    thread, _ = run_in_thread(worker)
    _wait_for(lambda: _statuses(db).get("stuck") == "running")
    worker.stop()
    thread.join(10)
    assert worker.stats.get("released_on_shutdown") == 1
    assert _statuses(db) == {"stuck": "queued"}  # retried at once by another worker
    nxt = client.claim_attempts("next")
    assert [a.attempt for a in nxt] == [2]
    # The released handler finishes late: its write is refused, nothing changes.
    release.set()
    _wait_for(lambda: worker.stats.get("complete:fence_lost") == 1)
    assert _statuses(db) == {"stuck": "running"}


# -- Relay --------------------------------------------------------------------
class Hook:
    """A webhook receiver whose behaviour a test scripts per request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self.headers: list[str] = []
        self.script: Callable[[int], tuple[int, float]] = lambda n: (200, 0.0)
        self.process_before_failing = False

    def handle(self, body: dict[str, Any], key: str) -> int:
        with self.lock:
            n = len(self.bodies)
            self.bodies.append(body)
        status, delay = self.script(n)
        time.sleep(delay)
        if status < 300 or self.process_before_failing:
            with self.lock:
                self.keys.extend(e["delivery_key"] for e in body["events"])
                self.headers.append(key)
        return status


@contextmanager
def serve(hook: Hook) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status = hook.handle(body, self.headers.get("Idempotency-Key", ""))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


def _events_in_db(db: psycopg.Connection) -> list[str]:
    rows = db.execute(
        "SELECT delivery_key FROM runrelay.ledger WHERE NOT acked_locally ORDER BY run_id, seq"
    ).fetchall()
    return [r[0] for r in rows]


def _make_runs(client: Client, n: int) -> None:
    for i in range(n):
        client.enqueue_run(f"r{i}")
        client.append_events(
            f"r{i}", [{"type": "step", "payload": {"i": i, "k": k}} for k in range(5)]
        )


def test_relay_survives_a_receiver_outage_in_order(db: psycopg.Connection, client: Client) -> None:
    _make_runs(client, 10)
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05, retry_max_seconds = 0.2")
    hook = Hook()
    hook.script = lambda n: (503, 0.0) if n < 8 else (200, 0.0)
    with serve(hook) as url:
        relay = Relay(client, WebhookSink(url), batch_size=3, max_sleep=0.05)
        relay.run(until_idle=1.0)
    assert sorted(hook.keys) == sorted(_events_in_db(db))
    assert len(hook.keys) == len(set(hook.keys))
    for i in range(10):  # per run: delivery order is seq order
        keys = [k for k in hook.keys if k.startswith(f"r{i}:")]
        assert keys == sorted(keys, key=lambda k: int(k.split(":")[1]))
    assert relay.stats["delivery_failures"] >= 8
    assert relay.stats["batches"] >= 10


def test_relay_renews_leases_during_slow_deliveries(
    db: psycopg.Connection, client: Client, calls: Counter[str]
) -> None:
    _make_runs(client, 1)
    hook = Hook()
    hook.script = lambda n: (200, 3.5 if n == 0 else 0.0)
    with serve(hook) as url:
        relay = Relay(client, WebhookSink(url), batch_size=100, lease_seconds=5, max_sleep=0.05)
        relay.run(until_idle=0.5)
    assert calls["renew_ledger_lease"] >= 1
    assert sorted(hook.keys) == sorted(_events_in_db(db))
    assert len(hook.keys) == len(set(hook.keys))  # the lease held: no redelivery


@pytest.mark.parametrize("runs_per_claim", [1, 8])
def test_relay_fast_deliveries_never_renew(
    db: psycopg.Connection, client: Client, calls: Counter[str], runs_per_claim: int
) -> None:
    _make_runs(client, 5)
    with serve(Hook()) as url:
        relay = Relay(client, WebhookSink(url), batch_size=100, max_sleep=0.05,
                      runs_per_claim=runs_per_claim)  # fmt: skip
        relay.run(until_idle=0.5)
    assert calls["renew_ledger_lease"] == 0
    # Every run's lifecycle and observability batches were acknowledged.
    assert relay.stats["delivered"] >= 10 and db.execute(UNDELIVERED).fetchone() == (0,)
    if runs_per_claim == 1:
        assert calls["ack_ledger"] >= 5
    else:
        assert 1 <= calls["ack_ledger_runs"] < 5 and calls["ack_ledger"] == 0


def test_permanent_rejection_blocks_the_lane(db: psycopg.Connection, client: Client) -> None:
    _make_runs(client, 1)
    hook = Hook()
    hook.script = lambda n: (422, 0.0)
    with serve(hook) as url:
        relay = Relay(client, WebhookSink(url), batch_size=100, max_sleep=0.05)
        relay.run(until_idle=0.5)
    assert relay.stats["blocked"] >= 1
    blocked = db.execute("SELECT count(*) FROM runrelay.ledger_lanes WHERE blocked").fetchone()
    assert blocked == (1,)
    assert len(hook.bodies) == 1  # no retry of a permanent failure


def test_redelivery_after_a_lost_reply_keeps_keys_stable(
    db: psycopg.Connection, client: Client
) -> None:
    """The receiver processes a batch but its reply fails: the relay retries,
    the frozen batch comes back identical, so the batch key is too."""
    _make_runs(client, 1)
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05")
    hook = Hook()
    hook.process_before_failing = True
    hook.script = lambda n: (500, 0.0) if n == 0 else (200, 0.0)
    with serve(hook) as url:
        relay = Relay(client, WebhookSink(url), batch_size=100, max_sleep=0.05)
        thread = threading.Thread(target=relay.run)
        thread.start()
        try:
            # Until the retry went out and nothing is left: on a loaded
            # machine an idle window can close before the retry comes due.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                len(hook.headers) >= 2 and db.execute(UNDELIVERED).fetchone() == (0,)
            ):
                time.sleep(0.05)
        finally:
            relay.stop()
            thread.join(30)
    assert hook.headers[0] == hook.headers[1]
    assert Counter(hook.keys).most_common(1)[0][1] == 2
    assert set(hook.keys) == set(_events_in_db(db))


@pytest.mark.parametrize("runs_per_claim", [1, 8])
def test_relay_replays_a_claim_whose_reply_was_lost(
    db: psycopg.Connection, db_url: str, runs_per_claim: int
) -> None:
    """The first claim commits but its reply is dropped (OperationalError after
    the call): the relay repeats it with the same call_id and delivers exactly
    once, in order."""
    pool = ConnectionPool(db_url, min_size=1, max_size=4, kwargs={"autocommit": True})
    with pool:
        real = Client(pool)
        _make_runs(real, 2)
        seen_call_ids: list[Any] = []

        class LossyClient(Client):
            def _lossy(self, rows: Any, call_id: Any) -> Any:
                seen_call_ids.append(call_id)
                if len(seen_call_ids) == 1:
                    raise psycopg.OperationalError("connection lost after COMMIT")
                return rows

            def claim_ledger(self, *args: Any, **kwargs: Any) -> Any:
                return self._lossy(super().claim_ledger(*args, **kwargs), kwargs.get("call_id"))

            def claim_ledger_runs(self, *args: Any, **kwargs: Any) -> Any:
                rows = super().claim_ledger_runs(*args, **kwargs)
                return self._lossy(rows, kwargs.get("call_id"))

        delivered: list[LedgerEvent] = []
        relay = Relay(
            LossyClient(pool),
            lambda lane, evs: delivered.extend(evs),
            batch_size=100,
            max_sleep=0.05,
            concurrency=1,  # one slot: its claims come one after the other
            runs_per_claim=runs_per_claim,
        )
        relay.run(until_idle=0.5)
    assert seen_call_ids[0] == seen_call_ids[1]
    keys = [e.delivery_key for e in delivered]
    assert sorted(keys) == sorted(_events_in_db(db))
    assert len(keys) == len(set(keys))


def test_relay_acknowledges_lone_transport_only_events_and_keeps_going(
    db: psycopg.Connection, client: Client
) -> None:
    """Each run's only pending observability event is transport-only, with no
    successor ever coming. The relay's claims acknowledge them locally — the
    sink sees nothing — and a pass that only acknowledged locally counts as
    progress, so the relay comes straight back instead of sleeping: all 40 are
    settled before it is idle at all (sleeping even the 20 ms minimum between
    passes would add up past until_idle)."""
    n = 40
    for i in range(n):
        client.enqueue_run(f"t{i}")
        client.append_events(
            f"t{i}", [{"type": "hidden", "lane": "observability", "transport_only": True}]
        )
    delivered: list[LedgerEvent] = []
    relay = Relay(
        client,
        lambda lane, evs: delivered.extend(evs),
        lanes=["observability"],
        max_sleep=5.0,
    )
    relay.run(until_idle=0.3)
    assert delivered == []
    assert relay.stats["local_acks"] == n
    left = db.execute(
        "SELECT count(*) FROM runrelay.ledger WHERE lane = 'observability' AND NOT acked_locally"
    ).fetchone()
    assert left == (0,)


def test_jsonl_sink_appends_one_line_per_event(
    db: psycopg.Connection, client: Client, tmp_path: Path
) -> None:
    _make_runs(client, 2)
    path = tmp_path / "events.jsonl"
    Relay(client, JsonLinesSink(path), max_sleep=0.05).run(until_idle=0.5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(e["delivery_key"] for e in lines) == sorted(_events_in_db(db))
    assert {e["lane"] for e in lines} == {"lifecycle"}


def test_delivery_error_classification() -> None:
    assert DeliveryError("x", permanent=True).permanent
    with serve(Hook()) as url:
        pass
    with pytest.raises(DeliveryError) as exc:  # the server is gone: transient
        WebhookSink(url, timeout=1)("lifecycle", [_fake_event()])
    assert not exc.value.permanent
    for status, permanent in ((400, True), (404, True), (408, False), (429, False), (500, False)):
        hook = Hook()
        hook.script = lambda n, s=status: (s, 0.0)
        with serve(hook) as url, pytest.raises(DeliveryError) as exc:
            WebhookSink(url)("lifecycle", [_fake_event()])
        assert exc.value.permanent is permanent, status


def _fake_event() -> LedgerEvent:
    from datetime import UTC, datetime

    from runrelay import LedgerKind

    return LedgerEvent(
        LedgerKind.CLAIMED, 1, "r", 1, "t", {}, "r:1", datetime.now(UTC), False, None, None
    )


def test_snooze_hands_the_run_back_to_run_later(db: psycopg.Connection, client: Client) -> None:
    seen: list[int] = []

    def handler(job: Job) -> Any:
        seen.append(job.attempt.attempt)
        if job.attempt.attempt == 1:
            raise Snooze(after=3600, reason="rate limited")
        return {"ok": True}

    client.enqueue_run("later", max_attempts=3)
    Worker(client, handler, poll_interval=0.05, maintenance=False).run(until_idle=0.3)
    (run_at_ahead,) = db.execute(
        "SELECT run_at > now() + interval '50 minutes' FROM runrelay.runs WHERE run_id = 'later'"
    ).fetchone()
    assert run_at_ahead
    # A snooze is not a failure: the attempt is released, not counted.
    assert handed_back(db, "later") == ("queued", "released", "Snooze: rate limited")
    assert seen == [1]
    with pytest.raises(ValueError):
        Snooze(after=-1)


def test_each_loop_logs_one_line_as_it_starts(
    client: Client, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """What an operator (and the documents' test) reads to know a process is
    up: one INFO line per loop, with what it serves."""
    with caplog.at_level(logging.INFO, logger="runrelay"):
        Worker(
            client,
            lambda job: None,
            name="w-1",
            queues=["q1", "q2"],
            concurrency=3,
            poll_interval=0.05,
            maintenance_interval=60,
        ).run(until_idle=0.1)
        sink = JsonLinesSink(str(tmp_path / "out.jsonl"))
        Relay(client, sink, name="r-1", lanes=["lifecycle"], concurrency=2, max_sleep=0.05).run(
            until_idle=0.1
        )
    started = {r.getMessage(): r for r in caplog.records if r.getMessage().endswith(" started")}
    assert sorted(started) == ["maintenance started", "relay started", "worker started"]
    assert all(r.levelno == logging.INFO for r in started.values())
    worker, relay = started["worker started"], started["relay started"]
    assert (worker.worker, worker.queues, worker.concurrency) == ("w-1", "q1,q2", 3)
    assert (relay.relay, relay.lanes, relay.concurrency) == ("r-1", "lifecycle", 2)
    assert started["maintenance started"].interval_s == 60


def test_each_finished_job_logs_one_line_with_its_fields(
    db: psycopg.Connection, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    def handler(job: Job) -> Any:
        if job.run_id == "bad":
            raise KeyError("missing")
        return None

    client.enqueue_run("good", queue="q1")
    client.enqueue_run("bad", queue="q1", max_attempts=1)
    with caplog.at_level(logging.INFO, logger="runrelay.worker"):
        Worker(client, handler, queues=["q1"], poll_interval=0.05, maintenance=False).run(
            until_idle=0.3
        )
    finished = [r for r in caplog.records if r.getMessage() == "run finished"]
    assert len(finished) == 2  # one line per job
    lines = {r.run_id: r for r in finished}
    good, bad = lines["good"], lines["bad"]
    fields = ("outcome", "queue", "attempt")
    assert good.levelno == logging.INFO and good.exc_info is None
    assert [getattr(good, f) for f in fields] == ["completed", "q1", 1]
    assert isinstance(good.duration_ms, int) and good.duration_ms >= 0
    assert bad.levelno == logging.WARNING
    assert [getattr(bad, f) for f in fields] == ["failed", "q1", 1]
    assert bad.exc_info is not None and isinstance(bad.exc_info[1], KeyError)


# -- Two installs in one database ---------------------------------------------
# NOTIFY is database-wide: each install's channels carry its schema, so a run
# enqueued in one install wakes that install's loops and no other's.
@pytest.fixture(scope="module")
def two_installs() -> Iterator[str]:
    name = f"rr_two_installs_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    alembic(url, "upgrade", "head")
    alembic(url, "-x", "schema=billing", "upgrade", "head")
    yield url
    drop_database(name)


def _listening(url: str, channel_name: str) -> int:
    """Sessions whose last statement was the loops' LISTEN on a channel."""
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
            (listen_statement(channel_name).as_string(c),),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _listen_all(url: str, schema: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True)
    for kind in CHANNEL_KINDS:
        conn.execute(listen_statement(channel(schema, kind)))
    return conn


def _received_until_sentinel(listener: psycopg.Connection[Any], schema: str) -> list[str]:
    """The channels of the notifications a listener received before a
    sentinel NOTIFY sent now: NOTIFYs reach a session in commit order, so
    whatever arrives before the sentinel was sent before it."""
    with psycopg.connect(listener.info.dsn, autocommit=True) as c:
        c.execute("SELECT pg_notify(%s, 'sentinel')", (channel(schema, "runs"),))
    got = []
    for notify in listener.notifies():
        if notify.payload == "sentinel":
            return got
        got.append(notify.channel)
    raise AssertionError("the notification stream ended")


def test_channel_names_are_the_same_in_sql_and_python(two_installs: str) -> None:
    with psycopg.connect(two_installs, autocommit=True) as c:
        for schema in ("runrelay", "billing"):
            for kind in CHANNEL_KINDS:
                row = c.execute(
                    sql.SQL("SELECT {}(%s)").format(sql.Identifier(schema, "_channel")), (kind,)
                ).fetchone()
                assert row == (channel(schema, kind),)
            # An install sends every kind until told otherwise, and takes
            # exactly these kinds in settings.notifications.
            settings = sql.Identifier(schema, "settings")
            row = c.execute(sql.SQL("SELECT notifications FROM {}").format(settings)).fetchone()
            assert row == (list(CHANNEL_KINDS),)
            with pytest.raises(psycopg.errors.CheckViolation, match="settings_notifications"):
                c.execute(sql.SQL("UPDATE {} SET notifications = '{{queue}}'").format(settings))
    assert [channel("runrelay", k) for k in CHANNEL_KINDS] == [
        "runrelay_runs",
        "runrelay_ledger",
        "runrelay_terminal",
        "runrelay_delivered",
        "runrelay_cancel",
    ]
    with pytest.raises(ValueError, match="kind 'queue'"):
        channel("runrelay", "queue")
    # The dashboard's live pages listen on their own install's four.
    assert Notifications(two_installs, "billing").channels == (
        "billing_runs",
        "billing_ledger",
        "billing_terminal",
        "billing_delivered",
    )


def _notified_by_a_runs_life(client: Client, listener: psycopg.Connection[Any]) -> Counter[str]:
    """The kinds a listener on every channel hears while one run is
    enqueued, given its first observability event (a new lane), its
    run.queued delivered, claimed (run.started wakes the lane the delivery
    left empty) and completed, and a second run cancelled while a worker
    holds it: every statement that notifies ledger or terminal."""
    client.enqueue_run("life", "mail", {"n": 1})
    client.append_events("life", [{"type": "note.added", "lane": "observability"}])
    [queued] = client.claim_ledger(relay="r", run_id="life")
    assert queued.type == "run.queued"
    client.ack_ledger(relay="r", run_id="life", event_ids=[queued.event_id])
    [attempt] = client.claim_attempts(worker="w", queues=["mail"])
    assert client.claim_ledger(relay="r", run_id="life")[0].type == "run.started"
    assert client.complete_attempt(**attempt.fence, result={"ok": 1}) == "completed"
    client.enqueue_run("held", "held", {"n": 2})
    assert len(client.claim_attempts(worker="w", queues=["held"])) == 1
    assert client.cancel_run("held") == "cancelled"
    got = _received_until_sentinel(listener, "runrelay")
    return Counter(name.rsplit("_", 1)[1] for name in got)


# What that life sends with every kind on, statement by statement: runs —
# the two enqueues; ledger — the two enqueues, the new observability lane
# (_lanes_on_write's one-lane insert) and the claim's run.started on the
# emptied lane (its one-statement wake); terminal — the completion (the
# fused completion) and the cancellation (_ended); delivered — the one
# acknowledgement; cancel — the held run's worker.
LIFE_SENDS = Counter({"runs": 2, "ledger": 4, "terminal": 2, "delivered": 1, "cancel": 1})


@pytest.mark.parametrize(
    "sent",
    [
        list(CHANNEL_KINDS),
        ["runs", "ledger"],
        ["terminal", "delivered", "cancel"],
        [],
    ],
    ids=["every kind", "wake-ups only", "observers only", "none"],
)
def test_settings_notifications_sends_the_kinds_it_names(
    db: psycopg.Connection[Any], db_url: str, client: Client, sent: list[str]
) -> None:
    """settings.notifications decides which kinds an install sends, and the
    run's life is the same whichever it names (the calls above assert it)."""
    db.execute("UPDATE runrelay.settings SET notifications = %s", (sent,))
    with _listen_all(db_url, "runrelay") as listener:
        got = _notified_by_a_runs_life(client, listener)
    assert got == Counter({kind: n for kind, n in LIFE_SENDS.items() if kind in sent})


def test_a_channel_name_that_needs_quoting_is_listened_on_quoted(db_url: str) -> None:
    """A schema may start with a digit; its channels are then quoted
    identifiers, and NOTIFY's text name reaches them. The default install's
    go bare, as LISTEN runrelay_runs."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        assert listen_statement("runrelay_runs").as_string(listener) == "LISTEN runrelay_runs"
        name = channel("2024billing", "runs")
        assert listen_statement(name).as_string(listener) == 'LISTEN "2024billing_runs"'
        listener.execute(listen_statement(name))
        with psycopg.connect(db_url, autocommit=True) as sender:
            sender.execute("SELECT pg_notify(%s, 'q')", (name,))
        notify = next(listener.notifies())
        assert (notify.channel, notify.payload) == (name, "q")


@pytest.mark.parametrize("busy,quiet", [("billing", "runrelay"), ("runrelay", "billing")])
def test_a_run_wakes_only_its_own_installs_listeners_and_loops(
    two_installs: str, tmp_path: Path, busy: str, quiet: str
) -> None:
    url = two_installs
    loop_channels = [channel(s, k) for s in (busy, quiet) for k in ("runs", "ledger")]
    # A closed session can still show in pg_stat_activity for a moment: the
    # count below must see this test's loops listening, not the last test's.
    _wait_for(lambda: all(_listening(url, name) == 0 for name in loop_channels))
    listeners = {s: _listen_all(url, s) for s in (busy, quiet)}
    pools = {
        s: ConnectionPool(url, min_size=1, max_size=4, kwargs={"autocommit": True}, open=True)
        for s in (busy, quiet)
    }
    loops: list[Any] = []
    threads = []
    try:
        clients = {s: Client(pools[s], schema=s) for s in (busy, quiet)}
        for s in (busy, quiet):
            # Polls too rare to matter: only a NOTIFY wakes these loops in time.
            worker = Worker(
                clients[s],
                lambda job: {"ok": job.run_id},
                poll_interval=3600.0,
                listen_dsn=url,
                maintenance=False,
                name=f"w-{s}",
            )
            relay = Relay(
                clients[s],
                JsonLinesSink(tmp_path / f"{s}.jsonl"),
                max_sleep=3600.0,
                listen_dsn=url,
                name=f"r-{s}",
            )
            for loop in (worker, relay):
                loops.append(loop)
                thread = threading.Thread(target=loop.run, daemon=True)
                thread.start()
                threads.append(thread)
        for s in (busy, quiet):
            _wait_for(lambda s=s: _listening(url, channel(s, "runs")) == 1)
            _wait_for(lambda s=s: _listening(url, channel(s, "ledger")) == 1)

        clients[busy].enqueue_run("woken", "mail", {"n": 1})
        with psycopg.connect(url, autocommit=True) as c:
            status = sql.SQL("SELECT status FROM {} WHERE run_id = 'woken'").format(
                sql.Identifier(busy, "runs")
            )
            _wait_for(
                lambda: c.execute(status).fetchone() == ("completed",),
                state=lambda: (
                    c.execute(status).fetchone(),
                    {loop.name: getattr(loop, "stats", None) for loop in loops},
                    {name: _listening(url, name) for name in loop_channels},
                ),
            )
        _wait_for(
            lambda: (
                (tmp_path / f"{busy}.jsonl").exists()
                and "run.completed" in (tmp_path / f"{busy}.jsonl").read_text()
            )
        )

        got = _received_until_sentinel(listeners[busy], busy)
        # Every channel a run's life notifies (a run nobody cancelled sends
        # nothing on <schema>_cancel).
        assert {name.rsplit("_", 1)[1] for name in got} == set(CHANNEL_KINDS) - {"cancel"}, got
        assert all(name.startswith(f"{busy}_") for name in got), got
        assert _received_until_sentinel(listeners[quiet], quiet) == []
        assert not (tmp_path / f"{quiet}.jsonl").exists()
    finally:
        for loop in loops:
            loop.stop()
        for thread in threads:
            thread.join(30)
        for conn in listeners.values():
            conn.close()
        for pool in pools.values():
            pool.close()
        _wait_for(lambda: all(_listening(url, name) == 0 for name in loop_channels))
