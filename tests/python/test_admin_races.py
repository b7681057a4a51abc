"""The admin functions that write (docs/admin.md), racing the API.

Races use real sessions: a session holds a lock in an open transaction, the
competitor queues behind it (confirmed through pg_stat_activity), then the
holder commits or rolls back. The scheduler's invariants are checked over
the whole database afterwards (lifecycle.check_database, which knows
run.retried).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import datetime
from functools import partial
from typing import Any

import psycopg
import pytest

from lifecycle import check_database, check_lanes
from sqlapi import (
    call,
    claim_one,
    enqueue,
    events,
    fenced,
    queued_behind_lock,
    run_row,
    scalar,
    table_checksum,
)

Connect = Callable[..., psycopg.Connection]


def failed_run(db: psycopg.Connection, run_id: str, **kwargs: Any) -> None:
    enqueue(db, run_id, queue=run_id, max_attempts=1, **kwargs)
    claim = claim_one(db, queues=[run_id])
    assert scalar(db, "fail_attempt", **fenced(claim), error={"e": 1}) == "failed"


def an_hour_from_now(db: psycopg.Connection) -> datetime:
    row = db.execute("SELECT now() + interval '1 hour'").fetchone()
    assert row is not None
    return row[0]


def times_out_behind_a_row_lock(
    db: psycopg.Connection,
    connect: Connect,
    table: str,
    run_id: str,
    attempt: Callable[[psycopg.Connection], object],
) -> psycopg.Connection:
    """`attempt` on an operator session with a 200ms lock_timeout, while
    another session holds the run's rows of `table` (runs or ledger_lanes):
    it fails with 55P03 and writes nothing. Returns the operator session once
    the rows are free again."""
    holder = connect(autocommit=False)
    holder.execute(f"SELECT 1 FROM runrelay.{table} WHERE run_id = %s FOR UPDATE", [run_id])
    operator = connect()
    operator.execute("SET lock_timeout = '200ms'")
    before = table_checksum(db)
    with pytest.raises(psycopg.errors.LockNotAvailable):
        attempt(operator)
    assert table_checksum(db) == before
    holder.rollback()
    return operator


def race(
    looping: Sequence[Callable[[threading.Event], None]], finite: Sequence[Callable[[], None]]
) -> None:
    """Run each function on a thread of its own: the `finite` ones to their
    end, the `looping` ones until those ended (they are handed the stop
    event). An exception on any thread fails the test."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    loops = [threading.Thread(target=guarded, args=(fn, stop)) for fn in looping]
    rounds = [threading.Thread(target=guarded, args=(fn,)) for fn in finite]
    for t in loops + rounds:
        t.start()
    for t in rounds:
        t.join(timeout=120)
    stop.set()
    for t in loops:
        t.join(timeout=60)
    assert errors == []


# --------------------------------------------------------------------------
# retry_run


@pytest.mark.parametrize("same_call", [False, True])
def test_a_retry_waits_for_a_retry_in_flight_and_answers_after_it(
    db: psycopg.Connection, connect: Connect, same_call: bool
) -> None:
    """Two retries of one failed run: the second waits for the first's
    custody locks (or, with the same call_id, its call lock), then answers
    not_retryable (the run is queued) or, as a replay, retried; the run is
    retried once."""
    failed_run(db, "f")
    call_id = uuid.uuid4()
    first = connect(autocommit=False)
    assert scalar(first, "retry_run", run_id="f", call_id=call_id) == "retried"
    kwargs = {"call_id": call_id} if same_call else {}
    pending = queued_behind_lock(
        db, connect(), lambda c: scalar(c, "retry_run", run_id="f", **kwargs)
    )
    first.commit()
    assert pending.result(timeout=10) == ("retried" if same_call else "not_retryable")
    assert events(db, "f").count("run.retried") == 1
    check_database(db)


def test_a_retry_that_rolls_back_leaves_the_run_to_the_next(
    db: psycopg.Connection, connect: Connect
) -> None:
    failed_run(db, "f")
    first = connect(autocommit=False)
    assert scalar(first, "retry_run", run_id="f") == "retried"
    pending = queued_behind_lock(
        db, connect(), lambda c: scalar(c, "retry_run", run_id="f", reason="second")
    )
    first.rollback()
    assert pending.result(timeout=10) == "retried"
    (retried,) = db.execute(
        "SELECT payload ->> 'reason' FROM runrelay.ledger"
        " WHERE run_id = 'f' AND type = 'run.retried'"
    ).fetchall()
    assert retried == ("second",)
    check_database(db)


def test_a_cancel_during_a_retry_sees_the_run_ended_and_one_after_cancels_it(
    db: psycopg.Connection, connect: Connect
) -> None:
    """cancel_run never waits for custody locks: while a retry is in flight
    it reads the run as committed, ended (already_terminal, nothing
    written); once the retry committed it cancels the queued run. The
    history is run.failed, run.retried, run.cancelled."""
    failed_run(db, "f")
    retry = connect(autocommit=False)
    assert scalar(retry, "retry_run", run_id="f") == "retried"
    canceller = connect()
    assert scalar(canceller, "cancel_run", run_id="f", reason="early") == "already_terminal"
    retry.commit()
    assert run_row(db, "f")["status"] == "queued"
    assert scalar(canceller, "cancel_run", run_id="f", reason="late") == "cancelled"
    assert events(db, "f")[-3:] == ["run.failed", "run.retried", "run.cancelled"]
    assert scalar(db, "retry_run", run_id="f") == "retried"  # cancelled: retryable again
    check_database(db)


def test_a_retry_of_a_keyed_run_waits_for_the_key_and_rejoins_behind_it(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The key lock is custody step 1: a writer of another run of the key
    (here an enqueue in an open transaction) makes the retry wait; after it,
    the retried run is held behind the key's new live run."""
    failed_run(db, "k1", concurrency_key="k")
    producer = connect(autocommit=False)
    call(producer, "enqueue_run", run_id="k2", queue="k2", concurrency_key="k")
    pending = queued_behind_lock(db, connect(), lambda c: scalar(c, "retry_run", run_id="k1"))
    producer.commit()
    assert pending.result(timeout=10) == "retried"
    assert run_row(db, "k1")["key_held"] is True
    assert run_row(db, "k2")["key_held"] is False
    check_database(db)


def test_a_retry_waits_no_longer_than_the_callers_lock_timeout(
    db: psycopg.Connection, connect: Connect
) -> None:
    failed_run(db, "f")
    retry = partial(scalar, function="retry_run", run_id="f")
    operator = times_out_behind_a_row_lock(db, connect, "runs", "f", retry)
    assert operator.execute("SHOW lock_timeout").fetchone() == ("200ms",)
    assert retry(operator) == "retried"


def test_retries_cancels_and_workers_racing_keep_every_invariant(
    db: psycopg.Connection, connect: Connect
) -> None:
    """Operators retry and cancel while workers claim, fail and complete, over
    the same 20 runs (half of them on one concurrency key); every run's
    history is a legal path of the state machine, its failures fit the
    budget of its series, and attempts stay dense."""
    for i in range(20):
        enqueue(db, f"r{i}", queue="race", max_attempts=2, concurrency_key="k" if i % 2 else None)

    def worker(n: int, stop: threading.Event) -> None:
        conn = connect()
        while not stop.is_set():
            rows = call(conn, "claim_attempts", worker=f"w{n}", queues=["race"])
            for row in rows:
                if int(row["attempt"]) % 2:
                    scalar(conn, "fail_attempt", **fenced(row), error={"n": n}, retry_at=None)
                else:
                    scalar(conn, "complete_attempt", **fenced(row))

    def operator(n: int) -> None:
        conn = connect()
        for i in range(200):
            run_id = f"r{(i * 7 + n) % 20}"
            if i % 3 == 0:
                scalar(conn, "cancel_run", run_id=run_id, reason=f"op{n}")
            else:
                scalar(conn, "retry_run", run_id=run_id, requested_by=f"op{n}")

    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.001, retry_max_seconds = 0.01")
    race([partial(worker, n) for n in range(3)], [partial(operator, n) for n in range(2)])
    retried = db.execute(
        "SELECT count(*) FROM runrelay.ledger WHERE type = 'run.retried'"
    ).fetchone()
    assert retried is not None and retried[0] > 0
    check_database(db)


# --------------------------------------------------------------------------
# requeue_blocked_heads


def blocked_lane(db: psycopg.Connection, run_id: str) -> int:
    """A run whose lifecycle lane is blocked behind its failed run.queued."""
    enqueue(db, run_id, queue=run_id)
    (head,) = call(db, "claim_ledger", relay="r", run_id=run_id)
    (failed,) = call(
        db, "fail_ledger", relay="r", event_ids=[head["event_id"]], error={"x": 1}, permanent=True
    )
    assert failed["outcome"] == "blocked"
    return int(head["event_id"])


def test_a_requeue_waits_for_a_relay_holding_the_lane_and_requeues_after_it(
    db: psycopg.Connection, connect: Connect
) -> None:
    """requeue_blocked_heads takes lane rows, waiting, like every relay call:
    behind a relay's lane lock (a requeue_ledger_event in flight here), it
    waits, then finds the head already requeued and answers no row; the lane
    is claimable once, by one relay."""
    head = blocked_lane(db, "b")
    relay = connect(autocommit=False)
    assert scalar(relay, "requeue_ledger_event", event_id=head) is True
    pending = queued_behind_lock(
        db, connect(), lambda c: call(c, "requeue_blocked_heads", run_id="b")
    )
    relay.commit()
    assert pending.result(timeout=10) == []
    assert [r["type"] for r in call(db, "claim_ledger", relay="r2", run_id="b")] == ["run.queued"]


def test_a_requeue_waits_no_longer_than_the_callers_lock_timeout(
    db: psycopg.Connection, connect: Connect
) -> None:
    blocked_lane(db, "b")
    operator = times_out_behind_a_row_lock(
        db, connect, "ledger_lanes", "b", lambda c: call(c, "requeue_blocked_heads", run_id="b")
    )
    assert [r["requeued"] for r in call(operator, "requeue_blocked_heads", run_id="b")] == [1]


def test_a_skip_waits_for_a_requeue_in_flight_and_then_finds_nothing_blocked(
    db: psycopg.Connection, connect: Connect
) -> None:
    """skip_ledger_events reads the head after the lane lock: behind a
    requeue in flight it waits, then answers not_blocked and skips nothing,
    and the requeued head is delivered, not lost."""
    head = blocked_lane(db, "s")
    requeuer = connect(autocommit=False)
    assert scalar(requeuer, "requeue_ledger_event", event_id=head) is True
    pending = queued_behind_lock(
        db,
        connect(),
        lambda c: call(c, "skip_ledger_events", run_id="s", lane="lifecycle", reason="r"),
    )
    requeuer.commit()
    assert pending.result(timeout=10) == [{"event_id": head, "seq": 1, "outcome": "not_blocked"}]
    assert db.execute(
        "SELECT state FROM runrelay.ledger WHERE event_id = %s", [head]
    ).fetchone() == ("pending",)
    assert [r["event_id"] for r in call(db, "claim_ledger", relay="r2", run_id="s")] == [head]


def test_two_skips_with_one_call_id_the_second_waits_and_answers_the_first(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A repeat that arrives while the first call is still open waits for its
    call id's lock, then answers what the first recorded and writes nothing."""
    head = blocked_lane(db, "s2")
    call_id = uuid.uuid4()
    args = {"run_id": "s2", "lane": "lifecycle", "reason": "gone", "call_id": call_id}
    first = connect(autocommit=False)
    assert call(first, "skip_ledger_events", **args) == [
        {"event_id": head, "seq": 1, "outcome": "skipped"}
    ]
    pending = queued_behind_lock(db, connect(), lambda c: call(c, "skip_ledger_events", **args))
    first.commit()
    before = table_checksum(db)
    assert pending.result(timeout=10) == [{"event_id": head, "seq": 1, "outcome": "skipped"}]
    assert table_checksum(db) == before


def test_a_skip_waits_no_longer_than_the_callers_lock_timeout(
    db: psycopg.Connection, connect: Connect
) -> None:
    blocked_lane(db, "s3")
    skip = partial(call, function="skip_ledger_events", run_id="s3", lane="lifecycle", reason="r")
    operator = times_out_behind_a_row_lock(db, connect, "ledger_lanes", "s3", skip)
    (row,) = skip(operator)
    assert row["outcome"] == "skipped"
    check_lanes(db)


def test_requeues_racing_relays_that_fail_again_leave_every_lane_consistent(
    db: psycopg.Connection, connect: Connect
) -> None:
    """Operators requeue every blocked lane over and over while relays claim
    and fail or deliver the heads: no deadlock, no error, and every lane
    row still leads to its pending head (lifecycle.check_lanes)."""
    for i in range(20):
        blocked_lane(db, f"b{i}")

    def relay(n: int, stop: threading.Event) -> None:
        conn = connect()
        while not stop.is_set():
            for row in call(conn, "claim_ledger", relay=f"r{n}"):
                if row["kind"] != "claimed":
                    continue
                if row["event_id"] % 3 == n % 3:
                    call(conn, "ack_ledger", relay=f"r{n}", run_id=row["run_id"],
                         event_ids=[row["event_id"]])  # fmt: skip
                else:
                    call(conn, "fail_ledger", relay=f"r{n}", event_ids=[row["event_id"]],
                         error={"n": n}, permanent=True)  # fmt: skip

    def operator() -> None:
        conn = connect()
        for _ in range(100):
            call(conn, "requeue_blocked_heads", max_lanes=7)
            call(conn, "list_blocked_heads")

    race([partial(relay, n) for n in range(3)], [operator, operator])
    check_lanes(db)


# --------------------------------------------------------------------------
# pause_queue, resume_queue


def test_a_pause_waits_for_no_claim_and_stops_every_claim_that_starts_after_it(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A worker's claim in an open transaction holds runs of the queue:
    pause_queue does not wait for it. A claim whose statement starts after
    the pause committed takes nothing from the queue, also inside a
    transaction that began before the pause (READ COMMITTED: each statement
    sees what committed before it)."""
    for i in range(6):
        enqueue(db, f"p{i}", queue="p")
    worker = connect(autocommit=False)
    assert len(call(worker, "claim_attempts", worker="w1", queues=["p"], max_runs=2)) == 2
    late = connect(autocommit=False)
    late.execute("SELECT 1")  # its transaction is open before the pause
    operator = connect()
    operator.execute("SET lock_timeout = '1s'")
    assert scalar(operator, "pause_queue", queue="p") == "paused"
    assert call(late, "claim_attempts", worker="w2", queues=["p"], max_runs=10) == []
    assert call(late, "claim_attempts", worker="w2", max_runs=10) == []
    late.rollback()
    worker.commit()  # the claim made before the pause stands
    assert scalar(operator, "resume_queue", queue="p") == "resumed"
    assert len(call(connect(), "claim_attempts", worker="w3", queues=["p"], max_runs=10)) == 4
    check_database(db)


def test_claims_racing_a_pause_take_no_run_of_the_queue_once_it_is_paused(
    db: psycopg.Connection, connect: Connect
) -> None:
    """Four workers claim from every queue in a loop while an operator pauses
    queue `p`: no attempt of `p` is opened by a claim that started after
    the pause committed, and the other queue keeps being claimed. A claim
    that started before may still take a run of `p`, and its attempt's
    claimed_at (the grant time, after its candidates were locked) may fall
    after the pause: so each worker notes the clock on its own connection
    once it has seen the pause, and only its claims after that note count."""
    for i in range(400):
        enqueue(db, f"p{i}", queue="p")
        enqueue(db, f"o{i}", queue="o")
    stop = threading.Event()
    paused = threading.Event()
    errors: list[BaseException] = []
    seen: dict[str, Any] = {}

    def worker(n: int) -> None:
        conn = connect()
        try:
            while not stop.is_set():
                if paused.is_set() and f"w{n}" not in seen:
                    seen[f"w{n}"] = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                for row in call(conn, "claim_attempts", worker=f"w{n}", max_runs=2):
                    scalar(conn, "complete_attempt", **fenced(row))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in workers:
        t.start()
    operator = connect()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        taken = db.execute("SELECT count(*) FROM runrelay.attempts WHERE run_id LIKE 'p%'")
        row = taken.fetchone()
        assert row is not None
        if row[0] >= 20:
            break
    assert scalar(operator, "pause_queue", queue="p") == "paused"
    paused.set()
    while time.monotonic() < deadline:  # the other queue goes on
        left = db.execute(
            "SELECT count(*) FROM runrelay.runs WHERE queue = 'o' AND status = 'queued'"
        )
        row = left.fetchone()
        assert row is not None
        if row[0] == 0 or errors:
            break
    stop.set()
    for t in workers:
        t.join(timeout=60)
    assert errors == []
    assert row[0] == 0, "the other queue was not drained while p was paused"
    assert sorted(seen) == [f"w{n}" for n in range(4)]
    for name, noted in seen.items():
        late = db.execute(
            "SELECT count(*) FROM runrelay.attempts AS a JOIN runrelay.runs AS r USING (run_id)"
            " WHERE r.queue = 'p' AND a.worker = %s AND a.claimed_at >= %s",
            [name, noted],
        ).fetchone()
        assert late == (0,), name
    queued = db.execute(
        "SELECT count(*) FROM runrelay.runs WHERE queue = 'p' AND status = 'queued'"
    )
    left_p = queued.fetchone()
    assert left_p is not None and left_p[0] > 0
    check_database(db)


def test_two_pauses_of_one_queue_one_waits_for_the_other_boundedly(
    db: psycopg.Connection, connect: Connect
) -> None:
    first = connect(autocommit=False)
    assert scalar(first, "pause_queue", queue="q", reason="first") == "paused"
    second = connect()
    pending = queued_behind_lock(
        db, second, lambda c: scalar(c, "pause_queue", queue="q", reason="second")
    )
    first.commit()
    assert pending.result(timeout=10) == "already_paused"
    rows = call(db, "list_paused_queues")
    assert [(r["queue"], r["reason"]) for r in rows] == [("q", "first")]
    holder = connect(autocommit=False)
    assert scalar(holder, "resume_queue", queue="q") == "resumed"
    second.execute("SET lock_timeout = '200ms'")
    with pytest.raises(psycopg.errors.LockNotAvailable):
        scalar(second, "pause_queue", queue="q")
    holder.rollback()


# --------------------------------------------------------------------------
# purge_runs


def ended_and_delivered(db: psycopg.Connection, run_id: str) -> None:
    failed_run(db, run_id)
    while rows := call(db, "claim_ledger", relay="d", run_id=run_id, max_events=100, batch=True):
        ids = [r["event_id"] for r in rows if r["kind"] == "claimed"]
        if ids:
            call(db, "ack_ledger", relay="d", run_id=run_id, event_ids=ids)


def purge_behind_a_relay(
    db: psycopg.Connection, connect: Connect, run_id: str
) -> tuple[psycopg.Connection, list[int], Future[int]]:
    """A failed run whose events relay r1 leased, the relay's session holding
    the run's lanes in an open transaction, and a purge of undelivered runs
    waiting behind it. Returns the relay's session, the leased event ids and
    the purge's answer to come."""
    failed_run(db, run_id)
    leased = call(db, "claim_ledger", relay="r1", run_id=run_id, max_events=100, batch=True)
    ids = [r["event_id"] for r in leased if r["kind"] == "claimed"]
    assert ids
    later = an_hour_from_now(db)
    relay = connect(autocommit=False)
    # The first step of every relay call on these events (_lock_event_lanes).
    relay.execute("SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = %s FOR UPDATE", [run_id])
    pending = queued_behind_lock(
        db,
        connect(),
        lambda c: scalar(c, "purge_runs", finished_before=later, include_undelivered=True),
    )
    return relay, ids, pending


def check_ledger_gone(db: psycopg.Connection, run_id: str) -> None:
    """No event and no lane of the run is left, and the invariants hold."""
    assert db.execute(
        "SELECT (SELECT count(*) FROM runrelay.ledger_events WHERE run_id = %(r)s),"
        " (SELECT count(*) FROM runrelay.ledger_lanes WHERE run_id = %(r)s)",
        {"r": run_id},
    ).fetchone() == (0, 0)
    check_database(db)
    check_lanes(db)


def test_a_purge_skips_a_run_a_retry_holds_and_a_retry_after_a_purge_finds_nothing(
    db: psycopg.Connection, connect: Connect
) -> None:
    """purge_runs never waits for a run's lock: a run a retry holds is
    skipped (and retried); a retry that waits behind a purge in flight
    finds the run gone (not_found)."""
    ended_and_delivered(db, "held")
    ended_and_delivered(db, "gone")
    retry = connect(autocommit=False)
    assert scalar(retry, "retry_run", run_id="held") == "retried"
    purge = connect(autocommit=False)
    assert scalar(purge, "purge_runs", finished_before=an_hour_from_now(db)) == 1  # "gone" only
    pending = queued_behind_lock(db, connect(), lambda c: scalar(c, "retry_run", run_id="gone"))
    purge.commit()
    assert pending.result(timeout=10) == "not_found"
    retry.commit()
    assert run_row(db, "held")["status"] == "queued"
    assert db.execute("SELECT count(*) FROM runrelay.runs WHERE run_id = 'gone'").fetchone() == (0,)
    check_database(db)


def test_a_purge_waits_for_a_relay_on_a_lane_no_longer_than_the_callers_lock_timeout(
    db: psycopg.Connection, connect: Connect
) -> None:
    """Deleting a run's ledger takes its lane rows: behind a relay's lane
    lock the purge waits, boundedly (55P03, nothing deleted), and goes
    through once the lane is free."""
    ended_and_delivered(db, "r")
    purge = partial(scalar, function="purge_runs", finished_before=an_hour_from_now(db))
    operator = times_out_behind_a_row_lock(db, connect, "ledger_lanes", "r", purge)
    assert purge(operator) == 1


def test_an_append_to_an_ended_run_in_flight_keeps_it_from_a_purge(
    db: psycopg.Connection, connect: Connect
) -> None:
    """An append holds the run's row: the purge skips the run, and once the
    append committed the run has an undelivered event and is kept."""
    ended_and_delivered(db, "r")
    later = an_hour_from_now(db)
    producer = connect(autocommit=False)
    call(producer, "append_events", run_id="r", events=[{"type": "late"}])
    assert scalar(connect(), "purge_runs", finished_before=later) == 0
    producer.commit()
    assert scalar(connect(), "purge_runs", finished_before=later) == 0
    assert scalar(connect(), "purge_runs", finished_before=later, include_undelivered=True) == 1


def test_a_purge_of_undelivered_runs_takes_their_lanes_before_their_events(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A relay takes a lane, then its events (custody order). A purge with
    include_undelivered deletes a run's events and lanes: it takes the lanes
    first, so it waits behind a relay holding the lane, the relay writes the
    lane's events (an acknowledgement) and commits, and the purge goes through.
    Deleting the events first would hold them while waiting for the lane,
    and the relay's acknowledgement would close a cycle (40P01)."""
    relay, ids, pending = purge_behind_a_relay(db, connect, "u")
    call(relay, "ack_ledger", relay="r1", run_id="u", event_ids=ids)
    relay.commit()
    assert pending.result(timeout=10) == 1
    assert db.execute("SELECT count(*) FROM runrelay.runs WHERE run_id = 'u'").fetchone() == (0,)
    check_ledger_gone(db, "u")


def test_a_purge_deletes_a_lane_a_relay_renewed_while_the_purge_waited(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A relay renews its lease (an update of the lane row) while a purge
    waits for that lane: the purge deletes the lane's new row version too,
    and leaves no lane behind its deleted run."""
    relay, ids, pending = purge_behind_a_relay(db, connect, "u")
    renewed = call(relay, "renew_ledger_lease", relay="r1", event_ids=ids)
    assert sorted(r["event_id"] for r in renewed) == sorted(ids)
    relay.commit()
    assert pending.result(timeout=10) == 1
    check_ledger_gone(db, "u")
