"""Privileges and definer safety (SPEC §5), proved from the catalog and by
calling every function as every role.

tests/pgtap/021_security.sql and 040_ledger_security.sql check the API
functions one by one on the default install; this file checks the whole
schema generically (internal helpers included), calls every function as
every role, adds a fresh unprivileged LOGIN role, proves that objects a
low-privilege user plants in `public` and `pg_temp` cannot hijack a SECURITY
DEFINER body, and re-runs the matrix after an upgrade from 0002 and on a
second install in another schema.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conftest import alembic, create_database, drop_database, url_for
from sqlapi import JSON_PARAMS, table_checksum

ROLE_SUFFIXES = ("producer", "worker", "relay", "admin")

# SPEC §5: each role gets exactly the functions of its SPEC section; the
# worker and the relay also run_trace_context, their tracing lookup.
GRANTS: dict[str, frozenset[str]] = {
    "producer": frozenset(
        {
            "enqueue_run",
            "enqueue_runs",
            "append_events",
            "signal_run",
            "cancel_run",
            "get_schema_version",
        }
    ),
    "worker": frozenset(
        {
            "claim_attempts",
            "settle_and_claim",
            "heartbeat",
            "record_step",
            "complete_attempt",
            "complete_attempts",
            "fail_attempt",
            "suspend_attempt",
            "release_attempt",
            "prepare_waiting_failure",
            "record_runner_terminal",
            "claim_detached_terminal",
            "read_runner_terminal",
            "reap_expired",
            "run_trace_context",
            "enqueue_due_schedules",
            "schedules_next_due_at",
            "record_queue_activity",
            "get_schema_version",
        }
    ),
    "relay": frozenset(
        {
            "claim_ledger",
            "ack_ledger",
            "claim_ledger_runs",
            "ack_ledger_runs",
            "renew_ledger_lease",
            "release_ledger",
            "fail_ledger",
            "ledger_next_due_at",
            "run_trace_context",
            "get_schema_version",
        }
    ),
    "admin": frozenset(
        {
            "requeue_ledger_event",
            "prune",
            "list_runs",
            "get_run",
            "run_attempts",
            "run_steps",
            "run_ledger_events",
            "retry_run",
            "list_blocked_heads",
            "requeue_blocked_heads",
            "skip_ledger_events",
            "list_processes",
            "pause_queue",
            "resume_queue",
            "list_paused_queues",
            "purge_runs",
            "upsert_schedule",
            "delete_schedule",
            "list_schedules",
            "enqueue_due_schedules",
            "schedules_next_due_at",
            "queue_overview",
            "ledger_overview",
            "record_queue_activity",
            "get_schema_version",
        }
    ),
}
API = frozenset().union(*GRANTS.values())
ADMIN_VIEWS = frozenset({"run_stats", "ledger_stats", "wait_stats"})

# Functions allowed to be STABLE or IMMUTABLE. A STABLE function reuses its
# caller's snapshot and would miss a cancel marker committed meanwhile
# (SPEC §4), so adding a name here needs a review. Reviewed: _runnable, the
# runnable rule, which reads only its arguments (no snapshot to reuse) and
# must be IMMUTABLE for the planner to fold the claim's WITH query that
# calls it (plpgsql/_internal/runnable.sql). _fence_of, the fence rule, the
# same way: it reads only its arguments, and is inlined into _complete's
# decision statement (plpgsql/_internal/fence.sql). And the tables' rules
# functions, which the runs_rules and attempts_rules CHECK constraints call: a
# CHECK must give a row the same answer whenever it is evaluated, so they read
# only their arguments (plpgsql/schema/02_runs.sql). _ledger_row, the format
# of a claimed or acknowledged event: it reads only its arguments, and the
# planner inlines a set-returning SQL function into the claim or
# acknowledgement that calls it only if it is not volatile
# (plpgsql/_internal/ledger_row.sql). _ledger_claimable and
# _ledger_claimable_at, whether an event is claimable by a relay: they read
# only their arguments and are inlined into the claim's statements, the
# successors of a batch tested in one (plpgsql/_internal/claim_lane.sql).
# _enqueue_valid and
# _enqueue_item_well_formed, the enqueue argument rules as expressions: they
# read only their arguments (the payload cap is passed in) and are inlined
# into enqueue_runs' one-statement check of all its items
# (plpgsql/_internal/validate.sql). _trace_context_valid, the shape of a
# trace context, the same way (plpgsql/_internal/trace_context.sql).
# _activity_minute, the minute of queue activity an instant falls in: it
# reads only its argument and is inlined into the per-event count
# (plpgsql/_internal/queue_activity.sql). _id_valid, _run_id_reserved and
# _event_type_reserved, the identifier rule and the reserved namespaces: they
# read only their arguments and are inlined into _enqueue_valid, which an
# IMMUTABLE function can be only if they are (plpgsql/_internal/validate.sql).
# _routing_partition, the partition a run_id routes to on a sharded install:
# it reads only its arguments and is inlined into _check_run_owner's
# set-based check of every run_id (plpgsql/_internal/shard_ownership.sql).
# _notifying, the channel of a notification kind while settings.notifications
# sends it: it reads the settings row, which decides only whether a wake-up
# is sent (never what a call writes or answers), and the planner inlines a
# set-returning SQL function into the notifying statement only if it is not
# volatile (plpgsql/_internal/channels.sql).
VOLATILITY_ALLOW_LIST: frozenset[str] = frozenset(
    {
        "_runnable",
        "_terminal",
        "_fence_of",
        "_runs_rules",
        "_attempts_rules",
        "_ledger_events_rules",
        "_ledger_lanes_rules",
        "_ledger_row",
        "_ledger_claimable",
        "_ledger_claimable_at",
        "_enqueue_valid",
        "_enqueue_item_well_formed",
        "_trace_context_valid",
        "_activity_minute",
        "_id_valid",
        "_run_id_reserved",
        "_event_type_reserved",
        "_routing_partition",
        "_notifying",
    }
)

RANDOM_TOKEN = "6b1c3c52-7d4e-4a8f-9e0a-1f2b3c4d5e6f"
SHADOW_TOKEN = "00000000-0000-0000-0000-00000000beef"


def _allowed_calls() -> dict[str, tuple[dict[str, Any], Callable[[list[tuple[Any, ...]]], bool]]]:
    """A valid call of every API function on a schema holding run `sec-seed`,
    and what its answer must look like. All are harmless (no live attempt is
    touched) except enqueue_run, enqueue_runs and append_events, which really write."""
    far = "2000-01-01T00:00:00Z"

    def first_is(value: Any) -> Callable[[list[tuple[Any, ...]]], bool]:
        return lambda rows: len(rows) == 1 and rows[0][0] == value

    def empty(rows: list[tuple[Any, ...]]) -> bool:
        return rows == []

    fenced = {"run_id": "sec-seed", "attempt": 1, "lease_token": RANDOM_TOKEN}
    return {
        "get_schema_version": ({}, lambda rows: len(rows) == 1 and bool(rows[0][0])),
        "enqueue_run": (
            {"run_id": "sec-new", "queue": "sec-q"},
            lambda rows: rows == [("sec-new", "queued", True)],
        ),
        "enqueue_runs": (
            {
                "items": [
                    {"run_id": "sec-new-1", "queue": "sec-q"},
                    {"run_id": "sec-seed", "queue": "sec-q"},
                ]
            },
            lambda rows: rows == [("sec-new-1", "queued", True), ("sec-seed", "queued", False)],
        ),
        "append_events": (
            {"run_id": "sec-seed", "events": [{"type": "sec.event"}]},
            lambda rows: len(rows) == 1,
        ),
        "signal_run": ({"run_id": "sec-absent", "name": "go"}, first_is("not_found")),
        "cancel_run": ({"run_id": "sec-absent"}, first_is("not_found")),
        "claim_attempts": ({"worker": "w", "queues": ["sec-empty"]}, empty),
        "settle_and_claim": (
            {"items": [fenced], "worker": "w", "queues": ["sec-empty"]},
            lambda rows: rows == [("settled", "sec-seed", 1, "fence_lost", *[None] * 7)],
        ),
        "heartbeat": (fenced, lambda rows: rows == [("fence_lost", None)]),
        "record_step": ({**fenced, "step": "s", "result": {}}, first_is("fence_lost")),
        "complete_attempt": (fenced, first_is("fence_lost")),
        "complete_attempts": (
            {"items": [fenced]},
            lambda rows: rows == [("sec-seed", 1, "fence_lost")],
        ),
        "fail_attempt": ({**fenced, "error": {"e": 1}}, first_is("fence_lost")),
        "suspend_attempt": (
            {**fenced, "wait": {"kind": "sleep", "until": "2100-01-01T00:00:00Z"}},
            first_is("fence_lost"),
        ),
        "release_attempt": (fenced, first_is("fence_lost")),
        "prepare_waiting_failure": (fenced, first_is("not_applicable")),
        "record_runner_terminal": (
            {"run_id": "sec-absent", "attempt": 1, "result": {}},
            first_is("not_found"),
        ),
        "claim_detached_terminal": (fenced, first_is(False)),
        "read_runner_terminal": ({"run_id": "sec-absent", "attempt": 1}, empty),
        "reap_expired": ({}, empty),
        "claim_ledger": ({"relay": "r", "run_id": "sec-absent"}, empty),
        "ack_ledger": ({"relay": "r", "run_id": "sec-seed", "event_ids": [-1]}, empty),
        # The observability lanes hold nothing to lease: no lease is taken.
        "claim_ledger_runs": (
            {"relay": "r", "lane": "observability"},
            lambda rows: all(len(r) == 11 for r in rows),
        ),
        "ack_ledger_runs": ({"relay": "r", "event_ids": [-1]}, empty),
        "renew_ledger_lease": ({"relay": "r", "event_ids": [-1]}, empty),
        "release_ledger": ({"relay": "r", "event_ids": [-1]}, first_is(0)),
        "fail_ledger": ({"relay": "r", "event_ids": [-1], "error": {}}, empty),
        "ledger_next_due_at": ({"run_id": "sec-absent"}, first_is(None)),
        "requeue_ledger_event": ({"event_id": -1}, first_is(False)),
        "prune": ({"delivered_before": far}, first_is(0)),
        "list_runs": ({"queue": "sec-none"}, empty),
        "get_run": ({"run_id": "sec-absent"}, empty),
        "run_attempts": ({"run_id": "sec-absent"}, empty),
        "run_steps": ({"run_id": "sec-absent"}, empty),
        "run_ledger_events": ({"run_id": "sec-absent"}, empty),
        "retry_run": ({"run_id": "sec-absent"}, first_is("not_found")),
        "list_blocked_heads": ({"run_id": "sec-absent"}, empty),
        "requeue_blocked_heads": ({"run_id": "sec-absent"}, empty),
        "skip_ledger_events": (
            {"run_id": "sec-absent", "lane": "lifecycle", "reason": "r"},
            lambda rows: rows == [(None, None, "not_blocked")],
        ),
        "list_processes": ({}, lambda rows: all(len(r) == 5 for r in rows)),
        # Pausing writes (a paused_queues row); the matrix calls the functions
        # in name order, so resume_queue then finds it paused.
        "pause_queue": ({"queue": "sec-paused"}, first_is("paused")),
        "resume_queue": (
            {"queue": "sec-paused"},
            lambda rows: rows in ([("resumed",)], [("not_paused",)]),
        ),
        "list_paused_queues": ({}, lambda rows: all(len(r) == 4 for r in rows)),
        "purge_runs": ({"finished_before": far}, first_is(0)),
        "run_trace_context": ({"run_id": "sec-seed"}, first_is(None)),
        # upsert_schedule writes a schedule whose first slot is a year on:
        # enqueue_due_schedules then finds nothing due, and the matrix calls
        # the functions in name order, so delete_schedule comes first.
        "upsert_schedule": (
            {"name": "sec-schedule", "cron": "@yearly"},
            lambda rows: rows in ([("created",)], [("unchanged",)]),
        ),
        "delete_schedule": (
            {"name": "sec-schedule"},
            lambda rows: rows in ([("deleted",)], [("not_found",)]),
        ),
        "list_schedules": ({}, lambda rows: all(len(r) == 14 for r in rows)),
        "enqueue_due_schedules": ({}, empty),
        "schedules_next_due_at": ({}, lambda rows: len(rows) == 1 and len(rows[0]) == 2),
        # One row per queue (sec-q, once enqueue_run made it), 12 columns.
        "queue_overview": ({}, lambda rows: all(len(r) == 12 for r in rows)),
        "ledger_overview": (
            {},
            lambda rows: [r[0] for r in rows] == ["lifecycle", "observability"],
        ),
        # The first caller finalizes the last hour's minutes, later ones none.
        "record_queue_activity": ({}, lambda rows: len(rows) == 1 and rows[0][0] >= 0),
    }


ALLOWED_CALLS = _allowed_calls()


def call_in(
    conn: psycopg.Connection, schema: str, function: str, **kwargs: Any
) -> list[tuple[Any, ...]]:
    """SELECT * FROM <schema>.<function>(name => value, ...)."""
    args = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in kwargs
    )
    query = sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(function), args
    )
    params = {k: Jsonb(v) if k in JSON_PARAMS and v is not None else v for k, v in kwargs.items()}
    return conn.execute(query, params).fetchall()


@contextmanager
def as_role(conn: psycopg.Connection, role: str) -> Iterator[psycopg.Connection]:
    """SET ROLE on a superuser autocommit connection for the block."""
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    try:
        yield conn
    finally:
        conn.execute("RESET ROLE")


def schema_roles(schema: str) -> dict[str, str]:
    return {suffix: f"{schema}_{suffix}" for suffix in ROLE_SUFFIXES}


def functions(conn: psycopg.Connection, schema: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            """SELECT p.oid, p.proname AS name, p.oid::regprocedure::text AS signature,
                      p.prosecdef, p.proconfig, p.provolatile,
                      p.prosqlbody IS NOT NULL AS prebound,
                      -- A table's rules function: a CHECK constraint calls it.
                      EXISTS (
                          SELECT 1 FROM pg_catalog.pg_depend AS d
                          WHERE d.classid = 'pg_catalog.pg_constraint'::regclass
                            AND d.refclassid = 'pg_catalog.pg_proc'::regclass
                            AND d.refobjid = p.oid
                      ) AS row_rules,
                      p.prorettype = 'pg_catalog.trigger'::regtype AS is_trigger,
                      p.proowner = n.nspowner AS owned_by_schema_owner,
                      coalesce(p.proacl, acldefault('f', p.proowner))::text[] AS acl,
                      EXISTS (
                          SELECT 1
                          FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
                          WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'
                      ) AS public_execute,
                      array(
                          SELECT DISTINCT a.grantee::regrole::text
                          FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
                          WHERE a.grantee NOT IN (0, p.proowner)
                          ORDER BY 1
                      ) AS grantees
               FROM pg_catalog.pg_proc AS p
               JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
               WHERE n.nspname = %s
               ORDER BY p.proname, p.oid""",
            [schema],
        )
        return cur.fetchall()


def relations(conn: psycopg.Connection, schema: str) -> list[tuple[str, str]]:
    rows = conn.execute(
        """SELECT c.relname, c.relkind::text FROM pg_catalog.pg_class AS c
           WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
           ORDER BY c.relname""",
        [schema],
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def assert_cannot_execute(conn: psycopg.Connection, schema: str, f: dict[str, Any]) -> None:
    """The current role cannot run `f`: a call with NULL arguments is refused
    (42501). A trigger function cannot be called at all, by anyone, so for
    one the current role must lack EXECUTE on it."""
    if f["is_trigger"]:
        row = conn.execute("SELECT has_function_privilege(%s, 'EXECUTE')", [f["oid"]]).fetchone()
        assert row == (False,), f"{f['signature']} is executable"
        return
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(null_args_call(conn, schema, f["oid"], f["name"]))


def null_args_call(conn: psycopg.Connection, schema: str, oid: int, name: str) -> sql.Composed:
    types = conn.execute(
        "SELECT coalesce(array_agg(format_type(t, NULL) ORDER BY o), '{}')"
        " FROM unnest((SELECT proargtypes::oid[] FROM pg_proc WHERE oid = %s))"
        " WITH ORDINALITY AS a (t, o)",
        [oid],
    ).fetchone()
    assert types is not None
    args = sql.SQL(", ").join(sql.SQL("NULL::" + t) for t in types[0])
    return sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(name), args
    )


# --------------------------------------------------------------------------
# Catalog assertions.


def assert_definer_catalog(conn: psycopg.Connection, schema: str) -> None:
    fns = functions(conn, schema)
    assert fns, f"no functions in schema {schema}"
    names = [f["name"] for f in fns]
    for name in API:
        assert names.count(name) == 1, f"{schema}.{name} must exist exactly once (no overloads)"
    problems: list[str] = []
    for f in fns:
        settings = [c for c in (f["proconfig"] or []) if c.startswith("search_path=")]
        if f["prosecdef"] or f["name"] in API:
            if not f["prosecdef"]:
                problems.append(f"{f['signature']}: public API but not SECURITY DEFINER")
            if not f["owned_by_schema_owner"]:
                problems.append(f"{f['signature']}: not owned by the schema owner")
        if f["name"] not in API:
            if f["prosecdef"]:
                problems.append(f"{f['signature']}: SECURITY DEFINER but not in the SPEC API")
            if not f["name"].startswith("_"):
                problems.append(f"{f['signature']}: an internal helper must be _-prefixed")
            if f["grantees"]:
                problems.append(f"{f['signature']}: internal helper executable by {f['grantees']}")
        if f["public_execute"]:
            problems.append(f"{f['signature']}: EXECUTE granted to PUBLIC")
        # Every function pins its path, helpers included: a helper inherits
        # nothing from the definer it is called from. The exception is a
        # helper with a SQL-standard body (RETURN ...), which is parsed when
        # it is created, so no search_path is ever consulted to run it; it
        # has no SET clause so that the planner can inline it (_runnable),
        # and it must not be SECURITY DEFINER.
        if f["prebound"] and not f["prosecdef"] and not f["proconfig"]:
            continue
        # And a table's rules function, which a CHECK calls for every row
        # written: it pins nothing (a SET clause costs each row a save and
        # restore of the setting) and must not need to. It is IMMUTABLE,
        # not SECURITY DEFINER, and sets nothing; that no path changes what
        # it does is
        # test_the_rules_functions_enforce_their_rules_whatever_the_callers_path.
        if f["row_rules"]:
            if f["prosecdef"] or f["proconfig"] or f["provolatile"] != "i":
                problems.append(
                    f"{f['signature']}: a rules function must be IMMUTABLE and set nothing"
                )
            continue
        if len(settings) != 1:
            problems.append(f"{f['signature']}: search_path not pinned ({f['proconfig']})")
            continue
        path = [p.strip().strip('"') for p in settings[0].split("=", 1)[1].split(",")]
        if path[-1] != "pg_temp":
            problems.append(f"{f['signature']}: pg_temp is not last in {path}")
        if path[0] != schema:
            problems.append(f"{f['signature']}: {schema} is not first in {path}")
        if set(path) - {schema, "pg_temp", "pg_catalog"}:
            problems.append(f"{f['signature']}: foreign schema in search_path {path}")
        if "pg_catalog" in path and path.index("pg_catalog") != 0:
            problems.append(f"{f['signature']}: pg_catalog is not searched first in {path}")
    assert problems == []


def test_the_rules_functions_enforce_their_rules_whatever_the_callers_path(
    db: psycopg.Connection,
) -> None:
    """The rules functions pin no search_path: a path that puts a schema
    with its own length() first still gets pg_catalog's, which any path that
    does not name pg_catalog searches first. Each call breaks a length rule,
    which the impostor (always 1) would let pass."""
    rules = sorted(f["name"] for f in functions(db, "runrelay") if f["row_rules"])
    assert rules == [
        "_attempts_rules", "_ledger_events_rules", "_ledger_lanes_rules", "_runs_rules"
    ]  # fmt: skip
    db.execute("DROP SCHEMA IF EXISTS impostor CASCADE")
    db.execute("CREATE SCHEMA impostor")
    db.execute("CREATE FUNCTION impostor.length(text) RETURNS integer LANGUAGE sql RETURN 1")
    long = "x" * 500
    calls = {
        "runs_run_id_length": (
            "SELECT runrelay._runs_rules(%s, 'q', 'queued', NULL, NULL, NULL, 'keep', 3, 0,"
            " NULL, NULL, false, NULL, 0, 0)",
            [long],
        ),
        "ledger_type_length": (
            "SELECT runrelay._ledger_events_rules('lifecycle', %s, 'k', 1, NULL, NULL, NULL,"
            " NULL, NULL, 0, false, NULL)",
            [long],
        ),
    }
    try:
        db.execute("SET search_path = impostor, pg_temp")
        for rule, (query, args) in calls.items():
            with pytest.raises(psycopg.errors.CheckViolation) as broken:
                db.execute(query, args)
            assert broken.value.diag.constraint_name == rule
        # The lane and attempt rules name no function; they hold under the
        # same path.
        with pytest.raises(psycopg.errors.CheckViolation):
            db.execute(
                "SELECT runrelay._ledger_lanes_rules('audit', 1, NULL, false, NULL, NULL,"
                " NULL, NULL, NULL, NULL, NULL)"
            )
        with pytest.raises(psycopg.errors.CheckViolation):
            db.execute(
                "SELECT runrelay._attempts_rules(0, 'running', now(), NULL, NULL, NULL, NULL,"
                " NULL, NULL)"
            )
    finally:
        db.execute("RESET search_path")
        db.execute("DROP SCHEMA impostor CASCADE")


def assert_all_volatile(conn: psycopg.Connection, schema: str) -> None:
    not_volatile = [
        (f["signature"], f["provolatile"])
        for f in functions(conn, schema)
        if f["provolatile"] != "v" and f["name"] not in VOLATILITY_ALLOW_LIST
    ]
    assert not_volatile == []


def test_definer_functions_pin_search_path_and_helpers_are_unreachable(
    db: psycopg.Connection,
) -> None:
    assert_definer_catalog(db, "runrelay")


def test_every_function_is_volatile_unless_allow_listed(db: psycopg.Connection) -> None:
    # A second copy on purpose: a name added to VOLATILITY_ALLOW_LIST alone
    # fails here, so that the addition shows up in a test's diff for review.
    reviewed = frozenset({
        "_runnable", "_terminal", "_fence_of", "_runs_rules", "_attempts_rules",
        "_ledger_events_rules", "_ledger_lanes_rules", "_ledger_row", "_ledger_claimable",
        "_ledger_claimable_at", "_enqueue_valid", "_enqueue_item_well_formed",
        "_trace_context_valid", "_activity_minute", "_id_valid", "_run_id_reserved",
        "_event_type_reserved", "_routing_partition", "_notifying",
    })  # fmt: skip
    assert reviewed == VOLATILITY_ALLOW_LIST, "the reviewed allow-list"
    assert_all_volatile(db, "runrelay")


def test_schema_roles_are_plain_nologin_roles(db: psycopg.Connection) -> None:
    rows = db.execute(
        """SELECT rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin,
                  rolreplication, rolbypassrls,
                  array(SELECT b.rolname::text FROM pg_auth_members AS m
                        JOIN pg_roles AS b ON b.oid = m.roleid WHERE m.member = r.oid)
           FROM pg_roles AS r WHERE rolname = ANY(%s) ORDER BY rolname""",
        [list(schema_roles("runrelay").values())],
    ).fetchall()
    assert len(rows) == 4
    for row in rows:
        assert row[1:] == (False, True, False, False, False, False, False, []), row


# --------------------------------------------------------------------------
# The role x function matrix.


def assert_privilege_matrix(
    conn: psycopg.Connection, schema: str, extra_roles: tuple[str, ...] = ()
) -> None:
    """has_function_privilege equals SPEC §5 exactly, and the calls agree:
    every allowed function answers as its role, every other one raises 42501;
    no role holds any table, view (but admin's stats views) or sequence
    privilege, and every attempt to use one directly raises 42501."""
    roles = schema_roles(schema)
    expected: dict[str, frozenset[str]] = {roles[s]: GRANTS[s] for s in ROLE_SUFFIXES}
    expected.update({r: frozenset() for r in extra_roles})
    fns = functions(conn, schema)

    # The catalog view.
    mismatches = []
    for role, allowed in expected.items():
        for f in fns:
            has = conn.execute(
                "SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')", [role, f["oid"]]
            ).fetchone()
            assert has is not None
            if has[0] != (f["name"] in allowed):
                mismatches.append((role, f["signature"], has[0]))
    assert mismatches == []

    call_in(conn, schema, "enqueue_run", run_id="sec-seed", queue="sec-q")
    # The calls: as each role, every function of the schema. PUBLIC is not a
    # role one can become: its row is the catalog's alone (and every real
    # role above inherits from it).
    for role, allowed in expected.items():
        if role == "public":
            continue
        with as_role(conn, role):
            for f in fns:
                if f["name"] in allowed:
                    kwargs, check = ALLOWED_CALLS[f["name"]]
                    rows = call_in(conn, schema, f["name"], **kwargs)
                    assert check(rows), (role, f["name"], rows)
                else:
                    assert_cannot_execute(conn, schema, f)

    # No direct table, view or sequence access.
    for role in expected:
        assert_no_relation_access(conn, schema, role, admin=role == roles["admin"])
        schema_create = conn.execute(
            "SELECT has_schema_privilege(%s, %s, 'CREATE')", [role, schema]
        ).fetchone()
        assert schema_create == (False,), f"{role} may create objects in {schema}"


TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")


def assert_no_relation_access(
    conn: psycopg.Connection, schema: str, role: str, admin: bool
) -> None:
    for name, kind in relations(conn, schema):
        qualified = sql.Identifier(schema, name)
        target = f"{schema}.{name}"
        if kind == "S":
            for priv in ("USAGE", "SELECT", "UPDATE"):
                row = conn.execute(
                    "SELECT has_sequence_privilege(%s, %s, %s)", [role, target, priv]
                ).fetchone()
                assert row == (False,), (role, target, priv)
            if role == "public":
                continue
            with as_role(conn, role):
                for stmt in (
                    sql.SQL("SELECT nextval({})").format(sql.Literal(target)),
                    sql.SQL("SELECT setval({}, 1)").format(sql.Literal(target)),
                    sql.SQL("SELECT last_value FROM {}").format(qualified),
                ):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        conn.execute(stmt)
            continue
        may_select = admin and kind == "v" and name in ADMIN_VIEWS
        for priv in TABLE_PRIVILEGES:
            row = conn.execute(
                "SELECT has_table_privilege(%s, %s, %s)", [role, target, priv]
            ).fetchone()
            assert row == (may_select and priv == "SELECT",), (role, target, priv)
        for priv in ("SELECT", "INSERT", "UPDATE", "REFERENCES"):
            row = conn.execute(
                "SELECT has_any_column_privilege(%s, %s, %s)", [role, target, priv]
            ).fetchone()
            assert row == (may_select and priv == "SELECT",), (role, target, priv, "column")
        if role == "public":
            continue
        with as_role(conn, role):
            if may_select:
                conn.execute(sql.SQL("SELECT * FROM {}").format(qualified)).fetchall()
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(qualified))
            if kind == "v":
                # Writes to these aggregate views fail in the rewriter before
                # any privilege check; has_table_privilege above covers them.
                continue
            writes = [
                sql.SQL("INSERT INTO {} DEFAULT VALUES").format(qualified),
                sql.SQL("DELETE FROM {}").format(qualified),
                sql.SQL("TRUNCATE {}").format(qualified),
            ]
            for stmt in writes:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(stmt)
            first_column = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                " AND attnum > 0 AND NOT attisdropped AND attidentity = ''"
                " AND attgenerated = '' ORDER BY attnum LIMIT 1",
                [target],
            ).fetchone()
            assert first_column is not None
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    sql.SQL("UPDATE {} SET {} = {}").format(
                        qualified, sql.Identifier(first_column[0]), sql.Identifier(first_column[0])
                    )
                )


@pytest.fixture
def nobody(db: psycopg.Connection, db_url: str) -> Iterator[str]:
    """A freshly created LOGIN role with no grant but USAGE on the schema,
    so that only each function's own ACL stands between it and the API."""
    role = f"rr_nobody_{os.getpid()}"
    db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA runrelay TO {}").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        db.execute("RESET ROLE")
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def login_url(db_url: str, role: str) -> str:
    conninfo = psycopg.conninfo.conninfo_to_dict(db_url)
    conninfo["user"] = role
    conninfo.pop("password", None)
    return psycopg.conninfo.make_conninfo(**conninfo)


def test_privilege_matrix_matches_spec_for_every_role(db: psycopg.Connection, nobody: str) -> None:
    assert_privilege_matrix(db, "runrelay", extra_roles=(nobody, "public"))


def test_unprivileged_login_role_is_refused_everything_over_its_own_session(
    db: psycopg.Connection, db_url: str, nobody: str
) -> None:
    """The same as the matrix's SET ROLE rows, on a real login session."""
    call_in(db, "runrelay", "enqueue_run", run_id="sec-seed")
    before = table_checksum(db)
    with psycopg.connect(login_url(db_url, nobody), autocommit=True) as own:
        assert own.execute("SELECT current_user").fetchone() == (nobody,)
        for f in functions(db, "runrelay"):
            assert_cannot_execute(own, "runrelay", f)
            if f["name"] in ALLOWED_CALLS:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    call_in(own, "runrelay", f["name"], **ALLOWED_CALLS[f["name"]][0])
        for name, _ in relations(db, "runrelay"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                own.execute(
                    sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier("runrelay", name))
                )
        assert own.execute("SELECT 1").fetchone() == (1,)
    assert table_checksum(db) == before


# --------------------------------------------------------------------------
# Shadowing: objects planted in public and pg_temp change nothing.

SHADOW_FUNCTIONS = [
    # name, argument types, return type, returned value
    ("now", "", "timestamptz", "'2000-01-01 00:00:00+00'"),
    ("_now", "", "timestamptz", "'2000-01-01 00:00:00+00'"),
    ("statement_timestamp", "", "timestamptz", "'2000-01-01 00:00:00+00'"),
    ("clock_timestamp", "", "timestamptz", "'2000-01-01 00:00:00+00'"),
    ("gen_random_uuid", "", "uuid", f"'{SHADOW_TOKEN}'"),
    ("jsonb_build_object", "text, text", "jsonb", """'{"shadowed": true}'"""),
    ("jsonb_build_object", "text, jsonb", "jsonb", """'{"shadowed": true}'"""),
    ("jsonb_build_object", "text, integer", "jsonb", """'{"shadowed": true}'"""),
    ("jsonb_build_object", "text, text, text, text", "jsonb", """'{"shadowed": true}'"""),
    ("jsonb_build_object", "VARIADIC text[]", "jsonb", """'{"shadowed": true}'"""),
    ("jsonb_build_array", "VARIADIC text[]", "jsonb", """'["shadowed"]'"""),
    ("btrim", "text", "text", "'not blank'"),
    ("length", "text", "integer", "1"),
    ("octet_length", "text", "integer", "1"),
    ("jsonb_typeof", "jsonb", "text", "'object'"),
    ("current_setting", "text, boolean", "text", "'10 days'"),
    ("pg_notify", "text, text", "void", ""),
    ("format", "text, VARIADIC text[]", "text", "'shadowed'"),
]


def _plant_shadows(shadow: psycopg.Connection) -> None:
    """Run as the low-privilege role: tables, functions and operators named
    like runrelay's own objects and like the builtins its bodies use, in
    public and in pg_temp. Every planted function records its call."""
    shadow.execute(
        "CREATE TABLE public.shadow_hits (name text, at timestamptz DEFAULT clock_timestamp())"
    )
    shadow.execute("GRANT ALL ON public.shadow_hits TO PUBLIC")
    for table in ("runs", "attempts", "ledger", "ledger_lanes", "cancellations", "signals"):
        shadow.execute(
            f"CREATE TABLE public.{table} (run_id text, status text, seq bigint, payload jsonb)"
        )
        shadow.execute(f"CREATE TEMP TABLE {table} (LIKE public.{table})")
    shadow.execute(
        """CREATE TABLE public.settings (
               singleton boolean DEFAULT true, max_payload_bytes integer DEFAULT 268435456,
               ledger_max_delivery_attempts integer DEFAULT 1000,
               retry_base_seconds double precision DEFAULT 1,
               retry_max_seconds double precision DEFAULT 1,
               allow_clock_override boolean DEFAULT true)"""
    )
    shadow.execute("INSERT INTO public.settings DEFAULT VALUES")
    shadow.execute("CREATE TEMP TABLE settings AS SELECT * FROM public.settings")
    for schema in ("public", "pg_temp"):
        for name, args, returns, value in SHADOW_FUNCTIONS:
            shadow.execute(
                f"""CREATE FUNCTION {schema}.{name}({args}) RETURNS {returns}
                    LANGUAGE plpgsql VOLATILE AS $f$
                    BEGIN
                        INSERT INTO public.shadow_hits (name) VALUES ('{schema}.{name}');
                        RETURN {value};
                    END $f$"""
            )
        for argtype in ("text", "uuid", "bigint", "integer"):
            shadow.execute(
                f"""CREATE FUNCTION {schema}.shadow_eq_{argtype}({argtype}, {argtype})
                    RETURNS boolean LANGUAGE plpgsql VOLATILE AS $f$
                    BEGIN
                        INSERT INTO public.shadow_hits (name) VALUES ('{schema}.= {argtype}');
                        RETURN true;
                    END $f$"""
            )
            shadow.execute(
                f"""CREATE OPERATOR {schema}.= (
                        LEFTARG = {argtype}, RIGHTARG = {argtype},
                        FUNCTION = {schema}.shadow_eq_{argtype})"""
            )


def _round_trip(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    """A full producer -> worker -> relay round trip, reduced to the parts of
    its answers that do not depend on the clock or on random tokens."""

    def q(function: str, **kwargs: Any) -> list[dict[str, Any]]:
        args = sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in kwargs
        )
        query = sql.SQL("SELECT * FROM runrelay.{}({})").format(sql.Identifier(function), args)
        params = {k: Jsonb(v) if k in JSON_PARAMS else v for k, v in kwargs.items()}
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    out: dict[str, Any] = {}
    out["enqueue"] = q("enqueue_run", run_id=run_id, queue="shadow-q", payload={"n": 1})
    out["append"] = [
        {k: r[k] for k in ("seq", "delivery_key")}
        for r in q("append_events", run_id=run_id, events=[{"type": "shadow.a"}])
    ]
    claim = q("claim_attempts", worker="shadow-w", queues=["shadow-q"], lease_seconds=60)
    assert len(claim) == 1, claim
    c = claim[0]
    out["claim"] = {k: c[k] for k in ("run_id", "attempt", "queue", "payload", "resume")}
    out["token_is_shadow"] = str(c["lease_token"]) == SHADOW_TOKEN
    now = conn.execute("SELECT pg_catalog.statement_timestamp()").fetchone()
    assert now is not None
    out["lease_window_ok"] = 0 < (c["lease_expires_at"] - now[0]).total_seconds() <= 61
    fence = {"run_id": run_id, "attempt": c["attempt"], "lease_token": c["lease_token"]}
    wrong = {**fence, "lease_token": uuid.UUID(SHADOW_TOKEN)}
    out["wrong_heartbeat"] = [r["outcome"] for r in q("heartbeat", **wrong)]
    out["wrong_complete"] = q("complete_attempt", **wrong, result={})
    out["heartbeat"] = [r["outcome"] for r in q("heartbeat", **fence, lease_seconds=60)]
    out["complete"] = q(
        "complete_attempt", **fence, result={"ok": True}, final_events=[{"type": "shadow.done"}]
    )
    events = q("claim_ledger", relay="shadow-r", run_id=run_id, max_events=10, batch=True)
    out["claimed"] = [(e["kind"], e["run_id"], e["seq"], e["type"]) for e in events]
    acked = q(
        "ack_ledger",
        relay="shadow-r",
        run_id=run_id,
        event_ids=[e["event_id"] for e in events],
    )
    out["acked"] = [(e["kind"], e["seq"], e["type"]) for e in acked]
    out["next_due"] = q("ledger_next_due_at", run_id=run_id)
    out["signal"] = q("signal_run", run_id=run_id, name="late")
    out["cancel"] = q("cancel_run", run_id=run_id)
    too_big = {"pad": "x" * 2_000_000}
    try:
        q("enqueue_run", run_id=f"{run_id}-big", payload=too_big)
        out["cap"] = "accepted"
    except psycopg.Error as exc:
        out["cap"] = exc.sqlstate
    return out


def test_shadow_objects_in_public_and_pg_temp_change_no_result(
    db: psycopg.Connection, db_url: str
) -> None:
    role = f"rr_shadow_{os.getpid()}"
    ident = sql.Identifier(role)
    db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    db.execute(
        sql.SQL("GRANT runrelay_producer, runrelay_worker, runrelay_relay TO {}").format(ident)
    )
    db.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(ident))
    # Only the schema owner may allow the test clock; a planted settings
    # table that allows it must not let the session's offset through.
    db.execute("UPDATE runrelay.settings SET allow_clock_override = false")
    call_in(db, "runrelay", "enqueue_run", run_id="bystander", queue="other-q")
    try:
        with psycopg.connect(login_url(db_url, role), autocommit=True) as shadow:
            baseline = _round_trip(shadow, "shadow-base")
            _plant_shadows(shadow)
            shadow.execute("SET search_path = pg_temp, public, pg_catalog")
            shadow.execute("SET runrelay.clock_offset = '10 days'")
            # The planted objects are live for anyone who resolves names
            # through this path: the planted `=` answers true.
            assert shadow.execute("SELECT 'a'::text = 'b'::text").fetchone() == (True,)
            shadow.execute("TRUNCATE public.shadow_hits")
            bystander = db.execute(
                "SELECT r::text FROM runrelay.runs AS r WHERE run_id = 'bystander'"
            ).fetchone()
            attacked = _round_trip(shadow, "shadow-attack")
            hits = shadow.execute("SELECT name FROM public.shadow_hits").fetchall()
            temp_rows = shadow.execute(
                "SELECT (SELECT count(*) FROM pg_temp.runs) + (SELECT count(*) FROM pg_temp.ledger)"
                " + (SELECT count(*) FROM pg_temp.attempts)"
            ).fetchone()
            temp_settings = shadow.execute("SELECT count(*) FROM pg_temp.settings").fetchone()
        public_rows = db.execute(
            "SELECT (SELECT count(*) FROM public.runs) + (SELECT count(*) FROM public.ledger)"
            " + (SELECT count(*) FROM public.attempts) + (SELECT count(*) FROM public.ledger_lanes)"
        ).fetchone()
        public_settings = db.execute(
            "SELECT count(*), bool_and(allow_clock_override) FROM public.settings"
        ).fetchone()
        bystander_after = db.execute(
            "SELECT r::text FROM runrelay.runs AS r WHERE run_id = 'bystander'"
        ).fetchone()
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        db.execute(sql.SQL("DROP ROLE {}").format(ident))

    def normal(result: dict[str, Any]) -> dict[str, Any]:
        text = repr(result).replace("shadow-base", "RUN").replace("shadow-attack", "RUN")
        return {"repr": text}

    assert hits == [], "a SECURITY DEFINER body resolved a planted object"
    assert normal(attacked) == normal(baseline)
    assert attacked["token_is_shadow"] is False
    assert attacked["lease_window_ok"] is True, "the planted clock or settings were read"
    assert attacked["wrong_heartbeat"] == ["fence_lost"]
    assert attacked["wrong_complete"] == [{"complete_attempt": "fence_lost"}]
    assert attacked["cap"] == "54000", "the planted settings raised the payload cap"
    assert [t for _, _, _, t in attacked["claimed"]] == [
        "run.queued",
        "shadow.a",
        "run.started",
        "shadow.done",
        "run.completed",
    ]
    assert temp_rows == (0,) and temp_settings == (1,)
    assert public_rows == (0,) and public_settings == (1, True)
    assert bystander_after == bystander


# --------------------------------------------------------------------------
# Upgrades and a second install keep the matrix.


@pytest.fixture
def scratch_database() -> Iterator[tuple[str, str]]:
    name = f"rr_sec_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        yield name, url
    finally:
        drop_database(name)
        with psycopg.connect(url_for("postgres"), autocommit=True) as c:
            for role in schema_roles("tenant_x").values():
                c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_upgrade_from_0002_keeps_the_privilege_matrix(scratch_database: tuple[str, str]) -> None:
    _, url = scratch_database
    alembic(url, "upgrade", "0002")
    with psycopg.connect(url, autocommit=True) as c:
        # Data in the tables while the code is replaced, as users upgrade.
        call_in(c, "runrelay", "enqueue_run", run_id="before-upgrade")
    alembic(url, "upgrade", "head")
    with psycopg.connect(url, autocommit=True) as c:
        assert_definer_catalog(c, "runrelay")
        assert_all_volatile(c, "runrelay")
        assert_privilege_matrix(c, "runrelay", extra_roles=("public",))
        assert c.execute(
            "SELECT status FROM runrelay.runs WHERE run_id = 'before-upgrade'"
        ).fetchone() == ("queued",)


def test_second_install_has_its_own_roles_and_no_access_to_the_other(
    scratch_database: tuple[str, str],
) -> None:
    _, url = scratch_database
    alembic(url, "upgrade", "head")
    alembic(url, "-x", "schema=tenant_x", "upgrade", "head")
    with psycopg.connect(url, autocommit=True) as c:
        roles = c.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'tenant\\_x\\_%' ORDER BY 1"
        ).fetchall()
        assert [r[0] for r in roles] == sorted(schema_roles("tenant_x").values())
        assert_definer_catalog(c, "tenant_x")
        assert_all_volatile(c, "tenant_x")
        assert_privilege_matrix(c, "tenant_x", extra_roles=("public",))
        assert_privilege_matrix(c, "runrelay", extra_roles=("public",))
        # Cross-install: neither install's roles reach the other schema.
        for own, other in (("tenant_x", "runrelay"), ("runrelay", "tenant_x")):
            for role in schema_roles(own).values():
                usage = c.execute(
                    "SELECT has_schema_privilege(%s, %s, 'USAGE')", [role, other]
                ).fetchone()
                assert usage == (False,), (role, other)
                for f in functions(c, other):
                    has = c.execute(
                        "SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')", [role, f["oid"]]
                    ).fetchone()
                    assert has == (False,), (role, f["signature"])
                with as_role(c, role):
                    for name in sorted(GRANTS[role.rsplit("_", 1)[1]]):
                        kwargs, _ = ALLOWED_CALLS[name]
                        with pytest.raises(psycopg.errors.InsufficientPrivilege):
                            call_in(c, other, name, **kwargs)
