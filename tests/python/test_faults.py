"""Real faults against a real server: nothing committed is lost, nothing is
applied twice, nothing is delivered out of order, and no stale caller gets
through. Each scenario records a history and ends with the offline checker
(faults.Checker) reporting zero violations of invariants I1-I10 (docs/guarantees.md).

Bounded for `make test`; `make chaos DURATION=...` runs the same scenarios
longer (RUNRELAY_CHAOS_SECONDS) with more connections and prints the figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest

from faults import (
    LEDGER_ACKS,
    LEDGER_CLAIMS,
    MODES,
    TABLES,
    Checker,
    Child,
    Children,
    History,
    RecordingClient,
    Report,
    SinkLog,
    TcpProxy,
    backend_of,
    chaos_mode,
    checksum,
    duration,
    load_history,
    load_sink,
    read_jsonl,
    record_figures,
    row_images,
    shifted,
    terminate_backend,
    wait_for,
    wait_until_waiting,
)
from lifecycle import check_drained, check_lanes, drain_ledger
from runrelay import LockTimeout, StatementTimeout
from runrelay.demo import UNDELIVERED
from runrelay.errors import RunrelayError
from sqlapi import call, claim_one, enqueue, events, fenced, run_row, scalar, table_checksum

pytest_plugins = ["conftest_faults"]
Connect = Callable[..., psycopg.Connection]
Recorded = Callable[..., RecordingClient]
FAR_FUTURE = datetime(2999, 1, 1, tzinfo=UTC)
# Final events with explicit delivery keys: a replay must not mistake them for reuse.
FINAL = [{"type": "order.note", "delivery_key": "note-1"}]


def check(calls: list[dict[str, Any]], db: psycopg.Connection, **kwargs: Any) -> Report:
    report = Checker(calls, db, **kwargs).run()
    assert report.violations == [], str(report)
    return report


def test_checker_i5_tells_a_lapsed_lease_from_a_redelivery_under_a_live_lease() -> None:
    """The checker itself: a relay that delivers a batch, lets its lease run
    out and leases the same events again may deliver them again (its lease
    was lost to expiry; nobody else happened to take it). Delivering again
    under the lease it still held is an I5 violation."""

    def claim(w1: float, expires: str) -> dict[str, Any]:
        row = {"kind": "claimed", "event_id": 7, "lease_expires_at": expires}
        args = {"relay": "r1", "lease_seconds": 5}
        return {"fn": "claim_ledger", "type": "ok", "args": args, "w1": w1, "result": [row]}

    def delivered(w: float) -> dict[str, Any]:
        return {"relay": "r1", "lane": "observability", "run_id": "a", "keys": ["k7"],
                "event_ids": [7], "w": w}  # fmt: skip

    first = claim(100.0, "2026-01-01T00:00:05+00:00")  # leased 00:00:00-00:00:05
    lapsed = claim(106.0, "2026-01-01T00:00:10.5+00:00")  # leased again from 00:00:05.5
    live = claim(103.0, "2026-01-01T00:00:08+00:00")  # a re-claim at 00:00:03, lease held
    for second, violations in ((lapsed, 0), (live, 1)):
        sink = [delivered(100.1), delivered(second["w1"] + 0.1)]
        checker = Checker([first, second], None, sink=sink)  # type: ignore[arg-type]
        checker.i5_redeliveries()
        assert len(checker.violations) == violations, checker.violations


def test_checker_i9_allows_a_requeue_replay_after_the_event_failed_again() -> None:
    """The checker itself, on a timeline a chaos run recorded: a requeue
    commits and its reply is lost; a relay claims the event and fails it
    permanently; the replay of the requeue then finds it failed again and
    requeues it (true) - correctly, not twice. Without that failure in
    between, a replay answering true is an I9 violation."""
    original = {"function": "requeue_ledger_event", "columns": ["value"], "rows": [["t"]],
                "fault": "drop_reply_after_commit", "committed": True}  # fmt: skip
    first = {"index": 0, "fn": "requeue_ledger_event", "args": {"event_id": 7}, "type": "info",
             "t0": 10.0, "t1": 10.03, "replay_of": None, "original": original}  # fmt: skip
    failed = {"index": 1, "fn": "fail_ledger", "args": {"event_ids": [7]}, "type": "ok",
              "t0": 10.04, "t1": 10.05, "replay_of": None,
              "result": [{"event_id": 7, "outcome": "blocked"}]}  # fmt: skip
    replay = {"index": 2, "fn": "requeue_ledger_event", "args": {"event_id": 7}, "type": "ok",
              "t0": 10.06, "t1": 10.07, "replay_of": 0, "result": True}  # fmt: skip
    for calls, violations in (([first, failed, replay], 0), ([first, replay], 1)):
        checker = Checker(calls, None)  # type: ignore[arg-type]
        checker.i9_replays()
        assert len(checker.violations) == violations, checker.violations


def test_checker_i3_finds_ledger_rows_of_no_run(db: psycopg.Connection) -> None:
    """The checker itself: the ledger tables have no foreign key to runs, so
    an event, delivery, lane or wake-up of a run that does not exist is
    reported (and nothing is reported while every row has its run), and so
    is a delivery that overlaps an earlier one of its lane."""
    db.execute("SELECT runrelay.enqueue_run(run_id => 'kept')")
    db.execute("SELECT runrelay.append_events('kept', '[{\"type\": \"a\"}]')")
    db.execute(
        "SELECT runrelay.ack_ledger('r', 'kept', ARRAY(SELECT c.event_id"
        " FROM runrelay.claim_ledger('r', run_id => 'kept') AS c))"
    )
    checker = Checker([], db)
    checker.i3_ledger_rows_have_runs()
    assert checker.violations == []
    db.execute(
        "INSERT INTO runrelay.ledger_deliveries (run_id, lane, first_seq, last_seq, delivered_at,"
        " delivered_by, call_id) VALUES ('kept', 'lifecycle', 1, 2, now(), 'r', gen_random_uuid())"
    )
    checker.i3_ledger_rows_have_runs()
    assert checker.violations == ["I3: kept lifecycle: delivery 1..2 overlaps an earlier one"]
    db.execute("DELETE FROM runrelay.ledger_deliveries WHERE last_seq = 2")
    checker.violations.clear()
    db.execute("SET session_replication_role = replica")  # no triggers: a run vanishes alone
    db.execute("DELETE FROM runrelay.runs WHERE run_id = 'kept'")
    db.execute("RESET session_replication_role")
    checker.i3_ledger_rows_have_runs()
    assert checker.violations == [
        "I3: 1 ledger_deliveries rows of no run (e.g. kept)",
        "I3: 2 ledger_events rows of no run (e.g. kept)",
        "I3: 1 ledger_lanes rows of no run (e.g. kept)",
    ]


def semantic_checksum(conn: psycopg.Connection) -> str:
    """Every table's contents except lease expiries and heartbeat times: what a
    harmless repeat (a lease extended again) may change."""
    volatile = "- 'lease_expires_at' - 'heartbeat_at' - 'available_at'"
    return table_checksum(conn, TABLES, f"(to_jsonb(t) {volatile})::text")


# =============================================================================
# Ambiguous commits: every mutating function, reply lost before and after COMMIT
# =============================================================================
@dataclasses.dataclass
class ReplayCase:
    """setup(db) -> the call's keyword arguments; `first` accepts a fresh
    call's answer; `replay` is how a repeat after a committed call answers:
    exact (what the first answered), converge (the already-applied state,
    e.g. created=false), repeat (applied again, harmlessly: a lease extended),
    or documented (not idempotent, see docs/guarantees.md)."""

    setup: Callable[[psycopg.Connection], dict[str, Any]]
    first: Callable[[Any], bool]
    replay: str
    after: Callable[[Any], bool] = lambda _r: True
    state: str = "full"  # what must be unchanged by a replay: full, semantic or none
    once: Callable[[psycopg.Connection], None] | None = None
    options: str = ""


def _claimed(db: psycopg.Connection, run_id: str = "r1", lease: int = 30) -> dict[str, Any]:
    enqueue(db, run_id)
    return claim_one(db, worker="w-setup", lease_seconds=lease)


def _suspended(db: psycopg.Connection, wait: dict[str, Any]) -> dict[str, Any]:
    claim = _claimed(db)
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    return claim


def _leased(db: psycopg.Connection, n_events: int = 3, max_events: int = 2) -> list[int]:
    """r1 with run.queued + n events; relay R holds a frozen batch of max_events."""
    enqueue(db, "r1")
    call(db, "append_events", run_id="r1",
         events=[{"type": f"e{i}", "delivery_key": f"k{i}"} for i in range(n_events)])  # fmt: skip
    rows = call(db, "claim_ledger", relay="R", max_events=max_events, batch=True)
    assert [r["kind"] for r in rows] == ["claimed"] * max_events, rows
    return [r["event_id"] for r in rows]


RUNNING_FOR = "SELECT count(*) FROM runrelay.attempts WHERE status = 'running' AND worker = %s"
LEASED_BY = "SELECT count(*) FROM runrelay.ledger WHERE state = 'leased' AND lease_owner = %s"


def _count(db: psycopg.Connection, query: str, *params: Any) -> int:
    row = db.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def _held_as_recorded(child: Child) -> set[int]:
    """The events a relay's own history shows it holding: claimed in a call
    that returned, with no acknowledgement, release or failure of them
    invoked since. A relay killed while holding one strands a batch that the
    checker can see taken over (a claim still in flight when the kill landed
    may have leased events, but nothing shows which). Calls come in the
    order they were invoked, and a call that ends a hold is invoked after
    the claim that began it returned."""
    held: set[int] = set()
    calls, _ = load_history([child.history])
    for c in calls:
        if c["fn"] in (*LEDGER_ACKS, "release_ledger", "fail_ledger"):
            held.difference_update(c["args"]["event_ids"])
        if c["type"] == "ok" and c["fn"] in LEDGER_CLAIMS:
            held.update(r["event_id"] for r in c["result"] if r["kind"] == "claimed")
    return held


def _once_event(kind: str, run_id: str = "r1") -> Callable[[psycopg.Connection], None]:
    def check_once(db: psycopg.Connection) -> None:
        assert events(db, run_id).count(kind) == 1, events(db, run_id)

    return check_once


def _setup_append(db: psycopg.Connection) -> dict[str, Any]:
    enqueue(db, "r1")
    evs = [
        {"type": "order.paid", "payload": {"n": 1}, "delivery_key": "paid-1"},
        {"type": "log", "lane": "observability", "delivery_key": "log-1"},
    ]
    return {"run_id": "r1", "events": evs}


def _setup_complete(db: psycopg.Connection) -> dict[str, Any]:
    claim = _claimed(db)
    return {**fenced(claim), "result": {"ok": 1},
            "final_events": [{"type": "order.shipped", "delivery_key": "ship-1"}]}  # fmt: skip


def _setup_complete_many(db: psycopg.Connection) -> dict[str, Any]:
    items = []
    for run_id in ("r1", "r2"):
        enqueue(db, run_id)
        items.append(fenced(claim_one(db, worker="w-setup")))
    return {"items": items}


def _setup_terminal(db: psycopg.Connection) -> dict[str, Any]:
    claim = _suspended(db, {"kind": "detached_runner", "runner": "ext"})
    assert (
        scalar(db, "record_runner_terminal", run_id="r1", attempt=1, result={"x": 1}) == "recorded"
    )
    return fenced(claim)


def _setup_reap(db: psycopg.Connection) -> dict[str, Any]:
    _claimed(db, lease=5)
    return {"max_attempts": 10}


def _setup_claim_ledger(db: psycopg.Connection) -> dict[str, Any]:
    enqueue(db, "r1")
    call(db, "append_events", run_id="r1", events=[{"type": "e1"}, {"type": "e2"}])
    return {"relay": "R", "lane": "lifecycle", "max_events": 5, "batch": True,
            "call_id": uuid.uuid4()}  # fmt: skip


def _setup_ack(db: psycopg.Connection) -> dict[str, Any]:
    ids = _leased(db)
    return {"relay": "R", "run_id": "r1", "event_ids": ids, "claim_next": 5, "batch": True}


def _setup_claim_ledger_runs(db: psycopg.Connection) -> dict[str, Any]:
    for run_id in ("r1", "r2"):
        enqueue(db, run_id)
        call(db, "append_events", run_id=run_id, events=[{"type": "e1"}])
    return {"relay": "R", "max_runs": 2, "max_events": 5, "call_id": uuid.uuid4()}


def _setup_ack_runs(db: psycopg.Connection) -> dict[str, Any]:
    """r1's batch leased (its head and e0), r2 waiting to be claimed next."""
    ids = _leased(db)
    enqueue(db, "r2")
    return {"relay": "R", "event_ids": ids, "claim_runs": 5, "max_events": 5,
            "call_id": uuid.uuid4()}  # fmt: skip


def _setup_requeue(db: psycopg.Connection) -> dict[str, Any]:
    ids = _leased(db, max_events=1)
    call(db, "fail_ledger", relay="R", event_ids=ids, error={"e": 1}, permanent=True)
    return {"event_id": ids[0]}


def _setup_prune(db: psycopg.Connection) -> dict[str, Any]:
    enqueue(db, "r1")
    logs = [{"type": "log", "lane": "observability", "delivery_key": f"log-{i}"} for i in range(2)]
    call(db, "append_events", run_id="r1", events=logs)
    rows = call(db, "claim_ledger", relay="R", lane="observability", max_events=5, batch=True)
    call(db, "ack_ledger", relay="R", run_id="r1", event_ids=[r["event_id"] for r in rows])
    return {"delivered_before": FAR_FUTURE, "max_rows": 100}


def _kinds(rows: list[Any]) -> list[str]:
    return [str(r.kind) for r in rows]


CASES: dict[str, ReplayCase] = {
    "enqueue_run": ReplayCase(
        lambda db: {"run_id": "r1", "payload": {"a": 1}},
        lambda r: r.created and r.status == "queued",
        "converge",
        after=lambda r: not r.created and r.status == "queued",
        once=_once_event("run.queued"),
    ),
    "append_events": ReplayCase(
        _setup_append,
        lambda r: [e.delivery_key for e in r] == ["paid-1", "log-1"],
        "exact",
        once=lambda db: (
            None
            if _count(
                db, "SELECT count(*) FROM runrelay.ledger WHERE delivery_key IN ('paid-1', 'log-1')"
            )
            == 2
            else pytest.fail("events appended twice")
        ),
    ),
    "signal_run": ReplayCase(
        lambda db: (
            _suspended(db, {"kind": "event", "name": "go"})
            and {"run_id": "r1", "name": "go", "payload": {"v": 1}, "call_id": uuid.uuid4()}
        ),
        lambda r: r == "resumed",
        "exact",
        once=_once_event("run.resumed"),  # and the checksum shows no signal stored
    ),
    "cancel_run": ReplayCase(
        lambda db: (
            enqueue(db, "r1") and {"run_id": "r1", "reason": "test", "call_id": uuid.uuid4()}
        ),
        lambda r: r == "cancelled",
        "exact",
        once=_once_event("run.cancelled"),
    ),
    "claim_attempts": ReplayCase(
        lambda db: (
            enqueue(db, "r1")
            and enqueue(db, "r2")
            and {"worker": "w", "max_runs": 2, "call_id": uuid.uuid4()}
        ),
        lambda r: sorted(a.run_id for a in r) == ["r1", "r2"],
        "exact",
        once=lambda db: (
            None
            if _count(db, "SELECT count(*) FROM runrelay.attempts") == 2
            else pytest.fail("claimed twice")
        ),
    ),
    "heartbeat": ReplayCase(
        lambda db: {**fenced(_claimed(db)), "lease_seconds": 60},
        lambda r: r.outcome == "ok",
        "repeat",
        after=lambda r: r.outcome == "ok",
        state="semantic",
    ),
    "complete_attempt": ReplayCase(
        _setup_complete,
        lambda r: r == "completed",
        "exact",
        once=lambda db: [_once_event(e)(db) for e in ("run.completed", "order.shipped")] and None,
    ),
    "complete_attempts": ReplayCase(
        _setup_complete_many,
        lambda r: [i.outcome for i in r] == ["completed", "completed"],
        "exact",
        once=_once_event("run.completed", "r2"),
    ),
    "fail_attempt": ReplayCase(
        lambda db: {**fenced(_claimed(db)), "error": {"e": 1}, "final_events": FINAL},
        lambda r: r == "retry_scheduled",
        "exact",
        once=_once_event("run.retry_scheduled"),
    ),
    "suspend_attempt": ReplayCase(
        lambda db: {
            **fenced(_claimed(db)),
            "wait": {"kind": "event", "name": "go"},
            "final_events": FINAL,
        },
        lambda r: r == "waiting",
        "exact",
        once=_once_event("run.waiting"),
    ),
    "release_attempt": ReplayCase(
        lambda db: {**fenced(_claimed(db)), "reason": "shutdown"},
        lambda r: r == "released",
        "exact",
        once=_once_event("run.retry_scheduled"),
    ),
    "prepare_waiting_failure": ReplayCase(
        lambda db: fenced(_suspended(db, {"kind": "event", "name": "go"})),
        lambda r: r == "prepared",
        "exact",
        state="semantic",  # a repeat refreshes the prepared attempt's lease
    ),
    "record_runner_terminal": ReplayCase(
        lambda db: (
            _suspended(db, {"kind": "detached_runner", "runner": "ext"})
            and {"run_id": "r1", "attempt": 1, "result": {"x": 1}}
        ),
        lambda r: r == "recorded",
        "converge",
        after=lambda r: r == "duplicate",
    ),
    "claim_detached_terminal": ReplayCase(
        _setup_terminal, lambda r: r is True, "exact", once=_once_event("run.resumed")
    ),
    "reap_expired": ReplayCase(
        _setup_reap,
        lambda r: (
            [(x.run_id, x.attempt, str(x.outcome)) for x in r] == [("r1", 1, "retry_scheduled")]
        ),
        "converge",
        after=lambda r: r == [],
        options="-c%20runrelay.clock_offset%3D60s",
        once=_once_event("run.retry_scheduled"),
    ),
    "claim_ledger": ReplayCase(
        _setup_claim_ledger,
        lambda r: _kinds(r) == ["claimed"] * 3,
        "exact",
    ),
    "ack_ledger": ReplayCase(
        _setup_ack,
        lambda r: _kinds(r) == ["delivered", "delivered", "claimed", "claimed"],
        "exact",  # and writes nothing: the claimed prefix's lease is not re-extended
    ),
    "claim_ledger_runs": ReplayCase(
        _setup_claim_ledger_runs,
        lambda r: _kinds(r) == ["claimed"] * 4,
        "exact",
    ),
    "ack_ledger_runs": ReplayCase(
        _setup_ack_runs,
        # r1's two delivered; r1's next batch (e1, e2) and r2's run.queued claimed.
        lambda r: _kinds(r) == ["delivered", "delivered", "claimed", "claimed", "claimed"],
        "exact",
    ),
    "renew_ledger_lease": ReplayCase(
        lambda db: {"relay": "R", "event_ids": _leased(db), "lease_seconds": 60},
        lambda r: len(r) == 2,
        "repeat",
        after=lambda r: len(r) == 2,
        state="semantic",
    ),
    "release_ledger": ReplayCase(
        lambda db: {"relay": "R", "event_ids": _leased(db)},
        lambda r: r == 2,
        "converge",
        after=lambda r: r == 0,
    ),
    "fail_ledger": ReplayCase(
        lambda db: {"relay": "R", "event_ids": _leased(db), "error": {"e": 1}},
        lambda r: [str(x.outcome) for x in r] == ["retrying", "retrying"],
        "converge",
        after=lambda r: r == [],
        once=lambda db: (
            None
            if _count(db, "SELECT max(delivery_attempts) FROM runrelay.ledger") == 1
            else pytest.fail("delivery attempt charged twice")
        ),
    ),
    "requeue_ledger_event": ReplayCase(
        _setup_requeue, lambda r: r is True, "converge", after=lambda r: r is False
    ),
    "prune": ReplayCase(_setup_prune, lambda r: r == 2, "converge", after=lambda r: r == 0),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("function", sorted(CASES))
def test_lost_reply_replay_is_exact(
    db: psycopg.Connection, recorded: Recorded, history: History, function: str, mode: str
) -> None:
    case = CASES[function]
    kwargs = case.setup(db)
    client = recorded(f"replay-{function}", replay=False, options=case.options)
    proxy = client.proxy
    assert proxy is not None
    method = getattr(client, function)
    before = checksum(db)
    rule = proxy.arm(mode, f'"{function}"('.encode())
    with pytest.raises(psycopg.OperationalError):
        method(**kwargs)
    assert rule.fired.is_set() and rule.exchange is not None
    lost = history.calls[-1]
    assert lost["type"] == "info" and lost["original"]["fault"] == mode
    committed = bool(rule.exchange.committed)
    assert committed == (mode == "drop_reply_after_commit"), rule.exchange
    # Wait for the cut backend to end (its rollback releases its locks).
    wait_for(lambda: backend_of(db, f"replay-{function}") is None, 30, "backend exit")
    after_fault = checksum(db)
    if not committed:
        # Nothing ran, or it ran and rolled back: no trace at all (I10).
        history.image_check(f"{function}/{mode}", before, after_fault, [lost["index"]])
    semantic = semantic_checksum(db)
    result = client.replay_call(lost["index"])
    if committed:
        assert case.after(result) if case.replay != "exact" else case.first(result), result
        if case.state == "full":
            assert checksum(db) == after_fault, "the replay had a second effect"
        elif case.state == "semantic":
            assert semantic_checksum(db) == semantic, "the replay had a second effect"
    else:
        assert case.first(result), result  # the work is done afresh
    if case.once is not None:
        case.once(db)
    report = check(history.calls, db, images=history.images)
    assert report.counters["replays:recorded" if committed else "replays:afresh"] == 1


# =============================================================================
# Workers: paused past the lease, killed at random points
# =============================================================================
def _recorder(url: str, history: History, name: str, **kwargs: Any) -> RecordingClient:
    sep = "&" if "?" in url else "?"
    return RecordingClient(f"{url}{sep}application_name={name}", history, name, **kwargs)


def _handler_lines(path: Any, ev: str, run_id: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if r["ev"] == ev and run_id in (None, r["run_id"])]


def _outcomes(calls: list[dict[str, Any]], fn: str, process: str) -> list[Any]:
    return [
        c["result"]
        for c in calls
        if c["fn"] == fn and c["process"] == process and c["type"] == "ok"
    ]


def test_paused_worker_resumes_fenced_and_changes_nothing(
    db: psycopg.Connection, fast_retries: None, children: Children, history: History, db_url: str
) -> None:
    """A worker stopped (SIGSTOP) past its lease is reaped; another worker
    completes the run; the paused one, continued, hears fence_lost from its
    heartbeat and its completion, and the run's rows stay byte-identical."""
    enqueue(db, "r1", payload={"work": 30})
    paused = children.worker("paused", lease=5, heartbeat_every=0.5, concurrency=1)
    wait_for(lambda: _handler_lines(paused.log, "start", "r1") != [], 60, "handler start")
    paused.stop()
    reaper = _recorder(db_url, history, "reaper")
    taker = _recorder(db_url, history, "taker")
    for client, offset in ((reaper, "1 minute"), (taker, "2 minutes")):
        with client.connection() as c:  # past the 5 s lease, and past the retry's backoff
            c.execute("SELECT set_config('runrelay.clock_offset', %s, false)", [offset])
    reaped = reaper.reap_expired()
    assert [(r.run_id, r.attempt, str(r.outcome)) for r in reaped] == [("r1", 1, "retry_scheduled")]
    (second,) = taker.claim_attempts("taker", call_id=uuid.uuid4())
    assert second.attempt == 2
    assert taker.complete_attempt(**second.fence, result={"by": "taker"}) == "completed"
    before = row_images(db, "r1")
    stale_token = uuid.UUID(_handler_lines(paused.log, "start", "r1")[0]["token"])
    paused.cont()

    def stale_writes_seen() -> bool:
        calls, _ = load_history([paused.history])
        # The Worker writes its completion with settle_and_claim (fused, the
        # default) or complete_attempt (fused=False).
        settled = [
            row["outcome"]
            for result in _outcomes(calls, "settle_and_claim", "paused")
            for row in result
            if row["kind"] == "settled"
        ]
        return "fence_lost" in str(_outcomes(calls, "heartbeat", "paused")) and (
            "fence_lost" in [*_outcomes(calls, "complete_attempt", "paused"), *settled]
        )

    wait_for(stale_writes_seen, 60, "the paused worker's stale writes")
    # The same stale token from here: completion with events, failure,
    # suspension, heartbeat, detached claim — all refused alike.
    stale = _recorder(db_url, history, "stale")
    fence = {"run_id": "r1", "attempt": 1, "lease_token": stale_token}
    first = len(history.calls)
    assert stale.complete_attempt(**fence, final_events=[{"type": "late"}]) == "fence_lost"
    assert stale.fail_attempt(**fence, error={"late": True}) == "fence_lost"
    assert stale.suspend_attempt(**fence, wait={"kind": "event", "name": "x"}) == "fence_lost"
    assert stale.heartbeat(**fence).outcome == "fence_lost"
    assert stale.claim_detached_terminal(**fence) is False
    assert stale.prepare_waiting_failure(**fence) == "not_applicable"
    paused.terminate()
    history.image_check("stale writes of a paused worker", before, row_images(db, "r1"),
                        list(range(first, len(history.calls))))  # fmt: skip
    assert run_row(db, "r1")["result"] == {"by": "taker"}
    calls, images = load_history([history.path, paused.history])
    check(calls, db, images=images)


def test_killed_workers_every_run_ends_exactly_once(
    db: psycopg.Connection, fast_retries: None, children: Children, history: History, db_url: str
) -> None:
    """Workers SIGKILLed at random points: their attempts are reaped after the
    lease and re-run elsewhere; every run completes exactly once (handlers ran
    at least once)."""
    rng = random.Random(6)
    n_runs = 60 if chaos_mode() else 24
    for i in range(n_runs):
        enqueue(db, f"k{i}", payload={"work": rng.uniform(0.3, 1.2)}, max_attempts=50)
    workers = [children.worker(f"w{i}", lease=5, concurrency=2) for i in range(3)]
    reaper = _recorder(db_url, history, "reaper")
    stop = threading.Event()

    def reap() -> None:
        while not stop.wait(0.3):
            reaper.reap_expired()

    reaping = threading.Thread(target=reap, daemon=True)
    reaping.start()
    kills, spawned = 0, 3
    deadline = time.monotonic() + duration(5.0)
    try:
        # Until the deadline, and past it (up to a minute) until a kill has
        # landed: on a loaded machine a worker may still be starting.
        while time.monotonic() < deadline or (kills == 0 and time.monotonic() < deadline + 60):
            time.sleep(rng.uniform(0.2, 0.8))
            if _count(db, "SELECT count(*) FROM runrelay.runs WHERE status = 'queued'") < 6:
                for _ in range(12):  # keep the workers busy for as long as we kill them
                    enqueue(db, f"k{n_runs}", payload={"work": rng.uniform(0.3, 1.2)},
                            max_attempts=50)  # fmt: skip
                    n_runs += 1
            # Only a worker running a handler: a kill must interrupt work.
            busy = [w for w in workers if w.proc.poll() is None and _count(db, RUNNING_FOR, w.name)]
            if not busy:
                continue
            victim = rng.choice(busy)
            victim.kill()
            kills += 1
            workers.remove(victim)
            workers.append(children.worker(f"w{spawned}", lease=5, concurrency=2))
            spawned += 1

        def all_done() -> bool:
            row = db.execute(
                "SELECT count(*) FROM runrelay.runs WHERE status <> 'completed'"
            ).fetchone()
            return row is not None and row[0] == 0

        wait_for(all_done, 120, "every run completed")
    finally:
        stop.set()
        reaping.join(30)
        for w in workers:
            w.terminate()
    lost = _count(db, "SELECT count(*) FROM runrelay.attempts WHERE status = 'lost'")
    assert lost > 0, "no kill landed on a running handler"
    once = db.execute(
        "SELECT run_id FROM runrelay.ledger WHERE type = 'run.completed'"
        " GROUP BY run_id HAVING count(*) = 1"
    ).fetchall()
    assert len(once) == n_runs
    # At-least-once execution: the completed attempt's handler ran.
    starts = {
        (r["run_id"], r["attempt"]) for p in children.logs() for r in _handler_lines(p, "start")
    }
    completed = db.execute(
        "SELECT run_id, attempt FROM runrelay.attempts WHERE status = 'completed'"
    )
    assert set(completed.fetchall()) <= starts
    calls, images = load_history([history.path, *children.histories()])
    report = check(calls, db, images=images)
    report.counters["kills"] = kills
    report.counters["takeovers"] += lost
    record_figures("killed workers", duration(5.0), len(calls), kills, report)


# =============================================================================
# Relays: killed, paused during a slow delivery, duplicate and foreign acks
# =============================================================================
def test_killed_relays_deliver_everything_in_order(
    db: psycopg.Connection, children: Children, history: History, db_url: str
) -> None:
    """Relays SIGKILLed at random points: after lease expiry another relay
    takes their frozen batch over; the consumer sees every event, in order,
    and redeliveries never exceed the taken-over batch."""
    rng = random.Random(7)
    runs = [f"e{i}" for i in range(8)]
    for run_id in runs:
        enqueue(db, run_id)
    relays = [children.relay(f"relay{i}", lease=5, delay=0.15, batch=4) for i in range(3)]
    producer = _recorder(db_url, history, "producer")
    seconds = duration(5.0)
    deadline = time.monotonic() + seconds
    stop = threading.Event()
    appended = 0

    def produce() -> None:
        nonlocal appended
        local = random.Random(70)
        while not stop.is_set():
            run_id = local.choice(runs)
            evs = [
                {"type": "fact", "lane": local.choice(["lifecycle", "observability"]),
                 "delivery_key": f"{run_id}-{appended}-{j}", "payload": {"j": j},
                 "transport_only": local.random() < 0.1}
                for j in range(local.randint(1, 4))
            ]  # fmt: skip
            producer.append_events(run_id, evs)
            appended += 1
            time.sleep(0.03)

    producing = threading.Thread(target=produce, daemon=True)
    producing.start()
    kills, stranded, spawned = 0, 0, 3
    try:
        # Until the deadline, and past it (up to a minute) until a kill has
        # stranded a batch the relay's history shows it holding: on a loaded
        # machine a relay may still be starting, or a kill may land inside a
        # call, where nothing recorded says what the relay held.
        while time.monotonic() < deadline or (stranded == 0 and time.monotonic() < deadline + 60):
            time.sleep(rng.uniform(0.3, 0.9))
            # Only a relay holding a lease: a kill must strand a batch.
            busy = [r for r in relays if r.proc.poll() is None and _count(db, LEASED_BY, r.name)]
            if not busy:
                continue
            victim = rng.choice(busy)
            victim.kill()
            kills += 1
            stranded += bool(_held_as_recorded(victim))
            relays.remove(victim)
            relays.append(children.relay(f"relay{spawned}", lease=5, delay=0.15, batch=4))
            spawned += 1
        stop.set()
        producing.join(30)
        wait_for(lambda: _count(db, UNDELIVERED) == 0, 120 + 2 * seconds, "every event delivered")
    finally:
        stop.set()
        for r in relays:
            r.terminate()
    calls, images = load_history([history.path, *children.histories()])
    sink = load_sink(children.logs())
    report = check(calls, db, sink=sink, images=images)
    assert report.counters["takeovers"] > 0, (kills, stranded, report.counters)
    report.counters["kills"] = kills
    record_figures("killed relays", seconds, len(calls), kills, report)


def test_lease_expires_during_slow_delivery_and_another_relay_takes_over(
    db: psycopg.Connection, children: Children, history: History, db_url: str
) -> None:
    """A relay paused in the middle of a slow delivery (so it cannot renew)
    loses its lease; a second relay takes the frozen batch over and
    acknowledges it; the first one's late acknowledgement changes nothing."""
    enqueue(db, "r1")
    call(db, "append_events", run_id="r1",
         events=[{"type": f"e{i}", "delivery_key": f"slow-{i}"} for i in range(3)])  # fmt: skip
    slow = children.relay("slow", lease=5, delay=8.0, batch=10)
    wait_for(lambda: read_jsonl(slow.log) != [], 60, "the slow relay's delivery")
    slow.stop()
    fast = children.relay("fast", lease=5, delay=0.0, batch=10)
    wait_for(lambda: _count(db, UNDELIVERED) == 0, 60, "the takeover")
    slow.cont()

    def late_ack_seen() -> bool:
        calls, _ = load_history([slow.history])
        return any(c["fn"] in LEDGER_ACKS and c["type"] == "ok" for c in calls)

    wait_for(late_ack_seen, 60, "the slow relay's late acknowledgement")
    slow.terminate()
    fast.terminate()
    calls, _ = load_history([slow.history, fast.history])
    late = [c for c in calls if c["fn"] in LEDGER_ACKS and c["process"] == "slow"]
    assert all(r["kind"] != "delivered" for c in late for r in c["result"]), late
    by = db.execute("SELECT DISTINCT delivered_by FROM runrelay.ledger WHERE NOT acked_locally")
    assert by.fetchall() == [("fast",)]
    sink = load_sink(children.logs())
    report = check(calls, db, sink=sink)
    assert report.counters["takeovers"] >= 1 and report.counters["redeliveries"] >= 1, report


def test_duplicate_and_foreign_acks_change_nothing(
    db: psycopg.Connection, history: History, db_url: str
) -> None:
    one = _recorder(db_url, history, "one")
    other = _recorder(db_url, history, "other")
    enqueue(db, "r1")
    call(db, "append_events", run_id="r1", events=[{"type": "a"}, {"type": "b"}])
    held = one.claim_ledger("one", max_events=5, batch=True, lease_seconds=5, call_id=uuid.uuid4())
    ids = [e.event_id for e in held]
    before = checksum(db)
    n = len(history.calls)
    assert [e for e in other.ack_ledger("other", "r1", ids) if e.kind == "delivered"] == []
    assert other.renew_ledger_lease("other", ids) == []
    assert other.release_ledger("other", ids) == 0
    assert other.fail_ledger("other", ids, {"e": 1}) == []
    history.image_check("foreign relay", before, checksum(db), list(range(n, len(history.calls))))
    first = one.ack_ledger("one", "r1", ids)
    assert [e.kind for e in first] == ["delivered"] * 3
    after = checksum(db)
    n = len(history.calls)
    again = one.ack_ledger("one", "r1", ids)
    assert [(e.event_id, e.lag_ms) for e in again] == [(e.event_id, e.lag_ms) for e in first]
    assert [e for e in other.ack_ledger("other", "r1", ids) if e.kind == "delivered"] == []
    history.image_check("duplicate acks", after, checksum(db), list(range(n, len(history.calls))))
    # A relay whose lease lapsed and was taken over acknowledges nothing.
    call(db, "append_events", run_id="r1", events=[{"type": "c"}])
    (lapsed,) = one.claim_ledger("one", lease_seconds=5, call_id=uuid.uuid4())
    with shifted(db, "1 minute"):
        (taken,) = call(db, "claim_ledger", relay="thief", call_id=uuid.uuid4())
    assert taken["event_id"] == lapsed.event_id
    before = checksum(db)
    n = len(history.calls)
    assert [
        e for e in one.ack_ledger("one", "r1", [lapsed.event_id]) if e.kind == "delivered"
    ] == []
    assert one.renew_ledger_lease("one", [lapsed.event_id]) == []
    history.image_check("stale relay", before, checksum(db), list(range(n, len(history.calls))))
    check(history.calls, db, images=history.images)


# =============================================================================
# Sessions killed, cancel vs complete, timeouts
# =============================================================================
def _barrier(connect: Connect, statement: str) -> psycopg.Connection:
    """A session that holds a lock (in an open transaction) until rolled back."""
    barrier = connect(autocommit=False)
    barrier.execute(statement)
    return barrier


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("function", ["complete_attempt", "ack_ledger", "append_events"])
def test_session_terminated_mid_call_then_replayed(
    db: psycopg.Connection, connect: Connect, history: History, db_url: str, function: str
) -> None:
    """pg_terminate_backend while the call waits for a lock: the call is
    indeterminate to the caller, left no trace, and its replay applies once."""
    victim = _recorder(db_url, history, "victim", replay=False)
    if function == "complete_attempt":
        kwargs: dict[str, Any] = {**fenced(_claimed(db)), "final_events": [{"type": "x"}]}
        lock = "SELECT 1 FROM runrelay.runs WHERE run_id = 'r1' FOR UPDATE"
    elif function == "ack_ledger":
        kwargs = {"relay": "R", "run_id": "r1", "event_ids": _leased(db)}
        lock = "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = 'r1' FOR UPDATE"
    else:
        enqueue(db, "r1")
        kwargs = {"run_id": "r1", "events": [{"type": "y", "delivery_key": "y-1"}]}
        lock = "SELECT 1 FROM runrelay.runs WHERE run_id = 'r1' FOR UPDATE"
    with victim.connection():
        pass  # connect first, so its backend exists
    pid = backend_of(db, "victim")
    assert pid is not None
    barrier = _barrier(connect, lock)
    thread, out = _in_thread(lambda: getattr(victim, function)(**kwargs))
    wait_until_waiting(db, pid)
    before = row_images(db, "r1")
    assert terminate_backend(db, pid)
    thread.join(30)
    assert isinstance(out[0], psycopg.OperationalError), out
    (lost,) = [c for c in history.calls if c["type"] == "info"]
    history.image_check(f"terminated {function}", before, row_images(db, "r1"), [lost["index"]])
    barrier.rollback()
    result = victim.replay_call(lost["index"])
    if function == "complete_attempt":
        assert result == "completed"
        assert events(db, "r1").count("run.completed") == 1
    elif function == "ack_ledger":
        assert [e.kind for e in result] == ["delivered", "delivered"]
    else:
        assert [e.delivery_key for e in result] == ["y-1"]
        assert victim.append_events(**kwargs) == result  # and exact from here on
    check(history.calls, db, images=history.images)


def test_cancel_versus_complete_both_orders(
    db: psycopg.Connection, connect: Connect, history: History, db_url: str
) -> None:
    """Barriers force each order; random delays race them. Never both, never
    neither (I8), and both winners are observed."""
    worker = _recorder(db_url, history, "worker")
    canceller = _recorder(db_url, history, "canceller")
    winners: Counter[str] = Counter()

    def settle(run_id: str) -> str:
        status = str(run_row(db, run_id)["status"])
        winners[status] += 1
        return status

    # 1. The cancel comes while the completion waits for the run row: cancel wins.
    enqueue(db, "c1")
    claim = claim_one(db, worker="worker")
    barrier = _barrier(connect, "SELECT 1 FROM runrelay.runs WHERE run_id = 'c1' FOR UPDATE")
    with worker.connection():
        pass
    thread, out = _in_thread(lambda: worker.complete_attempt(**fenced(claim)))
    wait_until_waiting(db, backend_of(db, "worker") or 0)
    assert canceller.cancel_run("c1") == "cancel_requested"
    barrier.rollback()
    thread.join(30)
    assert out == ["cancelled"]
    assert settle("c1") == "cancelled"
    # 2. The completion lands while the cancel waits to write its marker: complete wins.
    enqueue(db, "c2")
    claim = claim_one(db, worker="worker")
    # An uncommitted marker for c2 in a third session: cancel_run's own marker
    # insert queues behind it, invisible to the completion.
    barrier = _barrier(
        connect,
        "INSERT INTO runrelay.cancellations (run_id, requested_at) VALUES ('c2', now())",
    )
    with canceller.connection():
        pass
    thread, out = _in_thread(lambda: canceller.cancel_run("c2"))
    wait_until_waiting(db, backend_of(db, "canceller") or 0)
    assert worker.complete_attempt(**fenced(claim)) == "completed"
    barrier.rollback()
    thread.join(30)
    assert out == ["already_terminal"]
    assert settle("c2") == "completed"
    # 3. Random delays.
    rng = random.Random(8)
    trials = 100 if chaos_mode() else 30
    for i in range(trials):
        run_id = f"race{i}"
        enqueue(db, run_id)
        claim = claim_one(db, worker="worker")
        start = threading.Barrier(2)
        delays = (rng.uniform(0, 0.004), rng.uniform(0, 0.004))

        def go(fn: Callable[[], Any], delay: float, start: threading.Barrier = start) -> Any:
            start.wait()
            time.sleep(delay)
            return fn()

        t1, _ = _in_thread(
            lambda c=claim, d=delays[0]: go(lambda: worker.complete_attempt(**fenced(c)), d)
        )
        t2, _ = _in_thread(lambda r=run_id, d=delays[1]: go(lambda: canceller.cancel_run(r), d))
        t1.join(30)
        t2.join(30)
        assert settle(run_id) in ("completed", "cancelled")
    assert winners["completed"] >= 1 and winners["cancelled"] >= 1, winners
    report = check(history.calls, db)
    assert report.counters["cancels_won"] >= 1
    report.counters.update({f"won:{k}": v for k, v in winners.items()})
    record_figures("cancel vs complete", 0, len(history.calls), 2, report)


def test_statement_and_lock_timeouts_are_clean(
    db: psycopg.Connection, connect: Connect, history: History, db_url: str
) -> None:
    """A caller's statement_timeout (57014) or a function's own lock_timeout
    (55P03) ends a call waiting for a busy run: it raises, writes nothing, and
    the same calls succeed once the run is free."""
    claim = _claimed(db)
    call(db, "append_events", run_id="r1", events=[{"type": "e"}])
    impatient = _recorder(db_url, history, "impatient")
    with impatient.connection() as c:
        c.execute("SET statement_timeout = '300ms'")
    fence = fenced(claim)
    writes: list[tuple[str, dict[str, Any]]] = [
        ("heartbeat", fence),
        ("append_events", {"run_id": "r1", "events": [{"type": "t", "delivery_key": "t-1"}]}),
        ("signal_run", {"run_id": "r1", "name": "go"}),
        ("suspend_attempt", {**fence, "wait": {"kind": "event", "name": "go"}}),
        ("fail_attempt", {**fence, "error": {"e": 1}}),
        ("complete_attempt", {**fence, "result": {"ok": 1}, "final_events": [{"type": "x"}]}),
    ]
    barrier = _barrier(connect, "SELECT 1 FROM runrelay.runs WHERE run_id = 'r1' FOR UPDATE")
    before = row_images(db, "r1")
    n = len(history.calls)
    for function, kwargs in writes:
        with pytest.raises(StatementTimeout):
            getattr(impatient, function)(**kwargs)
    history.image_check(
        "statement_timeout", before, row_images(db, "r1"), list(range(n, len(history.calls)))
    )
    barrier.rollback()
    # 55P03: claim_ledger(wait_for_run) waits no longer than the caller's lock_timeout.
    patient = _recorder(db_url, history, "patient")
    with patient.connection() as c:
        c.execute("SET lock_timeout = '300ms'")
    barrier = _barrier(
        connect, "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = 'r1' FOR UPDATE"
    )
    before = row_images(db, "r1")
    n = len(history.calls)
    with pytest.raises(LockTimeout):
        patient.claim_ledger("R", run_id="r1", wait_for_run=True, call_id=uuid.uuid4())
    history.image_check("lock_timeout", before, row_images(db, "r1"), [n])
    barrier.rollback()
    with impatient.connection() as c:
        c.execute("RESET statement_timeout")
    assert impatient.heartbeat(**fence).outcome == "ok"
    assert impatient.complete_attempt(**fence, result={"ok": 1}) == "completed"
    assert [e.kind for e in patient.claim_ledger("R", run_id="r1", wait_for_run=True)] == [
        "claimed"
    ]
    report = check(history.calls, db, images=history.images)
    assert report.counters["fail:57014"] == len(writes) and report.counters["fail:55P03"] == 1


# =============================================================================
# Server crash under load (a dedicated cluster)
# =============================================================================
def test_server_crash_loses_no_acknowledged_call(crashable: Any, tmp_path: Any) -> None:
    """pg_ctl stop -m immediate in the middle of a load (synchronous_commit=on):
    every call that returned ok is still there after restart (I6), every
    interrupted call resolves on replay (I9), and every client recovers."""
    history = History(tmp_path / "crash.jsonl")
    stop = threading.Event()
    errors: list[BaseException] = []
    seconds = duration(4.0)

    def load(n: int) -> None:
        client = _recorder(crashable.url, history, f"load{n}", replay_for=120)
        k = 0
        try:
            while not stop.is_set():
                run_id = f"L{n}-{k}"
                k += 1
                client.enqueue_run(run_id, payload={"k": k})
                client.append_events(run_id, [{"type": "fact", "delivery_key": f"{run_id}:fact"}])
                for a in client.claim_attempts(f"w{n}", lease_seconds=300, call_id=uuid.uuid4()):
                    client.complete_attempt(**a.fence, result={"k": k})
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=load, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(seconds / 2)
    crashable.crash()
    time.sleep(0.5)
    crashable.restart()
    restarted = time.time()
    time.sleep(seconds / 2)
    stop.set()
    for t in threads:
        t.join(180)
    assert errors == []
    history.close()
    for n in range(4):
        assert any(c["process"] == f"load{n}" and c["type"] == "ok" and c["w0"] > restarted
                   for c in history.calls), f"load{n} never recovered"  # fmt: skip
    with psycopg.connect(crashable.url, autocommit=True) as db:
        report = check(history.calls, db)
    assert report.counters["calls:info"] >= 4, report.counters
    assert report.counters["appends_ok"] > 0
    record_figures("server crash", seconds, len(history.calls), 1, report)


# =============================================================================
# Random mixed operations with faults, many connections
# =============================================================================
RETRY_NOW = datetime(1970, 1, 1, tzinfo=UTC)
FAULT_RATE = 1 / 200


class Chaos:
    """One connection (through its own proxy) playing producer, worker and
    relay at random, with a fault about once per 200 calls."""

    OPS: ClassVar[dict[str, int]] = {
        "enqueue": 10, "append": 10, "claim": 10, "heartbeat": 5, "complete": 9,
        "complete_many": 3, "fail": 4, "suspend": 4, "signal": 4, "cancel": 3,
        "reap": 2, "abandon": 1, "relay": 20, "requeue": 1, "prune": 1, "step": 4,
    }  # fmt: skip

    def __init__(self, n: int, url: str, history: History, shared: dict[str, Any]) -> None:
        self.name = f"chaos{n}"
        self.proxy = TcpProxy(url)
        self.client = RecordingClient(
            self.proxy.url(self.name), history, self.name, proxy=self.proxy, replay_for=120
        )
        self.rng = random.Random(1000 + n)
        self.shared = shared
        self.attempts: list[Any] = []
        self.ops: Counter[str] = Counter()
        self.faults = 0
        self.serial = 0

    def _run_id(self) -> str | None:
        runs = self.shared["runs"]
        return self.rng.choice(runs) if runs else None

    def loop(self, stop_at: float) -> None:
        names, weights = zip(*self.OPS.items(), strict=True)
        while time.monotonic() < stop_at:
            if self.rng.random() < FAULT_RATE:
                self.proxy.arm(self.rng.choice(MODES))
                self.faults += 1
            op = self.rng.choices(names, weights)[0]
            with contextlib.suppress(RunrelayError):  # recorded; the checker judges it
                getattr(self, f"op_{op}")()
            self.ops[op] += 1
        self.proxy.disarm()

    # producer ---------------------------------------------------------------
    def op_enqueue(self) -> None:
        self.serial += 1
        run_id = f"{self.name}-{self.serial}"
        key = self.rng.choice([None, None, None, "ck1", "ck2"])
        self.client.enqueue_run(run_id, "q", {"n": run_id}, max_attempts=4, concurrency_key=key)
        self.shared["runs"].append(run_id)

    def op_append(self) -> None:
        run_id = self._run_id()
        if run_id is None:
            return
        self.serial += 1
        evs = [
            {"type": "fact", "lane": self.rng.choice(["lifecycle", "observability"]),
             "delivery_key": f"{self.name}-{self.serial}-{j}", "payload": {"j": j},
             "transport_only": self.rng.random() < 0.1}
            for j in range(self.rng.randint(1, 3))
        ]  # fmt: skip
        self.client.append_events(run_id, evs)

    def _lose_reply_now_and_then(self, function: str) -> None:
        """Faults aimed at the calls named by a call_id, so that replays of
        them resolved as recorded are observed in every bounded run too."""
        if self.rng.random() < 0.1:
            self.proxy.arm("drop_reply_after_commit", f'"{function}"('.encode())
            self.faults += 1

    def op_signal(self) -> None:
        run_id = self._run_id()
        if run_id is not None:
            self._lose_reply_now_and_then("signal_run")
            self.client.signal_run(run_id, "go", {"by": self.name}, call_id=uuid.uuid4())

    def op_cancel(self) -> None:
        run_id = self._run_id()
        if run_id is not None:
            self._lose_reply_now_and_then("cancel_run")
            self.client.cancel_run(run_id, "chaos", call_id=uuid.uuid4())

    # worker -----------------------------------------------------------------
    def op_claim(self) -> None:
        claimed = self.client.claim_attempts(
            self.name, ["q"], self.rng.randint(1, 3), lease_seconds=5, call_id=uuid.uuid4()
        )
        self.attempts.extend(claimed)

    def _take(self) -> Any:
        if not self.attempts:
            return None
        return self.attempts.pop(self.rng.randrange(len(self.attempts)))

    def op_heartbeat(self) -> None:
        if self.attempts:
            a = self.rng.choice(self.attempts)
            if self.client.heartbeat(**a.fence, lease_seconds=5).outcome != "ok":
                self.attempts.remove(a)

    def op_complete(self) -> None:
        a = self._take()
        if a is not None:
            final = [{"type": "done"}]
            if self.rng.random() < 0.5:
                final = [{"type": "done", "delivery_key": f"fin-{a.run_id}-{a.attempt}"}]
            self.client.complete_attempt(**a.fence, result={"by": self.name}, final_events=final)

    def op_step(self) -> None:
        """record_step of a held attempt: three step names per run, each
        call with its own result, so a repeat of a name by another call or
        attempt must answer already_recorded (or be fenced off)."""
        if self.attempts:
            a = self.rng.choice(self.attempts)
            self.serial += 1
            result = {"by": self.name, "attempt": a.attempt, "n": self.serial}
            name = f"s{self.rng.randint(1, 3)}"
            outcome = self.client.record_step(**a.fence, step=name, result=result)
            if outcome in ("cancelled", "fence_lost"):
                self.attempts.remove(a)

    def op_complete_many(self) -> None:
        batch = [a for a in (self._take() for _ in range(3)) if a is not None]
        if batch:
            self.client.complete_attempts(batch)

    def op_fail(self) -> None:
        a = self._take()
        if a is not None:
            retry_at = RETRY_NOW if self.rng.random() < 0.7 else None
            self.client.fail_attempt(**a.fence, error={"by": self.name}, retry_at=retry_at)

    def op_suspend(self) -> None:
        a = self._take()
        if a is not None:
            wait: dict[str, Any] = {"kind": "event", "name": "go"}
            if self.rng.random() < 0.5:
                timeout = datetime.now(UTC) + timedelta(seconds=self.rng.uniform(0.2, 2))
                wait["timeout_at"] = timeout.isoformat()
            self.client.suspend_attempt(**a.fence, wait=wait)

    def op_reap(self) -> None:
        self.client.reap_expired(50)

    def op_abandon(self) -> None:
        self._take()  # a worker that dies: the lease must expire and be reaped

    # relay ------------------------------------------------------------------
    def op_relay(self) -> None:
        """Lease the heads of one run, or of several (a relay serving several
        runs at once); several are then renewed, released or failed together
        in one call, or delivered and acknowledged run by run."""
        lane = self.rng.choice(["lifecycle", "observability"])
        batch = self.rng.random() < 0.6
        held: list[list[Any]] = []
        for _ in range(self.rng.choice([1, 1, 2, 3])):
            rows = self.client.claim_ledger(
                self.name, lane, max_events=self.rng.randint(1, 6), lease_seconds=5,
                batch=batch, call_id=uuid.uuid4(),
            )  # fmt: skip
            claimed = [e for e in rows if e.kind == "claimed"]
            if claimed:
                held.append(claimed)
        if len(held) > 1:
            ids = [e.event_id for claimed in held for e in claimed]
            roll = self.rng.random()
            if roll < 0.1:
                self.client.release_ledger(self.name, ids)
                return
            if roll < 0.2:
                failed = self.client.fail_ledger(
                    self.name, ids, {"by": self.name}, retry_at=RETRY_NOW,
                    permanent=self.rng.random() < 0.3,
                )  # fmt: skip
                self.shared["blocked"].extend(f.event_id for f in failed if f.outcome == "blocked")
                return
            if roll < 0.4:
                self.client.renew_ledger_lease(self.name, ids, 5)
        for claimed in held:
            self._deliver(lane, batch, claimed)

    def _deliver(self, lane: str, batch: bool, claimed: list[Any]) -> None:
        for _ in range(3):
            if not claimed:
                return
            ids = [e.event_id for e in claimed]
            roll = self.rng.random()
            if roll < 0.04:
                self.client.release_ledger(self.name, ids)
                return
            if roll < 0.08:
                permanent = self.rng.random() < 0.3
                failed = self.client.fail_ledger(
                    self.name, ids, {"by": self.name}, retry_at=RETRY_NOW, permanent=permanent
                )
                self.shared["blocked"].extend(f.event_id for f in failed if f.outcome == "blocked")
                return
            self.shared["sink"].receive(self.name, lane, claimed)
            if roll < 0.11:
                return  # delivered, then died before the ack: a takeover redelivers
            if roll < 0.2:
                self.client.renew_ledger_lease(self.name, ids, 5)
            out = self.client.ack_ledger(self.name, claimed[0].run_id, ids,
                                         claim_next=self.rng.choice([0, 4]), lease_seconds=5,
                                         batch=batch)  # fmt: skip
            claimed = [e for e in out if e.kind == "claimed"]

    def op_requeue(self) -> None:
        blocked = self.shared["blocked"]
        if blocked:
            self.client.requeue_ledger_event(blocked.pop())

    def op_prune(self) -> None:
        self.client.prune(datetime.now(UTC) - timedelta(hours=1), 100)


def test_random_operations_with_faults(
    db: psycopg.Connection, db_url: str, history: History, fast_retries: None, tmp_path: Any
) -> None:
    """8+ connections of every operation at random, a fault (lost request,
    rolled-back execution, lost reply after COMMIT, terminated session) about
    once per 200 calls: zero violations, zero deadlocks, and every kind of
    event the invariants talk about actually happened."""
    seconds = duration(20.0)
    n = 16 if chaos_mode() else 8
    shared: dict[str, Any] = {"runs": [], "blocked": [], "sink": SinkLog(tmp_path / "sink.jsonl")}
    players = [Chaos(i, db_url, history, shared) for i in range(n)]
    stop_at = time.monotonic() + seconds
    failures: list[BaseException] = []
    terminations = 0

    def play(p: Chaos) -> None:
        try:
            p.loop(stop_at)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=play, args=(p,), daemon=True) for p in players]
    for t in threads:
        t.start()
    rng = random.Random(9)
    while time.monotonic() < stop_at:
        time.sleep(rng.uniform(0.5, 1.5))
        pid = backend_of(db, rng.choice(players).name)
        if pid is not None and terminate_backend(db, pid):
            terminations += 1
    for t in threads:
        t.join(300)
    for p in players:
        p.client.close()
        p.proxy.close()
    assert failures == [], failures
    # Final sweep: end every lease and apply every pending cancellation.
    sweeper = _recorder(db_url, history, "sweeper")
    with sweeper.connection() as c:
        c.execute("SET runrelay.clock_offset = '1 hour'")
    while sweeper.reap_expired(10000):
        pass
    report = Checker(history.calls, db, sink=shared["sink"].records).run()
    operations = sum(sum(p.ops.values()) for p in players)
    faults = sum(p.faults for p in players) + terminations
    report.counters["operations"] = operations
    report.counters["faults"] = faults
    record_figures(f"random mix ({n} connections)", seconds, operations, faults, report)
    assert report.violations == [], str(report)
    # Every lane still leads to its pending events, and a relay gets them all.
    check_lanes(db)
    drain_ledger(db)
    check_drained(db)
    for counter in (
        "takeovers",
        "cancels_won",
        "replays:recorded",
        "replays:afresh",
        "replays:recorded:signal_run",
        "replays:recorded:cancel_run",
        "redeliveries",
        "steps:recorded",
        "steps:already_recorded",
    ):
        assert report.counters[counter] > 0, f"coverage: no {counter} in {dict(report.counters)}"
