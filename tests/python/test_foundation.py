"""The foundation: schema, constraints, roles, clock, isolation, migrations."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from devtools import sqlsource as _sqlsource
from psycopg import errors

from conftest import alembic, create_database, drop_database
from sqlapi import call, claim_one, enqueue, fenced, scalar

ROLES = ("runrelay_producer", "runrelay_worker", "runrelay_relay", "runrelay_admin")
SET_CLAUSE = {
    "settings": "singleton = true",
    "signals": "name = name",
    "ledger": "lane = lane",
    "ledger_events": "lane = lane",
}
TABLES = ("runs", "attempts", "cancellations", "signals", "ledger", "ledger_events",
          "ledger_lanes", "settings", "calls")  # fmt: skip
# `ledger` is a view joining ledger_events to its lane: not updatable at all,
# so a write fails before any privilege is checked (and would fail for anyone).
VIEWS = ("ledger",)


def insert_run(conn: psycopg.Connection, run_id: str = "r1", **overrides: object) -> None:
    row: dict[str, object] = {
        "run_id": run_id,
        "queue": "default",
        "status": "queued",
        "payload": "{}",
        "run_at": "now",
        "max_attempts": 3,
        "created_at": "now",
        "updated_at": "now",
    }
    row.update(overrides)
    cols = ", ".join(row)
    vals = ", ".join(["%s"] * len(row))
    conn.execute(f"INSERT INTO runrelay.runs ({cols}) VALUES ({vals})", list(row.values()))


def test_tables_have_the_spec_columns(db: psycopg.Connection) -> None:
    spec = {
        "runs": "run_id queue status priority concurrency_key payload run_at max_attempts "
        "attempt_count wait resume result error payload_retention created_at updated_at "
        "finished_at",
        "attempts": "run_id attempt worker lease_token status claimed_at heartbeat_at "
        "lease_expires_at runner_result runner_result_received_at error finished_at",
        "cancellations": "run_id reason requested_at",
        "ledger": "event_id run_id lane seq type payload delivery_key transport_only "
        "created_at lease_owner lease_expires_at batch_id batch_started_at "
        "delivery_attempts next_attempt_at failed_at last_error delivered_at",
    }
    for table, columns in spec.items():
        have = {
            r[0]
            for r in db.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'runrelay' AND table_name = %s",
                [table],
            )
        }
        assert set(columns.split()) <= have, (table, set(columns.split()) - have)


@pytest.mark.parametrize(
    ("overrides", "constraint"),
    [
        ({"status": "done"}, "runs_status"),
        ({"status": "failed"}, "runs_finished_iff_terminal"),
        ({"status": "waiting", "attempt_count": 1}, "runs_wait_iff_waiting"),
        ({"payload_retention": "forever"}, "runs_payload_retention"),
        ({"max_attempts": 0}, "runs_max_attempts"),
        ({"run_id": ""}, "runs_run_id_length"),
        ({"run_id": "x" * 201}, "runs_run_id_length"),
        ({"key_held": True}, "runs_key_held_only_queued"),
        ({"concurrency_key": "k"}, "runs_key_position_iff_key"),
        ({"status": "running"}, "runs_started_has_attempt"),
    ],
)
def test_run_constraints_reject_illegal_rows(
    db: psycopg.Connection, overrides: dict[str, object], constraint: str
) -> None:
    with pytest.raises(errors.CheckViolation) as exc:
        insert_run(db, **overrides)
    assert exc.value.diag.constraint_name == constraint
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)


def test_attempt_and_ledger_constraints(db: psycopg.Connection) -> None:
    insert_run(db)
    with pytest.raises(errors.CheckViolation) as exc:
        db.execute(
            "INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status,"
            " claimed_at) VALUES ('r1', 1, 'w', gen_random_uuid(), 'running', now())"
        )
    assert exc.value.diag.constraint_name == "attempts_running_has_lease"
    with pytest.raises(errors.CheckViolation) as exc:
        db.execute(
            "INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status,"
            " claimed_at, lease_expires_at) VALUES ('r1', 1, 'w', gen_random_uuid(),"
            " 'exploded', now(), now())"
        )
    assert exc.value.diag.constraint_name == "attempts_status"
    # The events table holds what a lease does not change (the lease is the
    # lane's, see schema/06_ledger.sql); its CHECKs tie delivery to its columns.
    base = (
        "INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, delivery_key, created_at,"
        " next_attempt_at, delivered_at, delivered_by, failed_at, batch_id, batch_started_at)"
        " VALUES ('r1', %s, 1, 't', 'k', now(), now(), %s, %s, %s, %s, %s)"
    )
    batch = "00000000-0000-0000-0000-000000000001"
    cases = [
        (("sideband", None, None, None, None, None), "ledger_lane"),
        (("lifecycle", "now", None, None, None, None), "ledger_delivered_by"),
        (("lifecycle", "now", "relay", "now", None, None), "ledger_delivered_not_failed"),
        (("lifecycle", None, None, None, batch, "now"), "ledger_batch_delivered"),
    ]
    for params, constraint in cases:
        with pytest.raises(errors.CheckViolation) as exc:
            db.execute(base, params)
        assert exc.value.diag.constraint_name == constraint
    with pytest.raises(errors.CheckViolation) as exc:
        db.execute(
            "INSERT INTO runrelay.ledger_lanes (run_id, lane, lease_owner)"
            " VALUES ('r1', 'lifecycle', 'x')"
        )
    assert exc.value.diag.constraint_name == "ledger_lanes_lease"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("table", TABLES)
def test_roles_cannot_touch_tables(db_url: str, role: str, table: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(f"SET ROLE {role}")
        refused: tuple[type[Exception], ...] = (errors.InsufficientPrivilege,)
        if table in VIEWS:
            refused += (errors.ObjectNotInPrerequisiteState,)
        with pytest.raises(errors.InsufficientPrivilege):
            c.execute(f"SELECT 1 FROM runrelay.{table} LIMIT 1")
        for statement in (
            f"DELETE FROM runrelay.{table}",
            f"UPDATE runrelay.{table} SET {SET_CLAUSE.get(table, 'run_id = run_id')}",
        ):
            with pytest.raises(refused):
                c.execute(statement)


def test_no_function_is_executable_by_public(db: psycopg.Connection) -> None:
    rows = db.execute(
        """
        SELECT p.oid::regprocedure::text
        FROM pg_proc AS p
        WHERE p.pronamespace = 'runrelay'::regnamespace
          AND (p.proacl IS NULL
               OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) AS a
                          WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
        """
    ).fetchall()
    assert rows == []


def test_internal_helpers_are_granted_to_nobody(db: psycopg.Connection) -> None:
    for role in ROLES:
        for fn in ("runrelay._now()", "runrelay._require_read_committed()"):
            allowed = db.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, fn]
            ).fetchone()
            assert allowed == (False,), (role, fn)


def test_schema_version_is_readable_by_every_role(db_url: str) -> None:
    head = _sqlsource.head_revision()
    with psycopg.connect(db_url, autocommit=True) as c:
        for role in ROLES:
            c.execute(f"SET ROLE {role}")
            assert c.execute("SELECT runrelay.get_schema_version()").fetchone() == (head,)
            c.execute("RESET ROLE")


def test_clock_override_needs_the_installation_flag(db: psycopg.Connection) -> None:
    with db.transaction():
        db.execute("SET LOCAL runrelay.clock_offset = '2 hours'")
        shifted = db.execute("SELECT runrelay._now() - statement_timestamp()").fetchone()
    assert shifted is not None and shifted[0].total_seconds() == 7200
    db.execute("UPDATE runrelay.settings SET allow_clock_override = false")
    with db.transaction():
        db.execute("SET LOCAL runrelay.clock_offset = '2 hours'")
        ignored = db.execute("SELECT runrelay._now() - statement_timestamp()").fetchone()
    assert ignored is not None and ignored[0].total_seconds() == 0


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_wrong_isolation_level_raises_25000(db: psycopg.Connection, level: str) -> None:
    with pytest.raises(errors.InvalidTransactionState) as exc, db.transaction():
        db.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        db.execute("SELECT runrelay._require_read_committed()")
    assert exc.value.sqlstate == "25000"
    assert exc.value.diag.message_hint and "READ COMMITTED" in exc.value.diag.message_hint
    db.execute("SELECT runrelay._require_read_committed()")


def _dump(url: str) -> str:
    bindir = os.environ.get("RUNRELAY_PG_BINDIR")
    pg_dump = str(Path(bindir) / "pg_dump") if bindir else "pg_dump"
    out = subprocess.run(
        [
            pg_dump,
            "--schema-only",
            "--no-owner",
            "--schema=runrelay",
            "--exclude-table=runrelay.alembic_version",
            "-d",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    skip = ("--", "\\restrict", "\\unrestrict")
    lines = [ln for ln in out.splitlines() if not ln.startswith(skip)]
    return "\n".join(ln for ln in lines if ln.strip())


def test_plpgsql_source_and_migrations_build_the_same_schema(db_url: str) -> None:
    """plpgsql/ (schema + code) and `alembic upgrade head` must agree exactly."""
    name = f"rr_from_source_{os.getpid()}"
    url = create_database(name)
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE SCHEMA runrelay")
            c.execute("SET search_path TO runrelay, pg_temp")
            with c.transaction():
                c.execute(_sqlsource.build_schema())
                # Alembic's version table, which get_schema_version() reads
                # (alembic creates it before the first revision runs).
                c.execute(
                    "CREATE TABLE alembic_version (version_num varchar(32) NOT NULL"
                    " CONSTRAINT alembic_version_pkc PRIMARY KEY)"
                )
                c.execute(
                    "GRANT USAGE ON SCHEMA runrelay TO runrelay_producer, runrelay_worker,"
                    " runrelay_relay, runrelay_admin"
                )
                c.execute(_sqlsource.build_code())
        from_source = _dump(url)
    finally:
        drop_database(name)
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE runrelay.settings SET allow_clock_override = false")
    try:
        from_migrations = _dump(db_url)
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("UPDATE runrelay.settings SET allow_clock_override = true")
    assert from_source == from_migrations


def test_migrations_are_reversible_and_idempotent_with_data() -> None:
    name = f"rr_roundtrip_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "head")
        alembic(url, "upgrade", "head")
        assert "(head)" in alembic(url, "current").stdout
        with psycopg.connect(url, autocommit=True) as c:
            insert_run(c, "kept")
        alembic(url, "downgrade", "base")
        with psycopg.connect(url, autocommit=True) as c:
            left = c.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'runrelay'"
            ).fetchone()
            assert left == (0,)
        alembic(url, "upgrade", "head")
    finally:
        drop_database(name)


def test_downgrade_to_0004_turns_released_attempts_into_resumed_ones() -> None:
    """0004 has no released status: a downgrade maps released attempts to
    resumed (ended without failing), every row stays valid under 0004's
    CHECKs, 0004's functions keep the run's budget whole, and an upgrade back
    still answers a replayed release with its recorded outcome."""
    name = f"rr_release_down_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT runrelay.enqueue_run('rel', max_attempts => 2)")
            claim = c.execute(
                "SELECT attempt, lease_token FROM runrelay.claim_attempts('w')"
            ).fetchone()
            assert claim is not None
            release = "SELECT runrelay.release_attempt('rel', %s, %s, reason => 'deploy')"
            assert c.execute(release, claim).fetchone() == ("released",)
        alembic(url, "downgrade", "0004")
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT runrelay.get_schema_version()").fetchone() == ("0004",)
            rows = c.execute(
                "SELECT a.status, a.finished_at IS NOT NULL, r.status FROM runrelay.attempts AS a"
                " JOIN runrelay.runs AS r USING (run_id) WHERE a.run_id = 'rel'"
            ).fetchall()
            assert rows == [("resumed", True, "queued")]
            with pytest.raises(errors.CheckViolation):
                c.execute("UPDATE runrelay.attempts SET status = 'released' WHERE run_id = 'rel'")
            second = c.execute(
                "SELECT attempt, lease_token FROM runrelay.claim_attempts('w')"
            ).fetchone()
            assert second is not None and second[0] == 2
            fail = "SELECT runrelay.fail_attempt('rel', %s, %s, '{}', retry_at => now())"
            # The released attempt cost nothing: one failure of two allowed.
            assert c.execute(fail, second).fetchone() == ("retry_scheduled",)
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute(release, claim).fetchone() == ("released",)
    finally:
        drop_database(name)


def test_0006_wakes_lanes_resting_on_a_lone_transport_only_head() -> None:
    """Under 0005 a transport-only head without a successor rests (its lane has
    available_at NULL) until an append wakes it. From 0006 the next claim
    acknowledges it locally, so the upgrade makes such lanes available at
    their head's due time, and the downgrade puts them back to rest."""
    name = f"rr_resting_{os.getpid()}"
    url = create_database(name)
    lane = (
        "SELECT ll.available_at, l.created_at FROM runrelay.ledger_lanes AS ll"
        " JOIN runrelay.ledger AS l ON l.run_id = ll.run_id AND l.lane = ll.lane"
        " AND l.seq = ll.head_seq WHERE ll.run_id = %s AND ll.lane = 'observability'"
    )
    hidden = """[{"type": "hidden", "lane": "observability", "transport_only": true}]"""
    try:
        alembic(url, "upgrade", "0005")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT runrelay.enqueue_run('old')")
            c.execute("SELECT runrelay.append_events('old', %s)", [hidden])
            available, _created = c.execute(lane, ["old"]).fetchone() or (0, 0)
            assert available is None  # resting under 0005
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            available, created = c.execute(lane, ["old"]).fetchone() or (0, 0)
            assert available == created
            claimed = c.execute(
                "SELECT run_id, kind, type FROM runrelay.claim_ledger('r', lane => 'observability')"
            ).fetchall()
            assert claimed == [("old", "local_ack", "hidden")]
            c.execute("SELECT runrelay.enqueue_run('new')")
            c.execute("SELECT runrelay.append_events('new', %s)", [hidden])
            available, created = c.execute(lane, ["new"]).fetchone() or (0, 0)
            assert available == created
        alembic(url, "downgrade", "0005")
        with psycopg.connect(url, autocommit=True) as c:
            available, _created = c.execute(lane, ["new"]).fetchone() or (0, 0)
            assert available is None  # resting again, as 0005 expects
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            claimed = c.execute(
                "SELECT run_id, kind FROM runrelay.claim_ledger('r', lane => 'observability')"
            ).fetchall()
            assert claimed == [("new", "local_ack")]
    finally:
        drop_database(name)


def _detached_wait(
    c: psycopg.Connection, run_id: str, timeout_at: datetime | None = None
) -> dict[str, Any]:
    """run_id, alone on its queue, claimed and waiting on a detached runner."""
    enqueue(c, run_id, queue=run_id)
    claim = claim_one(c, queues=[run_id])
    wait: dict[str, Any] = {"kind": "detached_runner", "runner": "gpu"}
    if timeout_at is not None:
        wait["timeout_at"] = timeout_at.isoformat()
    assert scalar(c, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    return claim


def _push(c: psycopg.Connection, run_id: str) -> None:
    pushed = scalar(c, "record_runner_terminal", run_id=run_id, attempt=1, result={"from": run_id})
    assert pushed == "recorded"


def _deadlines(c: psycopg.Connection) -> dict[str, tuple[datetime | None, datetime | None]]:
    """Each run's wake_at, and when its current attempt's pushed terminal arrived."""
    rows = c.execute(
        "SELECT r.run_id, r.wake_at, a.runner_result_received_at FROM runrelay.runs AS r"
        " JOIN runrelay.attempts AS a ON a.run_id = r.run_id AND a.attempt = r.attempt_count"
    ).fetchall()
    return {run_id: (wake_at, received_at) for run_id, wake_at, received_at in rows}


def _db_now(c: psycopg.Connection) -> datetime:
    row = c.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def test_0006_gives_terminals_pushed_under_0005_their_claim_window() -> None:
    """0005's record_runner_terminal disarmed the run's deadline (wake_at NULL)
    until the owner claimed the terminal; 0006 bounds the claim by a window
    (5 minutes from the push, or timeout_at if sooner). The upgrade gives
    terminals pushed under 0005 the deadline 0006 would have given them, so
    none can keep its run waiting forever; a terminal already claimed keeps
    0006's semantics: no deadline while the owner's lease governs, the window
    restored when the lease lapses."""
    name = f"rr_window_up_{os.getpid()}"
    url = create_database(name)
    window = timedelta(minutes=5)
    try:
        alembic(url, "upgrade", "0005")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("UPDATE runrelay.settings SET allow_clock_override = true")
            soon = _db_now(c) + timedelta(minutes=1)
            later = _db_now(c) + timedelta(hours=1)
            claims = {
                "plain": _detached_wait(c, "plain"),
                "soon": _detached_wait(c, "soon", timeout_at=soon),
                "claimed": _detached_wait(c, "claimed"),
                "stale": _detached_wait(c, "stale"),
                "unpushed": _detached_wait(c, "unpushed", timeout_at=later),
            }
            for run_id in ("plain", "soon", "claimed"):
                _push(c, run_id)
            with c.transaction():  # pushed an hour ago, never claimed
                c.execute("SET LOCAL runrelay.clock_offset = '-1 hour'")
                _push(c, "stale")
            assert scalar(c, "claim_detached_terminal", **fenced(claims["claimed"])) is True
            old = _deadlines(c)
            assert [old[r][0] for r in ("plain", "soon", "claimed", "stale")] == [None] * 4
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            new = _deadlines(c)
            plain_received = new["plain"][1]
            assert plain_received is not None
            assert new["plain"][0] == plain_received + window
            assert new["soon"][0] == soon  # timeout_at is sooner than the window
            assert new["claimed"][0] is None  # the owner's lease governs
            assert new["unpushed"] == old["unpushed"] == (later, None)
            # The stale terminal's window is over: the claim is refused and the
            # next claim on its queue wakes the run with the pushed result.
            assert scalar(c, "claim_detached_terminal", **fenced(claims["stale"])) is False
            call(c, "claim_attempts", worker="w2", queues=["stale"], lease_seconds=300)
            resume = c.execute("SELECT resume FROM runrelay.runs WHERE run_id = 'stale'").fetchone()
            assert resume == ({"timed_out": True, "runner_result": {"from": "stale"}},)
            # The claimed terminal's lease lapses: the reaper restores its window.
            with c.transaction():
                c.execute("SET LOCAL runrelay.clock_offset = '1 minute'")
                reaped = call(c, "reap_expired")
            assert reaped == [{"run_id": "claimed", "attempt": 1, "outcome": "waiting"}]
            claimed_wake, claimed_received = _deadlines(c)["claimed"]
            assert claimed_received is not None and claimed_wake == claimed_received + window
            # Within its window the owner still claims the plain terminal.
            assert scalar(c, "claim_detached_terminal", **fenced(claims["plain"])) is True
    finally:
        drop_database(name)


def test_downgrade_to_0005_disarms_the_claim_window_of_pushed_terminals() -> None:
    """0005 keeps a pushed detached terminal waiting for its owner with no
    deadline (wake_at NULL), and its claim_detached_terminal does not look at
    wake_at. A claim window left in place would let 0005's claims wake the run
    {"timed_out": true} — dropping the pushed result, and fencing out an owner
    that claimed it meanwhile. The downgrade disarms it; a wait that has no
    pushed terminal keeps its timeout."""
    name = f"rr_window_down_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("UPDATE runrelay.settings SET allow_clock_override = true")
            later = _db_now(c) + timedelta(hours=1)
            claims = {
                "pushed": _detached_wait(c, "pushed"),
                "pushed_timed": _detached_wait(c, "pushed_timed", timeout_at=later),
                "claimed": _detached_wait(c, "claimed"),
                "timed": _detached_wait(c, "timed", timeout_at=later),
            }
            for run_id in ("pushed", "pushed_timed", "claimed"):
                _push(c, run_id)
            assert scalar(c, "claim_detached_terminal", **fenced(claims["claimed"])) is True
            assert _deadlines(c)["pushed"][0] is not None  # 0006's claim window
        alembic(url, "downgrade", "0005")
        with psycopg.connect(url, autocommit=True) as c:
            old = _deadlines(c)
            assert [old[r][0] for r in ("pushed", "pushed_timed", "claimed")] == [None] * 3
            assert old["timed"] == (later, None)
            with c.transaction():  # two hours on: only the wait without a terminal times out
                c.execute("SET LOCAL runrelay.clock_offset = '2 hours'")
                call(c, "claim_attempts", worker="w2", queues=list(claims), max_runs=10)
                statuses = dict(c.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
                assert statuses == {
                    "pushed": "waiting",
                    "pushed_timed": "waiting",
                    "claimed": "waiting",
                    "timed": "running",
                }
                pushed = fenced(claims["pushed"])
                assert scalar(c, "claim_detached_terminal", **pushed) is True
                assert scalar(c, "complete_attempt", **pushed, result={"ok": 1}) == "completed"
    finally:
        drop_database(name)


def test_two_installs_share_one_database() -> None:
    name = f"rr_two_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "head")
        alembic(url, "-x", "schema=tenant_b", "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            insert_run(c, "a-only")
            assert c.execute("SELECT count(*) FROM tenant_b.runs").fetchone() == (0,)
            proconfig = c.execute(
                "SELECT proconfig FROM pg_proc"
                " WHERE proname = 'get_schema_version' AND pronamespace = 'tenant_b'::regnamespace"
            ).fetchone()
            assert proconfig == (["search_path=tenant_b, pg_temp"],)
            c.execute("SET ROLE tenant_b_worker")
            with pytest.raises(errors.InsufficientPrivilege):
                c.execute("SELECT runrelay.get_schema_version()")
        alembic(url, "-x", "schema=tenant_b", "downgrade", "base")
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (1,)
    finally:
        drop_database(name)


def test_frozen_code_of_head_matches_plpgsql_source() -> None:
    assert _sqlsource.main(["check"]) == 0


def test_0008_moves_live_leases_to_their_lanes_and_back() -> None:
    """0008 keeps a lane's lease on its lane row instead of its events. The
    upgrade moves every live lease (a batch, a single head, a lapsed one) and
    every frozen batch to the lanes, the downgrade back to the events, and the
    ledger reads the same each way: every event's state, owner, expiry,
    batch and attempts. Relays then carry on where they were."""
    name = f"rr_watermark_{os.getpid()}"
    url = create_database(name)
    facts = (
        "SELECT run_id, lane, seq, state, lease_owner, lease_expires_at, batch_id,"
        " batch_started_at, delivery_attempts, delivered_at, delivered_by, acked_locally"
        " FROM runrelay.ledger ORDER BY run_id, lane, seq"
    )
    obs = """[{"type": "a", "lane": "observability"}, {"type": "b", "lane": "observability"},
              {"type": "c", "lane": "observability"}, {"type": "d", "lane": "observability"}]"""
    try:
        alembic(url, "upgrade", "0007")
        with psycopg.connect(url, autocommit=True) as c:
            for run in ("batch", "released", "single", "failing"):
                c.execute("SELECT runrelay.enqueue_run(%s)", [run])
                c.execute("SELECT runrelay.append_events(%s, %s)", [run, obs])
            # A leased batch of three, partly acknowledged.
            ids = [
                r[0]
                for r in c.execute(
                    "SELECT event_id FROM runrelay.claim_ledger('A', 'observability', 'batch',"
                    " max_events => 3, batch => true)"
                ).fetchall()
            ]
            c.execute("SELECT runrelay.ack_ledger('A', 'batch', %s)", [ids[:1]])
            # A frozen batch released: pending, still frozen.
            ids = [
                r[0]
                for r in c.execute(
                    "SELECT event_id FROM runrelay.claim_ledger('B', 'observability', 'released',"
                    " max_events => 2, batch => true)"
                ).fetchall()
            ]
            c.execute("SELECT runrelay.release_ledger('B', %s)", [ids])
            # A single lifecycle head leased, one that failed and retries.
            c.execute("SELECT runrelay.claim_ledger('C', run_id => 'single')")
            [[head]] = c.execute(
                "SELECT event_id FROM runrelay.claim_ledger('D', run_id => 'failing')"
            ).fetchall()
            c.execute(
                "SELECT runrelay.fail_ledger('D', %s, '{}', retry_at => now() + interval '1 hour')",
                [[head]],
            )
            before = c.execute(facts).fetchall()
            assert {r[3] for r in before} == {"pending", "leased", "delivered"}
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute(facts).fetchall() == before
            # The lease holder acknowledges the rest of its batch and goes on.
            rest = [
                r[0]
                for r in c.execute(
                    "SELECT event_id FROM runrelay.ledger WHERE run_id = 'batch'"
                    " AND lane = 'observability' AND state = 'leased' ORDER BY seq"
                ).fetchall()
            ]
            assert len(rest) == 2
            kinds = c.execute(
                "SELECT kind FROM runrelay.ack_ledger('A', 'batch', %s, claim_next => 10,"
                " batch => true)",
                [rest],
            ).fetchall()
            assert kinds == [("delivered",), ("delivered",), ("claimed",)]
            # The released batch is re-claimed exactly.
            again = c.execute(
                "SELECT type, frozen FROM runrelay.claim_ledger('E', 'observability', 'released',"
                " max_events => 10, batch => true)"
            ).fetchall()
            assert again == [("a", True), ("b", True)]
            c.execute(
                "SELECT runrelay.release_ledger('E', ARRAY(SELECT event_id FROM"
                " runrelay.ledger WHERE lease_owner = 'E'))"
            )
            during = c.execute(facts).fetchall()
        alembic(url, "downgrade", "0007")
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute(facts).fetchall() == during
            assert c.execute(
                "SELECT type FROM runrelay.claim_ledger('F', 'observability', 'released',"
                " max_events => 10, batch => true)"
            ).fetchall() == [("a",), ("b",)]
    finally:
        drop_database(name)
