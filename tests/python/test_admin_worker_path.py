"""What the admin functions cost the worker path (docs/admin.md): the
listing indexes of list_runs, counted exactly in WAL records (a claim writes
no entry, an enqueue and a completion one each, two for a keyed run); and
claims while a queue is paused, by their plans (index probes, whatever the
paused backlog)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from sqlapi import call, scalar
from test_admin_plans import buffers, explained, nested


def wal_records(conn: psycopg.Connection, query: str, drop_listing_indexes: bool) -> int:
    """WAL records a call writes, in a transaction that is rolled back, with
    or without the listing indexes (dropped inside that transaction). The
    fewest of three runs, each after a VACUUM: a run may also prune a page
    (the rolled-back rows of the run before, or rows of an earlier test),
    which adds a record that has nothing to do with the indexes."""
    records = []
    for _ in range(3):
        conn.execute(
            "VACUUM runrelay.runs, runrelay.attempts, runrelay.ledger_events,"
            " runrelay.ledger_lanes, runrelay.ledger_wakeups"
        )
        with conn.transaction(force_rollback=True):
            if drop_listing_indexes:
                conn.execute("DROP INDEX runrelay.runs_list_idx, runrelay.runs_key_list_idx")
            plan = conn.execute(f"EXPLAIN (ANALYZE, WAL, FORMAT JSON) {query}").fetchone()
            assert plan is not None
            records.append(int(plan[0][0]["Plan"]["WAL Records"]))
    return min(records)


@pytest.mark.parametrize("key", [None, "k"])
def test_a_claim_writes_no_listing_index_entry(db: psycopg.Connection, key: str | None) -> None:
    """The price of list_runs on the worker path, counted exactly: a claim
    (queued -> running) writes the same WAL records with or without the
    listing indexes; an enqueue and a completion write one more each (two
    for a keyed run), the new index entries."""
    call(db, "enqueue_run", run_id="seed", queue="q", concurrency_key=key)
    new_key = "NULL" if key is None else f"'{key}-2'"
    enqueue = f"SELECT * FROM runrelay.enqueue_run('new', 'q', concurrency_key => {new_key})"
    claim = "SELECT * FROM runrelay.claim_attempts('w', ARRAY['q'])"
    per_index = 1 if key is None else 2
    assert wal_records(db, enqueue, False) == wal_records(db, enqueue, True) + per_index
    assert wal_records(db, claim, False) == wal_records(db, claim, True)
    (claimed,) = call(db, "claim_attempts", worker="w", queues=["q"])
    complete = f"SELECT runrelay.complete_attempt('seed', 1, '{claimed['lease_token']}')"
    assert wal_records(db, complete, False) == wal_records(db, complete, True) + per_index


@pytest.fixture
def paused_backlog(db: psycopg.Connection) -> psycopg.Connection:
    """200 000 queued runs: 100 000 in queue `hot` at the highest priority
    and the oldest run_at, paused, and 25 000 in each of four others; 50
    queues of one finished run each."""
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, priority, payload, run_at,
                                   max_attempts, created_at, updated_at)
        SELECT 'hot-' || i, 'hot', 'queued', 100, '{}'::jsonb, now() - interval '1 day', 3,
               now(), now()
        FROM generate_series(1, 100000) AS i
        UNION ALL
        SELECT 'cold-' || i, 'cold' || (i % 4), 'queued', 0, '{}'::jsonb,
               now() - make_interval(secs => i), 3, now(), now()
        FROM generate_series(1, 100000) AS i
        """
    )
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts, result,
                                   created_at, updated_at, finished_at)
        SELECT 'done-' || i, 'old' || i, 'completed', '{}', now(), 3, '{}', now(), now(), now()
        FROM generate_series(1, 50) AS i
        """
    )
    db.execute("VACUUM ANALYZE runrelay.runs")
    assert scalar(db, "pause_queue", queue="hot") == "paused"
    return db


def test_claims_skip_a_paused_queue_by_index_probes_whatever_its_backlog(
    paused_backlog: psycopg.Connection,
) -> None:
    """With the best 100 000 runs in a paused queue, a claim of every queue
    finds the other queues with a skip scan (one probe each) and claims from
    their ranges: no paused run, no walk over the paused backlog, past
    PL/pgSQL's switch to generic plans; it costs a claim of the same runs
    without a pause plus the skip scan and the few extra candidates each
    queue's range offers. A claim naming only the paused queue reads no
    candidate at all."""
    db = paused_backlog
    take = explained(db)

    def claim(**kwargs: Any) -> tuple[list[dict[str, Any]], list[str]]:
        take()
        rows = call(db, "claim_attempts", worker="w", **kwargs)
        return rows, take()

    paused_cost = 0
    for i in range(8):
        rows, plans = claim(max_runs=10)
        assert len(rows) == 10 and not any(r["queue"] == "hot" for r in rows)
        text = "\n".join(nested(plans))
        assert "Seq Scan on runs" not in text, text
        skip = [p for p in plans if "WITH RECURSIVE q (name)" in p]
        assert len(skip) == 1 and buffers(skip[0]) < 60, skip
        rows, plans = claim(queues=["hot", "cold1"], max_runs=5)
        assert [r["queue"] for r in rows] == ["cold1"] * 5
        assert "Seq Scan on runs" not in "\n".join(plans)
        rows, plans = claim(queues=["hot"])
        assert rows == []
        assert "runs_claim" not in "\n".join(plans)  # no candidate range was read
        if i >= 2:  # past loading the catalog caches
            _, plans = claim(max_runs=10)
            paused_cost = max(paused_cost, total(plans))
    assert scalar(db, "resume_queue", queue="hot") == "resumed"
    for _ in range(8):
        rows, plans = claim(max_runs=10)
        assert [r["queue"] for r in rows] == ["hot"] * 10
    assert paused_cost < total(plans) + 200, (paused_cost, total(plans))


def total(plans: list[str]) -> int:
    """The buffers of the client's call, every nested statement included."""
    calls = [p for p in plans if 'Query Text: SELECT * FROM runrelay."' in p]
    assert len(calls) == 1, plans
    return buffers(calls[0])
