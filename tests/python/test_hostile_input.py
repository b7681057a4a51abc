"""Hostile input against every public function (SPEC §3, §5, §6).

tests/python/test_bad_input.py and pgTAP 019/020/039 pin one hand-picked
case per rule; this file fuzzes systematically: NULL for every parameter of
every function, boundary and blank strings for every identifier, JSON of
every wrong top-level type, deep and wide JSON, payloads at the cap, over it
and at 10 MB, out-of-range numbers, infinite timestamps, every kind of wrong
lease token, batch sizes at and over their limits and with duplicates, and a
flood of oversized submissions beside normal traffic; and the input rules
of docs/security.md#input-rules: control characters and Unicode blanks in names,
the reserved run. event types and schedule: run ids, enqueue_runs capped as
a whole, and errors that quote a short escaped prefix of a value.

Every rejection must be SPEC §6's SQLSTATE (22023 bad input, 54000 oversized)
naming the parameter (message and COLUMN field) with a HINT; afterwards the
tables are byte-identical and the server still answers.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from runrelay import Client, InvalidArgument, PayloadTooLarge
from sqlapi import JSON_PARAMS, call, claim_one, enqueue, fenced, table_checksum

RANDOM = "3f1e2d4c-5b6a-4789-8a9b-0c1d2e3f4a5b"
WHITESPACE = ["", " ", "   ", "\t", "\n", "\r\n", " \t\n\r\f\v "]

World = dict[str, Any]


@pytest.fixture
def world(db: psycopg.Connection) -> World:
    """A running attempt (run `w`) and a run `l` whose first ledger event is
    leased to relay r1."""
    enqueue(db, "w", queue="wq")
    claim = claim_one(db, queues=["wq"])
    enqueue(db, "l", queue="lq")
    appended = call(db, "append_events", run_id="l", events=[{"type": "a"}, {"type": "b"}])
    leased = call(db, "claim_ledger", relay="r1", run_id="l")
    assert len(leased) == 1
    return {
        "claim": claim,
        "token": claim["lease_token"],
        "leased": leased[0]["event_id"],
        "appended": [r["event_id"] for r in appended],
    }


def base_calls(w: World) -> dict[str, dict[str, Any]]:
    """A valid call of every public function, every parameter spelled out."""
    fence = {"run_id": "w", "attempt": 1, "lease_token": RANDOM}
    return {
        "enqueue_run": {
            "run_id": "new",
            "queue": "q",
            "payload": {},
            "run_at": "2020-01-01T00:00:00Z",
            "priority": 0,
            "max_attempts": 3,
            "payload_retention": "keep",
            "concurrency_key": "k",
        },
        "append_events": {"run_id": "l", "events": [{"type": "x"}]},
        "signal_run": {"run_id": "w", "name": "n", "payload": {}},
        "cancel_run": {"run_id": "absent", "reason": "r"},
        "claim_attempts": {
            "worker": "w2",
            "queues": ["none"],
            "max_runs": 1,
            "lease_seconds": 30,
            "call_id": str(uuid.uuid4()),
        },
        "heartbeat": {**fence, "lease_token": w["token"], "lease_seconds": 30},
        "complete_attempt": {**fence, "result": {}, "final_events": []},
        "complete_attempts": {"items": [fence]},
        "fail_attempt": {
            **fence,
            "error": {},
            "retry_at": "2020-01-01T00:00:00Z",
            "final_events": [],
            "preserve_runner_terminal": False,
            "protect_waiting_suspension": False,
        },
        "suspend_attempt": {
            **fence,
            "wait": {"kind": "sleep", "until": "2100-01-01T00:00:00Z"},
            "final_events": [],
        },
        "release_attempt": {**fence, "run_at": "2020-01-01T00:00:00Z", "reason": "r"},
        "prepare_waiting_failure": fence,
        "record_runner_terminal": {"run_id": "absent", "attempt": 1, "result": {}},
        "claim_detached_terminal": fence,
        "read_runner_terminal": {"run_id": "w", "attempt": 1},
        "reap_expired": {"max_attempts": 10},
        "claim_ledger": {
            "relay": "r2",
            "lane": "lifecycle",
            "run_id": "absent",
            "max_events": 1,
            "lease_seconds": 30,
            "wait_for_run": False,
            "expected_head": 1,
            "batch": False,
            "call_id": str(uuid.uuid4()),
        },
        "ack_ledger": {
            "relay": "r2",
            "run_id": "l",
            "event_ids": [w["leased"]],
            "claim_next": 0,
            "lease_seconds": 30,
            "batch": False,
        },
        "renew_ledger_lease": {"relay": "r2", "event_ids": [w["leased"]], "lease_seconds": 30},
        "release_ledger": {"relay": "r2", "event_ids": [w["leased"]]},
        "fail_ledger": {
            "relay": "r2",
            "event_ids": [w["leased"]],
            "error": {},
            "retry_at": "2100-01-01T00:00:00Z",
            "permanent": False,
        },
        "ledger_next_due_at": {"lane": "lifecycle", "run_id": "l"},
        "requeue_ledger_event": {"event_id": w["leased"]},
        "prune": {"delivered_before": "2000-01-01T00:00:00Z", "max_rows": 10},
        "list_runs": {
            "queue": "wq",
            "status": "running",
            "concurrency_key": "k",
            "created_after": "2000-01-01T00:00:00Z",
            "created_before": "2100-01-01T00:00:00Z",
            "finished_before": "2100-01-01T00:00:00Z",
            "after_created_at": "2100-01-01T00:00:00Z",
            "after_run_id": "w",
            "max_rows": 10,
        },
        "get_run": {"run_id": "w"},
        "run_attempts": {"run_id": "w", "after_attempt": 0, "max_rows": 10},
        "run_ledger_events": {"run_id": "l", "lane": "lifecycle", "after_seq": 0, "max_rows": 10},
        "retry_run": {
            "run_id": "w",
            "max_attempts": 3,
            "run_at": "2020-01-01T00:00:00Z",
            "reason": "r",
            "requested_by": "ops",
            "call_id": str(uuid.uuid4()),
        },
        "list_blocked_heads": {
            "lane": "lifecycle",
            "run_id": "l",
            "after_run_id": "a",
            "after_lane": "lifecycle",
            "max_rows": 10,
        },
        "requeue_blocked_heads": {"run_id": "l", "lane": "lifecycle", "max_lanes": 10},
        "pause_queue": {"queue": "wq", "reason": "r", "requested_by": "ops"},
        "resume_queue": {"queue": "wq"},
        "list_paused_queues": {},
        "purge_runs": {
            "finished_before": "2000-01-01T00:00:00Z",
            "max_rows": 10,
            "include_undelivered": False,
        },
        "upsert_schedule": {
            "name": "s",
            "cron": "*/5 * * * *",
            "time_zone": "UTC",
            "queue": "q",
            "payload": {},
            "priority": 0,
            "max_attempts": 3,
            "concurrency_key": "k",
            "missed": "skip",
            "enabled": True,
        },
        "delete_schedule": {"name": "s"},
        "list_schedules": {"after_name": "a", "max_rows": 10},
        "enqueue_due_schedules": {"max_runs": 10},
        "schedules_next_due_at": {},
        "queue_overview": {},
        "ledger_overview": {},
        "record_queue_activity": {},
    }


PARAMS = {fn: list(kwargs) for fn, kwargs in base_calls({"token": RANDOM, "leased": 1}).items()}

# Parameters whose SQL NULL is documented (a null default, or a lease length
# that falls back to its default): every other one must raise 22023.
NULLABLE = {
    ("enqueue_run", "run_at"),
    ("enqueue_run", "concurrency_key"),
    ("cancel_run", "reason"),
    ("claim_attempts", "queues"),
    ("claim_attempts", "lease_seconds"),
    ("claim_attempts", "call_id"),
    ("heartbeat", "lease_seconds"),
    ("fail_attempt", "retry_at"),
    ("release_attempt", "run_at"),
    ("release_attempt", "reason"),
    ("claim_ledger", "run_id"),
    ("claim_ledger", "lease_seconds"),
    ("claim_ledger", "expected_head"),
    ("claim_ledger", "call_id"),
    ("ack_ledger", "lease_seconds"),
    ("renew_ledger_lease", "lease_seconds"),
    ("fail_ledger", "retry_at"),
    ("ledger_next_due_at", "lane"),
    ("ledger_next_due_at", "run_id"),
    ("list_runs", "queue"),
    ("list_runs", "status"),
    ("list_runs", "concurrency_key"),
    ("list_runs", "created_after"),
    ("list_runs", "created_before"),
    ("list_runs", "finished_before"),
    ("run_ledger_events", "lane"),
    ("retry_run", "max_attempts"),
    ("retry_run", "run_at"),
    ("retry_run", "reason"),
    ("retry_run", "requested_by"),
    ("retry_run", "call_id"),
    ("list_blocked_heads", "lane"),
    ("list_blocked_heads", "run_id"),
    ("requeue_blocked_heads", "run_id"),
    ("requeue_blocked_heads", "lane"),
    ("pause_queue", "reason"),
    ("pause_queue", "requested_by"),
    ("upsert_schedule", "concurrency_key"),
    ("list_schedules", "after_name"),
}

# Identifier parameters: 1 to 200 characters, not blank.
IDENTIFIERS = [
    ("enqueue_run", "run_id"),
    ("enqueue_run", "queue"),
    ("enqueue_run", "concurrency_key"),
    ("append_events", "run_id"),
    ("signal_run", "run_id"),
    ("signal_run", "name"),
    ("cancel_run", "run_id"),
    ("claim_attempts", "worker"),
    ("heartbeat", "run_id"),
    ("complete_attempt", "run_id"),
    ("fail_attempt", "run_id"),
    ("suspend_attempt", "run_id"),
    ("release_attempt", "run_id"),
    ("prepare_waiting_failure", "run_id"),
    ("record_runner_terminal", "run_id"),
    ("claim_detached_terminal", "run_id"),
    ("read_runner_terminal", "run_id"),
    ("claim_ledger", "relay"),
    ("claim_ledger", "run_id"),
    ("ack_ledger", "relay"),
    ("ack_ledger", "run_id"),
    ("renew_ledger_lease", "relay"),
    ("release_ledger", "relay"),
    ("fail_ledger", "relay"),
    ("ledger_next_due_at", "run_id"),
    ("list_runs", "queue"),
    ("list_runs", "concurrency_key"),
    ("list_runs", "after_run_id"),
    ("get_run", "run_id"),
    ("run_attempts", "run_id"),
    ("run_ledger_events", "run_id"),
    ("retry_run", "run_id"),
    ("retry_run", "requested_by"),
    ("list_blocked_heads", "run_id"),
    ("list_blocked_heads", "after_run_id"),
    ("requeue_blocked_heads", "run_id"),
    ("pause_queue", "queue"),
    ("pause_queue", "requested_by"),
    ("resume_queue", "queue"),
    ("upsert_schedule", "queue"),
    ("upsert_schedule", "concurrency_key"),
    ("delete_schedule", "name"),
    ("list_schedules", "after_name"),
]


def caller(db: psycopg.Connection, function: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: call(db, function, **kwargs)


def assert_rejected(
    db: psycopg.Connection,
    thunk: Callable[[], Any],
    sqlstate: str,
    parameter: str,
) -> psycopg.Error:
    """The call raises `sqlstate` naming `parameter`, with a hint, and
    changes nothing; the server still answers."""
    before = table_checksum(db)
    with pytest.raises(psycopg.Error) as exc:
        thunk()
    err = exc.value
    assert err.sqlstate == sqlstate, err
    assert err.diag.column_name == parameter, err
    assert parameter in (err.diag.message_primary or ""), err
    assert err.diag.message_hint, err
    assert table_checksum(db) == before
    assert db.execute("SELECT 1").fetchone() == (1,)
    return err


# --------------------------------------------------------------------------
# NULL, strings, numbers, timestamps.


def test_every_base_call_is_valid(db: psycopg.Connection, world: World) -> None:
    """The fuzz below changes one parameter of these calls at a time, so
    each of them must be accepted as it is."""
    for function, kwargs in base_calls(world).items():
        db.execute("BEGIN")
        try:
            call(db, function, **kwargs)
        finally:
            db.execute("ROLLBACK")
    assert sorted(PARAMS) == sorted(base_calls(world))


@pytest.mark.parametrize(
    ("function", "parameter"), [(f, p) for f, ps in PARAMS.items() for p in ps]
)
def test_null_for_every_parameter(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    kwargs = {**base_calls(world)[function], parameter: None}
    if (function, parameter) in NULLABLE:
        call(db, function, **kwargs)
        assert db.execute("SELECT 1").fetchone() == (1,)
    else:
        assert_rejected(db, lambda: call(db, function, **kwargs), "22023", parameter)


def test_null_run_at_means_now(db: psycopg.Connection) -> None:
    enqueue(db, "null-run-at", run_at=None)
    row = db.execute(
        "SELECT abs(extract(epoch FROM run_at - statement_timestamp())) < 60"
        " FROM runrelay.runs WHERE run_id = 'null-run-at'"
    ).fetchone()
    assert row == (True,)


@pytest.mark.parametrize(("function", "parameter"), IDENTIFIERS)
def test_identifier_bounds_and_blanks(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    base = base_calls(world)[function]
    for value in [*WHITESPACE, "x" * 201, "é" * 201]:
        kwargs = {**base, parameter: value}
        assert_rejected(db, lambda kw=kwargs: call(db, function, **kw), "22023", parameter)
    # 200 characters are allowed whatever their byte length.
    for value in ["x" * 200, "é" * 200]:
        db.execute("BEGIN")
        try:
            if function == "append_events":
                enqueue(db, value)
            call(db, function, **{**base, parameter: value})
        finally:
            db.execute("ROLLBACK")


@pytest.mark.parametrize(
    ("function", "parameter"),
    [
        ("enqueue_run", "payload_retention"),
        ("claim_ledger", "lane"),
        ("ledger_next_due_at", "lane"),
        ("list_runs", "status"),
        ("run_ledger_events", "lane"),
        ("list_blocked_heads", "lane"),
        ("list_blocked_heads", "after_lane"),
        ("requeue_blocked_heads", "lane"),
        ("upsert_schedule", "missed"),
    ],
)
def test_enumerated_text_parameters(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    base = base_calls(world)[function]
    for value in [*WHITESPACE, "x" * 200, "x" * 201, "Keep", "lifecycle ", "keep\n"]:
        kwargs = {**base, parameter: value}
        assert_rejected(db, lambda kw=kwargs: call(db, function, **kw), "22023", parameter)


def test_free_text_reason_is_bounded_not_blank_checked(db: psycopg.Connection) -> None:
    enqueue(db, "r")
    for value in [*WHITESPACE, "x" * 2000]:
        db.execute("BEGIN")
        try:
            assert call(db, "cancel_run", run_id="r", reason=value)[0]["cancel_run"] == "cancelled"
        finally:
            db.execute("ROLLBACK")
    assert_rejected(
        db, lambda: call(db, "cancel_run", run_id="r", reason="é" * 2001), "22023", "reason"
    )
    enqueue(db, "held", queue="hq")
    fence = fenced(claim_one(db, queues=["hq"]))
    for value in [*WHITESPACE, "é" * 2000]:
        db.execute("BEGIN")
        try:
            assert call(db, "release_attempt", **fence, reason=value)[0]["release_attempt"] == (
                "released"
            )
        finally:
            db.execute("ROLLBACK")
    assert_rejected(
        db, lambda: call(db, "release_attempt", **fence, reason="é" * 2001), "22023", "reason"
    )


def test_identifiers_nested_in_json_are_checked_alike(db: psycopg.Connection, world: World) -> None:
    token = str(world["token"])

    def items(run_id: str) -> Callable[[], Any]:
        return lambda: call(
            db,
            "complete_attempts",
            items=[{"run_id": run_id, "attempt": 1, "lease_token": token}],
        )

    def wait(kind: str, key: str, value: str) -> Callable[[], Any]:
        return lambda: call(
            db, "suspend_attempt", **fenced(world["claim"]), wait={"kind": kind, key: value}
        )

    def event(field: str, value: str) -> Callable[[], Any]:
        return lambda: call(db, "append_events", run_id="l", events=[{"type": "t", field: value}])

    for value in [*WHITESPACE, "x" * 201]:
        assert_rejected(db, items(value), "22023", "items")
        assert_rejected(db, wait("event", "name", value), "22023", "wait")
        assert_rejected(db, wait("detached_runner", "runner", value), "22023", "wait")
        assert_rejected(db, event("type", value), "22023", "events")
    for value in ["", "k" * 401]:
        assert_rejected(db, event("delivery_key", value), "22023", "events")
    # The longest allowed values are accepted.
    db.execute("BEGIN")
    try:
        call(
            db,
            "append_events",
            run_id="l",
            events=[{"type": "t" * 200, "delivery_key": "k" * 400}],
        )
        assert items("x" * 200)() == [{"run_id": "x" * 200, "attempt": 1, "outcome": "fence_lost"}]
    finally:
        db.execute("ROLLBACK")


def test_queue_names_and_their_array(db: psycopg.Connection, world: World) -> None:
    def claim(queues: Any) -> Callable[[], Any]:
        return lambda: call(db, "claim_attempts", worker="w", queues=queues)

    for bad in [
        [],
        [*WHITESPACE[:1]],
        ["\t"],
        ["ok", " \n"],
        ["q" * 201],
        [f"q{i}" for i in range(101)],
    ]:
        assert_rejected(db, claim(bad), "22023", "queues")
    for bad_literal in ["'{{a,b},{c,d}}'", "ARRAY['a', NULL]"]:
        query = f"SELECT * FROM runrelay.claim_attempts(worker => 'w', queues => {bad_literal})"
        assert_rejected(db, lambda q=query: db.execute(q).fetchall(), "22023", "queues")
    assert claim([f"q{i}" for i in range(100)])() == []
    assert claim(["q" * 200, "q" * 200])() == []


INT_LIMITS = [
    ("enqueue_run", "priority", -1_000_000, 1_000_000),
    ("enqueue_run", "max_attempts", 1, 1000),
    ("claim_attempts", "max_runs", 1, 1000),
    ("reap_expired", "max_attempts", 1, 10_000),
    ("claim_ledger", "max_events", 1, 1000),
    ("ack_ledger", "claim_next", 0, 1000),
    ("prune", "max_rows", 1, 1_000_000),
    ("list_runs", "max_rows", 1, 1000),
    ("run_attempts", "after_attempt", 0, 2**31 - 1),
    ("run_attempts", "max_rows", 1, 1000),
    ("run_ledger_events", "after_seq", 0, 2**63 - 1),
    ("run_ledger_events", "max_rows", 1, 1000),
    ("retry_run", "max_attempts", 1, 1000),
    ("list_blocked_heads", "max_rows", 1, 1000),
    ("requeue_blocked_heads", "max_lanes", 1, 1000),
    ("purge_runs", "max_rows", 1, 10_000),
    ("heartbeat", "attempt", 1, 2**31 - 1),
    ("complete_attempt", "attempt", 1, 2**31 - 1),
    ("fail_attempt", "attempt", 1, 2**31 - 1),
    ("suspend_attempt", "attempt", 1, 2**31 - 1),
    ("release_attempt", "attempt", 1, 2**31 - 1),
    ("prepare_waiting_failure", "attempt", 1, 2**31 - 1),
    ("record_runner_terminal", "attempt", 1, 2**31 - 1),
    ("claim_detached_terminal", "attempt", 1, 2**31 - 1),
    ("read_runner_terminal", "attempt", 1, 2**31 - 1),
]


@pytest.mark.parametrize(("function", "parameter", "low", "high"), INT_LIMITS)
def test_integer_limits(
    db: psycopg.Connection, world: World, function: str, parameter: str, low: int, high: int
) -> None:
    base = base_calls(world)[function]
    candidates = {-(2**31), -1, 0, low - 1, high + 1, 2**31 - 1}
    for value in sorted(v for v in candidates if -(2**31) <= v < 2**31 and not low <= v <= high):
        kwargs = {**base, parameter: value}
        err = assert_rejected(db, lambda kw=kwargs: call(db, function, **kw), "22023", parameter)
        assert str(value) in (err.diag.message_primary or "")
    for value in (low, high):
        db.execute("BEGIN")
        try:
            call(db, function, **{**base, parameter: value})
        finally:
            db.execute("ROLLBACK")


def test_integer_overflow_is_refused_before_the_call(db: psycopg.Connection) -> None:
    """A number outside int4 never reaches the function: the server's type
    input refuses it (class 22) and nothing is written."""
    before = table_checksum(db)
    with pytest.raises(psycopg.Error) as exc:
        db.execute("SELECT * FROM runrelay.reap_expired(max_attempts => %s::bigint::int)", [2**40])
    assert (exc.value.sqlstate or "").startswith("22")
    assert table_checksum(db) == before


LEASES = [-(2**31), -1, 0, 1, 4, 5, 300, 301, 86_400, 2**31 - 1, None]


def _expected_lease(seconds: int | None) -> float:
    return 30.0 if seconds is None else float(min(300, max(5, seconds)))


def _lease_of(db: psycopg.Connection, expires: Any) -> float:
    row = db.execute("SELECT extract(epoch FROM %s - statement_timestamp())", [expires]).fetchone()
    assert row is not None
    return float(row[0])


def test_lease_seconds_are_clamped_everywhere(db: psycopg.Connection) -> None:
    """claim_attempts, heartbeat, claim_ledger, ack_ledger (claim-next) and
    renew_ledger_lease all clamp to 5..300 (null: 30) rather than reject."""
    for i, seconds in enumerate(LEASES):
        run = f"lease-{i}"
        enqueue(db, run, queue=f"lease-q-{i}")
        claim = claim_one(db, queues=[f"lease-q-{i}"], lease_seconds=seconds)
        want = _expected_lease(seconds)
        assert want - 2 < _lease_of(db, claim["lease_expires_at"]) <= want, seconds
        hb = call(db, "heartbeat", **fenced(claim), lease_seconds=seconds)[0]
        assert hb["outcome"] == "ok"
        assert want - 2 < _lease_of(db, hb["lease_expires_at"]) <= want, seconds
        call(db, "append_events", run_id=run, events=[{"type": "x"}])
        head = call(db, "claim_ledger", relay="r", run_id=run, lease_seconds=seconds)
        assert len(head) == 1
        assert want - 2 < _lease_of(db, head[0]["lease_expires_at"]) <= want, seconds
        renewed = call(
            db,
            "renew_ledger_lease",
            relay="r",
            event_ids=[head[0]["event_id"]],
            lease_seconds=seconds,
        )
        assert want - 2 < _lease_of(db, renewed[0]["lease_expires_at"]) <= want, seconds
        acked = call(
            db,
            "ack_ledger",
            relay="r",
            run_id=run,
            event_ids=[head[0]["event_id"]],
            claim_next=1,
            lease_seconds=seconds,
        )
        nxt = [r for r in acked if r["kind"] == "claimed"]
        assert len(nxt) == 1
        assert want - 2 < _lease_of(db, nxt[0]["lease_expires_at"]) <= want, seconds


TIMESTAMPS = [
    ("enqueue_run", "run_at"),
    ("fail_attempt", "retry_at"),
    ("release_attempt", "run_at"),
    ("fail_ledger", "retry_at"),
    ("prune", "delivered_before"),
    ("list_runs", "created_after"),
    ("list_runs", "created_before"),
    ("list_runs", "finished_before"),
    ("list_runs", "after_created_at"),
    ("retry_run", "run_at"),
    ("purge_runs", "finished_before"),
]


@pytest.mark.parametrize(("function", "parameter"), TIMESTAMPS)
def test_infinite_timestamps(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    base = base_calls(world)[function]
    for value in ("infinity", "-infinity"):
        kwargs = {**base, parameter: value}
        assert_rejected(db, lambda kw=kwargs: call(db, function, **kw), "22023", parameter)


def test_infinite_timestamps_inside_a_wait(db: psycopg.Connection, world: World) -> None:
    for value in ("infinity", "-infinity", "Infinity", "not a time", ""):
        for wait in (
            {"kind": "sleep", "until": value},
            {"kind": "event", "name": "n", "timeout_at": value},
            {"kind": "detached_runner", "runner": "r", "timeout_at": value},
        ):
            assert_rejected(
                db,
                lambda w=wait: call(db, "suspend_attempt", **fenced(world["claim"]), wait=w),
                "22023",
                "wait",
            )


# --------------------------------------------------------------------------
# JSON: wrong types, NUL, depth, width, size.

SHAPED_JSON = [
    ("append_events", "events", "array"),
    ("complete_attempt", "final_events", "array"),
    ("fail_attempt", "final_events", "array"),
    ("suspend_attempt", "final_events", "array"),
    ("complete_attempts", "items", "array"),
    ("suspend_attempt", "wait", "object"),
]
FREE_JSON = [
    ("enqueue_run", "payload"),
    ("signal_run", "payload"),
    ("complete_attempt", "result"),
    ("record_runner_terminal", "result"),
    ("fail_attempt", "error"),
    ("fail_ledger", "error"),
]
SAMPLES = {"number": 5, "string": "s", "boolean": True, "array": [], "object": {"a": 1}}


def _json_null_call(
    db: psycopg.Connection, function: str, kwargs: dict[str, Any], parameter: str
) -> Any:
    """The call with the JSON literal null (not SQL NULL) for `parameter`."""
    from psycopg.types.json import Jsonb

    args = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(
            sql.Identifier(k), sql.SQL("'null'::jsonb") if k == parameter else sql.Placeholder(k)
        )
        for k in kwargs
    )
    query = sql.SQL("SELECT * FROM runrelay.{}({})").format(sql.Identifier(function), args)
    params = {k: Jsonb(v) if k in JSON_PARAMS else v for k, v in kwargs.items() if k != parameter}
    return db.execute(query, params).fetchall()


@pytest.mark.parametrize(("function", "parameter", "kind"), SHAPED_JSON)
def test_json_of_the_wrong_top_level_type(
    db: psycopg.Connection, world: World, function: str, parameter: str, kind: str
) -> None:
    base = base_calls(world)[function]
    for sample_kind, value in SAMPLES.items():
        if sample_kind == kind:
            continue
        kwargs = {**base, parameter: value}
        err = assert_rejected(db, lambda kw=kwargs: call(db, function, **kw), "22023", parameter)
        assert kind in (err.diag.message_primary or "")
    assert_rejected(db, lambda: _json_null_call(db, function, base, parameter), "22023", parameter)


@pytest.mark.parametrize(("function", "parameter"), FREE_JSON)
def test_free_form_json_takes_any_json_value(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    """Payloads, results and errors are the caller's data: any JSON value,
    the literal null included, is accepted (SQL NULL is not: see above)."""
    base = base_calls(world)[function]
    for value in SAMPLES.values():
        db.execute("BEGIN")
        try:
            call(db, function, **{**base, parameter: value})
        finally:
            db.execute("ROLLBACK")
    _json_null_call(db, function, base, parameter)


def test_nul_characters_are_refused_and_write_nothing(db: psycopg.Connection, world: World) -> None:
    """PostgreSQL text cannot hold NUL: psycopg refuses it in a text argument
    before sending, and the server refuses \\u0000 inside JSON (22P05)."""
    before = table_checksum(db)
    with pytest.raises(psycopg.DataError):
        call(db, "enqueue_run", run_id="nul\x00id")
    with pytest.raises(psycopg.DataError):
        call(db, "signal_run", run_id="w", name="a\x00")
    for thunk in (
        lambda: call(db, "enqueue_run", run_id="nul", payload={"a": "x\x00y"}),
        lambda: call(db, "enqueue_run", run_id="nul", payload={"k\x00": 1}),
        lambda: call(db, "append_events", run_id="l", events=[{"type": "t\x00"}]),
        lambda: call(db, "complete_attempt", **fenced(world["claim"]), result={"r": "\x00"}),
    ):
        with pytest.raises(psycopg.Error) as exc:
            thunk()
        assert exc.value.sqlstate == "22P05", exc.value
    assert table_checksum(db) == before
    assert db.execute("SELECT 1").fetchone() == (1,)


def test_json_nested_ten_thousand_deep(db: psycopg.Connection, world: World) -> None:
    """Depth 10 000 either is refused cleanly or is stored intact; the server
    survives either way."""
    deep = "[" * 10_000 + "]" * 10_000
    cases = [
        (
            "enqueue_run",
            "payload",
            "SELECT * FROM runrelay.enqueue_run(run_id => 'deep', payload => %s::jsonb)",
        ),
        ("signal_run", "payload", "SELECT runrelay.signal_run('w', 'deep', %s::jsonb)"),
        (
            "append_events",
            "events",
            "SELECT * FROM runrelay.append_events('l', jsonb_build_array("
            "jsonb_build_object('type', 'deep', 'payload', %s::jsonb)))",
        ),
        ("suspend_attempt", "wait", "SELECT runrelay.suspend_attempt('w', 1, %s, %s::jsonb)"),
    ]
    for function, parameter, query in cases:
        params: list[Any] = [deep]
        if function == "suspend_attempt":
            params = [world["token"], '{"kind": "sleep", "until": "2100-01-01", "x": ' + deep + "}"]
        before = table_checksum(db)
        try:
            db.execute(query, params).fetchall()
        except psycopg.Error as exc:
            assert exc.sqlstate in {"22023", "54000", "54001"}, (function, exc)
            if exc.sqlstate != "54001":
                assert exc.diag.column_name == parameter
            assert table_checksum(db) == before
        else:
            assert function != "suspend_attempt", "an unknown wait field was accepted"
        assert db.execute("SELECT 1").fetchone() == (1,)
    stored = db.execute(
        "SELECT octet_length(payload::text) FROM runrelay.runs WHERE run_id = 'deep'"
    ).fetchone()
    assert stored in (None, (20_000,))


def test_an_object_with_a_million_keys(db: psycopg.Connection) -> None:
    """Built server-side (18 MB of text): refused as oversized, nothing kept."""
    query = (
        "SELECT * FROM runrelay.enqueue_run(run_id => 'wide', payload =>"
        " (SELECT jsonb_object_agg(i::text, 0) FROM generate_series(1, 1000000) AS i))"
    )
    assert_rejected(db, lambda: db.execute(query).fetchall(), "54000", "payload")


CAP = 4096


def _padded(
    db: psycopg.Connection, template: Callable[[str], Any], size: int, char: str = "y"
) -> Any:
    """template(pad) whose jsonb text is exactly `size` bytes, the pad made
    of `char` (topped up with single-byte characters)."""
    from psycopg.types.json import Jsonb

    row = db.execute("SELECT octet_length(%s::jsonb::text)", [Jsonb(template(""))]).fetchone()
    assert row is not None
    width = len(char.encode())
    value = template(char * ((size - row[0]) // width) + "y" * ((size - row[0]) % width))
    check = db.execute("SELECT octet_length(%s::jsonb::text)", [Jsonb(value)]).fetchone()
    assert check == (size,)
    return value


def _capped_calls(
    w: World,
) -> list[tuple[str, str, Callable[[str], Any], Callable[[Any], dict[str, Any]]]]:
    fence = fenced(w["claim"])
    return [
        ("enqueue_run", "payload", lambda p: {"p": p}, lambda v: {"run_id": "cap", "payload": v}),
        (
            "signal_run",
            "payload",
            lambda p: {"p": p},
            lambda v: {"run_id": "w", "name": "n", "payload": v},
        ),
        ("complete_attempt", "result", lambda p: {"p": p}, lambda v: {**fence, "result": v}),
        ("fail_attempt", "error", lambda p: {"p": p}, lambda v: {**fence, "error": v}),
        (
            "record_runner_terminal",
            "result",
            lambda p: {"p": p},
            lambda v: {"run_id": "w", "attempt": 1, "result": v},
        ),
        (
            "fail_ledger",
            "error",
            lambda p: {"p": p},
            lambda v: {"relay": "r1", "event_ids": [w["leased"]], "error": v},
        ),
        (
            "append_events",
            "events",
            lambda p: [{"type": "t", "payload": p}],
            lambda v: {"run_id": "l", "events": v},
        ),
        (
            "complete_attempt",
            "final_events",
            lambda p: [{"type": "t", "payload": p}],
            lambda v: {**fence, "final_events": v},
        ),
        (
            "complete_attempts",
            "items",
            lambda p: [{**{k: str(x) for k, x in fence.items()}, "attempt": 1, "result": {"p": p}}],
            lambda v: {"items": v},
        ),
    ]


def test_payload_exactly_at_the_cap_and_one_byte_over(db: psycopg.Connection, world: World) -> None:
    """The cap counts bytes of the JSON text: exactly max_payload_bytes is
    accepted, one byte more is 54000, also when the extra byte comes from a
    multi-byte character."""
    db.execute("UPDATE runrelay.settings SET max_payload_bytes = %s", [CAP])
    for function, parameter, template, kwargs in _capped_calls(world):
        at_cap = _padded(db, template, CAP)
        db.execute("BEGIN")
        try:
            call(db, function, **kwargs(at_cap))
        finally:
            db.execute("ROLLBACK")
        over = _padded(db, template, CAP + 1)
        assert_rejected(db, caller(db, function, kwargs(over)), "54000", parameter)
        # 3-byte characters: fewer characters than CAP, more bytes.
        over_bytes = _padded(db, template, CAP + 1, "€")
        assert len(repr(over_bytes)) < CAP
        assert_rejected(db, caller(db, function, kwargs(over_bytes)), "54000", parameter)
    stored = call(db, "enqueue_run", run_id="cap", payload=_padded(db, lambda p: {"p": p}, CAP))
    assert stored[0]["created"] is True


def test_ten_megabytes_everywhere(db: psycopg.Connection, world: World) -> None:
    """At the default cap (1 MiB) a 10 MB value is 54000 in every JSON
    parameter, the wait included, and quickly."""
    pad = "z" * (10 * 1024 * 1024)
    cases = [(f, p, k) for f, p, _, k in _capped_calls(world)]
    cases.append(
        (
            "suspend_attempt",
            "wait",
            lambda v: {
                **fenced(world["claim"]),
                "wait": {"kind": "sleep", "until": "2100-01-01", "x": v},
            },
        )
    )
    for function, parameter, kwargs in cases:
        started = time.monotonic()
        value: Any = pad if function == "suspend_attempt" else {"p": pad}
        if parameter in ("events", "final_events"):
            value = [{"type": "t", "payload": {"p": pad}}]
        if parameter == "items":
            fence = fenced(world["claim"])
            value = [
                {
                    "run_id": "w",
                    "attempt": 1,
                    "lease_token": str(fence["lease_token"]),
                    "result": {"p": pad},
                }
            ]
        assert_rejected(db, caller(db, function, kwargs(value)), "54000", parameter)
        assert time.monotonic() - started < 10


# --------------------------------------------------------------------------
# Lease tokens: every wrong one gets the same answer.

FENCED_CALLS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "heartbeat": lambda f: f,
    "complete_attempt": lambda f: {**f, "result": {"stolen": True}},
    "fail_attempt": lambda f: {**f, "error": {"stolen": True}},
    "suspend_attempt": lambda f: {**f, "wait": {"kind": "sleep", "until": "2100-01-01T00:00:00Z"}},
    "release_attempt": lambda f: {**f, "reason": "stolen"},
    "complete_attempts": lambda f: {
        "items": [
            {"run_id": f["run_id"], "attempt": f["attempt"], "lease_token": str(f["lease_token"])}
        ]
    },
    "claim_detached_terminal": lambda f: f,
}


def test_wrong_lease_tokens_are_refused_alike(db: psycopg.Connection) -> None:
    """Random, foreign (another run's live token), previous-attempt (the
    token of attempt 1 after attempt 2 was claimed, presented as either
    attempt), expired-and-reaped, and a run that does not exist: every
    fenced write answers fence_lost (false for claim_detached_terminal) with
    the same shape, so an answer reveals nothing about which part was wrong;
    nothing changes. (SPEC: an expired lease that is not yet reaped still
    passes the fence; reaping ends it.)"""
    enqueue(db, "target", queue="t", max_attempts=5)
    first = claim_one(db, queues=["t"], lease_seconds=5)
    enqueue(db, "expired", queue="e", max_attempts=1)
    expired = claim_one(db, queues=["e"], lease_seconds=5)
    with db.transaction():
        db.execute("SET LOCAL runrelay.clock_offset = '1 minute'")
        reaped = call(db, "reap_expired")
    assert sorted((r["run_id"], r["outcome"]) for r in reaped) == [
        ("expired", "failed"),
        ("target", "retry_scheduled"),
    ]
    with db.transaction():
        # Past the retry backoff; the new lease runs on from there.
        db.execute("SET LOCAL runrelay.clock_offset = '1 hour'")
        current = claim_one(db, queues=["t"], lease_seconds=300)
    assert current["attempt"] == 2
    enqueue(db, "other", queue="o")
    other = claim_one(db, queues=["o"], lease_seconds=300)

    target = {"run_id": "target", "attempt": 2}
    credentials = {
        "random": {**target, "lease_token": uuid.uuid4()},
        "foreign": {**target, "lease_token": other["lease_token"]},
        "previous token, current attempt": {**target, "lease_token": first["lease_token"]},
        "previous attempt": fenced(first),
        "current token, wrong attempt": {
            **target,
            "attempt": 3,
            "lease_token": current["lease_token"],
        },
        "current token, other run": {**fenced(current), "run_id": "other"},
        "expired and reaped": fenced(expired),
        "no such run": {"run_id": "ghost", "attempt": 1, "lease_token": uuid.uuid4()},
    }
    before = table_checksum(db)
    for function, make in FENCED_CALLS.items():
        answers = {}
        for label, credential in credentials.items():
            rows = call(db, function, **make(credential))
            for row in rows:
                row.pop("run_id", None)
                row.pop("attempt", None)
            answers[label] = rows
        distinct = {repr(a) for a in answers.values()}
        assert len(distinct) == 1, (function, answers)
        expected = {
            "heartbeat": [{"outcome": "fence_lost", "lease_expires_at": None}],
            "complete_attempts": [{"outcome": "fence_lost"}],
            "claim_detached_terminal": [{"claim_detached_terminal": False}],
        }.get(function, [{function: "fence_lost"}])
        assert answers["random"] == expected, (function, answers["random"])
    assert table_checksum(db) == before
    # The right credentials still work afterwards.
    assert call(db, "heartbeat", **fenced(current))[0]["outcome"] == "ok"


# --------------------------------------------------------------------------
# Batches: 0, 1, max, max + 1, duplicates.


def test_complete_attempts_batch_sizes(db: psycopg.Connection) -> None:
    before = table_checksum(db)
    assert call(db, "complete_attempts", items=[]) == []
    assert table_checksum(db) == before
    enqueue(db, "b1", queue="b")
    live = claim_one(db, queues=["b"])
    item = {"run_id": "b1", "attempt": 1, "lease_token": str(live["lease_token"])}
    ghosts = [
        {"run_id": f"ghost-{i}", "attempt": 1, "lease_token": str(uuid.uuid4())} for i in range(999)
    ]
    assert_rejected(
        db,
        lambda: call(db, "complete_attempts", items=[item, *ghosts, {**ghosts[0], "run_id": "x"}]),
        "22023",
        "items",
    )
    for duplicate in (
        [item, item],
        [item, {**item, "attempt": 2}],
        [item, {**item, "lease_token": str(uuid.uuid4())}],
    ):
        assert_rejected(
            db, lambda d=duplicate: call(db, "complete_attempts", items=d), "22023", "items"
        )
    rows = call(db, "complete_attempts", items=[item, *ghosts])
    assert len(rows) == 1000
    outcomes = {r["run_id"]: r["outcome"] for r in rows}
    assert outcomes.pop("b1") == "completed"
    assert set(outcomes.values()) == {"fence_lost"}
    enqueue(db, "b2", queue="b")
    single = claim_one(db, queues=["b"])
    one = {"run_id": "b2", "attempt": 1, "lease_token": str(single["lease_token"])}
    assert call(db, "complete_attempts", items=[one]) == [
        {"run_id": "b2", "attempt": 1, "outcome": "completed"}
    ]


def test_append_events_batch_sizes(db: psycopg.Connection) -> None:
    enqueue(db, "ev")
    before = table_checksum(db)
    assert call(db, "append_events", run_id="ev", events=[]) == []
    assert table_checksum(db) == before
    assert_rejected(
        db,
        lambda: call(db, "append_events", run_id="ev", events=[{"type": "x"}] * 1001),
        "22023",
        "events",
    )
    assert_rejected(
        db,
        lambda: call(
            db,
            "append_events",
            run_id="ev",
            events=[{"type": "x", "delivery_key": "dup"}, {"type": "y", "delivery_key": "dup"}],
        ),
        "22023",
        "events",
    )
    one = call(db, "append_events", run_id="ev", events=[{"type": "one"}])
    assert len(one) == 1
    # Identical events without keys are distinct events, in order.
    many = call(db, "append_events", run_id="ev", events=[{"type": "same"}] * 1000)
    seqs = [r["seq"] for r in many]
    assert len(many) == 1000 and seqs == sorted(set(seqs)) and seqs[0] > one[0]["seq"]
    assert_rejected(
        db,
        lambda: call(
            db,
            "append_events",
            run_id="ev",
            events=[{"type": "again", "delivery_key": "ev-key"}] * 2,
        ),
        "22023",
        "events",
    )


EVENT_ID_FUNCTIONS: dict[str, Callable[[list[int]], dict[str, Any]]] = {
    "ack_ledger": lambda ids: {"relay": "r1", "run_id": "l", "event_ids": ids},
    "renew_ledger_lease": lambda ids: {"relay": "r1", "event_ids": ids},
    "release_ledger": lambda ids: {"relay": "r1", "event_ids": ids},
    "fail_ledger": lambda ids: {"relay": "r1", "event_ids": ids, "error": {}},
}


@pytest.mark.parametrize("function", list(EVENT_ID_FUNCTIONS))
def test_event_id_batch_sizes(db: psycopg.Connection, world: World, function: str) -> None:
    make = EVENT_ID_FUNCTIONS[function]
    before = table_checksum(db)
    empty = call(db, function, **make([]))
    assert empty in ([], [{"release_ledger": 0}])
    assert table_checksum(db) == before
    assert_rejected(
        db, lambda: call(db, function, **make(list(range(1, 10_002)))), "22023", "event_ids"
    )
    with_null: list[Any] = [world["leased"], None]
    assert_rejected(db, lambda: call(db, function, **make(with_null)), "22023", "event_ids")
    # 10 000 ids (the maximum) of which one is real, and that one twice:
    # applied once.
    ids = [world["leased"], world["leased"], *range(-9_998, 0)]
    rows = call(db, function, **make(ids))
    state = db.execute(
        "SELECT state, delivery_attempts FROM runrelay.ledger WHERE event_id = %s",
        [world["leased"]],
    ).fetchone()
    expected_state = {
        "ack_ledger": ("delivered", 0),
        "renew_ledger_lease": ("leased", 0),
        "release_ledger": ("pending", 0),
        "fail_ledger": ("pending", 1),
    }[function]
    assert state == expected_state
    if function == "release_ledger":
        assert rows == [{"release_ledger": 1}]
    else:
        assert [r["event_id"] for r in rows if r.get("kind", "delivered") == "delivered"] == [
            world["leased"]
        ]


@pytest.mark.parametrize("function", list(EVENT_ID_FUNCTIONS))
def test_event_ids_of_more_than_one_dimension_are_bad_input(
    db: psycopg.Connection, world: World, function: str
) -> None:
    """bigint[] admits {{1,2},{3,4}}: it must be refused as 22023 naming
    event_ids like any other malformed list, not fail on an internal
    array_position call (0A000)."""
    multi = sql.SQL(
        "SELECT * FROM runrelay.{}(relay => 'r1', {}event_ids => '{{{{1,2}},{{3,4}}}}'::bigint[]{})"
    ).format(
        sql.Identifier(function),
        sql.SQL("run_id => 'l', " if function == "ack_ledger" else ""),
        sql.SQL(", error => '{}'::jsonb" if function == "fail_ledger" else ""),
    )
    assert_rejected(db, lambda: db.execute(multi).fetchall(), "22023", "event_ids")


# --------------------------------------------------------------------------
# A flood of oversized submissions beside normal traffic.

FLOOD = 100
TEN_MB_JSON = '{"blob": "' + "f" * (10 * 1024 * 1024) + '"}'


def test_oversized_flood_is_refused_while_normal_traffic_continues(
    db: psycopg.Connection, db_url: str
) -> None:
    opened = [psycopg.connect(db_url, autocommit=True) for _ in range(FLOOD)]
    outcomes: list[str | None] = [None] * FLOOD
    gate = threading.Barrier(FLOOD + 1)
    done = threading.Event()

    def submit(i: int) -> None:
        conn = opened[i]
        gate.wait()
        try:
            if i % 3 == 0:
                conn.execute(
                    "SELECT runrelay.signal_run('flood-target', 'n', %s::jsonb)", [TEN_MB_JSON]
                )
            else:
                conn.execute(
                    "SELECT * FROM runrelay.enqueue_run(run_id => %s, payload => %s::jsonb)",
                    [f"flood-{i}", TEN_MB_JSON],
                )
            outcomes[i] = "accepted"
        except psycopg.Error as exc:
            outcomes[i] = exc.sqlstate

    normal_ops = 0
    normal_errors: list[BaseException] = []

    def normal_loop() -> None:
        nonlocal normal_ops
        conn = psycopg.connect(db_url, autocommit=True)
        try:
            i = 0
            while not done.is_set() or normal_ops < 3:
                run = f"steady-{i}"
                enqueue(conn, run, queue="steady")
                claim = claim_one(conn, queues=["steady"])
                assert call(conn, "complete_attempt", **fenced(claim)) == [
                    {"complete_attempt": "completed"}
                ]
                normal_ops += 1
                i += 1
        except BaseException as exc:  # reported by the test thread
            normal_errors.append(exc)
        finally:
            conn.close()

    enqueue(db, "flood-target")
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(FLOOD)]
    for t in threads:
        t.start()
    steady = threading.Thread(target=normal_loop)
    steady.start()
    started = time.monotonic()
    gate.wait()
    try:
        for t in threads:
            t.join(timeout=120)
        flood_seconds = time.monotonic() - started
        ops_during_flood = normal_ops
    finally:
        done.set()
        steady.join(timeout=60)
        for c in opened:
            c.close()
    assert normal_errors == []
    assert outcomes == ["54000"] * FLOOD
    assert flood_seconds < 90
    assert ops_during_flood >= 3, (
        f"only {ops_during_flood} normal cycles during a {flood_seconds:.1f}s flood"
    )
    flooded = db.execute(
        "SELECT count(*) FROM runrelay.runs"
        " WHERE run_id LIKE 'flood-%%' AND run_id <> 'flood-target'"
    ).fetchone()
    assert flooded == (0,)
    assert db.execute("SELECT count(*) FROM runrelay.signals").fetchone() == (0,)
    assert db.execute("SELECT 1").fetchone() == (1,)


# --------------------------------------------------------------------------
# Input rules: identifiers, reserved namespaces, the batch cap, quoted values.

CONTROL = ["\x01", "a\x1b[2Jb", "bell\x07", "del\x7f", "nel\u0085", "\u009b31m", "tab\there"]
UNICODE_BLANK = ["\u00a0", " \u00a0 ", "\u3000", "\u2003\u2009", "\u200b", "\ufeff", "\u202f"]


def _printable(text: str) -> bool:
    return not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


@pytest.mark.parametrize(("function", "parameter"), [*IDENTIFIERS, ("upsert_schedule", "name")])
def test_identifiers_refuse_control_characters_and_unicode_blanks(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    """A name with an escape sequence would rewrite an operator's terminal
    when listed; a name of only NBSP or ideographic spaces looks empty. Both
    are bad input, and the error shows the value escaped."""
    base = base_calls(world)[function]
    for value in [*CONTROL, *UNICODE_BLANK]:
        kwargs = {**base, parameter: value}
        err = assert_rejected(db, lambda kw=kwargs: call(db, function, **kw), "22023", parameter)
        assert _printable(err.diag.message_primary or ""), err


def test_identifiers_nested_in_json_refuse_control_characters(
    db: psycopg.Connection, world: World
) -> None:
    token = str(world["token"])
    for value in ["a\x1b[2Jb", "\u00a0\u3000"]:
        assert_rejected(
            db,
            lambda v=value: call(
                db, "complete_attempts", items=[{"run_id": v, "attempt": 1, "lease_token": token}]
            ),
            "22023",
            "items",
        )
        assert_rejected(
            db,
            lambda v=value: call(
                db, "suspend_attempt", **fenced(world["claim"]), wait={"kind": "event", "name": v}
            ),
            "22023",
            "wait",
        )
        assert_rejected(
            db,
            lambda v=value: call(db, "append_events", run_id="l", events=[{"type": v}]),
            "22023",
            "events",
        )
        assert_rejected(
            db,
            lambda v=value: call(db, "claim_attempts", worker="w", queues=[v]),
            "22023",
            "queues",
        )
        assert_rejected(
            db,
            lambda v=value: call(db, "enqueue_runs", items=[{"run_id": "ok"}, {"run_id": v}]),
            "22023",
            "items[1].run_id",
        )
        assert_rejected(
            db,
            lambda v=value: call(db, "enqueue_runs", items=[{"run_id": "ok", "queue": v}]),
            "22023",
            "items[0].queue",
        )


def test_non_ascii_identifiers_are_accepted(db: psycopg.Connection) -> None:
    client = Client(db)
    for run_id, queue, key in [("café", "キュー", "clé"), ("注文-1", "очередь", "ключ-1")]:
        assert client.enqueue_run(run_id, queue=queue, concurrency_key=key).created
        claimed = client.claim_attempts("работник-1", queues=[queue])
        assert [c.run_id for c in claimed] == [run_id]
        client.append_events(run_id, [{"type": "заказ.создан"}])
    assert [r.created for r in client.enqueue_runs([{"run_id": "naïve-ü", "queue": "ß"}])] == [True]


def test_producers_cannot_forge_lifecycle_events(db: psycopg.Connection, world: World) -> None:
    """The run. event types are the engine's: a producer appending
    run.completed to a running run would tell every consumer it ended."""
    client = Client(db)
    for event_type in ["run.completed", "run.failed", "run.queued", "run.custom"]:
        before = table_checksum(db)
        with pytest.raises(InvalidArgument) as exc:
            client.append_events("w", [{"type": "ok"}, {"type": event_type}])
        assert exc.value.parameter == "events"
        assert event_type in exc.value.message
        assert table_checksum(db) == before
    # Only the run. prefix is reserved.
    appended = client.append_events(
        "l", [{"type": t} for t in ["runner.started", "Run.x", "rundown"]]
    )
    assert len(appended) == 3


def test_workers_cannot_forge_lifecycle_events(db: psycopg.Connection, world: World) -> None:
    """final_events follow the producers' rule: a worker cannot put a
    run.completed ahead of the real terminal event."""
    client = Client(db)
    claim = world["claim"]
    forged = [{"type": "run.completed"}]
    before = table_checksum(db)
    with pytest.raises(InvalidArgument) as exc:
        client.complete_attempt(
            "w", claim["attempt"], claim["lease_token"], result={}, final_events=forged
        )
    assert exc.value.parameter == "final_events"
    assert table_checksum(db) == before
    fence = {**fenced(claim)}
    assert_rejected(
        db,
        lambda: call(db, "fail_attempt", **fence, error={}, final_events=forged),
        "22023",
        "final_events",
    )
    assert_rejected(
        db,
        lambda: call(
            db,
            "suspend_attempt",
            **fence,
            wait={"kind": "sleep", "until": "2100-01-01T00:00:00Z"},
            final_events=forged,
        ),
        "22023",
        "final_events",
    )
    item = {**fence, "lease_token": str(fence["lease_token"]), "final_events": forged}
    assert_rejected(db, lambda: call(db, "complete_attempts", items=[item]), "22023", "items")
    assert_rejected(
        db,
        lambda: call(db, "settle_and_claim", worker="w", items=[{"op": "complete", **item}]),
        "22023",
        "items",
    )
    assert call(db, "get_run", run_id="w")[0]["status"] == "running"


def test_schedule_run_ids_are_reserved_for_schedules(db: psycopg.Connection) -> None:
    """A producer enqueueing schedule:<name>:<slot> first would take the
    slot's run id, and the slot would never run."""
    client = Client(db)
    slot = "schedule:nightly:2030-01-01T02:00:00Z"
    before = table_checksum(db)
    with pytest.raises(InvalidArgument) as exc:
        client.enqueue_run(slot)
    assert exc.value.parameter == "run_id"
    with pytest.raises(InvalidArgument) as exc:
        client.enqueue_runs([{"run_id": "fine"}, {"run_id": "schedule:x"}])
    assert exc.value.parameter == "items[1].run_id"
    assert table_checksum(db) == before
    # Not the namespace: another letter case, or schedule without the colon.
    for run_id in ["Schedule:x", "schedules:x", "my-schedule:x"]:
        assert client.enqueue_run(run_id).created


def test_enqueue_runs_is_capped_as_a_whole(db: psycopg.Connection) -> None:
    """Every payload under the cap, the items together over it: 54000 naming
    items, nothing written."""
    db.execute("UPDATE runrelay.settings SET max_payload_bytes = 4096")
    client = Client(db)
    items = [{"run_id": f"big-{i}", "payload": {"p": "x" * 1000}} for i in range(5)]
    before = table_checksum(db)
    with pytest.raises(PayloadTooLarge) as exc:
        client.enqueue_runs(items)
    assert exc.value.parameter == "items"
    assert table_checksum(db) == before
    assert [r.created for r in client.enqueue_runs(items[:3])] == [True] * 3


@pytest.mark.parametrize(
    ("function", "parameter"),
    [
        ("enqueue_run", "payload_retention"),
        ("claim_ledger", "lane"),
        ("list_runs", "status"),
        ("list_blocked_heads", "after_lane"),
        ("upsert_schedule", "missed"),
    ],
)
def test_errors_quote_a_short_escaped_prefix_of_a_rejected_value(
    db: psycopg.Connection, world: World, function: str, parameter: str
) -> None:
    """A megabyte value is not echoed whole to the caller and the server log."""
    value = "\x1b[31m" + "v" * 1_000_000
    kwargs = {**base_calls(world)[function], parameter: value}
    err = assert_rejected(db, caller(db, function, kwargs), "22023", parameter)
    message = err.diag.message_primary or ""
    assert len(message) < 400, message[:500]
    assert _printable(message), message
    assert "\\x1b[31m" in message and "1000005 characters" in message, message


def test_nested_values_in_errors_are_quoted_short(db: psycopg.Connection, world: World) -> None:
    long = "k\x1b" + "k" * 100_000
    checks: list[tuple[Callable[[], Any], str]] = [
        (
            lambda: call(db, "append_events", run_id="l", events=[{"type": "t", "lane": long}]),
            "events",
        ),
        (
            lambda: call(db, "append_events", run_id=long[:200].replace("\x1b", "k"), events=[]),
            "run_id",
        ),
        (lambda: call(db, "settle_and_claim", worker="w", items=[{"op": long}]), "items"),
        (
            lambda: call(
                db,
                "settle_and_claim",
                worker="w",
                items=[
                    {
                        "op": "release",
                        **fenced(world["claim"]),
                        "lease_token": str(world["token"]),
                        "run_at": long,
                    }
                ],
            ),
            "items",
        ),
        (
            lambda: call(db, "enqueue_runs", items=[{"run_id": "a", "run_at": long}]),
            "items[0].run_at",
        ),
        (
            lambda: call(db, "enqueue_runs", items=[{"run_id": "a", "priority": int("9" * 4000)}]),
            "items[0].priority",
        ),
        (
            lambda: call(
                db,
                "upsert_schedule",
                **{**base_calls(world)["upsert_schedule"], "time_zone": long[:150]},
            ),
            "time_zone",
        ),
    ]
    for thunk, parameter in checks:
        err = assert_rejected(db, thunk, "22023", parameter)
        message = err.diag.message_primary or ""
        assert len(message) < 400 and _printable(message), message[:500]
