"""A lease runs from the moment it is granted, not from the statement's start.

settle_and_claim settles first and claims after; a settlement may wait for a
run's lock up to the lock bound. The leases its claim grants must still be
whole: a barrier session holds the run the call settles for longer than the
lease, then releases it. The wait is forced on the database clock (the
holder commits once clock_timestamp() has passed the waiter's query start
plus the wait), and the answer is compared with that clock, not timed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import psycopg

from lifecycle import check_database
from sqlapi import backend_pid, call, claim_one, enqueue, fenced, in_thread, wait_until_blocked

Connect = Callable[..., psycopg.Connection]

LEASE = timedelta(seconds=5)  # the shortest lease _lease grants
WAIT = timedelta(seconds=5.5)  # longer than the lease, under the 10 s lock bound


def test_settle_and_claim_grants_a_whole_lease_after_waiting_for_a_settlement(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The call waits 5.5 s for the run it settles, then claims the next run
    with a 5 s lease: the lease ends at least 5 s after the wait ended, and
    reap_expired, called at once, leaves it alone."""
    enqueue(db, "a", queue="q")
    enqueue(db, "b", queue="q")
    held = claim_one(db, queues=["q"], max_runs=1)
    assert held["run_id"] == "a"

    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM runrelay.runs WHERE run_id = 'a' FOR UPDATE")
    worker = connect()
    items = [{**fenced(held), "lease_token": str(held["lease_token"])}]
    pending = in_thread(
        lambda: call(
            worker,
            "settle_and_claim",
            items=items,
            worker="w1",
            queues=["q"],
            max_runs=1,
            lease_seconds=int(LEASE.total_seconds()),
        )
    )
    pid = backend_pid(worker)
    wait_until_blocked(db, pid)
    # Hold the run until the database clock is WAIT past the call's start:
    # a lease counted from the statement's start has expired by then.
    holder.execute(
        "SELECT pg_sleep_until(a.query_start + %s) FROM pg_stat_activity AS a WHERE a.pid = %s",
        [WAIT, pid],
    )
    (released,) = holder.execute("SELECT clock_timestamp()").fetchone()
    holder.commit()

    rows = pending.result(timeout=30)
    assert [(r["kind"], r["run_id"], r["outcome"]) for r in rows] == [
        ("settled", "a", "completed"),
        ("claimed", "b", None),
    ]
    claimed = rows[1]
    assert claimed["lease_expires_at"] >= released + LEASE
    (stored,) = db.execute(
        "SELECT lease_expires_at FROM runrelay.attempts WHERE run_id = 'b' AND attempt = 1"
    ).fetchone()
    assert stored == claimed["lease_expires_at"]

    assert call(db, "reap_expired") == []
    assert db.execute("SELECT status FROM runrelay.runs WHERE run_id = 'b'").fetchone() == (
        "running",
    )
    check_database(db)
