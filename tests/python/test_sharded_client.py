"""The Python client through a sharded install's proxy answers as on one node:
every SPEC function, for runs on both shards; a shard's errors arrive as the
same typed exceptions; a producer's transaction must be on the run's shard;
a down shard is a clear ShardUnavailable."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from devtools.round_trips import frontend_round_trips, traced

from runrelay import (
    AsyncClient,
    CancelOutcome,
    Client,
    CompleteOutcome,
    FailOutcome,
    HeartbeatOutcome,
    InvalidArgument,
    LedgerFailOutcome,
    LedgerKind,
    PauseOutcome,
    PayloadTooLarge,
    ReapOutcome,
    ReleaseOutcome,
    ResumeOutcome,
    RetryOutcome,
    RunnerTerminalOutcome,
    RunrelayError,
    RunStatus,
    SettleKind,
    SettleOutcome,
    ShardUnavailable,
    SignalOutcome,
    SuspendOutcome,
    WaitingFailureOutcome,
)
from runrelay.cli import main
from runrelay.sharding import EVENT_SHIFT, ProxyTransaction, WrongShard
from sharded_harness import ShardedInstall, run_ids_on
from sqlapi import table_checksum

pytestmark = pytest.mark.sharded

WAIT = {"kind": "event", "name": "go"}


def checksums(sharded: ShardedInstall) -> list[str]:
    """Every shard's table digest: equal before and after a call means the
    call changed nothing anywhere."""
    return [table_checksum(sharded.shard(i)) for i in range(len(sharded.shard_urls))]


def both(sharded: ShardedInstall, prefix: str, count: int = 1) -> tuple[list[str], list[str]]:
    return run_ids_on(sharded, 0, count, prefix + "0"), run_ids_on(sharded, 1, count, prefix + "1")


@contextmanager
def shifted_clock(sharded: ShardedInstall, offset: str = "7200s") -> Iterator[Client]:
    """A client whose calls see every shard's clock moved ahead: the shards'
    role default of runrelay.clock_offset (tests only: allow_clock_override)
    is read by the sessions PL/Proxy opens for a new proxy connection; the
    connection ends before the default is reset."""

    def apply(setting: str) -> None:
        for url in sharded.shard_urls:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(f"ALTER ROLE postgres IN DATABASE postgres {setting}")

    apply(f"SET runrelay.clock_offset = '{offset}'")
    try:
        with psycopg.connect(sharded.proxy_url, autocommit=True) as conn:
            yield Client(conn)
    finally:
        apply("RESET runrelay.clock_offset")


# --------------------------------------------------------------------------
# Producers
# --------------------------------------------------------------------------


def test_producer_calls_answer_as_on_one_node(sharded: ShardedInstall) -> None:
    client = sharded.client()
    (a,), (b,) = both(sharded, "p")
    for run_id in (a, b):
        created = client.enqueue_run(run_id, queue="q", payload={"n": 1})
        assert (created.run_id, created.status, created.created) == (run_id, "queued", True)
        repeat = client.enqueue_run(run_id, queue="q", payload={"n": 1})
        assert (repeat.status, repeat.created) == (RunStatus.QUEUED, False)
        before = checksums(sharded)
        with pytest.raises(InvalidArgument) as conflict:
            client.enqueue_run(run_id, queue="other", payload={"n": 1})
        assert conflict.value.sqlstate == "22023"
        assert "REMOTE" not in conflict.value.message
        assert checksums(sharded) == before

        appended = client.append_events(run_id, [{"type": "x"}, {"type": "y"}, {"type": "z"}])
        seqs = [e.seq for e in appended]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert [e.delivery_key for e in appended] == [f"{run_id}:{s}" for s in seqs]
        shard = 0 if run_id == a else 1
        assert all(e.event_id >> EVENT_SHIFT == shard for e in appended)

        assert client.signal_run(run_id, "go", {"v": 1}) is SignalOutcome.STORED
        call_id = uuid.uuid4()
        assert client.cancel_run(run_id, "bye", call_id) is CancelOutcome.CANCELLED
        assert client.cancel_run(run_id, "bye", call_id) is CancelOutcome.CANCELLED
        assert client.cancel_run(run_id, "again") is CancelOutcome.ALREADY_TERMINAL
        assert client.signal_run(run_id, "go") is SignalOutcome.TERMINAL
    assert client.signal_run("missing", "go") is SignalOutcome.NOT_FOUND
    assert client.cancel_run("missing") is CancelOutcome.NOT_FOUND
    homes = sharded.everywhere("SELECT run_id, status FROM runrelay.runs ORDER BY run_id")
    assert homes == sorted([(a, "cancelled"), (b, "cancelled")])


def test_enqueue_runs_across_shards_answers_in_item_order(sharded: ShardedInstall) -> None:
    client = sharded.client()
    zero, one = both(sharded, "e", 3)
    ids = [one[0], zero[0], one[1], zero[1], one[2], zero[2]]
    results = client.enqueue_runs([{"run_id": r, "queue": "q"} for r in ids])
    assert [(r.run_id, r.created) for r in results] == [(r, True) for r in ids]
    again = client.enqueue_runs([{"run_id": r, "queue": "q"} for r in reversed(ids)])
    assert [(r.run_id, r.created) for r in again] == [(r, False) for r in reversed(ids)]
    assert sorted(r[0] for r in sharded.shard(1).execute("SELECT run_id FROM runrelay.runs")) == (
        sorted(one)
    )


# --------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------


def test_claim_heartbeat_complete_on_both_shards(sharded: ShardedInstall) -> None:
    client = sharded.client()
    # Shard 1's run_ids sort first: the batch answers in run_id order, not shard order.
    zero, one = run_ids_on(sharded, 0, 2, "z"), run_ids_on(sharded, 1, 2, "a")
    for run_id in zero + one:
        client.enqueue_run(run_id, queue="w", payload={"id": run_id})
    call_id = uuid.uuid4()
    claimed = client.claim_attempts("w1", ["w"], max_runs=10, call_id=call_id)
    assert sorted(c.run_id for c in claimed) == sorted(zero + one)
    assert all(c.payload == {"id": c.run_id} and c.attempt == 1 for c in claimed)
    # A replay after a lost reply: the same rows, nothing claimed twice.
    before = checksums(sharded)
    assert client.claim_attempts("w1", ["w"], max_runs=10, call_id=call_id) == claimed
    assert checksums(sharded) == before
    assert client.claim_attempts("w2", ["w"], max_runs=10) == []

    by_id = {c.run_id: c for c in claimed}
    for run_id in (zero[0], one[0]):
        beat = client.heartbeat(**by_id[run_id].fence, lease_seconds=60)
        assert beat.outcome is HeartbeatOutcome.OK
        lost = client.heartbeat(run_id, 1, uuid.uuid4())
        assert (lost.outcome, lost.lease_expires_at) == (HeartbeatOutcome.FENCE_LOST, None)
        done = client.complete_attempt(**by_id[run_id].fence, result={"ok": run_id})
        assert done is CompleteOutcome.COMPLETED
        assert client.complete_attempt(**by_id[run_id].fence) is CompleteOutcome.COMPLETED
    # complete_attempts over both shards, a stale fence among them: in run_id
    # order, as on one node.
    stale = {**by_id[zero[1]].fence, "lease_token": uuid.uuid4()}
    outcomes = client.complete_attempts([stale, by_id[one[1]]])
    assert [(i.run_id, i.outcome) for i in outcomes] == [
        (one[1], CompleteOutcome.COMPLETED),
        (zero[1], CompleteOutcome.FENCE_LOST),
    ]
    (last,) = client.complete_attempts([by_id[zero[1]]])
    assert last.outcome is CompleteOutcome.COMPLETED
    statuses = sharded.everywhere("SELECT DISTINCT status FROM runrelay.runs")
    assert statuses == [("completed",), ("completed",)]


def test_fail_suspend_signal_and_runner_terminal(sharded: ShardedInstall) -> None:
    client = sharded.client()
    for run_id in [*run_ids_on(sharded, 0, 1, "f0"), *run_ids_on(sharded, 1, 1, "f1")]:
        # fail_attempt: a retry, then (attempts exhausted) failed.
        client.enqueue_run(run_id, queue=run_id, max_attempts=2)
        (first,) = client.claim_attempts("w", [run_id])
        assert client.fail_attempt(**first.fence, error={"e": 1}) is FailOutcome.RETRY_SCHEDULED
        with shifted_clock(sharded) as later:
            (second,) = later.claim_attempts("w", [run_id])
            assert second.attempt == 2
            assert later.fail_attempt(**second.fence, error={"e": 2}) is FailOutcome.FAILED

        # suspend_attempt, then a signal resumes the run with its payload.
        waiter = run_id + "-wait"
        client.enqueue_run(waiter, queue=waiter)
        (claim,) = client.claim_attempts("w", [waiter])
        assert client.suspend_attempt(**claim.fence, wait=WAIT) is SuspendOutcome.WAITING
        assert client.signal_run(waiter, "go", {"ok": 1}) is SignalOutcome.RESUMED
        (resumed,) = client.claim_attempts("w", [waiter])
        assert (resumed.attempt, resumed.resume) == (2, {"name": "go", "payload": {"ok": 1}})

        # A detached runner's pushed terminal.
        detached = run_id + "-det"
        client.enqueue_run(detached, queue=detached)
        (d,) = client.claim_attempts("w", [detached])
        wait = {"kind": "detached_runner", "runner": "gpu"}
        assert client.suspend_attempt(**d.fence, wait=wait) is SuspendOutcome.WAITING
        outcome = client.record_runner_terminal(detached, 1, {"status": "ok"})
        assert outcome is RunnerTerminalOutcome.RECORDED
        again = client.record_runner_terminal(detached, 1, {"status": "ok"})
        assert again is RunnerTerminalOutcome.DUPLICATE
        pushed = client.read_runner_terminal(detached, 1)
        assert pushed is not None and pushed.result == {"status": "ok"}
        assert client.claim_detached_terminal(**d.fence) is True
        assert client.complete_attempt(**d.fence, result=pushed.result) is (
            CompleteOutcome.COMPLETED
        )
    rows = sharded.everywhere("SELECT run_id, status FROM runrelay.runs ORDER BY run_id")
    assert sorted(s for _, s in rows) == sorted(["failed", "running", "completed"] * 2)


def test_steps_are_recorded_and_claimed_on_each_runs_shard(
    sharded: ShardedInstall, capsys: pytest.CaptureFixture[str]
) -> None:
    """record_step routes by run_id; a claim through the proxy returns each
    run's steps from its shard, and run_steps reads them there."""
    client = sharded.client()
    zero, one = both(sharded, "st")
    for run_id in zero + one:
        client.enqueue_run(run_id, queue="st")
    claimed = {c.run_id: c for c in client.claim_attempts("w1", ["st"], max_runs=10)}
    for run_id, claim in claimed.items():
        assert claim.steps is None
        assert client.record_step(**claim.fence, step="a", result={"on": run_id}) == "recorded"
        assert client.record_step(**claim.fence, step="a", result={}) == "already_recorded"
        assert client.release_attempt(**claim.fence) is ReleaseOutcome.RELEASED
    again = {c.run_id: c for c in client.claim_attempts("w1", ["st"], max_runs=10)}
    assert {r: c.steps for r, c in again.items()} == {r: {"a": {"on": r}} for r in zero + one}
    assert client.record_step(**claimed[zero[0]].fence, step="b", result=1) == "fence_lost"
    assert [s.step for s in client.run_steps(one[0])] == ["a"]
    # runs show of a running run through the proxy: its steps, and no dead
    # holder named (list_processes is per shard).
    assert main(["--database-url", sharded.proxy_url, "runs", "show", one[0], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"]["status"] == "running" and shown["held_by_dead_worker"] is None
    assert [s["step"] for s in shown["steps"]] == ["a"]


def test_reap_expired_walks_both_shards(sharded: ShardedInstall) -> None:
    client = sharded.client()
    zero, one = both(sharded, "x")
    for run_id in zero + one:
        client.enqueue_run(run_id, queue="x", max_attempts=1)
    assert len(client.claim_attempts("w", ["x"], max_runs=5, lease_seconds=5)) == 2
    assert client.reap_expired() == []  # the leases have not expired
    with shifted_clock(sharded) as later:
        reaped = later.reap_expired()
    assert sorted((r.run_id, r.outcome) for r in reaped) == sorted(
        [(zero[0], ReapOutcome.FAILED), (one[0], ReapOutcome.FAILED)]
    )
    assert client.reap_expired() == []


def test_settle_and_claim_with_items_on_both_shards(sharded: ShardedInstall) -> None:
    client = sharded.client()
    zero, one = both(sharded, "s", 3)
    for run_id in zero[:2] + one[:2]:
        client.enqueue_run(run_id, queue="s")
    claims = {c.run_id: c for c in client.claim_attempts("w", ["s"], max_runs=4)}
    for run_id in (zero[2], one[2]):
        client.enqueue_run(run_id, queue="s")
    items = [
        (claims[one[0]], {"r": 1}),
        {**claims[zero[0]].fence, "op": "suspend", "wait": WAIT},
        {**claims[one[1]].fence, "op": "fail", "error": {"e": 1}},
        {**claims[zero[1]].fence, "lease_token": uuid.uuid4()},
    ]
    call_id = uuid.uuid4()
    rows = client.settle_and_claim(items, "w", ["s"], max_runs=5, call_id=call_id)
    settled = [(r.kind, r.run_id, r.outcome) for r in rows[:4]]
    assert settled == [
        (SettleKind.SETTLED, one[0], SettleOutcome.COMPLETED),
        (SettleKind.SETTLED, zero[0], SettleOutcome.WAITING),
        (SettleKind.SETTLED, one[1], SettleOutcome.RETRY_SCHEDULED),
        (SettleKind.SETTLED, zero[1], SettleOutcome.FENCE_LOST),
    ]
    claimed = sorted(r.run_id for r in rows[4:])
    assert all(r.kind is SettleKind.CLAIMED for r in rows[4:])
    assert claimed == sorted([zero[2], one[2]])
    before = checksums(sharded)
    assert client.settle_and_claim(items, "w", ["s"], max_runs=5, call_id=call_id) == rows
    assert checksums(sharded) == before


def test_release_waiting_failure_and_admin_calls(sharded: ShardedInstall) -> None:
    client = sharded.client()
    for shard in (0, 1):
        released, waiting, failing = run_ids_on(sharded, shard, 3, f"m{shard}")
        for run_id in (released, waiting, failing):
            client.enqueue_run(run_id, queue=run_id, max_attempts=1)
        (r,) = client.claim_attempts("w", [released])
        assert client.release_attempt(**r.fence, reason="snooze") is ReleaseOutcome.RELEASED
        (w,) = client.claim_attempts("w", [waiting])
        assert client.suspend_attempt(**w.fence, wait=WAIT) is SuspendOutcome.WAITING
        outcome = client.fail_waiting(**w.fence, error={"e": "gave up"})
        assert outcome is WaitingFailureOutcome.FAILED
        (f,) = client.claim_attempts("w", [failing])
        assert client.fail_attempt(**f.fence, error={"e": 1}) is FailOutcome.FAILED
        assert client.retry_run(failing, max_attempts=2) is RetryOutcome.RETRIED
        detail = client.get_run(failing)
        assert detail is not None and (detail.run_id, detail.status) == (failing, "queued")
        assert [a.attempt for a in client.run_attempts(failing)] == [1]
        types = [e.type for e in client.run_ledger_events(failing)]
        assert types[0] == "run.queued" and types[-1] == "run.retried"
        assert client.get_run(f"nope-{shard}") is None

    assert client.pause_queue("pq", reason="maintenance") is PauseOutcome.PAUSED
    assert client.pause_queue("pq") is PauseOutcome.ALREADY_PAUSED
    assert sharded.everywhere("SELECT queue FROM runrelay.paused_queues") == [("pq",), ("pq",)]
    assert client.resume_queue("pq") is ResumeOutcome.RESUMED
    assert client.resume_queue("pq") is ResumeOutcome.NOT_PAUSED
    assert isinstance(client.record_queue_activity(), int)
    assert client.prune(datetime(2000, 1, 1, tzinfo=UTC)) == 0
    assert client.purge_runs(datetime(2000, 1, 1, tzinfo=UTC)) == 0


# --------------------------------------------------------------------------
# Relays
# --------------------------------------------------------------------------


def test_ledger_calls_on_both_shards(sharded: ShardedInstall) -> None:
    client = sharded.client()
    (a,), (b,) = both(sharded, "l")
    assert client.ledger_next_due_at() is None
    for run_id in (a, b):
        client.enqueue_run(run_id)  # its lifecycle lane starts with run.queued
        client.append_events(run_id, [{"type": "one"}, {"type": "two"}])
    assert isinstance(client.ledger_next_due_at(), datetime)
    assert isinstance(client.ledger_next_due_at("lifecycle", b), datetime)

    # A discovery claim takes one lane's events; two find both shards' heads.
    heads = []
    for _ in range(2):
        call_id = uuid.uuid4()
        got = client.claim_ledger("relay", max_events=10, lease_seconds=60, call_id=call_id)
        again = client.claim_ledger("relay", max_events=10, lease_seconds=60, call_id=call_id)
        # The same rows; only the lease's remaining time is read anew.
        assert [replace(e, lease_remaining_ms=None) for e in again] == [
            replace(e, lease_remaining_ms=None) for e in got
        ]
        heads += got
    assert sorted((h.run_id, h.type) for h in heads) == [(a, "run.queued"), (b, "run.queued")]
    assert client.claim_ledger("relay", max_events=10) == []
    ids = {h.run_id: h.event_id for h in heads}
    assert ids[a] >> EVENT_SHIFT == 0 and ids[b] >> EVENT_SHIFT == 1 and ids[b] >= 1 << 48

    renewed = client.renew_ledger_lease("relay", [ids[a], ids[b]], lease_seconds=120)
    assert sorted(r.event_id for r in renewed) == sorted(ids.values())
    assert client.renew_ledger_lease("other", [ids[a], ids[b]]) == []

    for run_id in (a, b):
        acked = client.ack_ledger("relay", run_id, [ids[run_id]], claim_next=5, batch=True)
        assert [(e.kind, e.type) for e in acked] == [
            (LedgerKind.DELIVERED, "run.queued"),
            (LedgerKind.CLAIMED, "one"),
            (LedgerKind.CLAIMED, "two"),
        ]
        ids[run_id] = acked[1].event_id
        assert client.release_ledger("relay", [e.event_id for e in acked[2:]]) == 1
    # "one" of each run is still claimed: fail both in one call (both shards).
    failed = client.fail_ledger("relay", [ids[a], ids[b]], {"http": 503})
    assert sorted((f.event_id, f.outcome) for f in failed) == sorted(
        [(ids[a], LedgerFailOutcome.RETRYING), (ids[b], LedgerFailOutcome.RETRYING)]
    )
    assert client.claim_ledger("relay", run_id=b) == []  # backing off
    with shifted_clock(sharded) as later:
        # The frozen batch of "one" and "two" comes back whole, as on one node.
        got = later.claim_ledger("relay", run_id=b)
        assert [(e.event_id, e.type) for e in got][:1] == [(ids[b], "one")]
        held = [e.event_id for e in got]
        failed = later.fail_ledger("relay", held, {"http": 410}, permanent=True)
        assert {f.event_id: f.outcome for f in failed}[ids[b]] is LedgerFailOutcome.BLOCKED
    assert client.requeue_ledger_event(ids[b]) is True
    assert client.requeue_ledger_event(ids[b]) is False
    (back,) = client.claim_ledger("relay", run_id=b)
    assert back.event_id == ids[b]


# --------------------------------------------------------------------------
# Admin and stats
# --------------------------------------------------------------------------


def test_stats_and_schema_version(sharded: ShardedInstall) -> None:
    client = sharded.client()
    zero, one = both(sharded, "t", 2)
    for run_id in zero + one[:1]:
        client.enqueue_run(run_id, queue="t")
    client.append_events(one[0], [{"type": "e"}])

    def totals(rows: list[dict[str, Any]], group: tuple[str, str], count: str) -> dict[Any, int]:
        out: dict[Any, int] = {}
        for row in rows:
            key = (row[group[0]], row[group[1]])
            out[key] = out.get(key, 0) + int(row[count])
        return out

    direct = [Client(sharded.shard(i)) for i in (0, 1)]
    runs = totals(client.run_stats(), ("queue", "status"), "runs")
    assert runs == {("t", "queued"): 3}
    assert runs == totals(
        direct[0].run_stats() + direct[1].run_stats(), ("queue", "status"), "runs"
    )
    events = totals(client.ledger_stats(), ("lane", "state"), "events")
    assert sum(events.values()) == 4  # three run.queued and one "e"
    assert events == totals(
        direct[0].ledger_stats() + direct[1].ledger_stats(), ("lane", "state"), "events"
    )
    version = client.get_schema_version()
    assert version == direct[0].get_schema_version() == direct[1].get_schema_version()


# --------------------------------------------------------------------------
# Errors: a shard's error through the proxy is the same typed exception
# --------------------------------------------------------------------------

BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], type[RunrelayError]]] = [
    ("enqueue_run", ("",), {}, InvalidArgument),
    ("enqueue_run", ("{r}",), {"max_attempts": 0}, InvalidArgument),
    ("enqueue_run", ("{r}",), {"payload": {"x": "y" * 2_000_000}}, PayloadTooLarge),
    ("append_events", ("{r}", [{"no": "type"}]), {}, InvalidArgument),
    ("heartbeat", ("{r}", 0, uuid.UUID(int=1)), {}, InvalidArgument),
    ("complete_attempts", ([{"bad": 1}],), {}, InvalidArgument),
    ("claim_attempts", ("",), {}, InvalidArgument),
    ("enqueue_runs", ([{"run_id": ""}],), {}, InvalidArgument),
    ("claim_ledger", ("",), {}, InvalidArgument),
    ("release_ledger", ("", [1]), {}, InvalidArgument),
    ("fail_ledger", ("", [1 << 48], {"e": 1}), {}, InvalidArgument),
    ("settle_and_claim", ([{"op": "explode"}], "w"), {}, InvalidArgument),
]


@pytest.mark.parametrize(("function", "args", "kwargs", "error"), BAD_CALLS)
def test_bad_input_raises_what_the_shard_raises(
    sharded: ShardedInstall,
    function: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: type[RunrelayError],
) -> None:
    proxy = sharded.client()
    # "{r}" routes by its tag "r": the direct call goes to that run's shard.
    shard = sharded.shard_map().shard_for("{r}")
    direct = Client(sharded.shard(shard))
    direct.enqueue_run("{r}")  # a run to act on, on both paths
    before = checksums(sharded)
    with pytest.raises(error) as on_shard:
        getattr(direct, function)(*args, **kwargs)
    with pytest.raises(error) as through:
        getattr(proxy, function)(*args, **kwargs)
    assert checksums(sharded) == before
    got, want = through.value, on_shard.value
    assert type(got) is type(want)
    assert (got.sqlstate, got.message, got.hint, got.parameter, got.detail) == (
        want.sqlstate,
        want.message,
        want.hint,
        want.parameter,
        want.detail,
    )
    assert got.parameter is not None
    assert isinstance(got.__cause__, psycopg.Error)


def test_concurrency_key_needs_its_hash_tag_and_is_serial(sharded: ShardedInstall) -> None:
    client = sharded.client()
    before = checksums(sharded)
    with pytest.raises(InvalidArgument) as untagged:
        client.enqueue_run("job-1", queue="k", concurrency_key="acct")
    assert (untagged.value.sqlstate, untagged.value.parameter) == ("22023", "run_id")
    assert "{acct}" in (untagged.value.hint or "")
    with pytest.raises(InvalidArgument):
        client.enqueue_runs([{"run_id": "job-2", "concurrency_key": "acct"}])
    assert checksums(sharded) == before

    ids = [f"job-{i}{{acct}}" for i in range(4)]
    for run_id in ids:
        assert client.enqueue_run(run_id, queue="k", concurrency_key="acct").created
    # One shard holds them all, and they run one at a time.
    counts = [
        len(sharded.shard(i).execute("SELECT 1 FROM runrelay.runs").fetchall()) for i in (0, 1)
    ]
    assert sorted(counts) == [0, 4]
    (first,) = client.claim_attempts("w", ["k"], max_runs=4)
    assert client.claim_attempts("w", ["k"], max_runs=4) == []
    assert client.complete_attempt(**first.fence) is CompleteOutcome.COMPLETED
    (second,) = client.claim_attempts("w", ["k"], max_runs=4)
    assert second.run_id != first.run_id


# --------------------------------------------------------------------------
# Producer transactions
# --------------------------------------------------------------------------


def test_producer_transaction_must_be_on_the_runs_shard(sharded: ShardedInstall) -> None:
    shards = sharded.shard_map()
    client = Client(sharded.connect(), shards=shards)
    (a,), (b,) = both(sharded, "tx")

    # On the proxy inside a transaction: refused before any SQL.
    proxy = sharded.connect()
    with proxy.transaction():
        with pytest.raises(ProxyTransaction, match=r"ShardMap\.transaction"):
            client.enqueue_run(a, conn=proxy)
        with pytest.raises(ProxyTransaction):
            client.append_events(a, [{"type": "x"}], conn=proxy)
        with pytest.raises(ProxyTransaction):
            client.enqueue_runs([{"run_id": a}, {"run_id": b}], conn=proxy)
        proxy.execute("SELECT 1")  # the transaction is untouched and usable
    idle = sharded.connect(autocommit=False)  # a call would open a transaction
    with pytest.raises(ProxyTransaction):
        client.signal_run(a, "go", conn=idle)
    assert idle.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # On the proxy outside a transaction: an ordinary call.
    assert client.enqueue_run(a, conn=proxy).created

    # On a shard that does not own the run: refused, naming both shards.
    with shards.transaction(b) as wrong:
        with pytest.raises(WrongShard, match=r"shard 0.*shard 1") as refused:
            client.cancel_run(a, conn=wrong)
        assert (refused.value.shard, refused.value.connected) == (0, 1)
        with pytest.raises(WrongShard):
            client.enqueue_runs([{"run_id": b}, {"run_id": a}], conn=wrong)
    assert sharded.everywhere("SELECT run_id FROM runrelay.runs") == [(a,)]

    # On the owning shard: the call commits or rolls back with the caller's writes.
    for run_id, shard in ((b, 1), (a + "-more", shards.shard_for(a + "-more"))):
        sharded.shard(shard).execute("CREATE TABLE IF NOT EXISTS orders (id text)")
        with pytest.raises(RuntimeError), client.shard_transaction(run_id) as conn:
            conn.execute("INSERT INTO orders VALUES (%s)", [run_id])
            assert client.enqueue_run(run_id, conn=conn).created
            client.append_events(run_id, [{"type": "order.placed"}], conn=conn)
            raise RuntimeError("roll back")
        assert sharded.everywhere("SELECT 1 FROM runrelay.runs WHERE run_id = %s", [run_id]) == []
        ledger = "SELECT type FROM runrelay.ledger_events WHERE run_id = %s ORDER BY seq"
        assert sharded.everywhere(ledger, [run_id]) == []
        with client.shard_transaction(run_id) as conn:
            conn.execute("INSERT INTO orders VALUES (%s)", [run_id])
            assert client.enqueue_run(run_id, conn=conn).created
            client.append_events(run_id, [{"type": "order.placed"}], conn=conn)
        assert sharded.shard(shard).execute(
            "SELECT count(*) FROM orders WHERE id = %s", [run_id]
        ).fetchone() == (1,)
        assert sharded.everywhere(ledger, [run_id]) == [("run.queued",), ("order.placed",)]
        sharded.shard(shard).execute("DROP TABLE orders")


def test_the_shard_check_costs_no_round_trip(sharded: ShardedInstall) -> None:
    """The check reads only the connection's local parameters: a checked call
    is still one round trip, and a refused one sends nothing."""
    shards = sharded.shard_map()
    client = Client(sharded.connect(), shards=shards)
    (a,) = run_ids_on(sharded, 0, 1, "rt")
    with shards.transaction(a) as conn:
        conn.execute("SELECT 1")  # the transaction is open: BEGIN has been sent
        with traced(conn) as out:
            client.enqueue_run(a, conn=conn)
        assert frontend_round_trips(out[0]) == 1
    proxy = sharded.connect()
    with proxy.transaction():
        proxy.execute("SELECT 1")
        with traced(proxy) as out, pytest.raises(ProxyTransaction):
            client.enqueue_run(a, conn=proxy)
        assert frontend_round_trips(out[0]) == 0


def test_without_a_shard_map_nothing_is_checked(sharded: ShardedInstall) -> None:
    """A client without shards= sends the call as given: on the proxy in a
    transaction it commits on the shard at once (what the check is for)."""
    client = sharded.client()
    (a,) = run_ids_on(sharded, 0, 1, "n")
    proxy = sharded.connect()
    with pytest.raises(RuntimeError), proxy.transaction():
        client.enqueue_run(a, conn=proxy)
        raise RuntimeError("roll back")
    assert sharded.everywhere("SELECT run_id FROM runrelay.runs") == [(a,)]


# --------------------------------------------------------------------------
# A shard down
# --------------------------------------------------------------------------


def test_a_down_shard_is_shard_unavailable(sharded: ShardedInstall) -> None:
    shards = sharded.shard_map()
    client = Client(sharded.connect(), shards=shards)
    bare = sharded.client()
    zero, one = both(sharded, "d", 2)
    client.enqueue_run(zero[0], queue="d")
    client.enqueue_run(one[0], queue="d")
    row = sharded.shard(1).execute("SELECT event_id FROM runrelay.ledger_events").fetchone()
    assert row is not None
    event_on_one = row[0]
    warnings: list[str] = []
    proxy = sharded.connect()
    proxy.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
    on_proxy = Client(proxy, shards=shards)

    sharded.clusters.shards[1].stop("immediate")
    try:
        with pytest.raises(ShardUnavailable) as per_run:
            client.enqueue_run(one[1], queue="d")
        assert (per_run.value.shard, per_run.value.sqlstate) == (1, "XX000")
        with pytest.raises(ShardUnavailable) as unnamed:
            bare.heartbeat(one[0], 1, uuid.uuid4())
        assert unnamed.value.shard is None  # no ShardMap: the proxy's message names no shard
        with pytest.raises(ShardUnavailable) as mapped:
            client.heartbeat(one[0], 1, uuid.uuid4())
        assert mapped.value.shard == 1
        # A call by event ids: the proxy names the shard.
        with pytest.raises(ShardUnavailable) as by_event:
            bare.renew_ledger_lease("relay", [event_on_one])
        assert (by_event.value.shard, by_event.value.sqlstate) == (1, "08006")
        # A walker skips the down shard with a warning and answers the others.
        (claim,) = on_proxy.claim_attempts("w", ["d"], max_runs=5)
        assert claim.run_id == zero[0]
        assert any("shard 1 is unavailable and was skipped" in w for w in warnings)
        # A batch that needs the down shard: 08006 naming it.
        items = [{"run_id": zero[1], "queue": "d"}, {"run_id": one[1], "queue": "d"}]
        with pytest.raises(ShardUnavailable) as batch:
            bare.enqueue_runs(items)
        assert (batch.value.shard, batch.value.sqlstate) == (1, "08006")
        assert batch.value.hint and "Repeat" in batch.value.hint
    finally:
        sharded.clusters.shards[1].start()
    # The repeat completes the batch: shard 0's item was enqueued before the
    # proxy reached shard 1 (a proxy call commits on each shard at once), so
    # it answers as a repeat; shard 1's item is new.
    results = client.enqueue_runs(items)
    assert [(r.run_id, r.status, r.created) for r in results] == [
        (zero[1], "queued", False),
        (one[1], "queued", True),
    ]
    again = client.enqueue_runs(items)
    assert [(r.run_id, r.created) for r in again] == [(zero[1], False), (one[1], False)]
    assert sorted(r[0] for r in sharded.everywhere("SELECT run_id FROM runrelay.runs")) == sorted(
        zero + one[:1] + one[1:]
    )


def test_prune_and_purge_runs_spend_one_budget_over_the_shards(sharded: ShardedInstall) -> None:
    """Each shard deletes at most what the budget still allows and the answer
    is the total; a shard that is down is skipped, and with none up the call
    fails naming itself."""
    client = sharded.client()
    zero, one = both(sharded, "pb", 2)
    for run_id in zero + one:
        client.enqueue_run(run_id, queue="pb")
    for claim in client.claim_attempts("w", ["pb"], max_runs=4):
        client.complete_attempt(**claim.fence, result={})
    # Every run's three lifecycle events delivered: 6 on each shard.
    while held := client.claim_ledger("relay", max_events=10):
        client.ack_ledger("relay", held[0].run_id, [e.event_id for e in held])
    assert len(sharded.everywhere("SELECT 1 FROM runrelay.ledger_events")) == 12

    sharded.clusters.shards[1].crash()
    try:
        assert client.prune(datetime.now(UTC), max_rows=100) == 6
    finally:
        sharded.clusters.shards[1].start()
    assert client.prune(datetime.now(UTC), max_rows=4) == 4
    assert client.prune(datetime.now(UTC), max_rows=4) == 2
    assert client.prune(datetime.now(UTC)) == 0

    assert client.purge_runs(datetime.now(UTC), max_rows=3) == 3
    assert client.purge_runs(datetime.now(UTC), max_rows=3) == 1
    assert sharded.everywhere("SELECT run_id FROM runrelay.runs") == []

    for shard in sharded.clusters.shards:
        shard.crash()
    try:
        with pytest.raises(ShardUnavailable, match="prune reached no shard"):
            client.prune(datetime.now(UTC))
        with pytest.raises(ShardUnavailable, match="purge_runs reached no shard"):
            client.purge_runs(datetime.now(UTC))
    finally:
        for shard in sharded.clusters.shards:
            shard.start()


# --------------------------------------------------------------------------
# AsyncClient
# --------------------------------------------------------------------------


def test_async_client_through_the_proxy(sharded: ShardedInstall) -> None:
    shards = sharded.shard_map()
    (a,), (b,) = both(sharded, "as")

    async def scenario() -> None:
        async with AsyncClient(sharded.proxy_url, shards=shards) as client:
            for run_id in (a, b):
                assert (await client.enqueue_run(run_id, queue="as")).created
            claimed = await client.claim_attempts("w", ["as"], max_runs=5)
            assert sorted(c.run_id for c in claimed) == sorted([a, b])
            done = await client.complete_attempts(claimed)
            assert [d.outcome for d in done] == [CompleteOutcome.COMPLETED] * 2
            with pytest.raises(InvalidArgument) as bad:
                await client.enqueue_run("")
            assert (bad.value.parameter, bad.value.message[:25]) == (
                "run_id",
                "runrelay: invalid run_id:",
            )
            conn = await psycopg.AsyncConnection.connect(sharded.proxy_url)
            try:
                with pytest.raises(ProxyTransaction):
                    await client.enqueue_run(a, conn=conn)
            finally:
                await conn.close()
            with pytest.raises(RuntimeError):
                async with client.shard_transaction(a + "-tx") as tx:
                    assert (await client.enqueue_run(a + "-tx", conn=tx)).created
                    raise RuntimeError("roll back")
            async with client.shard_transaction(b + "-tx") as tx:
                assert (await client.enqueue_run(b + "-tx", queue="tx", conn=tx)).created

    asyncio.run(scenario())
    assert sorted(sharded.everywhere("SELECT run_id, status FROM runrelay.runs")) == sorted(
        [(a, "completed"), (b, "completed"), (b + "-tx", "queued")]
    )
