"""Every API function on a young install: 100 000 finished runs with their
attempts and 200 000 delivered events, and no statistics yet (autovacuum has
not analyzed the tables). A tour through the scheduler and ledger functions,
repeated past PL/pgSQL's switch to generic plans, captures the plan of every
nested statement with auto_explain: none may scan the big tables or filter
away more than a handful of rows. This is the class of bug that made every
claim read the whole runs table (an unindexable predicate whose cost grows
with the backlog) and that only shows up once tables are large."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sqlapi import call, scalar

BIG = ("runs", "attempts", "ledger_events", "ledger_lanes", "calls", "concurrency_keys")
SEQ_SCAN = re.compile(rf"Seq Scan on ({'|'.join(BIG)}) ")
REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck|Join Filter): (\d+)")


@pytest.fixture(autouse=True)
def _autovacuum_back_on(db: psycopg.Connection) -> Iterator[None]:
    """The tests turn autovacuum off on the big tables; the next test module
    (on the same database) gets the schema as migrations made it."""
    yield
    for table in BIG:
        db.execute(f"ALTER TABLE runrelay.{table} RESET (autovacuum_enabled)")


def prefill(db: psycopg.Connection) -> None:
    # Young, and staying young: no autovacuum ANALYZE may give the planner
    # statistics halfway through (the test would pass or fail by timing).
    for table in BIG:
        db.execute(f"ALTER TABLE runrelay.{table} SET (autovacuum_enabled = false)")
    load_history(db)


def load_history(db: psycopg.Connection) -> None:
    """100 000 finished runs with their attempts, events, lanes, keys and
    calls. No DDL: the plans the session cached stay valid."""
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   attempt_count, result, ledger_seq,
                                   created_at, updated_at, finished_at)
        SELECT 'done-' || i, 'q' || (i % 7), 'completed', '{}', now() - interval '1 day',
               3, 1, '{}', 2, now() - interval '1 day', now() - interval '1 day',
               now() - interval '1 day'
        FROM generate_series(1, 100000) AS i
        """
    )
    db.execute(
        """
        INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status, claimed_at,
                                       heartbeat_at, lease_expires_at, finished_at,
                                       outcome, outcome_op)
        SELECT 'done-' || i, 1, 'old', gen_random_uuid(), 'completed', now() - interval '1 day',
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
               'completed', 'complete'
        FROM generate_series(1, 100000) AS i
        """
    )
    db.execute(
        """
        INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                            created_at, next_attempt_at, delivered_at,
                                            delivered_by)
        SELECT 'done-' || i, 'lifecycle', s,
               CASE s WHEN 1 THEN 'run.queued' ELSE 'run.completed' END,
               '{}', 'done-' || i || ':' || s, now() - interval '1 day',
               now() - interval '1 day', now() - interval '1 day', 'old'
        FROM generate_series(1, 100000) AS i CROSS JOIN generate_series(1, 2) AS s
        """
    )
    db.execute(
        "INSERT INTO runrelay.ledger_lanes (run_id, lane, delivered_below)"
        " SELECT 'done-' || i, 'lifecycle', 3 FROM generate_series(1, 100000) AS i"
    )
    db.execute(
        "INSERT INTO runrelay.concurrency_keys (key)"
        " SELECT 'old-key-' || i FROM generate_series(1, 100000) AS i"
    )
    db.execute(
        """
        INSERT INTO runrelay.calls (call_id, function_name, run_id, arguments_digest, outcome,
                                    called_at)
        SELECT gen_random_uuid(), 'cancel_run', 'done-' || i, sha256('[null]'), 'cancelled',
               now() - interval '1 day'
        FROM generate_series(1, 100000) AS i
        """
    )


def tour(db: psycopg.Connection, n: int) -> None:
    """One pass through (nearly) every API function, on fresh runs."""
    q = "tour"
    ids = [f"t{n}-{i}" for i in range(8)]
    for i, run_id in enumerate(ids):
        call(
            db,
            "enqueue_run",
            run_id=run_id,
            queue=q,
            max_attempts=1 if i == 5 else 3,  # f's failure is final
            concurrency_key=f"k{n}" if i >= 6 else None,
        )
    # A small bulk enqueue, due in 2100 so that the claims below never take
    # it (test_a_bulk_enqueue_of_1000_runs_is_index_probes has the big one).
    call(db, "enqueue_runs", items=[*bulk_items(n, 10), {"run_id": "done-7", "queue": "q0"}])
    claims = call(db, "claim_attempts", worker="w", queues=[q], max_runs=3)
    claims += call(db, "claim_attempts", worker="w", queues=[q, "elsewhere"], max_runs=2)
    claims += call(db, "claim_attempts", worker="w", max_runs=2, call_id=uuid.uuid4())
    by_id = {c["run_id"]: c for c in claims}
    assert len(by_id) == 7, sorted(by_id)  # the second keyed run waits for the first

    def fenced(run_id: str) -> dict[str, Any]:
        c = by_id[run_id]
        return {"run_id": run_id, "attempt": c["attempt"], "lease_token": c["lease_token"]}

    a, b, c, d, e, f, g = sorted(by_id)
    assert call(db, "heartbeat", **fenced(a))[0]["outcome"] == "ok"
    final = [{"type": "done", "delivery_key": f"dk-{a}"}]
    assert scalar(db, "complete_attempt", **fenced(a), final_events=final) == "completed"
    items = [{**fenced(x), "lease_token": str(by_id[x]["lease_token"])} for x in (b, c)]
    assert [r["outcome"] for r in call(db, "complete_attempts", items=items)] == ["completed"] * 2
    past = "2000-01-01T00:00:00Z"
    assert scalar(db, "fail_attempt", **fenced(d), error={}, retry_at=past) == "retry_scheduled"
    go = {"kind": "event", "name": "go"}
    assert scalar(db, "suspend_attempt", **fenced(e), wait=go) == "waiting"
    signal = {"run_id": e, "name": "go", "payload": {"v": 1}, "call_id": uuid.uuid4()}
    assert scalar(db, "signal_run", **signal) == "resumed"
    assert scalar(db, "signal_run", **signal) == "resumed"  # a replay: answered from calls
    other = {"kind": "event", "name": "x"}
    assert scalar(db, "suspend_attempt", **fenced(f), wait=other) == "waiting"
    assert scalar(db, "prepare_waiting_failure", **fenced(f)) == "prepared"
    assert (
        scalar(db, "fail_attempt", **fenced(f), error={"e": 2}, protect_waiting_suspension=True)
        == "failed"
    )
    cancel = {"run_id": g, "reason": "stop", "call_id": uuid.uuid4()}
    assert scalar(db, "cancel_run", **cancel) == "cancelled"
    assert scalar(db, "cancel_run", **cancel) == "cancelled"
    assert scalar(db, "cancel_run", run_id=ids[7], reason="stop") == "cancelled"
    # d (retrying) and e (resumed) are queued again: end them, so that the
    # next round's claims take only that round's runs.
    for queued in (d, e):
        assert scalar(db, "cancel_run", run_id=queued, reason="stop") == "cancelled"
    call(db, "reap_expired")

    # settle_and_claim on a queue of its own: a claim with no items; plain,
    # failed and suspended items locked ahead together; a keyed completion
    # with final events whose promoted successor the same call claims; a
    # release that settles only.
    sq = "tour-s"
    s_ids = [f"s{n}-{i}" for i in range(5)]
    for i, run_id in enumerate(s_ids):
        call(
            db, "enqueue_run", run_id=run_id, queue=sq, concurrency_key=f"sk{n}" if i >= 3 else None
        )

    def item(row: dict[str, Any], **fields: Any) -> dict[str, Any]:
        fence = {"run_id": row["run_id"], "attempt": row["attempt"]}
        return {**fence, "lease_token": str(row["lease_token"]), **fields}

    later = "2100-01-01T00:00:00Z"
    got = {
        r["run_id"]: r
        for r in call(db, "settle_and_claim", items=[], worker="w", queues=[sq], max_runs=3)
    }
    assert sorted(got) == s_ids[:3], sorted(got)
    items = [
        item(got[s_ids[0]], result={"ok": 1}),
        item(got[s_ids[1]], op="fail", error={"e": 1}, retry_at=later),
        item(got[s_ids[2]], op="suspend", wait={"kind": "event", "name": "go"}),
    ]
    rows = call(db, "settle_and_claim", items=items, worker="w", queues=[sq], call_id=uuid.uuid4())
    assert [r["outcome"] for r in rows] == ["completed", "retry_scheduled", "waiting", None], rows
    final = [{"type": "done", "delivery_key": f"dk-{s_ids[3]}"}]
    rows = call(
        db, "settle_and_claim", items=[item(rows[3], final_events=final)], worker="w", queues=[sq]
    )
    assert [(r["kind"], r["run_id"]) for r in rows] == [
        ("settled", s_ids[3]),
        ("claimed", s_ids[4]),
    ]
    release = [item(rows[1], op="release", run_at=later, reason="later")]
    rows = call(db, "settle_and_claim", items=release, worker="w", queues=[sq], max_runs=0)
    assert [r["outcome"] for r in rows] == ["released"], rows
    for left in (s_ids[1], s_ids[2], s_ids[4]):
        assert scalar(db, "cancel_run", run_id=left, reason="stop") == "cancelled"

    call(db, "append_events", run_id=a, events=[{"type": "obs", "lane": "observability"}] * 3)
    # Explicit keys: the first call appends, the repeat is answered as a
    # replay; both look their keys up in the index of explicit keys.
    keyed = [{"type": "order.paid", "delivery_key": f"paid-{n}"}]
    first = call(db, "append_events", run_id=a, events=keyed)
    assert call(db, "append_events", run_id=a, events=keyed) == first
    rows = call(db, "claim_ledger", relay="r", run_id=a, batch=True, max_events=10)
    assert rows
    ids_ = [r["event_id"] for r in rows]
    call(db, "renew_ledger_lease", relay="r", event_ids=ids_)
    call(db, "ack_ledger", relay="r", run_id=a, event_ids=ids_, claim_next=5)
    rows = call(db, "claim_ledger", relay="r", lane="observability", max_events=10, batch=True)
    assert rows
    ids_ = [r["event_id"] for r in rows]
    assert scalar(db, "release_ledger", relay="r", event_ids=ids_) == len(rows)
    rows = call(db, "claim_ledger", relay="r", lane="observability", max_events=10, batch=True)
    first = [rows[0]["event_id"]]
    call(db, "fail_ledger", relay="r", event_ids=first, error={"x": 1}, permanent=True)
    assert scalar(db, "requeue_ledger_event", event_id=rows[0]["event_id"]) is True
    rows = call(db, "claim_ledger", relay="r2", max_events=10, batch=True, call_id=uuid.uuid4())
    scalar(db, "ledger_next_due_at")
    scalar(db, "ledger_next_due_at", lane="lifecycle", run_id=b)
    scalar(db, "prune", delivered_before="2000-01-01T00:00:00Z", max_rows=10)
    admin_tour(db, n, a, f)


def admin_tour(db: psycopg.Connection, n: int, run_id: str, failed: str) -> None:
    """The admin functions (docs/admin.md) on the tour's runs: run_id
    completed, failed failed."""
    page = call(db, "list_runs", max_rows=5)
    assert len(page) == 5
    last = page[-1]
    call(db, "list_runs", after_created_at=last["created_at"], after_run_id=last["run_id"])
    assert call(db, "list_runs", queue="tour", status="completed", max_rows=3)
    assert call(db, "list_runs", status="failed")
    call(db, "list_runs", status="running")
    assert call(db, "list_runs", concurrency_key=f"k{n}")
    call(db, "list_runs", finished_before="2000-01-01T00:00:00Z")
    assert call(db, "get_run", run_id=run_id)
    assert call(db, "run_attempts", run_id=failed)
    assert call(db, "run_ledger_events", run_id=run_id, max_rows=5)
    assert scalar(db, "retry_run", run_id=failed, requested_by="tour") == "retried"
    assert scalar(db, "cancel_run", run_id=failed, reason="stop") == "cancelled"
    (head,) = call(db, "claim_ledger", relay="r3", run_id=failed)
    call(db, "fail_ledger", relay="r3", event_ids=[head["event_id"]], error={}, permanent=True)
    assert call(db, "list_blocked_heads", lane="lifecycle", max_rows=5)
    assert call(db, "requeue_blocked_heads", run_id=failed)
    # A claim of every queue while one is paused: a skip scan of the queues.
    assert scalar(db, "pause_queue", queue="bulk", reason="tour") == "paused"
    assert call(db, "list_paused_queues")
    assert call(db, "claim_attempts", worker="w", max_runs=2) == []
    assert scalar(db, "resume_queue", queue="bulk") == "resumed"
    # The overview. An hour and more on (a later hour each round), so that
    # the maintenance's rollup finalizes fresh minutes every round and the
    # overview's live tail, the minutes since the rollup's watermark, holds
    # none of the tour's events: each statement is a range of its index,
    # whatever the 200 000 old terminal events (test_admin_plans.py counts
    # a real tail's cost).
    db.execute("SELECT set_config('runrelay.clock_offset', %s, false)", [f"{70 + 61 * n} min"])
    assert scalar(db, "record_queue_activity") == 58
    assert [q["queue"] for q in call(db, "queue_overview")][:2] == ["bulk", "q0"]
    assert len(call(db, "ledger_overview")) == 2
    db.execute("RESET runrelay.clock_offset")
    # Five of the prefill's finished runs (delivered, with an attempt and a
    # call record each) go, with their rows.
    cut = db.execute("SELECT now() - interval '1 hour'").fetchone()
    assert cut is not None
    assert scalar(db, "purge_runs", finished_before=cut[0], max_rows=5) == 5


def bulk_items(n: int, count: int) -> list[dict[str, Any]]:
    """enqueue_runs items: new runs, every third keyed (ten keys), due in 2100."""
    return [
        {
            "run_id": f"b{n}-{i}",
            "queue": "bulk",
            "run_at": "2100-01-01T00:00:00Z",
            "concurrency_key": f"bk{n}-{i % 10}" if i % 3 == 0 else None,
        }
        for i in range(count)
    ]


def walks(plans: list[str]) -> list[str]:
    bad = []
    for plan in plans:
        removed = max((int(m) for m in REMOVED.findall(plan)), default=0)
        if SEQ_SCAN.search(plan) or removed > 200:
            bad.append(plan)
    return bad


@pytest.mark.parametrize("statistics", ["none", "stale"])
def test_no_function_walks_a_big_table_on_a_young_install(
    db: psycopg.Connection, plans: Callable[[], list[str]], statistics: str
) -> None:
    """`none`: never analyzed. `stale`: analyzed right after the prefill, when
    nothing was pending, so the planner believes the pending set is empty
    while the tour grows it (autovacuum's last ANALYZE predating a backlog)."""
    db.execute("SET auto_explain.log_min_duration = -1")
    prefill(db)
    if statistics == "stale":
        db.execute("ANALYZE " + ", ".join(f"runrelay.{table}" for table in BIG))
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_analyze = on")
    plans()
    bad: list[str] = []
    seen = 0
    for n in range(8):  # plpgsql switches to generic plans after 5 executions
        tour(db, n)
        captured = plans()
        seen += len(captured)
        bad += walks(captured)
    assert not bad, "\n\n".join(bad[:5])
    assert seen > 8 * 60, seen  # the tour's nested statements were all captured


@pytest.mark.parametrize("statistics", ["none", "stale"])
def test_a_bulk_enqueue_of_1000_runs_is_index_probes(
    db: psycopg.Connection, plans: Callable[[], list[str]], statistics: str
) -> None:
    """enqueue_runs of 1000 items (950 new runs, a third of them keyed, and 50
    repeats of finished runs) on the young install: each lookup is a probe,
    whatever the statistics, past PL/pgSQL's switch to generic plans."""
    db.execute("SET auto_explain.log_min_duration = -1")
    prefill(db)
    if statistics == "stale":
        db.execute("ANALYZE " + ", ".join(f"runrelay.{table}" for table in BIG))
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_analyze = on")
    plans()
    bad: list[str] = []
    for n in range(8):
        repeats = [{"run_id": f"done-{7 * i + n}", "queue": f"q{n % 7}"} for i in range(1, 51)]
        items = [*bulk_items(n, 950), *repeats]
        rows = call(db, "enqueue_runs", items=items)
        assert [r["created"] for r in rows] == [True] * 950 + [False] * 50
        captured = plans()
        assert any("INSERT INTO runs" in plan for plan in captured)
        bad += walks(captured)
    assert not bad, "\n\n".join(bad[:5])


def test_completions_planned_on_small_tables_stay_probes_as_they_grow(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """A worker's session makes its generic plans early, often while the
    tables are nearly empty (a new install, or runs loaded just before the
    workers start), and keeps them until an ANALYZE. Completions planned
    when attempts held a few dozen rows must still be probes once the tables
    hold 100 000 rows each: batches, a single completion and the fused call."""
    db.execute("SET auto_explain.log_min_duration = -1")
    for table in BIG:
        db.execute(f"ALTER TABLE runrelay.{table} SET (autovacuum_enabled = false)")
    for i in range(120):
        call(db, "enqueue_run", run_id=f"g-{i}", queue="grow")
    db.execute("ANALYZE " + ", ".join(f"runrelay.{table}" for table in BIG))

    def fenced(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"run_id": r["run_id"], "attempt": r["attempt"], "lease_token": str(r["lease_token"])}
            for r in rows
        ]

    def rounds(n: int) -> None:
        for _ in range(n):
            rows = call(db, "claim_attempts", worker="w", queues=["grow"], max_runs=10)
            done = call(db, "complete_attempts", items=fenced(rows))
            assert [r["outcome"] for r in done] == ["completed"] * 10
            (one,) = call(db, "claim_attempts", worker="w", queues=["grow"])
            assert scalar(db, "complete_attempt", **fenced([one])[0]) == "completed"
            (one,) = call(db, "claim_attempts", worker="w", queues=["grow"])
            rows = call(db, "settle_and_claim", items=fenced([one]), worker="w", max_runs=0)
            assert [r["outcome"] for r in rows] == ["completed"]

    rounds(8)  # plpgsql switches to generic plans after 5 executions
    prefill(db)  # the tables grow; no ANALYZE tells the planner
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_analyze = on")
    plans()
    rounds(1)
    captured = plans()
    assert any("UPDATE attempts" in plan for plan in captured)
    bad = walks(captured)
    assert not bad, "\n\n".join(bad[:5])


def test_enqueues_planned_on_emptied_tables_stay_probes_as_they_grow(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """Tables emptied and analyzed (a purge, a young install analyzed
    early), then loaded in one go: the producer's session plans its key
    lookups while the statistics say "empty", and keeps those plans while
    the load grows the tables. Planned as scans they made each enqueue read
    everything loaded before it (20 000 enqueue_run calls in one statement
    took ten times as long as on a fresh install). Each must stay a probe."""
    db.execute("SET auto_explain.log_min_duration = -1")
    for table in BIG:
        db.execute(f"ALTER TABLE runrelay.{table} SET (autovacuum_enabled = false)")
    db.execute("TRUNCATE runrelay.runs CASCADE")
    db.execute("VACUUM ANALYZE " + ", ".join(f"runrelay.{table}" for table in BIG))

    def rounds(n: int, tag: str) -> None:
        # One statement, as a load is: its calls share their cached plans.
        db.execute(
            """
            SELECT count(*)
            FROM generate_series(1, %(n)s) AS i,
                 LATERAL runrelay.enqueue_run(%(tag)s || i, 'load') AS e,
                 LATERAL runrelay.enqueue_run(
                     %(tag)s || i || '-k', 'load', concurrency_key => %(tag)s || i %% 3) AS k,
                 LATERAL runrelay.enqueue_runs(jsonb_build_array(
                     jsonb_build_object('run_id', %(tag)s || i || '-b'))) AS b,
                 LATERAL runrelay.append_events(%(tag)s || i, '[{"type": "loaded"}]') AS a
            """,
            {"n": n, "tag": f"{tag}-"},
        )

    rounds(8, "early")  # plpgsql switches to generic plans after 5 executions
    load_history(db)  # the tables grow; no ANALYZE (and no DDL) tells the planner
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_analyze = on")
    plans()
    rounds(2, "late")
    captured = plans()
    assert any("INSERT INTO runs" in plan for plan in captured)
    bad = walks(captured)
    assert not bad, "\n\n".join(bad[:5])


def test_every_scheduler_and_ledger_function_plans_key_lookups_without_statistics(
    db: psycopg.Connection,
) -> None:
    """Each public function of plpgsql/runs, plpgsql/ledger and the
    schedulers' of plpgsql/schedules (enqueue_due_schedules,
    schedules_next_due_at: the worker's maintenance rounds call them) runs with
    enable_seqscan off (a key lookup is a probe whatever the statistics say),
    jit off (the cost that makes a scan unattractive would otherwise make
    PostgreSQL compile each such statement, tens of milliseconds) and generic
    plans forced (no statement planned again on every call)."""
    root = Path(__file__).resolve().parents[2] / "plpgsql"
    names = sorted(
        [p.stem for folder in ("runs", "ledger") for p in (root / folder).glob("*.sql")]
        + ["enqueue_due_schedules", "schedules_next_due_at"]
    )
    rows = db.execute(
        "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc AS p"
        " WHERE p.pronamespace = 'runrelay'::regnamespace AND p.proname = ANY(%s)",
        [names],
    ).fetchall()
    assert sorted({name for name, _ in rows}) == names
    missing = [
        name
        for name, config in rows
        if not {"enable_seqscan=off", "jit=off", "plan_cache_mode=force_generic_plan"}
        <= set(config)
    ]
    assert missing == []
