"""Bad input raises SPEC §6's SQLSTATE with a message naming the parameter and
a hint, and changes nothing (a checksum of every table is unchanged)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from sqlapi import call, claim_one, enqueue, fenced, table_checksum

TOKEN = "00000000-0000-0000-0000-000000000000"
LONG = "x" * 201
DEEP: object = 1
for _ in range(600):  # deeper than the 511 levels runrelay accepts
    DEEP = [DEEP]


def held(**args: Any) -> dict[str, Any]:
    """The arguments of a fenced call on attempt 1 of run `existing` (each case
    claims it) with the nil lease token, `args` added or replacing these."""
    return {"run_id": "existing", "attempt": 1, "lease_token": TOKEN, **args}


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("enqueue_run", {"run_id": ""}, "22023", "run_id"),
    ("enqueue_run", {"run_id": "   "}, "22023", "run_id"),
    ("enqueue_run", {"run_id": LONG}, "22023", "run_id"),
    ("enqueue_run", {"run_id": None}, "22023", "run_id"),
    ("enqueue_run", {"run_id": "n", "queue": ""}, "22023", "queue"),
    ("enqueue_run", {"run_id": "n", "max_attempts": -1}, "22023", "max_attempts"),
    ("enqueue_run", {"run_id": "n", "max_attempts": 0}, "22023", "max_attempts"),
    ("enqueue_run", {"run_id": "n", "payload_retention": "forever"}, "22023", "payload_retention"),
    ("enqueue_run", {"run_id": "n", "payload": None}, "22023", "payload"),
    ("enqueue_run", {"run_id": "n", "run_at": "infinity"}, "22023", "run_at"),
    ("enqueue_run", {"run_id": "n", "concurrency_key": ""}, "22023", "concurrency_key"),
    ("enqueue_run", {"run_id": "n", "payload": {"blob": "y" * 2_000_000}}, "54000", "payload"),
    ("enqueue_run", {"run_id": "existing", "payload": {"other": True}}, "22023", "run_id"),
    ("enqueue_run", {"run_id": "n", "payload": DEEP}, "22023", "payload"),
    ("enqueue_run", {"run_id": "\t\n"}, "22023", "run_id"),
    ("claim_attempts", {"worker": ""}, "22023", "worker"),
    ("claim_attempts", {"worker": "w", "max_runs": 0}, "22023", "max_runs"),
    ("claim_attempts", {"worker": "w", "max_runs": 100000}, "22023", "max_runs"),
    ("claim_attempts", {"worker": "w", "queues": []}, "22023", "queues"),
    ("claim_attempts", {"worker": "w", "queues": [""]}, "22023", "queues"),
    ("heartbeat", held(attempt=0), "22023", "attempt"),
    ("heartbeat", held(lease_token=None), "22023", "lease_token"),
    ("complete_attempt", held(result=None), "22023", "result"),
    ("complete_attempt", held(final_events={"type": "x"}), "22023", "final_events"),
    ("complete_attempt", held(final_events=[{"payload": {}}]), "22023", "final_events"),
    (
        "complete_attempt",
        held(final_events=[{"type": "a", "lane": "side"}]),
        "22023",
        "final_events",
    ),
    (
        "complete_attempt",
        held(
            final_events=[
                {"type": "a", "delivery_key": "k"},
                {"type": "b", "delivery_key": "k"},
            ]
        ),
        "22023",
        "final_events",
    ),
    ("complete_attempts", {"items": {"run_id": "x"}}, "22023", "items"),
    ("complete_attempts", {"items": [{"run_id": "x", "attempt": 1}]}, "22023", "items"),
    (
        "complete_attempts",
        {"items": [{"run_id": "x", "attempt": "one", "lease_token": TOKEN}]},
        "22023",
        "items",
    ),
    (
        "complete_attempts",
        {"items": [{"run_id": "x", "attempt": 1, "lease_token": "nope"}]},
        "22023",
        "items",
    ),
    (
        "complete_attempts",
        {
            "items": [
                {"run_id": "x", "attempt": 1, "lease_token": TOKEN},
                {"run_id": "x", "attempt": 1, "lease_token": TOKEN},
            ]
        },
        "22023",
        "items",
    ),
    ("fail_attempt", held(error=None), "22023", "error"),
    ("fail_attempt", held(error={}, retry_at="-infinity"), "22023", "retry_at"),
    ("suspend_attempt", held(wait={"kind": "nap"}), "22023", "wait"),
    ("suspend_attempt", held(wait={"kind": "sleep"}), "22023", "wait"),
    ("suspend_attempt", held(wait={"kind": "event"}), "22023", "wait"),
    ("suspend_attempt", held(wait={"kind": "sleep", "until": "soon"}), "22023", "wait"),
    ("suspend_attempt", held(wait=["sleep"]), "22023", "wait"),
    ("suspend_attempt", held(wait={"kind": "event", "name": "n", "extra": 1}), "22023", "wait"),
    ("signal_run", {"run_id": "existing", "name": ""}, "22023", "name"),
    ("signal_run", {"run_id": "existing", "name": "n", "payload": None}, "22023", "payload"),
    ("cancel_run", {"run_id": LONG}, "22023", "run_id"),
    ("cancel_run", {"run_id": "existing", "reason": "r" * 2001}, "22023", "reason"),
    # The nil uuid (TOKEN) is an id nobody set: all such calls would share it.
    ("signal_run", {"run_id": "existing", "name": "n", "call_id": TOKEN}, "22023", "call_id"),
    ("cancel_run", {"run_id": "existing", "call_id": TOKEN}, "22023", "call_id"),
    (
        "record_runner_terminal",
        {"run_id": "existing", "attempt": 1, "result": None},
        "22023",
        "result",
    ),
    ("read_runner_terminal", {"run_id": "existing", "attempt": -1}, "22023", "attempt"),
    ("reap_expired", {"max_attempts": 0}, "22023", "max_attempts"),
]


@pytest.mark.parametrize(("function", "kwargs", "sqlstate", "parameter"), CASES)
def test_bad_input_raises_and_changes_nothing(
    db: psycopg.Connection, function: str, kwargs: dict[str, Any], sqlstate: str, parameter: str
) -> None:
    enqueue(db, "existing")
    claim_one(db)
    before = table_checksum(db)
    with pytest.raises(psycopg.Error) as exc:
        call(db, function, **kwargs)
    assert exc.value.sqlstate == sqlstate, exc.value
    assert exc.value.diag.column_name == parameter
    assert parameter in (exc.value.diag.message_primary or "")
    assert exc.value.diag.message_hint
    assert table_checksum(db) == before


def test_lease_seconds_are_clamped_not_rejected(db: psycopg.Connection) -> None:
    enqueue(db, "a")
    enqueue(db, "b")
    low = claim_one(db, lease_seconds=-10)
    high = claim_one(db, lease_seconds=100000)
    now = db.execute("SELECT statement_timestamp()").fetchone()
    assert now is not None
    assert 0 < (low["lease_expires_at"] - now[0]).total_seconds() <= 5
    assert 250 < (high["lease_expires_at"] - now[0]).total_seconds() <= 300
    hb = call(db, "heartbeat", **fenced(high), lease_seconds=1)[0]
    assert hb["outcome"] == "ok"
    assert (hb["lease_expires_at"] - now[0]).total_seconds() <= 6


def test_oversized_payload_cap_is_configurable(db: psycopg.Connection) -> None:
    db.execute("UPDATE runrelay.settings SET max_payload_bytes = 2048")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        enqueue(db, "big", payload={"x": "y" * 3000})
    enqueue(db, "fits", payload={"x": "y" * 1000})
