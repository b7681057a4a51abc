"""Faults on a sharded install: a shard server crashes under load, a proxy
backend dies mid-call.

Producers, workers and relays run through the proxy (recorded clients, see
faults.py) while shard 1 is killed (pg_ctl -m immediate) and started again.
Shard 0's work goes on while shard 1 is down; once everything is drained,
no run and no ledger event is lost on either shard, and the project's
history checker (I1-I10, docs/guarantees.md) finds nothing on either shard's
part of the history.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from faults import Checker, History, RecordingClient, SinkLog, is_shard_lost, wait_for
from runrelay.sharding import ShardMap
from sharded_harness import ShardedInstall, run_ids_on

pytestmark = pytest.mark.sharded

LEASE = 5  # seconds: a lease lost with a crashed shard's reply comes back soon


class Load:
    """Threads doing the work of producers, workers and relays through the
    proxy, each with its own recorded client, until told to stop."""

    def __init__(self, sharded: ShardedInstall, history: History, sink: SinkLog) -> None:
        self.sharded = sharded
        self.history = history
        self.sink = sink
        self.stop_producing = threading.Event()
        self.stop_all = threading.Event()
        self.threads: list[threading.Thread] = []
        self.clients: list[RecordingClient] = []
        self.errors: list[BaseException] = []

    def client(self, name: str) -> RecordingClient:
        c = RecordingClient(self.sharded.proxy_url, self.history, name, replay_for=90.0)
        self.clients.append(c)
        return c

    def spawn(self, name: str, body: Callable[[RecordingClient], None]) -> None:
        def run() -> None:
            client = self.client(name)
            try:
                body(client)
            except BaseException as error:  # a thread's failure fails the test
                self.errors.append(error)

        t = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def producer(self, run_ids: list[str]) -> Callable[[RecordingClient], None]:
        def body(client: RecordingClient) -> None:
            for run_id in run_ids:
                if self.stop_producing.is_set():
                    return
                client.enqueue_run(run_id, queue="fq", payload={"n": run_id}, max_attempts=20)
                client.append_events(run_id, [{"type": "a"}, {"type": "b"}])
                time.sleep(0.01)

        return body

    def worker(self, name: str) -> Callable[[RecordingClient], None]:
        def body(client: RecordingClient) -> None:
            while not self.stop_all.is_set():
                claimed = client.claim_attempts(
                    name, ["fq"], max_runs=3, lease_seconds=LEASE, call_id=uuid.uuid4()
                )
                for c in claimed:
                    client.complete_attempt(c.run_id, c.attempt, c.lease_token, {"ok": True})
                if not claimed:
                    time.sleep(0.05)

        return body

    def relay(self, name: str) -> Callable[[RecordingClient], None]:
        def body(client: RecordingClient) -> None:
            while not self.stop_all.is_set():
                events = client.claim_ledger(name, "lifecycle", lease_seconds=LEASE)
                if not events:
                    time.sleep(0.05)
                    continue
                deliver = [e for e in events if e.kind == "claimed"]
                self.sink.receive(name, "lifecycle", deliver)
                client.ack_ledger(name, events[0].run_id, [e.event_id for e in deliver])

        return body

    def reaper(self, client: RecordingClient) -> None:
        while not self.stop_all.is_set():
            client.reap_expired(max_attempts=100)
            time.sleep(0.5)

    def join(self) -> None:
        self.stop_producing.set()
        self.stop_all.set()
        for t in self.threads:
            t.join(timeout=120)
        for c in self.clients:
            c.close()


def _project(calls: list[dict[str, Any]], shard_map: ShardMap, shard: int) -> list[dict[str, Any]]:
    """Shard `shard`'s part of a history: per-run calls of its runs, and the
    discovery calls with only the rows of its runs."""
    mine: list[dict[str, Any]] = []
    for c in calls:
        run_id = c["args"].get("run_id")
        if run_id is not None:
            if shard_map.shard_for(run_id) == shard:
                mine.append(c)
            continue
        c = dict(c)
        if isinstance(c.get("result"), list):
            c["result"] = [r for r in c["result"] if shard_map.shard_for(r["run_id"]) == shard]
        mine.append(c)
    return mine


def _check(sharded: ShardedInstall, history: History, sink: SinkLog) -> dict[int, Any]:
    shard_map = sharded.shard_map()
    reports = {}
    for shard in (0, 1):
        calls = _project(history.calls, shard_map, shard)
        records = [r for r in sink.records if shard_map.shard_for(r["run_id"]) == shard]
        reports[shard] = Checker(calls, sharded.shard(shard), records).run()
    return reports


def _drained(shards: list[psycopg.Connection[Any]]) -> bool:
    total = 0
    for conn in shards:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM runrelay.runs WHERE status <> 'completed')"
            " + (SELECT count(*) FROM runrelay.ledger WHERE state <> 'delivered')"
        ).fetchone()
        assert row is not None
        total += row[0]
    return total == 0


def test_a_shard_crash_stops_only_its_own_work_and_loses_nothing(
    sharded: ShardedInstall, tmp_path: Path
) -> None:
    history = History(tmp_path / "history.jsonl")
    sink = SinkLog()
    load = Load(sharded, history, sink)
    ids = {s: run_ids_on(sharded, s, 1500, f"f{s}") for s in (0, 1)}
    try:
        for s in (0, 1):
            load.spawn(f"producer{s}", load.producer(ids[s]))
        for i in range(3):
            load.spawn(f"worker{i}", load.worker(f"worker{i}"))
        for i in range(2):
            load.spawn(f"relay{i}", load.relay(f"relay{i}"))
        load.spawn("reaper", load.reaper)
        time.sleep(7)
        sharded.clusters.shards[1].crash()
        down = time.time()  # the server is gone (pg_ctl waited for it)
        time.sleep(5)
        up = time.time()
        sharded.clusters.shards[1].start()
        time.sleep(6)
        load.stop_producing.set()
        shards = [sharded.shard(0), sharded.shard(1)]
        wait_for(lambda: _drained(shards), timeout=60, what="every run and event done")
    finally:
        load.join()
        history.close()
    assert load.errors == []

    shard_map = sharded.shard_map()
    # Shard 0 went on while shard 1 was down.
    during = [
        c
        for c in history.calls
        if c["fn"] == "complete_attempt"
        and c["type"] == "ok"
        and c["result"] == "completed"
        and down < c["w0"]
        and c["w1"] < up
    ]
    assert during and all(shard_map.shard_for(c["args"]["run_id"]) == 0 for c in during)
    # The crash was felt: some calls lost their shard and were repeated.
    lost = [c for c in history.calls if c["type"] == "info" and is_shard_lost(c["error"])]
    assert lost

    # Nothing lost: every run enqueued is completed, every event delivered,
    # each delivery key reached the consumer, in per-run order.
    enqueued = {c["args"]["run_id"] for c in history.calls if c["fn"] == "enqueue_run"}
    assert {shard_map.shard_for(r) for r in enqueued} == {0, 1}
    final = dict(sharded.everywhere("SELECT run_id, status FROM runrelay.runs"))
    assert set(final) == enqueued
    assert set(final.values()) == {"completed"}
    keys = sharded.everywhere(
        "SELECT run_id, seq, delivery_key FROM runrelay.ledger ORDER BY run_id, seq"
    )
    seen: dict[str, list[int]] = {}
    for record in sink.records:
        got = seen.setdefault(record["run_id"], [])
        got += [seq for seq in record["seqs"] if seq not in got]
    assert {r[2] for r in keys} <= {k for rec in sink.records for k in rec["keys"]}
    for run_id, seqs in seen.items():
        assert seqs == sorted(seqs), f"{run_id} delivered out of order: {seqs}"

    reports = _check(sharded, history, sink)
    print(
        f"runs {len(enqueued)}, completed on shard 0 while shard 1 was down {len(during)},"
        f" calls that lost their shard {len(lost)}, deliveries {len(sink.records)}"
    )
    for shard, report in reports.items():
        print(f"shard {shard}: {dict(report.counters)}")
        assert report.violations == [], f"shard {shard}: {report}"


def test_a_proxy_backend_killed_mid_call_replays_exactly(sharded: ShardedInstall) -> None:
    """The shard goes on with a call whose proxy backend was terminated
    while the shard waited for a lock: the shard commits, the caller sees
    its session end (57P01), and repeating the call answers what the
    shard recorded: exactly, never applied twice."""
    run_id, other = run_ids_on(sharded, 1, 2, "k")
    client = sharded.client()
    client.enqueue_run(run_id, queue="kq")
    client.enqueue_run(other, queue="kq")
    client.append_events(run_id, [{"type": "a"}])
    claimed = {c.run_id: c for c in client.claim_attempts("w", ["kq"], max_runs=2)}
    c = claimed[run_id]
    observer = sharded.connect()
    shard = sharded.shard(1)

    def killed_while_waiting(query: str, params: Any, table: str = "runs") -> None:
        """Run query on a proxy session, kill that session while its shard
        call waits on a row lock of the run (in `table`), then let the shard
        go on."""
        blocker = sharded.connect(sharded.shard_urls[1], autocommit=False)
        blocker.execute(f"SELECT 1 FROM runrelay.{table} WHERE run_id = %s FOR UPDATE", [run_id])
        name = f"victim-{uuid.uuid4().hex[:8]}"
        victim = sharded.connect(application_name=name)
        pid = victim.info.backend_pid
        failure: list[BaseException] = []

        def call() -> None:
            try:
                victim.execute(query, params).fetchall()
            except psycopg.Error as error:
                failure.append(error)

        t = threading.Thread(target=call)
        t.start()
        wait_for(
            lambda: (
                shard.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                == (1,)
            ),
            timeout=30,
            what="the shard call waits on the lock",
        )
        observer.execute("SELECT pg_terminate_backend(%s)", [pid])
        t.join(timeout=30)
        assert failure and failure[0].sqlstate == "57P01", failure
        blocker.rollback()
        wait_for(
            lambda: (
                shard.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                == (0,)
            ),
            timeout=30,
            what="the shard call finishes",
        )

    # Whether the shard went on (committed) or PL/Proxy cancelled its call
    # as its backend died, the caller cannot know: it repeats the call, and
    # the answer is the one outcome, applied once.
    # A fenced write: the repeat says completed (recorded, or done now).
    complete = (
        "SELECT runrelay.complete_attempt(%s, %s, %s, '{}'::jsonb)",
        [run_id, c.attempt, c.lease_token],
    )
    killed_while_waiting(*complete)
    assert sharded.connect().execute(*complete).fetchone() == ("completed",)
    assert client.complete_attempt(run_id, c.attempt, c.lease_token) == "completed"
    once = shard.execute(
        "SELECT (SELECT count(*) FROM runrelay.attempts WHERE run_id = %(r)s"
        "        AND status = 'completed'),"
        "       (SELECT count(*) FROM runrelay.ledger WHERE run_id = %(r)s"
        "        AND type = 'run.completed')",
        {"r": run_id},
    ).fetchone()
    assert once == (1, 1)

    # A claim with a call_id: the repeat returns the lease the lost call
    # took (or takes it now), and every later repeat the same.
    call = uuid.uuid4()
    claim = (
        "SELECT event_id, seq, delivery_key FROM runrelay.claim_ledger("
        "'relay', 'lifecycle', %s, 1, 30, true, NULL, false, %s)",
        [run_id, call],
    )
    killed_while_waiting(*claim, table="ledger_lanes")
    first = sharded.connect().execute(*claim).fetchall()
    assert len(first) == 1
    assert sharded.connect().execute(*claim).fetchall() == first
    leased = shard.execute(
        "SELECT event_id, seq, delivery_key FROM runrelay.ledger"
        " WHERE run_id = %s AND lease_owner = 'relay' ORDER BY seq",
        [run_id],
    ).fetchall()
    assert leased == first


def test_calls_over_a_down_shard(sharded: ShardedInstall) -> None:
    """With shard 1 down: a batch that names its runs fails with 08006 and a
    hint to repeat (shard 0's part is done, once); discovery skips it; a run
    of shard 1 is unreachable. Once it is back, the repeated batch answers
    for every item, shard 0's as already done. With no shard up, discovery
    fails with 08006."""
    a = run_ids_on(sharded, 0, 2, "dn")
    b = run_ids_on(sharded, 1, 2, "dn")
    items = [{"run_id": r, "queue": "dq"} for r in (a[0], b[0], a[1], b[1])]
    batch = "SELECT run_id, created FROM runrelay.enqueue_runs(%s::jsonb)"
    proxy = sharded.connect()
    sharded.clusters.shards[1].crash()
    try:
        with pytest.raises(psycopg.errors.ConnectionFailure) as caught:
            proxy.execute(batch, [psycopg.types.json.Jsonb(items)])
        assert caught.value.diag.message_primary is not None
        assert caught.value.diag.message_primary.startswith("runrelay: shard 1 is unavailable")
        assert caught.value.diag.message_hint is not None
        assert "replays are exact" in caught.value.diag.message_hint
        claimed = proxy.execute(
            "SELECT run_id FROM runrelay.claim_attempts('w', ARRAY['dq'], 10)"
        ).fetchall()
        assert sorted(r[0] for r in claimed) == sorted(a)
        with pytest.raises(psycopg.errors.InternalError) as lost:
            proxy.execute("SELECT * FROM runrelay.get_run(%s)", [b[0]])
        assert is_shard_lost(str(lost.value))
    finally:
        sharded.clusters.shards[1].start()
    again = sharded.connect().execute(batch, [psycopg.types.json.Jsonb(items)]).fetchall()
    assert again == [(a[0], False), (b[0], True), (a[1], False), (b[1], True)]

    sharded.clusters.shards[0].crash()
    sharded.clusters.shards[1].crash()
    try:
        with pytest.raises(psycopg.errors.ConnectionFailure) as none:
            sharded.connect().execute("SELECT * FROM runrelay.claim_attempts('w', ARRAY['dq'])")
        assert str(none.value).startswith("runrelay: claim_attempts reached no shard")
    finally:
        sharded.clusters.shards[0].start()
        sharded.clusters.shards[1].start()
