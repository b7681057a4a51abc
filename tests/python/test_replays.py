"""Replays are exact: a call repeated after its reply was lost answers what the
first one recorded and has no second effect; a rolled-back call repeated does
the work afresh. Each test discards the first reply on purpose."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from sqlapi import call, claim_one, enqueue, events, fenced, run_row, scalar, table_checksum

Connect = Callable[..., psycopg.Connection]


def _ledger_count(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM runrelay.ledger").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("function", "kwargs", "expected"),
    [
        ("complete_attempt", {"result": {"ok": 1}}, "completed"),
        ("fail_attempt", {"error": {"e": 1}}, "retry_scheduled"),
        (
            "fail_attempt",
            {"error": {"e": 1}, "retry_at": "2000-01-01T00:00:00Z"},
            "retry_scheduled",
        ),
        (
            "suspend_attempt",
            {"wait": {"kind": "sleep", "until": "2999-01-01T00:00:00Z"}},
            "waiting",
        ),
        ("suspend_attempt", {"wait": {"kind": "event", "name": "go"}}, "waiting"),
        ("release_attempt", {}, "released"),
        (
            "release_attempt",
            {"run_at": "2999-01-01T00:00:00Z", "reason": "shutdown"},
            "released",
        ),
    ],
)
def test_fenced_write_replay_returns_recorded_outcome(
    db: psycopg.Connection, function: str, kwargs: dict[str, Any], expected: str
) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    call(db, function, **fenced(claim), **kwargs)  # the reply is "lost": discarded
    before = table_checksum(db)
    assert scalar(db, function, **fenced(claim), **kwargs) == expected
    assert scalar(db, function, **fenced(claim), **kwargs) == expected
    assert table_checksum(db) == before


def test_replay_of_failure_after_the_retry_was_claimed(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    first = claim_one(db)
    call(db, "fail_attempt", **fenced(first), error={"e": 1}, retry_at="2000-01-01T00:00:00Z")
    second = claim_one(db)
    assert second["attempt"] == 2
    assert scalar(db, "fail_attempt", **fenced(first), error={"e": 1}) == "retry_scheduled"
    assert run_row(db, "r1")["status"] == "running"
    # Another operation with the old token is fenced.
    assert scalar(db, "complete_attempt", **fenced(first)) == "fence_lost"
    assert call(db, "heartbeat", **fenced(first))[0]["outcome"] == "fence_lost"


def test_replay_of_completion_with_final_events_appends_once(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    extra = [{"type": "order.shipped", "payload": {"n": 1}}]
    call(db, "complete_attempt", **fenced(claim), final_events=extra)
    n = _ledger_count(db)
    assert scalar(db, "complete_attempt", **fenced(claim), final_events=extra) == "completed"
    assert _ledger_count(db) == n
    assert events(db, "r1") == ["run.queued", "run.started", "order.shipped", "run.completed"]


def test_rolled_back_write_repeated_does_the_work(db: psycopg.Connection, connect: Connect) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    tx = connect(autocommit=False)
    assert scalar(tx, "complete_attempt", **fenced(claim)) == "completed"
    tx.rollback()
    assert run_row(db, "r1")["status"] == "running"
    assert scalar(db, "complete_attempt", **fenced(claim)) == "completed"
    assert events(db, "r1").count("run.completed") == 1


def test_claim_replay_with_call_id(db: psycopg.Connection, connect: Connect) -> None:
    for i in range(5):
        enqueue(db, f"r{i}")
    call_id = uuid.uuid4()
    first = call(db, "claim_attempts", worker="w", max_runs=3, call_id=call_id)
    assert len(first) == 3
    before = table_checksum(db)
    again = call(db, "claim_attempts", worker="w", max_runs=3, call_id=call_id)
    assert again == first
    assert table_checksum(db) == before
    # Another worker cannot read someone else's claim through its call_id.
    assert call(db, "claim_attempts", worker="intruder", max_runs=3, call_id=call_id) == []
    # A claim that rolled back left nothing: the same call_id claims afresh.
    other = uuid.uuid4()
    tx = connect(autocommit=False)
    assert len(call(tx, "claim_attempts", worker="w", max_runs=2, call_id=other)) == 2
    tx.rollback()
    fresh = call(db, "claim_attempts", worker="w", max_runs=2, call_id=other)
    assert len(fresh) == 2
    assert {r["run_id"] for r in fresh}.isdisjoint({r["run_id"] for r in first})


def test_wrong_token_is_fence_lost_and_changes_nothing(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    forged = {**fenced(claim), "lease_token": uuid.uuid4()}
    before = table_checksum(db)
    assert scalar(db, "complete_attempt", **forged) == "fence_lost"
    assert scalar(db, "fail_attempt", **forged, error={"e": 1}) == "fence_lost"
    assert (
        scalar(db, "suspend_attempt", **forged, wait={"kind": "event", "name": "x"}) == "fence_lost"
    )
    assert call(db, "heartbeat", **forged)[0]["outcome"] == "fence_lost"
    assert scalar(db, "release_attempt", **forged) == "fence_lost"
    assert scalar(db, "prepare_waiting_failure", **forged) == "not_applicable"
    assert table_checksum(db) == before
    # After cancellation a foreign token still learns nothing (no oracle).
    scalar(db, "cancel_run", run_id="r1")
    assert scalar(db, "complete_attempt", **forged) == "fence_lost"
    assert scalar(db, "complete_attempt", **fenced(claim)) == "cancelled"


def test_stale_writes_after_reap_are_fenced(db: psycopg.Connection) -> None:
    enqueue(db, "r1", max_attempts=2)
    claim = claim_one(db, lease_seconds=5)
    with db.transaction():
        db.execute("SET LOCAL runrelay.clock_offset = '1 minute'")
        assert call(db, "reap_expired") == [
            {"run_id": "r1", "attempt": 1, "outcome": "retry_scheduled"}
        ]
    assert scalar(db, "complete_attempt", **fenced(claim)) == "fence_lost"
    assert call(db, "heartbeat", **fenced(claim))[0]["outcome"] == "fence_lost"
    status = db.execute("SELECT status FROM runrelay.attempts WHERE run_id = 'r1'").fetchone()
    assert status == ("lost",)


def test_append_with_delivery_keys_replays_exactly(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    batch = [
        {"type": "invoice.issued", "delivery_key": "inv-1", "payload": {"n": 1}},
        {"type": "invoice.sent", "delivery_key": "inv-1-sent", "lane": "observability"},
    ]
    first = call(db, "append_events", run_id="r1", events=batch)  # reply "lost"
    before = table_checksum(db)
    assert call(db, "append_events", run_id="r1", events=batch) == first
    assert table_checksum(db) == before
    changed = [{**batch[0], "payload": {"n": 2}}, batch[1]]
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        call(db, "append_events", run_id="r1", events=changed)
    with pytest.raises(psycopg.errors.InvalidParameterValue):  # a subset is not a replay
        call(
            db,
            "append_events",
            run_id="r1",
            events=[batch[0], {"type": "x", "delivery_key": "new"}],
        )
    assert table_checksum(db) == before


def test_replay_with_keyed_final_events_answers_the_recorded_outcome(
    db: psycopg.Connection,
) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    extra = [{"type": "order.shipped", "delivery_key": "ship-1"}]
    call(db, "complete_attempt", **fenced(claim), final_events=extra)  # reply "lost"
    before = table_checksum(db)
    assert scalar(db, "complete_attempt", **fenced(claim), final_events=extra) == "completed"
    assert table_checksum(db) == before
    enqueue(db, "r2")
    other = claim_one(db)
    unchanged = table_checksum(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue):  # a real reuse is still refused
        call(db, "complete_attempt", **fenced(other), final_events=extra)
    assert table_checksum(db) == unchanged
