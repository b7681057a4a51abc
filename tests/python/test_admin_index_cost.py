"""What the listing indexes of list_runs cost the worker path, counted
exactly in WAL records (docs/admin.md): a claim writes none, an enqueue and
a completion one entry each (two for a keyed run)."""

from __future__ import annotations

import psycopg
import pytest

from sqlapi import call


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
