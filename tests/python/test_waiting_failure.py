"""The typed-wait failure protocol against concurrent signals and cancels."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from sqlapi import call, claim_one, enqueue, events, fenced, run_row, scalar

Connect = Callable[..., psycopg.Connection]
WAIT = {"kind": "event", "name": "approve"}


def _waiting(db: psycopg.Connection, run_id: str, max_attempts: int = 1) -> dict[str, Any]:
    enqueue(db, run_id, max_attempts=max_attempts, queue=run_id)
    claim = claim_one(db, queues=[run_id])
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=WAIT) == "waiting"
    return claim


def test_prepare_then_protected_failure_applies(db: psycopg.Connection) -> None:
    claim = _waiting(db, "r1")
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    assert run_row(db, "r1")["wait"] == WAIT  # never cleared by preparing
    assert "run.resumed" not in events(db, "r1")
    outcome = scalar(
        db,
        "fail_attempt",
        **fenced(claim),
        error={"why": "rejected"},
        protect_waiting_suspension=True,
    )
    assert outcome == "failed"
    assert run_row(db, "r1")["status"] == "failed"
    assert events(db, "r1") == ["run.queued", "run.started", "run.waiting", "run.failed"]


def test_signal_after_prepare_wins_and_failure_is_fenced(db: psycopg.Connection) -> None:
    claim = _waiting(db, "r1")
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    assert scalar(db, "signal_run", run_id="r1", name="approve", payload={"ok": True}) == "resumed"
    outcome = scalar(
        db, "fail_attempt", **fenced(claim), error={"e": 1}, protect_waiting_suspension=True
    )
    assert outcome == "fence_lost"
    run = run_row(db, "r1")
    assert run["status"] == "queued"
    assert run["resume"] == {"name": "approve", "payload": {"ok": True}}


def test_cancel_after_prepare_wins(db: psycopg.Connection) -> None:
    claim = _waiting(db, "r1")
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    assert scalar(db, "cancel_run", run_id="r1") == "cancelled"
    outcome = scalar(
        db, "fail_attempt", **fenced(claim), error={"e": 1}, protect_waiting_suspension=True
    )
    assert outcome == "cancelled"
    assert run_row(db, "r1")["status"] == "cancelled"


def test_prepare_is_not_applicable_to_running_or_detached(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "not_applicable"
    detached = {"kind": "detached_runner", "runner": "lambda"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=detached) == "waiting"
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "not_applicable"


def _race(
    connect: Connect,
    first: Callable[[psycopg.Connection], str],
    second: Callable[[psycopg.Connection], str],
) -> tuple[str, str]:
    a, b = connect(), connect()
    start = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(lambda: (start.wait(), first(a))[1])
        fb = pool.submit(lambda: (start.wait(), second(b))[1])
        return fa.result(timeout=10), fb.result(timeout=10)


def test_protected_failure_races_signal(db: psycopg.Connection, connect: Connect) -> None:
    """Exactly one of them takes effect, whichever gets the locks first."""
    winners: set[str] = set()
    for i in range(40):
        run_id = f"r{i}"
        claim = _waiting(db, run_id)
        assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
        fail, signal = _race(
            connect,
            lambda c, cl=claim: scalar(
                c, "fail_attempt", **fenced(cl), error={"e": 1}, protect_waiting_suspension=True
            ),
            lambda c, r=run_id: scalar(c, "signal_run", run_id=r, name="approve"),
        )
        status = run_row(db, run_id)["status"]
        if fail == "failed":
            assert signal == "terminal" and status == "failed"
            winners.add("fail")
        else:
            assert (fail, signal, status) == ("fence_lost", "resumed", "queued")
            winners.add("signal")
        types = events(db, run_id)
        assert types.count("run.failed") + types.count("run.resumed") == 1
    assert winners  # at least one winner kind; both usually appear


def test_protected_failure_races_cancel(db: psycopg.Connection, connect: Connect) -> None:
    for i in range(40):
        run_id = f"c{i}"
        claim = _waiting(db, run_id)
        assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
        fail, cancel = _race(
            connect,
            lambda c, cl=claim: scalar(
                c, "fail_attempt", **fenced(cl), error={"e": 1}, protect_waiting_suspension=True
            ),
            lambda c, r=run_id: scalar(c, "cancel_run", run_id=r),
        )
        status = run_row(db, run_id)["status"]
        if fail == "failed":
            assert status == "failed" and cancel in {"already_terminal", "cancel_requested"}
        else:
            assert fail == "cancelled" and status == "cancelled"
        types = events(db, run_id)
        assert types.count("run.failed") + types.count("run.cancelled") == 1
    # Nothing may be left half-done: no live attempt on an ended run.
    live = db.execute(
        "SELECT count(*) FROM runrelay.attempts a JOIN runrelay.runs r USING (run_id)"
        " WHERE a.status IN ('running', 'waiting') AND r.finished_at IS NOT NULL"
    ).fetchone()
    assert live == (0,)
    assert call(db, "reap_expired") == []


def test_protected_failure_after_timeout_loses_to_the_timeout(db: psycopg.Connection) -> None:
    """Past timeout_at the suspension is over even before a claim woke it: the
    protected failure is fenced and the next attempt sees the timeout."""
    enqueue(db, "t1", queue="t1")
    claim = claim_one(db, queues=["t1"])
    wait = {"kind": "event", "name": "approve", "timeout_at": "2000-01-01T00:00:00Z"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    outcome = scalar(
        db, "fail_attempt", **fenced(claim), error={"e": 1}, protect_waiting_suspension=True
    )
    assert outcome == "fence_lost"
    nxt = claim_one(db, queues=["t1"])
    assert (nxt["attempt"], nxt["resume"]) == (2, {"timed_out": True})
