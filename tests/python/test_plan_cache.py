"""The hot paths keep their cached generic plans.

PL/pgSQL plans each statement of a function five times with the call's values
(custom plans), then keeps a generic plan unless the custom plans looked
cheaper. A statement whose estimate depends on a value — `unnest(array)` or
`= ANY(array)` sizes its result by the array's length in a custom plan and
guesses in the generic one — can look cheaper custom forever and then pays
the planner on every call: once a third of a claim's server time, and three
times the cost of an append when the lane rule first used `= ANY`. Scan
tests cannot see this (both plans seek), so these tests do.

Every public function of plpgsql/runs and plpgsql/ledger now sets
plan_cache_mode = force_generic_plan itself (its key lookups are probes
whatever the values, enable_seqscan being off), and its nested statements,
the helpers' included, run under that setting. These tests hold the outcome,
not the setting: no hot statement is planned per call.

How they tell: with auto_explain.log_verbose, a generic plan shows PL/pgSQL
variables as `$n` parameters; a custom plan has them folded into constants.
A tour of the hot paths runs once under plan_cache_mode =
force_generic_plan, to learn which statements show parameters when generic,
and then repeatedly under the default mode: after warm-up, each of those
statements must still show them. The first test checks the detector itself
against force_custom_plan, so the main test cannot pass by not looking."""

from __future__ import annotations

import re
from collections.abc import Callable

import psycopg

from sqlapi import call

NODE = re.compile(r"^[A-Z][A-Za-z ]+(?: on \S+)?.*\(cost=", re.MULTILINE)
PARAM = re.compile(r"\$\d+")
INITPLAN = re.compile(r"InitPlan \d+ \(returns ([$\d,]+)\)")

# Statements reviewed and allowed to be planned per call (whether they are
# depends on the statistics): each may choose a custom plan for a value the
# generic plan cannot see, a cost left for the worker-path performance work.
#   ack_ledger's lane lookup and acknowledgement over event_id = ANY(ids)
REPLANNED = (
    "SELECT min(l.lane), count(DISTINCT l.lane)",
    "UPDATE ledger_events AS l",
)


def _statements(plans: list[str]) -> dict[str, int]:
    """Each nested statement's first query line -> the $n parameters in its plan."""
    out: dict[str, int] = {}
    for plan in plans:
        node = NODE.search(plan)
        if node is None or "Query Text:" not in plan:
            continue
        text = plan[plan.index("Query Text:") + len("Query Text:") : node.start()].strip()
        if text.startswith("SELECT * FROM runrelay."):
            continue  # the client's own top-level call
        if not text:
            # A SQL-standard-body function (_id_valid) the planner ran to
            # fold its constant arguments: not a statement that is cached.
            continue
        key = text.splitlines()[0].strip()
        body = plan[node.start() :]
        # An InitPlan's result is shown as a $n too (PostgreSQL before 17): not a variable.
        results = {p for found in INITPLAN.findall(body) for p in found.split(",")}
        out[key] = max(out.get(key, 0), len(set(PARAM.findall(body)) - results))
    return out


def _tour(db: psycopg.Connection, plans: Callable[[], list[str]], i: int) -> dict[str, int]:
    """One pass over the hot paths; the statements of each call and their parameters."""
    seen: dict[str, int] = {}

    def take(label: str) -> None:
        for key, params in _statements(plans()).items():
            seen[f"{label}: {key}"] = params

    plans()
    call(db, "enqueue_run", run_id=f"tour-{i}", queue="tour", payload={})
    take("enqueue_run")
    bulk = [{"run_id": f"tour-{i}-bulk-{j}", "queue": "bulk"} for j in range(20)]
    call(db, "enqueue_runs", items=[*bulk, {"run_id": f"tour-{i}", "queue": "tour"}])
    take("enqueue_runs")
    rows = call(db, "claim_attempts", worker="w", queues=["tour"], max_runs=3)
    take("claim_attempts")
    items = [
        {"run_id": r["run_id"], "attempt": r["attempt"], "lease_token": str(r["lease_token"])}
        for r in rows
    ]
    call(db, "complete_attempts", items=items)
    take("complete_attempts")
    run = call(db, "claim_attempts", worker="w", queues=["tour"], max_runs=1)[0]
    plans()
    call(
        db,
        "complete_attempt",
        run_id=run["run_id"],
        attempt=run["attempt"],
        lease_token=run["lease_token"],
    )
    take("complete_attempt")
    pair = call(db, "claim_attempts", worker="w", queues=["tour"], max_runs=2)
    plans()
    fences = [
        {"run_id": r["run_id"], "attempt": r["attempt"], "lease_token": str(r["lease_token"])}
        for r in pair
    ]
    items = [
        fences[0],
        {**fences[1], "op": "fail", "error": {}, "retry_at": "2100-01-01T00:00:00Z"},
    ]
    rows = call(db, "settle_and_claim", items=items, worker="w", queues=["tour"], max_runs=1)
    take("settle_and_claim")
    claimed = [
        {"run_id": r["run_id"], "attempt": r["attempt"], "lease_token": str(r["lease_token"])}
        for r in rows
        if r["kind"] == "claimed"
    ]
    call(db, "settle_and_claim", items=claimed, worker="w", queues=["tour"], max_runs=1)
    take("settle_and_claim")
    call(db, "append_events", run_id=f"base-{i}", events=[{"type": "t", "payload": {}}])
    take("append_events")
    events = call(db, "claim_ledger", relay="r", max_events=5)
    take("claim_ledger")
    head = events[0]["run_id"]
    call(
        db,
        "ack_ledger",
        relay="r",
        run_id=head,
        event_ids=[e["event_id"] for e in events if e["run_id"] == head],
        claim_next=5,
    )
    take("ack_ledger")
    return seen


def _prepare(db: psycopg.Connection) -> None:
    db.execute("SET auto_explain.log_verbose = on")
    for i in range(200):
        call(db, "enqueue_run", run_id=f"base-{i}", queue="tour", payload={})
    # Statistics of this data, not whatever an earlier test left: the choice
    # between custom and generic plans follows the estimates.
    db.execute("ANALYZE")


def test_the_detector_tells_custom_plans_from_generic_ones(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    _prepare(db)
    db.execute("SET plan_cache_mode = force_generic_plan")
    generic = _tour(db, plans, 0)
    # The public functions set plan_cache_mode themselves, which overrides
    # the session's: make them plan custom, in a transaction rolled back.
    with db.transaction(force_rollback=True):
        for (function,) in db.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
            " WHERE p.pronamespace = 'runrelay'::regnamespace"
            " AND 'plan_cache_mode=force_generic_plan' = ANY(p.proconfig)"
        ).fetchall():
            db.execute(f"ALTER FUNCTION {function} SET plan_cache_mode = force_custom_plan")
        db.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        custom = _tour(db, plans, 1)
    with_params = [k for k, n in generic.items() if n > 0]
    assert len(with_params) > 20, generic
    assert [k for k in with_params if custom.get(k)] == [], "custom plans fold every variable"


def test_hot_statements_keep_their_generic_plans(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    _prepare(db)
    db.execute("SET plan_cache_mode = force_generic_plan")
    generic = _tour(db, plans, 0)
    db.execute("SET plan_cache_mode = auto")
    for i in range(1, 9):  # five custom plans, then the choice is made
        latest = _tour(db, plans, i)
    replanned = sorted(
        key
        for key, params in generic.items()
        if params > 0 and latest.get(key) == 0 and not key.split(": ", 1)[1].startswith(REPLANNED)
    )
    assert replanned == [], "planned on every call: " + "; ".join(replanned)
