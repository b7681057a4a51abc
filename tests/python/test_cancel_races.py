"""Cancellation is never lost, and is terminal at once when the locks are free.

Races use real sessions: a barrier session holds the run's row lock, the
competitors queue behind it (confirmed through pg_stat_activity), then the
barrier releases.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from sqlapi import (
    call,
    claim_one,
    enqueue,
    events,
    fenced,
    in_thread,
    queued_behind_lock,
    run_row,
    scalar,
)

Connect = Callable[..., psycopg.Connection]
Call = Callable[[psycopg.Connection], str]


def _hold_run_lock(connect: Connect, run_id: str) -> psycopg.Connection:
    barrier = connect(autocommit=False)
    barrier.execute("SELECT 1 FROM runrelay.runs WHERE run_id = %s FOR UPDATE", [run_id])
    return barrier


def _complete_and_cancel(claim: dict[str, Any]) -> tuple[Call, Call]:
    """complete_attempt and cancel_run of the claimed run, each to be started
    on a thread of its own: neither goes before both have started."""
    start = threading.Barrier(2)

    def complete(conn: psycopg.Connection) -> str:
        start.wait()
        return str(scalar(conn, "complete_attempt", **fenced(claim)))

    def cancel(conn: psycopg.Connection) -> str:
        start.wait()
        return str(scalar(conn, "cancel_run", run_id=claim["run_id"]))

    return complete, cancel


def test_cancel_with_free_locks_is_terminal_at_once(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    assert scalar(db, "cancel_run", run_id="r1", reason="user asked") == "cancelled"
    run = run_row(db, "r1")
    assert run["status"] == "cancelled" and run["finished_at"] is not None
    status = db.execute("SELECT status FROM runrelay.attempts WHERE run_id = 'r1'").fetchone()
    assert status == ("cancelled",)
    hb = call(db, "heartbeat", **fenced(claim))[0]
    assert hb["outcome"] == "cancelled"
    assert scalar(db, "complete_attempt", **fenced(claim)) == "cancelled"
    assert scalar(db, "fail_attempt", **fenced(claim), error={"x": 1}) == "cancelled"
    assert events(db, "r1") == ["run.queued", "run.started", "run.cancelled"]
    assert scalar(db, "cancel_run", run_id="r1") == "already_terminal"


def test_marker_written_while_writer_waits_wins(db: psycopg.Connection, connect: Connect) -> None:
    """Barrier holds the lock; the writer queues; cancel gets cancel_requested;
    the writer, once through, sees the marker and answers cancelled."""
    enqueue(db, "r1")
    claim = claim_one(db)
    barrier = _hold_run_lock(connect, "r1")
    pending = queued_behind_lock(
        db, connect(), lambda c: scalar(c, "complete_attempt", **fenced(claim))
    )
    assert scalar(connect(), "cancel_run", run_id="r1") == "cancel_requested"
    barrier.rollback()
    assert pending.result(timeout=10) == "cancelled"
    assert run_row(db, "r1")["status"] == "cancelled"
    assert events(db, "r1")[-1] == "run.cancelled"
    assert "run.completed" not in events(db, "r1")


def test_marker_written_before_writer_arrives_wins(
    db: psycopg.Connection, connect: Connect
) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    barrier = _hold_run_lock(connect, "r1")
    assert scalar(connect(), "cancel_run", run_id="r1") == "cancel_requested"
    pending = queued_behind_lock(
        db, connect(), lambda c: scalar(c, "fail_attempt", **fenced(claim), error={"e": 1})
    )
    barrier.rollback()
    assert pending.result(timeout=10) == "cancelled"
    assert run_row(db, "r1")["status"] == "cancelled"


def test_writer_holding_locks_commits_first_then_cancel_is_already_terminal(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The writer completes inside an open transaction; cancel cannot get the
    locks (cancel_requested); the writer commits: completed, never both."""
    enqueue(db, "r1")
    claim = claim_one(db)
    writer = connect(autocommit=False)
    assert scalar(writer, "complete_attempt", **fenced(claim)) == "completed"
    assert scalar(connect(), "cancel_run", run_id="r1") == "cancel_requested"
    writer.commit()
    assert run_row(db, "r1")["status"] == "completed"
    # The stranded marker is swept by the reaper and never resurrects the run.
    assert call(db, "reap_expired") == []
    assert db.execute("SELECT count(*) FROM runrelay.cancellations").fetchone() == (0,)
    assert scalar(db, "cancel_run", run_id="r1") == "already_terminal"
    assert events(db, "r1").count("run.cancelled") == 0


def test_cancel_requested_on_a_queued_run_is_applied_by_the_next_claim(
    db: psycopg.Connection, connect: Connect
) -> None:
    enqueue(db, "r1")
    barrier = _hold_run_lock(connect, "r1")
    assert scalar(connect(), "cancel_run", run_id="r1") == "cancel_requested"
    barrier.rollback()
    assert call(db, "claim_attempts", worker="w") == []
    assert run_row(db, "r1")["status"] == "cancelled"


def test_cancel_requested_on_a_waiting_run_is_applied_by_the_reaper(
    db: psycopg.Connection, connect: Connect
) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    wait = {"kind": "event", "name": "approve"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    barrier = _hold_run_lock(connect, "r1")
    assert scalar(connect(), "cancel_run", run_id="r1") == "cancel_requested"
    barrier.rollback()
    assert call(db, "reap_expired") == [{"run_id": "r1", "attempt": 1, "outcome": "cancelled"}]
    assert run_row(db, "r1")["status"] == "cancelled"


def test_cancel_and_complete_race_from_both_sides(db: psycopg.Connection, connect: Connect) -> None:
    """Released together from a barrier many times: each run ends exactly one
    way, both orders are observed, and the answers agree with the state."""
    seen: set[str] = set()
    for i in range(30):
        run_id = f"race-{i}"
        enqueue(db, run_id, queue=run_id)
        claim = claim_one(db, queues=[run_id])
        barrier = _hold_run_lock(connect, run_id)
        writer, canceller = connect(), connect()
        complete, cancel = _complete_and_cancel(claim)
        # The cancel first: the complete waits for it at their start.
        f_cancel = in_thread(cancel, canceller)
        f_complete = queued_behind_lock(db, writer, complete)
        cancel_answer = f_cancel.result(timeout=10)
        barrier.rollback()
        complete_answer = f_complete.result(timeout=10)
        status = run_row(db, run_id)["status"]
        types = events(db, run_id)
        if complete_answer == "completed":
            assert status == "completed" and "run.cancelled" not in types
            seen.add("complete_won")
        else:
            assert complete_answer == "cancelled"
            assert status == "cancelled" and "run.completed" not in types
            seen.add("cancel_won")
        assert cancel_answer in {"cancel_requested", "cancelled"}
        for c in (writer, canceller):
            c.close()
    assert "cancel_won" in seen


def test_cancel_vs_complete_without_barrier_both_orders(
    db: psycopg.Connection, connect: Connect
) -> None:
    """No barrier: released together; over many rounds both winners appear."""
    outcomes: set[tuple[str, str]] = set()
    for i in range(60):
        run_id = f"free-{i}"
        enqueue(db, run_id, queue=run_id)
        claim = claim_one(db, queues=[run_id])
        writer, canceller = connect(), connect()
        complete, cancel = _complete_and_cancel(claim)
        f1, f2 = in_thread(complete, writer), in_thread(cancel, canceller)
        a, b = f1.result(timeout=10), f2.result(timeout=10)
        status = run_row(db, run_id)["status"]
        if a == "completed":
            assert status == "completed"
            assert b in {"already_terminal", "cancel_requested"}
        else:
            assert a == "cancelled" and status == "cancelled"
            assert b in {"cancelled", "cancel_requested"}
        outcomes.add((a, status))
        writer.close()
        canceller.close()
    assert {s for _, s in outcomes} <= {"completed", "cancelled"}
