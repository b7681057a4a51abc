"""Replays are exact: a call repeated after its reply was lost answers what the
first one recorded and has no second effect; a rolled-back call repeated does
the work afresh. Each test discards the first reply on purpose."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from faults import TcpProxy, backend_of, wait_for
from runrelay import AsyncClient, Client, InvalidArgument
from sqlapi import (
    backend_pid,
    call,
    claim_one,
    enqueue,
    events,
    fenced,
    run_row,
    scalar,
    table_checksum,
    wait_until_blocked,
)

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


# --------------------------------------------------------------------------
# signal_run and cancel_run: the call_id names the call.
# --------------------------------------------------------------------------
def _count(db: psycopg.Connection, query: str, *params: Any) -> int:
    row = db.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def _signals(db: psycopg.Connection, run_id: str = "r1") -> int:
    return _count(db, "SELECT count(*) FROM runrelay.signals WHERE run_id = %s", run_id)


def _waiting_for_go(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    assert scalar(db, "suspend_attempt", **fenced(claim), wait={"kind": "event", "name": "go"}) == (
        "waiting"
    )


def _running(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim_one(db)


def _failed(db: psycopg.Connection) -> None:
    enqueue(db, "r1", max_attempts=1)
    claim = claim_one(db)
    assert scalar(db, "fail_attempt", **fenced(claim), error={"e": 1}) == "failed"


def _hold_run_row(db: psycopg.Connection, connect: Connect) -> psycopg.Connection:
    """A writer in custody of r1: its row locked in an open transaction."""
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM runrelay.runs WHERE run_id = 'r1' FOR NO KEY UPDATE")
    return holder


@pytest.mark.parametrize(
    ("function", "setup", "kwargs", "expected", "effect"),
    [
        ("signal_run", _waiting_for_go, {"name": "go", "payload": {"v": 1}}, "resumed",
         lambda db: events(db, "r1").count("run.resumed") == 1 and _signals(db) == 0),
        ("signal_run", _running, {"name": "go", "payload": {"v": 1}}, "stored",
         lambda db: _signals(db) == 1),
        ("cancel_run", lambda db: enqueue(db, "r1"), {"reason": "stop"}, "cancelled",
         lambda db: events(db, "r1").count("run.cancelled") == 1),
        ("cancel_run", _running, {"reason": "stop"}, "cancel_requested",
         lambda db: run_row(db, "r1")["status"] == "running"),
        ("retry_run", _failed, {"reason": "fixed", "requested_by": "ops"}, "retried",
         lambda db: events(db, "r1").count("run.retried") == 1
         and run_row(db, "r1")["status"] == "queued"),
    ],
    ids=[
        "signal-resumed", "signal-stored", "cancel-cancelled", "cancel-requested", "retry-retried",
    ],
)  # fmt: skip
def test_replay_after_a_lost_reply_answers_the_first_outcome_and_writes_nothing(
    db: psycopg.Connection,
    db_url: str,
    connect: Connect,
    function: str,
    setup: Callable[[psycopg.Connection], Any],
    kwargs: dict[str, Any],
    expected: str,
    effect: Callable[[psycopg.Connection], bool],
) -> None:
    """The reply of a committed signal_run/cancel_run/retry_run is swallowed by a proxy
    (the client sees a lost connection); the client repeats the call with the
    same call_id: the repeat answers what the first call did and writes
    nothing - no second signal, no second event, no timestamp moved."""
    setup(db)
    holder = _hold_run_row(db, connect) if expected == "cancel_requested" else None
    proxy = TcpProxy(db_url)
    args = {"run_id": "r1", **kwargs, "call_id": uuid.uuid4()}
    try:
        lost = Client(proxy.url("lost-reply"), prepare_threshold=None)
        rule = proxy.arm("drop_reply_after_commit", f'"{function}"('.encode())
        with pytest.raises(psycopg.OperationalError):
            getattr(lost, function)(**args)
        assert rule.exchange is not None and rule.exchange.committed, rule.exchange
        assert rule.exchange.raw()["rows"] == [[expected]]  # what the lost reply said
        lost.close()
    finally:
        proxy.close()
    wait_for(lambda: backend_of(db, "lost-reply") is None, 30, "the cut backend's exit")
    if holder is not None:
        holder.rollback()  # the writer is gone: a repeat without call_id would apply the marker
    assert effect(db)
    before = table_checksum(db)
    with Client(db_url) as client:
        assert getattr(client, function)(**args) == expected
        assert getattr(client, function)(**args) == expected
    assert table_checksum(db) == before, "the repeat wrote something"
    assert effect(db)


class _SendsEachCallTwice(Client):
    """A client that sends every call a second time with the same values, as
    a retry after a lost reply does."""

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
        super()._call(function, values, conn)
        return super()._call(function, values, conn)


def test_the_client_names_each_call_so_its_repeats_are_exact(
    db: psycopg.Connection, db_url: str
) -> None:
    """Without a call_id argument the client sends a fresh uuid per call:
    two calls are two signals, but one call sent twice is one signal, and a
    cancel sent twice answers cancelled both times."""
    _running(db)
    with Client(db_url) as client:
        assert client.signal_run("r1", "go") == "stored"
        assert client.signal_run("r1", "go") == "stored"
    assert _signals(db) == 2
    assert _count(db, "SELECT count(DISTINCT call_id) FROM runrelay.calls") == 2
    with _SendsEachCallTwice(db_url) as twice:
        assert twice.signal_run("r1", "go", {"n": 3}) == "stored"
        assert _signals(db) == 3
        enqueue(db, "r2")
        assert twice.cancel_run("r2", "stop") == "cancelled"
    assert events(db, "r2").count("run.cancelled") == 1

    async def through_async_client() -> Any:
        async with AsyncClient(db_url) as aclient:
            return await aclient.signal_run("r1", "go")

    assert asyncio.run(through_async_client()) == "stored"
    assert _count(db, "SELECT count(DISTINCT call_id) FROM runrelay.calls") == 5


def test_a_call_id_reused_for_another_call_is_refused_and_changes_nothing(
    db: psycopg.Connection, db_url: str
) -> None:
    _running(db)
    enqueue(db, "r2")
    signal, cancel = uuid.uuid4(), uuid.uuid4()
    with Client(db_url) as client:
        assert client.signal_run("r1", "go", {"v": 1}, call_id=signal) == "stored"
        assert client.cancel_run("r2", "stop", call_id=cancel) == "cancelled"
        before = table_checksum(db)
        for function, args in (
            ("signal_run", ("r1", "go", {"v": 2}, signal)),  # another payload
            ("signal_run", ("r1", "went", {"v": 1}, signal)),  # another name
            ("signal_run", ("r2", "go", {"v": 1}, signal)),  # another run
            ("cancel_run", ("r1", None, signal)),  # another function
            ("cancel_run", ("r2", "other", cancel)),  # another reason
            ("cancel_run", ("r2", None, cancel)),  # no reason is another reason
            ("cancel_run", ("r1", "stop", cancel)),
            ("signal_run", ("r2", "go", None, cancel)),
        ):
            with pytest.raises(InvalidArgument) as exc:
                getattr(client, function)(*args)
            assert exc.value.parameter == "call_id", (function, args)
            assert str(args[-1]) in exc.value.message
            assert exc.value.hint
        assert table_checksum(db) == before


@pytest.mark.parametrize("first_commits", [True, False], ids=["commits", "rolls-back"])
@pytest.mark.parametrize("function", ["signal_run", "cancel_run"])
def test_a_repeat_while_the_first_call_is_in_flight_waits_for_its_outcome(
    db: psycopg.Connection, connect: Connect, function: str, first_commits: bool
) -> None:
    """The client gave up on a slow reply and repeats the call while the first
    is still in its transaction: the repeat waits on the call_id's lock (its
    insert into call_locks waits for the first call's transaction, seen in
    pg_locks), then answers what the first call committed - or, if it
    rolled back, does the work itself. Either way the effect happens once."""
    if function == "signal_run":
        _waiting_for_go(db)
        args, expected, effect = {"name": "go", "payload": {"v": 1}}, "resumed", "run.resumed"
    else:
        enqueue(db, "r1")
        args, expected, effect = {"reason": "stop"}, "cancelled", "run.cancelled"
    args = {"run_id": "r1", **args, "call_id": uuid.uuid4()}
    first = connect(autocommit=False)
    assert scalar(first, function, **args) == expected
    committed_run = run_row(first, "r1")  # as the first call left it
    second = connect()
    out: list[Any] = []

    def repeat() -> None:
        try:
            out.append(scalar(second, function, **args))
        except psycopg.Error as exc:
            out.append(exc)

    thread = threading.Thread(target=repeat)
    thread.start()
    wait_until_blocked(db, backend_pid(second))
    waiting = db.execute(
        "SELECT locktype FROM pg_locks WHERE pid = %s AND NOT granted", [backend_pid(second)]
    ).fetchall()
    assert waiting == [("transactionid",)]
    if first_commits:
        first.commit()
    else:
        first.rollback()
    thread.join(30)
    assert out == [expected]
    assert events(db, "r1").count(effect) == 1
    assert _count(db, "SELECT count(*) FROM runrelay.calls") == 1
    assert _signals(db) == 0
    if first_commits:
        assert run_row(db, "r1") == committed_run, "the repeat changed the run"
