"""Lane locks: one order for every call that locks several ledger lanes, and
appenders that never hold up delivery.

Races use real sessions. A barrier session holds a lane row lock in an open
transaction; the competitors are started one after the other, each confirmed
waiting (pg_locks) before the next starts, then the barrier lets go. Where
the old code deadlocked, PostgreSQL's deadlock detector answers 40P01; where
it blocked a relay, the relay's lock_timeout answers 55P03.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import alembic, drop_database, url_for
from sqlapi import backend_pid, call, claim_one, enqueue, fenced, in_thread, scalar

Connect = Callable[..., psycopg.Connection]


def _waiting(observer: psycopg.Connection, pid: int) -> bool:
    row = observer.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)", [pid]
    ).fetchone()
    return bool(row and row[0])


def _wait_until_waiting(observer: psycopg.Connection, pid: int, future: Future[Any]) -> bool:
    """Poll pg_locks until backend `pid` waits for a lock (True) or its call
    has returned without ever waiting (False)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _waiting(observer, pid):
            return True
        if future.done():
            return False
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} neither waited nor finished")


def _hold_lane(connect: Connect, run_id: str, lane: str = "lifecycle") -> psycopg.Connection:
    barrier = connect(autocommit=False)
    row = barrier.execute(
        "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = %s AND lane = %s FOR UPDATE",
        [run_id, lane],
    ).fetchone()
    assert row is not None
    return barrier


def _lease_head(db: psycopg.Connection, run_id: str, relay: str = "R") -> int:
    rows = call(db, "claim_ledger", relay=relay, run_id=run_id)
    assert [r["kind"] for r in rows] == ["claimed"], rows
    return int(rows[0]["event_id"])


def _deliver_all(db: psycopg.Connection, run_id: str, relay: str = "R") -> list[int]:
    """Claim and acknowledge everything pending on the run's lifecycle lane."""
    ids = []
    while rows := call(db, "claim_ledger", relay=relay, run_id=run_id):
        ids += [r["event_id"] for r in rows if r["kind"] == "claimed"]
        call(db, "ack_ledger", relay=relay, run_id=run_id, event_ids=[rows[-1]["event_id"]])
    return ids


def _race(
    db: psycopg.Connection,
    connect: Connect,
    held_run: str,
    relay_call: Callable[[psycopg.Connection], Any],
    writer_call: Callable[[psycopg.Connection], Any],
) -> tuple[Any, Any]:
    """The barrier holds `held_run`'s lane; the relay call queues behind it;
    then the writer call runs (it may wait too); then the barrier lets go.
    Returns both results; an exception (40P01 with the old lock orders)
    propagates."""
    relay, writer = connect(), connect()
    barrier = _hold_lane(connect, held_run)
    relay_future = in_thread(lambda: relay_call(relay))
    assert _wait_until_waiting(db, backend_pid(relay), relay_future)
    writer_future = in_thread(lambda: writer_call(writer))
    _wait_until_waiting(db, backend_pid(writer), writer_future)
    barrier.rollback()
    return relay_future.result(timeout=60), writer_future.result(timeout=60)


def _lane(db: psycopg.Connection, run_id: str) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT ll.head_seq, ll.available_at IS NOT NULL, ll.blocked"
        " FROM runrelay.ledger_lanes AS ll WHERE ll.run_id = %s AND ll.lane = 'lifecycle'",
        [run_id],
    ).fetchone()
    assert row is not None
    return tuple(row)


def _first_pending(db: psycopg.Connection, run_id: str) -> tuple[int, str]:
    row = db.execute(
        "SELECT seq, type FROM runrelay.ledger WHERE run_id = %s AND lane = 'lifecycle'"
        " AND state <> 'delivered' ORDER BY seq LIMIT 1",
        [run_id],
    ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


# --- one lane order: claims, batch completions and wakes vs. multi-run relay calls


@pytest.mark.parametrize("heads", ["leased", "drained"])
def test_multi_run_claim_and_multi_run_fail_ledger_never_deadlock(
    db: psycopg.Connection, connect: Connect, heads: str
) -> None:
    """claim_attempts starts b (priority 10) before a; fail_ledger names
    events of a and b. The claim used to lock the lanes in claim order (b,
    then a) while relays lock them in run_id order (a, then b): 40P01.
    With heads leased the claim's lanes need no change; drained (the relay's
    ids are stale, the lanes empty) they do."""
    enqueue(db, "a", priority=0)
    enqueue(db, "b", priority=10)
    if heads == "leased":
        ids = [_lease_head(db, "a"), _lease_head(db, "b")]
    else:
        ids = _deliver_all(db, "a") + _deliver_all(db, "b")
    failed, claimed = _race(
        db,
        connect,
        "a",
        lambda c: call(c, "fail_ledger", relay="R", event_ids=ids, error={"e": 1}),
        lambda c: call(c, "claim_attempts", worker="w", max_runs=2),
    )
    assert [c["run_id"] for c in claimed] == ["b", "a"]
    assert len(failed) == (2 if heads == "leased" else 0)
    for run_id in ("a", "b"):
        head_seq, available, blocked = _lane(db, run_id)
        assert available and not blocked
        assert head_seq == _first_pending(db, run_id)[0]
        if heads == "drained":
            assert _first_pending(db, run_id)[1] == "run.started"


def test_batch_completion_with_fast_and_slow_items_never_deadlocks_with_fail_ledger(
    db: psycopg.Connection, connect: Connect
) -> None:
    """complete_attempts settles its plain items together (b) and the others
    one by one after them (a has a concurrency key), so it took b's lane
    before a's; fail_ledger takes a's before b's."""
    enqueue(db, "a", concurrency_key="k")
    enqueue(db, "b")
    items = [fenced(claim_one(db)), fenced(claim_one(db))]
    ids = [_lease_head(db, "a"), _lease_head(db, "b")]
    payload = [{**i, "lease_token": str(i["lease_token"])} for i in items]
    failed, completed = _race(
        db,
        connect,
        "a",
        lambda c: call(c, "fail_ledger", relay="R", event_ids=ids, error={"e": 1}),
        lambda c: call(c, "complete_attempts", items=payload),
    )
    assert sorted((r["run_id"], r["outcome"]) for r in completed) == [
        ("a", "completed"),
        ("b", "completed"),
    ]
    assert len(failed) == 2


def test_ack_ledger_runs_takes_its_lanes_in_the_lane_order_whatever_the_ids_order(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The ids name b's event before a's. While a's lane is held, the call
    waits for it holding nothing: b's lane is free to lock meanwhile (it
    would be held already had the call gone in the ids' order, which two
    such calls in opposite orders would deadlock on). Then it acknowledges
    both, and a batch completion that takes the lanes the other way round
    finishes beside it."""
    enqueue(db, "a", concurrency_key="k")
    enqueue(db, "b")
    items = [fenced(claim_one(db)), fenced(claim_one(db))]
    payload = [{**i, "lease_token": str(i["lease_token"])} for i in items]
    ids = [_lease_head(db, "b"), _lease_head(db, "a")]
    relay, probe = connect(), connect(autocommit=False)
    barrier = _hold_lane(connect, "a")
    acked = in_thread(lambda: call(relay, "ack_ledger_runs", relay="R", event_ids=ids))
    assert _wait_until_waiting(db, backend_pid(relay), acked)
    row = probe.execute(
        "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = 'b' AND lane = 'lifecycle'"
        " FOR UPDATE NOWAIT"
    ).fetchone()
    assert row == (1,)
    probe.rollback()
    writer = connect()
    completed = in_thread(lambda: call(writer, "complete_attempts", items=payload))
    _wait_until_waiting(db, backend_pid(writer), completed)
    barrier.rollback()
    rows = acked.result(timeout=60)
    assert [(r["kind"], r["run_id"]) for r in rows] == [("delivered", "a"), ("delivered", "b")]
    assert sorted(r["outcome"] for r in completed.result(timeout=60)) == ["completed"] * 2


def test_waking_due_waits_never_deadlocks_with_fail_ledger(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A claim first wakes due waits: b's sleep is older, so it woke b and
    then a, taking their lanes in that order; fail_ledger takes a's first."""
    for run_id, hours in (("a", 2), ("b", 1)):
        enqueue(db, run_id)
        claim = claim_one(db)
        assert claim["run_id"] == run_id
        row = db.execute("SELECT now() + make_interval(hours => %s)", [hours]).fetchone()
        assert row is not None
        wait = {"kind": "sleep", "until": row[0].isoformat()}
        assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    ids = [_lease_head(db, "a"), _lease_head(db, "b")]

    def claim_later(c: psycopg.Connection) -> Any:
        c.execute("SET runrelay.clock_offset = '3 hours'")  # both sleeps are due
        return call(c, "claim_attempts", worker="w", max_runs=2)

    failed, claimed = _race(
        db,
        connect,
        "a",
        lambda c: call(c, "fail_ledger", relay="R", event_ids=ids, error={"e": 1}),
        claim_later,
    )
    assert sorted(c["run_id"] for c in claimed) == ["a", "b"]
    assert len(failed) == 2
    for run_id in ("a", "b"):
        types = [r[0] for r in db.execute(
            "SELECT type FROM runrelay.ledger WHERE run_id = %s ORDER BY seq", [run_id]
        )]  # fmt: skip
        assert types[-2:] == ["run.resumed", "run.started"], types


# A database default collation where 'a' sorts before 'B' (in "C", 'B'
# sorts first): ICU en-US where the server has ICU, else glibc's en_US.UTF-8
# (the embedded PostgreSQL 18 has no ICU; scripts/ensure_prereqs.sh
# generates the locale).
LOCALES = (
    "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' TEMPLATE template0",
    "LOCALE_PROVIDER libc LOCALE 'en_US.UTF-8' ENCODING 'UTF8' TEMPLATE template0",
)


@pytest.fixture
def icu_connect() -> Iterator[Connect]:
    """Connections to a database whose default collation is not "C"-ordered."""
    name = f"rr_icu_{os.getpid()}"
    drop_database(name)
    errors = []
    with psycopg.connect(url_for("postgres"), autocommit=True) as c:
        for options in LOCALES:
            try:
                c.execute(sql.SQL("CREATE DATABASE {} " + options).format(sql.Identifier(name)))
                break
            except psycopg.Error as exc:
                errors.append(str(exc).strip())
        else:
            pytest.fail(f"no non-C collation (run scripts/ensure_prereqs.sh): {errors}")
    url = url_for(name)
    alembic(url, "upgrade", "head")
    opened: list[psycopg.Connection] = []

    def _connect(autocommit: bool = True, **kwargs: object) -> psycopg.Connection:
        c = psycopg.connect(url, autocommit=autocommit, **kwargs)  # type: ignore[arg-type]
        opened.append(c)
        return c

    yield _connect
    for c in opened:
        c.close()
    drop_database(name)


def test_lane_order_does_not_depend_on_the_database_collation(icu_connect: Connect) -> None:
    """Items that are not settled together (both runs have a concurrency
    key) are settled in run_id COLLATE "C" order: B, then a. Relays sorted
    their lanes under the database's collation, a before B."""
    db = icu_connect()
    assert db.execute("SELECT 'a' < 'B', 'B' < 'a' COLLATE \"C\"").fetchone() == (True, True)
    enqueue(db, "B", concurrency_key="k1")
    enqueue(db, "a", concurrency_key="k2")
    items = [fenced(claim_one(db)), fenced(claim_one(db))]
    ids = [_lease_head(db, "a"), _lease_head(db, "B")]
    payload = [{**i, "lease_token": str(i["lease_token"])} for i in items]
    failed, completed = _race(
        db,
        icu_connect,
        "a",
        lambda c: call(c, "fail_ledger", relay="R", event_ids=ids, error={"e": 1}),
        lambda c: call(c, "complete_attempts", items=payload),
    )
    assert sorted(r["outcome"] for r in completed) == ["completed", "completed"]
    assert len(failed) == 2


# --- appenders never hold up delivery


def _relay_op(op: str, run_id: str, event_id: int) -> Callable[[psycopg.Connection], Any]:
    args: dict[str, Any] = {"relay": "R", "event_ids": [event_id]}
    if op == "ack_ledger":
        args["run_id"] = run_id
    if op == "fail_ledger":
        args["error"] = {"e": 1}
        args["retry_at"] = "2000-01-01T00:00:00Z"
    return lambda c: call(c, op, **args)


@pytest.mark.parametrize(
    "op", ["ack_ledger", "renew_ledger_lease", "fail_ledger", "release_ledger"]
)
def test_an_open_append_does_not_hold_up_relay_calls_on_its_lane(
    db: psycopg.Connection, connect: Connect, op: str
) -> None:
    """A producer appended in a transaction it has not committed. The relay's
    calls on the lane's leased head answer at once (the relay's lock_timeout
    would end a wait with 55P03), and the appended event is delivered after
    the head once the producer commits."""
    enqueue(db, "r1")
    head = _lease_head(db, "r1")
    producer = connect(autocommit=False)
    appended = call(producer, "append_events", run_id="r1", events=[{"type": "fact"}])
    relay = connect()
    relay.execute("SET lock_timeout = '200ms'")
    relay.execute("SET statement_timeout = '60s'")
    result = _relay_op(op, "r1", head)(relay)
    assert len(result) == 1, result
    producer.commit()

    # The lane still leads to the appended event, in order: the relay,
    # discovering due lanes a minute later (the renewed lease has lapsed, a
    # drained lane was due for a re-check), gets the head unless it
    # acknowledged it, then the event.
    got: list[int] = []
    with relay.transaction():
        relay.execute("SET LOCAL runrelay.clock_offset = '1 minute'")
        while rows := call(relay, "claim_ledger", relay="R"):
            ids = [r["event_id"] for r in rows]
            got += ids
            call(relay, "ack_ledger", relay="R", run_id="r1", event_ids=ids)
    expected = ([] if op == "ack_ledger" else [head]) + [appended[0]["event_id"]]
    assert got == expected
    assert _lane(db, "r1") == (None, False, False)


def test_a_lane_drained_during_an_open_append_is_looked_at_again(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The relay acknowledges the last committed event while an append is in
    flight: it cannot see the new event, so it leaves the lane due a moment
    later instead of empty; the next look after the commit claims the
    event. With no writer holding the run, a drained lane is empty."""
    enqueue(db, "r1")
    head = _lease_head(db, "r1")
    producer = connect(autocommit=False)
    appended = call(producer, "append_events", run_id="r1", events=[{"type": "fact"}])
    call(db, "ack_ledger", relay="R", run_id="r1", event_ids=[head])
    head_seq, available, _ = _lane(db, "r1")
    assert available and head_seq is not None
    due = db.execute("SELECT runrelay.ledger_next_due_at()").fetchone()
    assert due is not None and due[0] is not None
    producer.commit()
    with db.transaction():
        db.execute("SET LOCAL runrelay.clock_offset = '1 second'")
        rows = call(db, "claim_ledger", relay="R")
    assert [r["event_id"] for r in rows] == [appended[0]["event_id"]]
    call(db, "ack_ledger", relay="R", run_id="r1", event_ids=[rows[0]["event_id"]])
    assert _lane(db, "r1") == (None, False, False)
    assert db.execute("SELECT runrelay.ledger_next_due_at()").fetchone() == (None,)


@pytest.mark.parametrize("op", ["ack_ledger", "release_ledger", "requeue_ledger_event"])
def test_an_append_that_finds_its_lane_held_by_a_relay_call_is_not_stranded(
    db: psycopg.Connection, connect: Connect, op: str
) -> None:
    """A relay call holds an empty lane (a repeated ack, a stale release, a
    requeue of an event that is not failed) in a transaction still open when
    a producer appends to the run. The append leaves the held lane to the
    relay, whose call refreshed it; after both commit the lane leads to the
    new event."""
    enqueue(db, "r1")
    head = _lease_head(db, "r1")
    call(db, "ack_ledger", relay="R", run_id="r1", event_ids=[head])
    assert _lane(db, "r1") == (None, False, False)
    relay = connect(autocommit=False)
    if op == "ack_ledger":
        call(relay, op, relay="R", run_id="r1", event_ids=[head])
    elif op == "release_ledger":
        call(relay, op, relay="R", event_ids=[head])
    else:
        call(relay, op, event_id=head)
    producer = connect()
    future = in_thread(
        lambda: call(producer, "append_events", run_id="r1", events=[{"type": "fact"}])
    )
    _wait_until_waiting(db, backend_pid(producer), future)
    relay.commit()
    appended = future.result(timeout=60)
    assert _lane(db, "r1") == (appended[0]["seq"], True, False)
    rows = call(db, "claim_ledger", relay="R")
    assert [r["event_id"] for r in rows] == [appended[0]["event_id"]]


@pytest.mark.parametrize("holder_ends", ["commit", "rollback"])
def test_an_append_to_an_empty_lane_a_relay_holds_is_never_stranded(
    db: psycopg.Connection, connect: Connect, holder_ends: str
) -> None:
    """A relay holds an empty lane without ever refreshing it (a discovery
    claim whose candidate stopped matching once locked keeps the row lock; a
    relay call that rolls back undoes its refresh). An append meanwhile does
    not wait; once the holder is gone, the event is due, discovery claims it,
    and a later append is delivered after it, in seq order."""
    enqueue(db, "x")
    _deliver_all(db, "x")
    barrier = _hold_lane(connect, "x")
    producer = connect(options="-c lock_timeout=200ms")
    (late,) = call(producer, "append_events", run_id="x", events=[{"type": "late"}])
    getattr(barrier, holder_ends)()
    due = db.execute("SELECT runrelay.ledger_next_due_at('lifecycle') <= now()").fetchone()
    assert due is not None and due[0] is True, "the appended event is not due"
    call(db, "append_events", run_id="x", events=[{"type": "after"}])
    claimed = call(db, "claim_ledger", relay="Q", batch=True, max_events=10)
    assert [(r["kind"], r["type"]) for r in claimed] == [("claimed", "late"), ("claimed", "after")]
    assert claimed[0]["event_id"] == late["event_id"]
    wakeups = db.execute("SELECT count(*) FROM runrelay.ledger_wakeups").fetchone()
    assert wakeups == (0,), "the claim did not consume the wake-up"


def test_a_lane_woken_after_a_stranded_wake_up_starts_at_the_earlier_event(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The wake-up is left while the holder has the lane; the holder goes away
    without refreshing; the next append finds the lane empty and free, wakes
    it, and its head goes back to the earlier event, so a claim naming the
    run delivers both in order."""
    enqueue(db, "y")
    _deliver_all(db, "y")
    barrier = _hold_lane(connect, "y")
    call(db, "append_events", run_id="y", events=[{"type": "first"}])
    barrier.rollback()
    call(db, "append_events", run_id="y", events=[{"type": "second"}])
    claimed = call(db, "claim_ledger", relay="Q", run_id="y", batch=True, max_events=10)
    assert [r["type"] for r in claimed] == ["first", "second"]
    assert db.execute("SELECT count(*) FROM runrelay.ledger_wakeups").fetchone() == (0,)
