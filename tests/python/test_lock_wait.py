"""The lock-wait bound: a function waits for a lock at most 10 s, or less when
the caller's own lock_timeout is tighter (55P03, nothing written), and the
caller's lock_timeout is the same after the call as before it.

Each case holds the lock the function needs in a barrier session (an open
transaction) and calls the function from a session whose lock_timeout is
200 ms and whose statement_timeout is 3 s. A function that honoured only its
own 10 s bound would end in 57014 (statement_timeout); one that honours the
caller's ends in 55P03. No timing is asserted: the SQLSTATE tells them apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors

from sqlapi import (
    backend_pid,
    call,
    claim_one,
    enqueue,
    fenced,
    scalar,
    table_checksum,
    wait_until_blocked,
)

Connect = Callable[..., psycopg.Connection]
RUN_ROW = "SELECT 1 FROM runrelay.runs WHERE run_id = 'r1' FOR UPDATE"
LANE_ROW = "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = 'r1' FOR UPDATE"
RESTORED = "PERFORM _restore_lock_wait(v_caller_lock_timeout);"
TIGHT = "-c lock_timeout=200ms -c statement_timeout=3s"


def _item(claim: dict[str, Any]) -> dict[str, Any]:
    """One complete_attempts item (JSON: the token as text)."""
    return {**fenced(claim), "lease_token": str(claim["lease_token"]), "result": {}}


def _ids(claim: dict[str, Any]) -> list[int]:
    return [claim["event_id"]]


def _setup(db: psycopg.Connection) -> dict[str, Any]:
    """r1 claimed by w1 (fence returned), with its lifecycle head leased to relay R."""
    enqueue(db, "r1")
    claim = claim_one(db, worker="w1")
    (head,) = call(db, "claim_ledger", relay="R", run_id="r1")
    claim["event_id"] = head["event_id"]
    return claim


# (function, the lock the barrier holds, the call's arguments from the setup)
CASES: list[tuple[str, str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("heartbeat", RUN_ROW, lambda c: fenced(c)),
    ("record_step", RUN_ROW, lambda c: {**fenced(c), "step": "s", "result": {"r": 1}}),
    ("complete_attempt", RUN_ROW, lambda c: {**fenced(c), "result": {"ok": 1}}),
    ("complete_attempts", RUN_ROW, lambda c: {"items": [_item(c)]}),
    (
        "settle_and_claim",
        RUN_ROW,
        lambda c: {
            "items": [
                {**fenced(c), "lease_token": str(c["lease_token"]), "op": "fail", "error": {}}
            ],
            "worker": "w1",
        },
    ),
    ("fail_attempt", RUN_ROW, lambda c: {**fenced(c), "error": {"e": 1}}),
    ("release_attempt", RUN_ROW, lambda c: fenced(c)),
    ("prepare_waiting_failure", RUN_ROW, lambda c: fenced(c)),
    ("suspend_attempt", RUN_ROW, lambda c: {**fenced(c), "wait": {"kind": "event", "name": "go"}}),
    ("signal_run", RUN_ROW, lambda c: {"run_id": "r1", "name": "go"}),
    ("append_events", RUN_ROW, lambda c: {"run_id": "r1", "events": [{"type": "x"}]}),
    ("ack_ledger", LANE_ROW, lambda c: {"relay": "R", "run_id": "r1", "event_ids": _ids(c)}),
    ("renew_ledger_lease", LANE_ROW, lambda c: {"relay": "R", "event_ids": _ids(c)}),
    ("fail_ledger", LANE_ROW, lambda c: {"relay": "R", "event_ids": _ids(c), "error": {}}),
    ("release_ledger", LANE_ROW, lambda c: {"relay": "R", "event_ids": _ids(c)}),
    ("requeue_ledger_event", LANE_ROW, lambda c: {"event_id": c["event_id"]}),
    ("claim_ledger", LANE_ROW, lambda c: {"relay": "Q", "run_id": "r1", "wait_for_run": True}),
]


@pytest.mark.parametrize(("function", "lock", "args"), CASES, ids=[c[0] for c in CASES])
def test_a_callers_tighter_lock_timeout_is_honoured(
    db: psycopg.Connection,
    connect: Connect,
    function: str,
    lock: str,
    args: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    claim = _setup(db)
    barrier = connect(autocommit=False)
    barrier.execute(lock)
    before = table_checksum(db)
    caller = connect(options=TIGHT)
    with pytest.raises(errors.LockNotAvailable):
        call(caller, function, **args(claim))
    assert table_checksum(db) == before, "a call that timed out wrote something"
    barrier.rollback()
    call(caller, function, **args(claim))  # the lock is free: the same call goes through


def test_a_looser_caller_is_bounded_at_ten_seconds(
    db: psycopg.Connection, connect: Connect
) -> None:
    """No lock_timeout (0) and a longer one (1 min) both end at the function's
    own bound, well before a 20 s statement_timeout. Each waits for its own
    run: two waiters queued on one row would each wait out a bound per lock
    in the queue (tuple lock, then the holder's transaction)."""
    enqueue(db, "r1")
    enqueue(db, "r2")
    claims = call(db, "claim_attempts", worker="w1", max_runs=2)
    barrier = connect(autocommit=False)
    barrier.execute("SELECT 1 FROM runrelay.runs FOR UPDATE")

    def wait(lock_timeout: str, claim: dict[str, Any]) -> BaseException | None:
        caller = connect(options=f"-c lock_timeout={lock_timeout} -c statement_timeout=20s")
        try:
            call(caller, "heartbeat", **fenced(claim))
        except psycopg.Error as exc:
            return exc
        return None

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(wait, ["0", "1min"], claims))
    barrier.rollback()
    assert [type(r) for r in results] == [errors.LockNotAvailable] * 2


@pytest.mark.parametrize("setting", ["0", "200ms", "1min"])
def test_the_callers_lock_timeout_is_unchanged_after_every_outcome(
    db: psycopg.Connection, connect: Connect, setting: str
) -> None:
    """Inside one transaction, after each call and whatever it answered, the
    caller's lock_timeout is what the caller set."""
    conn = connect(autocommit=False)
    conn.execute(f"SET lock_timeout = '{setting}'")

    def checked(function: str, **kwargs: Any) -> list[dict[str, Any]]:
        rows = call(conn, function, **kwargs)
        shown = conn.execute("SHOW lock_timeout").fetchone()
        assert shown is not None and shown[0] == setting, (function, rows)
        return rows

    checked("enqueue_run", run_id="a")
    checked("enqueue_run", run_id="a")  # duplicate
    checked("enqueue_run", run_id="b")
    checked("cancel_run", run_id="b")
    checked("cancel_run", run_id="b")  # already terminal
    checked("cancel_run", run_id="missing")
    (claim,) = checked("claim_attempts", worker="w1")
    checked("claim_attempts", worker="w1")  # nothing to claim
    stale = {**fenced(claim), "lease_token": "00000000-0000-0000-0000-000000000000"}
    for function in ("heartbeat", "release_attempt", "prepare_waiting_failure"):
        checked(function, **stale)  # fence_lost
    checked("heartbeat", **fenced(claim))
    checked("signal_run", run_id="a", name="go")
    checked("signal_run", run_id="missing", name="go")
    checked("append_events", run_id="a", events=[{"type": "x", "transport_only": True}])
    checked("suspend_attempt", **fenced(claim), wait={"kind": "event", "name": "go"})  # resumed
    (claim,) = checked("claim_attempts", worker="w1")
    checked("suspend_attempt", **fenced(claim), wait={"kind": "detached_runner", "runner": "g"})
    checked("record_runner_terminal", run_id="a", attempt=claim["attempt"], result={"o": 1})
    checked("claim_detached_terminal", **fenced(claim))
    checked("claim_detached_terminal", **fenced(claim))  # replay
    (now,) = conn.execute("SELECT now()").fetchone() or (None,)
    checked("fail_attempt", **fenced(claim), error={"e": 1}, retry_at=now)
    (claim,) = checked("claim_attempts", worker="w1")
    checked("complete_attempts", items=[_item(claim)])
    checked("complete_attempt", **fenced(claim), result={})  # replay
    checked("settle_and_claim", items=[_item(claim)], worker="w1")  # replay, then a claim
    checked("settle_and_claim", items=[], worker="w1", max_runs=0)
    claimed = checked("claim_ledger", relay="R", run_id="a", max_events=1)
    ids = [r["event_id"] for r in claimed]
    checked("renew_ledger_lease", relay="R", event_ids=ids)
    checked("fail_ledger", relay="R", event_ids=ids, error={})
    checked("requeue_ledger_event", event_id=ids[0])
    checked("requeue_ledger_event", event_id=-1)
    claimed = checked("claim_ledger", relay="R", run_id="a", max_events=1)
    checked("release_ledger", relay="R", event_ids=[r["event_id"] for r in claimed])
    claimed = checked("claim_ledger", relay="R", run_id="a", max_events=1)
    checked("ack_ledger", relay="R", run_id="a", event_ids=[r["event_id"] for r in claimed])
    checked("reap_expired")
    checked("prune", delivered_before="2000-01-01")
    # The admin functions that write, on every outcome they can give here.
    checked("cancel_run", run_id="a")
    checked("retry_run", run_id="a")
    checked("retry_run", run_id="a")  # not_retryable
    checked("retry_run", run_id="missing")
    claimed = checked("claim_ledger", relay="R2", run_id="a", max_events=1)
    ids = [r["event_id"] for r in claimed]
    checked("fail_ledger", relay="R2", event_ids=ids, error={}, permanent=True)
    checked("requeue_blocked_heads", run_id="a")
    checked("requeue_blocked_heads", run_id="a")  # nothing blocked
    claimed = checked("claim_ledger", relay="R2", run_id="a", max_events=1)
    ids = [r["event_id"] for r in claimed]
    checked("fail_ledger", relay="R2", event_ids=ids, error={}, permanent=True)
    assert checked("skip_ledger_events", run_id="a", lane="lifecycle", reason="r")
    checked("skip_ledger_events", run_id="a", lane="lifecycle", reason="r")  # not_blocked
    checked("list_processes")
    checked("pause_queue", queue="default")
    checked("pause_queue", queue="default")  # already_paused
    checked("resume_queue", queue="default")
    checked("resume_queue", queue="default")  # not_paused
    checked("purge_runs", finished_before="2000-01-01")  # nothing ended then
    checked("purge_runs", finished_before="2100-01-01", include_undelivered=True)
    checked("upsert_schedule", name="tick", cron="* * * * *")
    checked("upsert_schedule", name="tick", cron="* * * * *")  # unchanged
    checked("upsert_schedule", name="tick", cron="*/2 * * * *")  # updated
    checked("enqueue_due_schedules")  # nothing due
    conn.execute("SELECT set_config('runrelay.clock_offset', '1 hour', true)")
    assert checked("enqueue_due_schedules")  # a slot due an hour on
    conn.execute("SELECT set_config('runrelay.clock_offset', '', true)")
    checked("delete_schedule", name="tick")
    checked("delete_schedule", name="tick")  # not_found
    assert checked("record_queue_activity")  # the last hour's minutes
    checked("record_queue_activity")  # none due: answers 0
    checked("queue_overview")
    checked("ledger_overview")
    conn.rollback()


def test_every_writing_function_restores_the_callers_lock_timeout_on_every_exit(
    db: psycopg.Connection,
) -> None:
    """Structural guard for the paths the scenario above cannot reach: every
    public function that bounds its lock waits passes each result back through
    _restore_lock_wait (a plain RETURN would leave the bound set for the rest
    of the caller's transaction)."""
    rows = db.execute(
        """
        SELECT p.proname, p.prosrc, p.proretset
        FROM pg_proc AS p
        WHERE p.pronamespace = 'runrelay'::regnamespace AND p.proname !~ '^_'
          AND p.prokind = 'f'
          AND p.prolang = (SELECT l.oid FROM pg_language AS l WHERE l.lanname = 'plpgsql')
        """
    ).fetchall()
    bounded = [(name, src, setof) for name, src, setof in rows if "_bound_lock_wait()" in src]
    unbounded = sorted(name for name, src, _ in rows if "_bound_lock_wait()" not in src)
    # The readers never wait for a lock.
    readers = {
        "get_schema_version",
        "ledger_next_due_at",
        "read_runner_terminal",
        # the admin functions that only read (docs/admin.md)
        "list_runs",
        "get_run",
        "run_attempts",
        "run_steps",
        "run_ledger_events",
        "list_blocked_heads",
        "list_paused_queues",
        # a run's trace context, for tracing workers and relays
        "run_trace_context",
        "list_schedules",
        "schedules_next_due_at",
        # the overview (docs/admin.md)
        "queue_overview",
        "ledger_overview",
        # live processes (docs/admin.md)
        "list_processes",
    }
    assert set(unbounded) <= readers, unbounded
    for name, src, setof in bounded:
        body = re.sub(r"--[^\n]*", "", src)
        for match in re.finditer(r"\bRETURN\b(?!\s+(NEXT|QUERY)\b)(.*)", body):
            rest = match.group(2).strip()
            if rest.startswith(";"):
                before = body[: match.start()].rstrip()
                assert before.endswith(RESTORED), name
            else:
                assert rest.startswith("_restore_lock_wait(v_caller_lock_timeout,"), (name, rest)
        if setof:
            tail = body.rstrip().removesuffix("END;").rstrip()
            assert tail.endswith((RESTORED, "RETURN;")), name
    assert len(bounded) >= 22


def _waiting_on_event(db: psycopg.Connection) -> dict[str, Any]:
    enqueue(db, "r1")
    claim = claim_one(db, worker="w1")
    wait = {"kind": "event", "name": "go"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    return claim


def _pushed_detached_terminal(db: psycopg.Connection) -> dict[str, Any]:
    enqueue(db, "r1")
    claim = claim_one(db, worker="w1")
    wait = {"kind": "detached_runner", "runner": "gpu"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    pushed = scalar(db, "record_runner_terminal", run_id="r1", attempt=1, result={"ok": 1})
    assert pushed == "recorded"
    return claim


@pytest.mark.parametrize(
    ("function", "setup"),
    [
        ("prepare_waiting_failure", _waiting_on_event),
        ("claim_detached_terminal", _pushed_detached_terminal),
    ],
)
def test_a_lease_granted_after_a_run_lock_wait_runs_from_the_grant(
    db: psycopg.Connection,
    connect: Connect,
    function: str,
    setup: Callable[[psycopg.Connection], dict[str, Any]],
) -> None:
    """prepare_waiting_failure and claim_detached_terminal hand a waiting
    attempt a fresh 30 s lease. A call that queued behind a session holding
    the run row must grant it from the moment it got the lock, not from the
    start of its statement, or its holder would start with the lease short by
    the time it waited. All times compared are the database clock's."""
    claim = setup(db)
    holder = connect(autocommit=False)
    holder.execute(RUN_ROW)
    waiter = connect()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(scalar, waiter, function, **fenced(claim))
        wait_until_blocked(db, backend_pid(waiter))
        # The waiter's statement began before this moment; its lock comes after.
        row = holder.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        released = row[0]
        holder.commit()
        answer = pending.result(timeout=10)
    assert answer in ("prepared", True), answer
    lease = db.execute(
        "SELECT status, heartbeat_at, lease_expires_at FROM runrelay.attempts"
        " WHERE run_id = 'r1' AND attempt = 1"
    ).fetchone()
    assert lease is not None
    status, granted_at, expires = lease
    assert status == "running"
    assert granted_at >= released, (granted_at, released)
    assert expires == granted_at + timedelta(seconds=30), lease
