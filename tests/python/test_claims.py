"""Claims: ordering, exactly-once under concurrency, concurrency keys, plans."""

from __future__ import annotations

import random
import re
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from sqlapi import call, enqueue, fenced, scalar

Connect = Callable[..., psycopg.Connection]


def test_priority_first_then_oldest_run_at(db: psycopg.Connection) -> None:
    enqueue(db, "old-low", run_at="2026-01-01T00:00:00Z", priority=0)
    enqueue(db, "new-high", run_at="2026-01-03T00:00:00Z", priority=5)
    enqueue(db, "older-high", run_at="2026-01-02T00:00:00Z", priority=5)
    enqueue(db, "future-top", run_at="2999-01-01T00:00:00Z", priority=99)
    order = [r["run_id"] for r in call(db, "claim_attempts", worker="w", max_runs=10)]
    assert order == ["older-high", "new-high", "old-low"]


def test_queues_filter_and_merge_across_queues(db: psycopg.Connection) -> None:
    enqueue(db, "a1", queue="a", priority=1, run_at="2026-01-01T00:00:00Z")
    enqueue(db, "b1", queue="b", priority=3, run_at="2026-01-01T00:00:00Z")
    enqueue(db, "c1", queue="c", priority=9, run_at="2026-01-01T00:00:00Z")
    enqueue(db, "b2", queue="b", priority=0, run_at="2026-01-01T00:00:00Z")
    rows = call(db, "claim_attempts", worker="w", queues=["a", "b", "b"], max_runs=2)
    assert [r["run_id"] for r in rows] == ["b1", "a1"]
    assert {r["queue"] for r in rows} == {"a", "b"}


def test_eight_claimers_take_every_run_exactly_once(
    db: psycopg.Connection, connect: Connect
) -> None:
    db.execute(
        "SELECT runrelay.enqueue_run('r' || i, payload => jsonb_build_object('i', i))"
        " FROM generate_series(1, 2000) AS i"
    )
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        conn = connect()
        while True:
            rows = call(conn, "claim_attempts", worker=f"w{n}", max_runs=random.choice([1, 3, 10]))
            if not rows:
                return
            for row in rows:
                assert scalar(conn, "complete_attempt", **fenced(row)) == "completed"
            with lock:
                claimed.extend(r["run_id"] for r in rows)

    with ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(claimer, n) for n in range(8)]:
            f.result(timeout=120)
    assert len(claimed) == 2000
    assert len(set(claimed)) == 2000
    assert db.execute("SELECT count(*) FROM runrelay.attempts WHERE attempt > 1").fetchone() == (0,)


def test_concurrency_keys_are_strictly_serial_in_enqueue_order(
    db: psycopg.Connection, connect: Connect
) -> None:
    """8 claimers over 50 keys x 20 runs (plus keyless runs). A first attempt
    fails one time in five and retries at once: a retrying head keeps its key."""
    rng = random.Random(7)
    plan = [(f"k{k}-{i}", f"k{k}") for i in range(20) for k in range(50)]
    rng.shuffle(plan)
    for run_id, key in plan:
        enqueue(db, run_id, concurrency_key=key)
    for i in range(100):
        enqueue(db, f"free-{i}")

    def worker(n: int) -> None:
        conn = connect()
        w_rng = random.Random(n)
        idle = 0
        while idle < 20:
            rows = call(conn, "claim_attempts", worker=f"w{n}", max_runs=2)
            if not rows:
                idle += 1
                threading.Event().wait(0.01)
                continue
            idle = 0
            for row in rows:
                if row["attempt"] == 1 and w_rng.random() < 0.2:
                    outcome = scalar(
                        conn,
                        "fail_attempt",
                        **fenced(row),
                        error={"flaky": True},
                        retry_at="2000-01-01T00:00:00Z",
                    )
                    assert outcome == "retry_scheduled"
                else:
                    assert scalar(conn, "complete_attempt", **fenced(row)) == "completed"

    with ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(worker, n) for n in range(8)]:
            f.result(timeout=180)

    assert db.execute(
        "SELECT count(*) FROM runrelay.runs WHERE status <> 'completed'"
    ).fetchone() == (0,)
    rows = db.execute(
        """
        SELECT r.concurrency_key, l.run_id, l.type, r.key_position
        FROM runrelay.ledger AS l JOIN runrelay.runs AS r USING (run_id)
        WHERE r.concurrency_key IS NOT NULL
          AND l.type IN ('run.started', 'run.retry_scheduled', 'run.completed')
        ORDER BY l.event_id
        """
    ).fetchall()
    by_key: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for key, run_id, kind, position in rows:
        by_key[key].append((run_id, kind, position))
    assert len(by_key) == 50
    retried = 0
    for key, seq in by_key.items():
        active: str | None = None
        starts: list[int] = []
        for run_id, kind, position in seq:
            if kind == "run.started":
                assert active is None, f"{key}: {run_id} started while {active} was live"
                active = run_id
                if not starts or starts[-1] != position:
                    starts.append(position)
            else:
                assert active == run_id
                active = None
                retried += kind == "run.retry_scheduled"
        assert starts == sorted(starts), f"{key} started out of enqueue order"
        assert len(starts) == 20
    assert retried > 0


def test_claim_path_uses_partial_indexes_at_100k_queued(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    db.execute("SET auto_explain.log_min_duration = -1")
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, priority, payload, run_at,
                                   max_attempts, created_at, updated_at, concurrency_key,
                                   key_position, key_held)
        SELECT 'bulk-' || i, 'q' || (i % 4), 'queued', i % 3, '{}',
               now() - make_interval(secs => i), 3, now(), now(),
               CASE WHEN i % 2 = 0 THEN 'key-' || (i % 500) END,
               CASE WHEN i % 2 = 0 THEN i END,
               i % 2 = 0 AND i > 500
        FROM generate_series(1, 100000) AS i
        """
    )
    db.execute("ANALYZE runrelay.runs")
    db.execute("SET auto_explain.log_min_duration = 0")
    plans()
    for queues in (None, ["q1"], ["q1", "q2"]):
        for _ in range(7):  # past plpgsql's switch to a generic plan
            rows = call(db, "claim_attempts", worker="w", queues=queues, max_runs=5)
            assert len(rows) == 5
            captured = "\n".join(plans())
            assert "Seq Scan on runs" not in captured, captured
            assert "runs_claim_any_idx" in captured or "runs_claim_queue_idx" in captured
            assert "using runs_wake_any_idx" in captured  # due waits: an index probe


def test_wake_check_is_a_seek_with_100k_sleeping_runs(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """Every claim first asks whether any wait has fallen due. With 100 000
    runs asleep until tomorrow that must be one bounded index probe, not a
    walk over every waiting run (a volatile clock call in the predicate
    cannot bound an index scan; a variable can)."""
    db.execute("SET auto_explain.log_min_duration = -1")
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   attempt_count, wait, wake_at, created_at, updated_at)
        SELECT 'sleeper-' || i, 'q', 'waiting', '{}', now(), 3, 1,
               '{"kind": "sleep"}', now() + interval '1 day' + make_interval(secs => i),
               now(), now()
        FROM generate_series(1, 100000) AS i
        """
    )
    enqueue(db, "ready", queue="q")
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_analyze = on")
    db.execute("SET auto_explain.log_buffers = on")
    plans()
    for _ in range(7):  # with fresh statistics and past plpgsql's generic plan
        call(db, "claim_attempts", worker="w", queues=["q"])
        assert_one_wake_probe(plans())
    db.execute("ANALYZE runrelay.runs")
    for _ in range(7):
        call(db, "claim_attempts", worker="w", queues=["q"])
        assert_one_wake_probe(plans())


def assert_one_wake_probe(captured: list[str]) -> None:
    checks = [p for p in captured if "min(w.wake_at)" in p]
    assert len(checks) == 1, captured
    plan = checks[0]
    # The same statement looks at paused_queues (empty: a scan of no page).
    assert "Seq Scan on runs" not in plan, plan
    assert "runs_wake_any_idx" in plan, plan
    assert "Rows Removed by Filter" not in plan, plan
    # One entry read: "rows=1" (PostgreSQL 18 prints "rows=1.00").
    assert re.search(r"rows=1(\.00)? loops=1", plan.split("runs_wake_any_idx", 1)[1]), plan


def insert_finished_runs(db: psycopg.Connection, n: int) -> None:
    """n completed runs, written directly: a large table for plan tests."""
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   result, created_at, updated_at, finished_at)
        SELECT 'done-' || i, 'q', 'completed', '{}', now(), 3, '{}', now(), now(), now()
        FROM generate_series(1, %s) AS i
        """,
        [n],
    )


BATCH_TABLES = ("runs", "attempts", "cancellations", "ledger", "ledger_lanes")
TABLE_NODE = re.compile(rf"(Scan|Update|Insert|Delete)( using \S+)? on ({'|'.join(BATCH_TABLES)}) ")


def table_statements(captured: list[str], forbidden: tuple[str, ...] = ()) -> int:
    """How many captured statements touch the queue and ledger tables; none
    may scan one of them sequentially or use a `forbidden` plan node.
    Foreign-key checks run per inserted row by design and are not counted."""
    touching = [
        p for p in captured if TABLE_NODE.search(p) and 'SELECT 1 FROM ONLY "runrelay"' not in p
    ]
    text = "\n".join(touching)
    for table in BATCH_TABLES:
        assert f"Seq Scan on {table} " not in text, text
    for node in forbidden:
        assert node not in text, text
    return len(touching)


def test_complete_attempts_is_set_based_and_seeks(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """A batch of plain completions touches the tables in a fixed number of
    statements, however many items it has (only input checks and foreign-key
    triggers run per item),
    and each reaches rows by index: with 2 000 attempts running, 20 500 cancel
    markers pending and 100 000 finished runs, nothing scans attempts, runs or
    cancellations."""
    db.execute("SET auto_explain.log_min_duration = -1")
    insert_finished_runs(db, 100_000)
    db.execute("SELECT runrelay.enqueue_run('bulk-' || i, 'q') FROM generate_series(1, 3000) AS i")
    running = call(db, "claim_attempts", worker="w", queues=["q"], max_runs=1000)
    running += call(db, "claim_attempts", worker="w", queues=["q"], max_runs=1000)
    db.execute(
        "INSERT INTO runrelay.cancellations (run_id, reason, requested_at)"
        " SELECT 'bulk-' || i, 'test', now() FROM generate_series(2501, 3000) AS i"
    )
    # Markers of runs no writer has touched yet (cancel_run inserts before it
    # locks), so that a scan of the markers would cost more than probes.
    db.execute(
        "INSERT INTO runrelay.cancellations (run_id, reason, requested_at)"
        " SELECT 'elsewhere-' || i, 'test', now() FROM generate_series(1, 20000) AS i"
    )
    db.execute("ANALYZE runrelay.runs, runrelay.attempts, runrelay.cancellations")
    db.execute("SET auto_explain.log_min_duration = 0")
    counts = []
    for size in (1, 10, 100, 1, 10, 100):  # the second round runs on generic plans
        batch = [
            {"run_id": c["run_id"], "attempt": c["attempt"], "lease_token": str(c["lease_token"])}
            for c in running[:size]
        ]
        del running[:size]
        plans()
        rows = call(db, "complete_attempts", items=batch)
        assert [r["outcome"] for r in rows] == ["completed"] * size
        counts.append(table_statements(plans(), forbidden=("attempts_lease_expiry_idx",)))
    assert len(set(counts)) == 1, counts


def test_claim_attempts_starts_runs_set_based_and_seeks(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """Claiming 1, 10 or 100 runs touches the tables in the same statements,
    each reaching rows by index, with 100 000 finished runs, 2 000 queued and
    no statistics yet (a young install, before autovacuum's first ANALYZE).
    Autovacuum is off for the test's tables: its first ANALYZE of the new
    rows would otherwise land at a moment of the test it chooses (once in
    many runs, between two claims), and the claims after it would be
    planned with statistics, which other tests cover."""
    tables = ("runs", "attempts", "ledger_events", "ledger_lanes")
    for table in tables:
        db.execute(f"ALTER TABLE runrelay.{table} SET (autovacuum_enabled = false)")
    try:
        db.execute("SET auto_explain.log_min_duration = -1")
        insert_finished_runs(db, 100_000)
        db.execute(
            "SELECT runrelay.enqueue_run('bulk-' || i, 'q') FROM generate_series(1, 2000) AS i"
        )
        db.execute("SET auto_explain.log_min_duration = 0")
        counts = []
        for size in (1, 10, 100, 1, 10, 100):  # the second round after plpgsql's plans warmed
            plans()
            rows = call(db, "claim_attempts", worker="w", queues=["q"], max_runs=size)
            assert len(rows) == size
            counts.append(table_statements(plans(), forbidden=("Bitmap Heap Scan on runs",)))
        assert len(set(counts)) == 1, counts
    finally:
        for table in tables:
            db.execute(f"ALTER TABLE runrelay.{table} RESET (autovacuum_enabled)")


@pytest.mark.parametrize("queues", [["q"], None, ["q", "other"]])
def test_claims_read_the_claim_index_after_statistics_saw_no_queued_run(
    db: psycopg.Connection, plans: Callable[[], list[str]], queues: list[str] | None
) -> None:
    """Statistics taken while nothing was queued (100 000 finished runs), then
    a backlog of 2 000: the claim's candidates still come from a claim index,
    best first, without reading and sorting the backlog. (PostgreSQL 18
    planned them through runs_list_idx and a sort of every queued run.)"""
    db.execute("ALTER TABLE runrelay.runs SET (autovacuum_enabled = false)")
    try:
        db.execute("SET auto_explain.log_min_duration = -1")
        insert_finished_runs(db, 100_000)
        db.execute("ANALYZE runrelay.runs")
        db.execute(
            "SELECT runrelay.enqueue_run('bulk-' || i, 'q') FROM generate_series(1, 2000) AS i"
        )
        db.execute("SET auto_explain.log_min_duration = 0")
        db.execute("SET auto_explain.log_analyze = on")
        db.execute("SET auto_explain.log_timing = off")
        for _ in range(7):  # past plpgsql's switch to the generic plan
            plans()
            assert len(call(db, "claim_attempts", worker="w", queues=queues)) == 1
            [candidates] = [
                p for p in plans() if "FOR UPDATE SKIP LOCKED" in p and "ORDER BY r.priority" in p
            ]
            assert "runs_claim_" in candidates, candidates
            assert "runs_list_idx" not in candidates, candidates
            # At most one run read per queue asked, per loop (PostgreSQL 18
            # prints the average over loops: 1.00, 0.50).
            for line in candidates.splitlines():
                if "Scan" in line and " on runs " in line:
                    assert re.search(r"actual rows=[01](\.\d+)? ", line), candidates
    finally:
        db.execute("ALTER TABLE runrelay.runs RESET (autovacuum_enabled)")


def test_claims_do_not_pay_for_another_queues_due_waits(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """50 000 waits fell due on queue x, whose workers are down. A claim on
    queue y still sees a wait due somewhere and wakes its own: that must be a
    probe of y's range of runs_wake_idx, not a walk over x's waits. The
    claim's own statements run on generic plans, in which a queue filter
    could not be folded; _end_due_waits plans per call for that reason."""
    db.execute("SET auto_explain.log_min_duration = -1")
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   attempt_count, wait, wake_at, created_at, updated_at)
        SELECT 'x-' || i, 'x', 'waiting', '{}', now(), 3, 1, '{"kind": "sleep"}',
               now() - interval '1 hour' + make_interval(secs => i), now(), now()
        FROM generate_series(1, 50000) AS i
        """
    )
    db.execute("SELECT runrelay.enqueue_run('y-' || i, 'y') FROM generate_series(1, 20) AS i")
    db.execute("ANALYZE runrelay.runs")
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_analyze = on")
    for queues in (["y"], ["y", "z"]):
        for _ in range(7):
            plans()
            assert len(call(db, "claim_attempts", worker="w", queues=queues)) == 1
            wake = [p for p in plans() if "FOR UPDATE SKIP LOCKED" in p and "wake_at <=" in p]
            assert len(wake) == 1, wake
            assert "Rows Removed by Filter" not in wake[0], wake[0]
            assert "runs_wake_idx" in wake[0], wake[0]
    # Claims for every queue do collect x's waits, 1000 per claim.
    call(db, "claim_attempts", worker="w")
    assert db.execute(
        "SELECT count(*) FROM runrelay.runs WHERE queue = 'x' AND status = 'queued'"
    ).fetchone() == (1000,)


def test_a_tasks_filtered_claim_seeks_its_tasks_range_past_100k_runs_of_other_tasks(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """Runs of other tasks (and untyped runs) waiting in the same queues cost
    a filtered claim nothing: it reads each (queue, task) range of
    runs_claim_task_idx, never the queue-wide claim indexes, with or without
    a queue list (without one, a skip scan finds the task's queues)."""
    db.execute("SET auto_explain.log_min_duration = -1")
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, priority, payload, run_at,
                                   max_attempts, created_at, updated_at, task)
        SELECT 'bulk-' || i, 'q' || (i % 4), 'queued', i % 3, '{}',
               now() - make_interval(secs => i), 3, now(), now(),
               CASE WHEN i % 5 = 0 THEN NULL WHEN i <= 400 THEN 'mine' ELSE 'other' END
        FROM generate_series(1, 100000) AS i
        """
    )
    db.execute("ANALYZE runrelay.runs")
    db.execute("SET auto_explain.log_min_duration = 0")
    plans()
    for queues in (None, ["q1"], ["q1", "q2"]):
        for _ in range(7):  # past plpgsql's switch to a generic plan
            rows = call(db, "claim_attempts", worker="w", queues=queues, max_runs=2, tasks=["mine"])
            assert len(rows) == 2
            assert {r["task"] for r in rows} == {"mine"}
            captured = "\n".join(plans())
            assert "Seq Scan on runs" not in captured, captured
            assert "runs_claim_task_idx" in captured, captured
            assert "runs_claim_any_idx" not in captured, captured
            assert "runs_claim_queue_idx" not in captured, captured


def test_a_claim_reads_each_claimed_runs_steps_by_its_key_past_100k_steps_of_other_runs(
    db: psycopg.Connection, plans: Callable[[], list[str]]
) -> None:
    """The steps a claim returns cost one range of the steps primary key per
    claimed run, whatever other runs recorded, before and after ANALYZE."""
    db.execute("SET auto_explain.log_min_duration = -1")
    enqueue(db, "mine-1", queue="stepped")
    enqueue(db, "mine-2", queue="stepped")
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   created_at, updated_at)
        SELECT 'old-' || i, 'elsewhere', 'queued', '{}', now() + interval '1 day', 3, now(), now()
        FROM generate_series(1, 20000) AS i;
        INSERT INTO runrelay.steps (run_id, step, position, result, attempt, recorded_at)
        SELECT 'old-' || (i % 20000 + 1), 'step-' || i, i, '{}', 1, now()
        FROM generate_series(1, 100000) AS i;
        INSERT INTO runrelay.steps (run_id, step, position, result, attempt, recorded_at)
        VALUES ('mine-1', 'a', 1, '"x"', 1, now());
        """
    )
    for analysed in (False, True):
        if analysed:
            db.execute("ANALYZE runrelay.steps")
        db.execute("SET auto_explain.log_min_duration = 0")
        plans()
        rows = call(db, "claim_attempts", worker="w", queues=["stepped"], max_runs=2)
        db.execute("SET auto_explain.log_min_duration = -1")
        assert {r["run_id"]: r["steps"] for r in rows} == {"mine-1": {"a": "x"}, "mine-2": None}
        captured = "\n".join(plans())
        assert "Seq Scan on steps" not in captured, captured
        assert "steps_pkey" in captured or "steps_position_unique" in captured, captured
        for row in rows:
            call(db, "release_attempt", run_id=row["run_id"], attempt=row["attempt"],
                 lease_token=row["lease_token"])  # fmt: skip
