"""Every lock runrelay serialises on is a row only runrelay's functions can
lock (docs/security.md#locks-no-other-login-can-take): a concurrency key's row, a call_id's row, the
queue-activity watermark. A login without a runrelay role, or with only the
producer role, can neither take nor block them; holding what it can (the
advisory lock ids the engine once used, which any login may take) stalls no
writer.

"Proceeds without waiting" is proved with the caller's lock_timeout: the
caller sets 100 ms, which the functions keep (it is tighter than their
10 s bound), so a call that had to wait for the hostile session would fail
with 55P03 instead of answering.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import alembic, create_database, drop_database
from sqlapi import (
    backend_pid,
    call,
    claim_one,
    enqueue,
    fenced,
    run_row,
    scalar,
    wait_until_blocked,
)

Connect = Callable[..., psycopg.Connection]

NO_WAIT = "-c lock_timeout=100ms -c statement_timeout=20s"

# The advisory lock ids runrelay used before: anyone who knows the schema
# name and the key (or reads pg_locks) can compute them.
OLD_KEY_LOCK = "SELECT pg_advisory_lock(hashtextextended('runrelay/' || %s, 0))"
OLD_CALL_LOCK = "SELECT pg_advisory_lock(hashtext('runrelay/call_id'), hashtext(%s::text))"
OLD_ROLLUP_LOCK = "SELECT pg_advisory_lock(hashtext('runrelay/queue_activity'), 0)"

MARK = (
    "INSERT INTO runrelay.cancellations (run_id, reason, requested_at) VALUES (%s, 'stop', now())"
)

LOCK_TABLES = ("concurrency_keys", "call_locks", "queue_activity_watermark")


@pytest.fixture(params=["no_role", "producer"])
def hostile(request: pytest.FixtureRequest, db: psycopg.Connection, db_url: str) -> Iterator[str]:
    """A fresh LOGIN role with USAGE on the schema (so nothing but the tables'
    own ACLs stands in its way) and either no runrelay role or the producer's."""
    role = f"rr_hostile_{os.getpid()}"
    ident = sql.Identifier(role)
    db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA runrelay TO {}").format(ident))
    if request.param == "producer":
        db.execute(sql.SQL("GRANT runrelay_producer TO {}").format(ident))
    conninfo = psycopg.conninfo.conninfo_to_dict(db_url)
    conninfo["user"] = role
    conninfo.pop("password", None)
    try:
        yield psycopg.conninfo.make_conninfo(**conninfo)
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        db.execute(sql.SQL("DROP ROLE {}").format(ident))


@pytest.mark.parametrize("table", LOCK_TABLES)
@pytest.mark.parametrize(
    "statement",
    [
        "SELECT FROM runrelay.{} FOR UPDATE",
        "SELECT FROM runrelay.{} FOR KEY SHARE",
        "LOCK TABLE runrelay.{} IN ACCESS SHARE MODE",
        "LOCK TABLE runrelay.{} IN ACCESS EXCLUSIVE MODE",
    ],
    ids=["for-update", "for-key-share", "lock-share", "lock-exclusive"],
)
def test_a_login_without_a_runrelay_role_cannot_lock_the_lock_rows(
    db: psycopg.Connection, hostile: str, table: str, statement: str
) -> None:
    """Row locks and table locks on the tables runrelay serialises on are
    refused with 42501 to a login with no runrelay role or only the producer's."""
    enqueue(db, "k1", concurrency_key="acct-1")
    scalar(db, "record_queue_activity")
    refused = pytest.raises(psycopg.errors.InsufficientPrivilege)
    with psycopg.connect(hostile) as conn, refused:
        conn.execute(sql.SQL(statement).format(sql.Identifier(table)))  # type: ignore[arg-type]


def _keyed_running(db: psycopg.Connection) -> dict[str, Any]:
    """k1 of key acct-1, claimed (its attempt running); returns the claim."""
    enqueue(db, "k1", concurrency_key="acct-1")
    return claim_one(db, worker="w1")


def test_holding_the_old_key_lock_stalls_no_writer_of_the_key(
    db: psycopg.Connection, connect: Connect, hostile: str
) -> None:
    """With a hostile session holding the key's advisory lock id, enqueue_run
    of that key and complete_attempt of its running run answer at once, and
    the key stays serial: the second run is held until the first ends."""
    claim = _keyed_running(db)
    with psycopg.connect(hostile, autocommit=True) as bad:
        bad.execute(OLD_KEY_LOCK, ["acct-1"])
        caller = connect(options=NO_WAIT)
        created = enqueue(caller, "k2", concurrency_key="acct-1")
        assert created["created"] is True
        assert run_row(db, "k2")["key_held"] is True
        assert scalar(caller, "complete_attempt", **fenced(claim), result={"ok": 1}) == "completed"
        assert run_row(db, "k2")["key_held"] is False


def test_holding_the_old_call_id_lock_stalls_no_call_with_that_id(
    db: psycopg.Connection, connect: Connect, hostile: str
) -> None:
    """signal_run and retry_run with a call_id answer at once while a hostile
    session holds that call_id's advisory lock id."""
    enqueue(db, "f1", max_attempts=1)
    failed = claim_one(db, worker="w1")
    call(db, "fail_attempt", **fenced(failed), error={"e": 1})
    enqueue(db, "s1")
    signal_id, retry_id = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(hostile, autocommit=True) as bad:
        bad.execute(OLD_CALL_LOCK, [signal_id])
        bad.execute(OLD_CALL_LOCK, [retry_id])
        caller = connect(options=NO_WAIT)
        assert scalar(caller, "signal_run", run_id="s1", name="go", call_id=signal_id) == "stored"
        assert scalar(caller, "signal_run", run_id="s1", name="go", call_id=signal_id) == "stored"
        assert scalar(caller, "retry_run", run_id=failed["run_id"], call_id=retry_id) == "retried"


def test_holding_the_old_rollup_lock_does_not_stop_the_rollup(
    db: psycopg.Connection, connect: Connect, hostile: str
) -> None:
    """record_queue_activity finalizes the last hour while a hostile session
    holds the rollup's old advisory lock id (it used to answer 0 for as long
    as that lock was held)."""
    with psycopg.connect(hostile, autocommit=True) as bad:
        bad.execute(OLD_ROLLUP_LOCK)
        caller = connect(options=NO_WAIT)
        assert scalar(caller, "record_queue_activity") > 0


def test_a_key_row_deleted_by_hand_makes_no_claim_skip_its_run(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A keyed run whose key row is missing is still claimed, and one with a
    cancel marker is still cancelled by the claim (the try-lock creates the
    row instead of answering busy)."""
    enqueue(db, "c1", concurrency_key="acct-c")
    enqueue(db, "c2", concurrency_key="acct-d")
    db.execute(MARK, ["c2"])
    db.execute("DELETE FROM runrelay.concurrency_keys")
    claimed = call(db, "claim_attempts", worker="w1", max_runs=10)
    assert [c["run_id"] for c in claimed] == ["c1"]
    assert run_row(db, "c2")["status"] == "cancelled"
    assert db.execute("SELECT key FROM runrelay.concurrency_keys ORDER BY key").fetchall() == [
        ("acct-d",)
    ]


def test_a_busy_key_row_is_skipped_by_a_claim_without_waiting(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A claim that meets a cancel marker on a run whose key row another
    session holds leaves the run queued with its marker and answers at once."""
    enqueue(db, "c1", concurrency_key="acct-c")
    db.execute(MARK, ["c1"])
    holder = connect(autocommit=False)
    holder.execute("SELECT FROM runrelay.concurrency_keys WHERE key = 'acct-c' FOR UPDATE")
    caller = connect(options=NO_WAIT)
    assert call(caller, "claim_attempts", worker="w1") == []
    assert run_row(db, "c1")["status"] == "queued"
    holder.rollback()
    assert call(caller, "claim_attempts", worker="w1") == []
    assert run_row(db, "c1")["status"] == "cancelled"


def test_the_upgrade_gives_every_key_in_runs_its_row(connect: Connect) -> None:
    """An install at 0008 with keyed runs upgrades to 0009 with a row for each
    of their keys, so a try-lock on an existing run's key finds the row (busy
    here: cancel_run answers cancel_requested without waiting) rather than
    creating one; a downgrade drops the lock tables and a new upgrade works."""
    name = f"rr_lock_rows_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "0008")
        with psycopg.connect(url, autocommit=True) as c:
            for run_id, key in (("a1", "k1"), ("a2", "k1"), ("b1", "k2"), ("n1", None)):
                c.execute(
                    "SELECT runrelay.enqueue_run(%s, 'q', concurrency_key => %s)", [run_id, key]
                )
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            keys = c.execute("SELECT key FROM runrelay.concurrency_keys ORDER BY key").fetchall()
            assert keys == [("k1",), ("k2",)]
            with psycopg.connect(url) as holder:
                holder.execute("SELECT FROM runrelay.concurrency_keys WHERE key = 'k1' FOR UPDATE")
                with psycopg.connect(url, autocommit=True, options=NO_WAIT) as caller:
                    answer = caller.execute("SELECT runrelay.cancel_run('a1')").fetchone()
                    assert answer == ("cancel_requested",)
        alembic(url, "downgrade", "0008")
        with psycopg.connect(url, autocommit=True) as c:
            gone = c.execute(
                "SELECT to_regclass('runrelay.concurrency_keys'),"
                " to_regclass('runrelay.call_locks')"
            ).fetchone()
            assert gone == (None, None)
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            keys = c.execute("SELECT key FROM runrelay.concurrency_keys ORDER BY key").fetchall()
            assert keys == [("k1",), ("k2",)]
    finally:
        drop_database(name)


def test_a_batch_takes_its_key_rows_in_key_order_collate_c(
    db: psycopg.Connection, connect: Connect
) -> None:
    """complete_attempts locks its runs' key rows ascending by key COLLATE "C"
    (custody step 1), whatever the items' order: with 'B-key' held elsewhere,
    a batch of ['a-key' run, 'B-key' run] waits on 'B-key' while holding
    nothing, so 'a-key' stays free ('B' sorts before 'a' in "C", after it in
    most linguistic collations)."""
    enqueue(db, "ra", concurrency_key="a-key")
    enqueue(db, "rb", concurrency_key="B-key")
    claims = {c["run_id"]: c for c in call(db, "claim_attempts", worker="w1", max_runs=2)}
    holder = connect(autocommit=False)
    holder.execute("SELECT FROM runrelay.concurrency_keys WHERE key = 'B-key' FOR UPDATE")
    batch = connect()
    out: list[Any] = []

    def complete() -> None:
        items = [
            {**fenced(claims[r]), "lease_token": str(claims[r]["lease_token"])}
            for r in ("ra", "rb")
        ]
        out.append(call(batch, "complete_attempts", items=items))

    thread = threading.Thread(target=complete)
    thread.start()
    wait_until_blocked(db, backend_pid(batch))
    probe = connect(autocommit=False)
    probe.execute("SELECT FROM runrelay.concurrency_keys WHERE key = 'a-key' FOR UPDATE NOWAIT")
    probe.rollback()
    holder.rollback()
    thread.join(30)
    assert [r["outcome"] for r in out[0]] == ["completed", "completed"]
