"""What a worker's call for one job costs the server, in statements and in
rows, with a backlog behind it.

A worker settles each job and claims the next in one settle_and_claim call
(one completion, a claim of one run from its queue, a call_id for replay).
Every statement that call runs, nested ones included, is captured with
auto_explain (the same statements pg_stat_statements counts with track =
all: a PL/pgSQL assignment or IF evaluates a plain expression and is not
one), with EXPLAIN ANALYZE figures. The call may run at most eight, itself
included, and none of them may read more than a few rows of a table however
long the backlog: queued runs and as many finished ones (2 000 each, then
20 000), analyzed, so the plans are the ones a long-lived install gets.
Repeated past PL/pgSQL's switch to generic plans, which are the ones a
worker's session keeps.

A call of ten jobs pays the same statements once, but for the foreign-key
check PostgreSQL makes per opened attempt."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from conftest import capture_plans
from sqlapi import call

# Rows any one node of the call's plans may produce across its loops, or
# filter away: a one-job call touches a handful of rows of each table.
ROWS = 20
TABLES = ("runs", "attempts", "ledger_events", "ledger_lanes", "cancellations", "steps", "calls")


@pytest.fixture(params=[2_000, 20_000], ids=lambda n: f"backlog{n}")
def backlog(db: psycopg.Connection, request: pytest.FixtureRequest) -> None:
    """Queued and finished runs, and the finished runs' attempts, analyzed.
    Two sizes: a plan's choice between probing and reading a whole index
    turns on the table's size, and a small table is where a generic plan is
    most tempted to read all of it."""
    size = request.param
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   created_at, updated_at)
        SELECT 'q-' || i, 'q', 'queued', '{}', now() - interval '1 minute', 3, now(), now()
        FROM generate_series(1, %s) AS i
        """,
        (size,),
    )
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   attempt_count, result, ledger_seq,
                                   created_at, updated_at, finished_at)
        SELECT 'done-' || i, 'q', 'completed', '{}', now() - interval '1 day', 3, 1, '{}', 0,
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
        FROM generate_series(1, %s) AS i
        """,
        (size,),
    )
    db.execute(
        """
        INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status, claimed_at,
                                       heartbeat_at, lease_expires_at, finished_at,
                                       outcome, outcome_op)
        SELECT 'done-' || i, 1, 'old', gen_random_uuid(), 'completed', now() - interval '1 day',
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
               'completed', 'complete'
        FROM generate_series(1, %s) AS i
        """,
        (size,),
    )
    # Runs enqueued the usual way too, so the claim meets lanes with a
    # live head (run.queued) as well as runs without a lane yet.
    call(
        db,
        "enqueue_runs",
        items=[{"run_id": f"e-{i}", "queue": "q", "priority": 1} for i in range(40)],
    )
    db.execute("ANALYZE")


@pytest.fixture
def explained(db: psycopg.Connection) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The plans, with EXPLAIN ANALYZE figures, of every statement the server
    runs for this connection from now on, nested ones included."""
    messages = capture_plans(db, analyze=True, json=True)

    def take() -> list[dict[str, Any]]:
        return [json.loads(m[m.index("{") :]) for m in messages() if "plan:" in m]

    yield take
    db.execute("SET auto_explain.log_min_duration = -1")


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def heavy(plans: list[dict[str, Any]]) -> list[str]:
    """Nodes that read or discard more than ROWS rows of a table."""
    found = []
    for p in plans:
        for node in nodes(p["Plan"]):
            table = node.get("Relation Name")
            produced = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
            removed = sum(
                node.get(k, 0) for k in ("Rows Removed by Filter", "Rows Removed by Join Filter")
            )
            if table in TABLES and (produced > ROWS or removed > ROWS):
                found.append(f"{node['Node Type']} on {table}: {produced} rows, {removed} removed")
            if node["Node Type"] == "Seq Scan" and table in TABLES:
                found.append(f"Seq Scan on {table}")
    return found


def one_job_calls(
    db: psycopg.Connection, take: Callable[[], list[dict[str, Any]]], calls: int, size: int = 1
) -> list[tuple[int, list[dict[str, Any]]]]:
    """A worker's loop: claim, then settle what it holds and claim as many
    again, `calls` times; each call's jobs settled and its plans."""
    held = call(db, "claim_attempts", worker="w", queues=["q"], max_runs=size)
    out = []
    for _ in range(calls):
        items = [
            {"run_id": h["run_id"], "attempt": h["attempt"], "lease_token": str(h["lease_token"])}
            for h in held
        ]
        take()
        rows = call(
            db,
            "settle_and_claim",
            items=items,
            worker="w",
            queues=["q"],
            max_runs=size,
            call_id=uuid.uuid4(),
        )
        plans = take()
        assert [r["outcome"] for r in rows if r["kind"] == "settled"] == ["completed"] * len(items)
        held = [r for r in rows if r["kind"] == "claimed"]
        assert len(held) == size
        out.append((len(items), plans))
    return out


@pytest.mark.usefixtures("backlog")
def test_a_workers_call_for_one_job_runs_at_most_eight_statements(
    db: psycopg.Connection, explained: Callable[[], list[dict[str, Any]]]
) -> None:
    # Past the fifth call, PL/pgSQL runs the generic plans a worker keeps.
    # The call itself (checked by an expression, no statement), _complete's
    # two for one item of a run without a key (the run's lock, no key look;
    # the decision and the writes), _claim's three (its look, the candidate,
    # the start of one run), the attempt's foreign-key check and the
    # restored lock wait.
    for _jobs, plans in one_job_calls(db, explained, 12)[6:]:
        texts = [p["Query Text"] for p in plans]
        assert len(plans) <= 8, "\n---\n".join(texts)
        one_item = [t for t in texts if "FOR NO KEY UPDATE" in t and "concurrency_key IS NULL" in t]
        assert one_item, texts


@pytest.mark.usefixtures("backlog")
def test_no_statement_of_a_workers_call_reads_the_backlog(
    db: psycopg.Connection, explained: Callable[[], list[dict[str, Any]]]
) -> None:
    for _jobs, plans in one_job_calls(db, explained, 12)[6:]:
        assert heavy(plans) == []


@pytest.mark.usefixtures("backlog")
def test_a_call_of_ten_jobs_pays_its_statements_once_and_reads_no_backlog(
    db: psycopg.Connection, explained: Callable[[], list[dict[str, Any]]]
) -> None:
    for jobs, plans in one_job_calls(db, explained, 10, size=10)[6:]:
        # PostgreSQL checks the attempts' foreign key with a statement per
        # opened attempt; everything else is paid once per call: the one-job
        # call's statements, the lock order of several items, and a lane
        # statement for runs enqueued without one.
        checks = [p for p in plans if p["Query Text"].startswith("SELECT 1 FROM ONLY")]
        assert len(checks) == jobs
        assert len(plans) - len(checks) <= 12, [p["Query Text"] for p in plans]
        assert heavy(plans) == []
