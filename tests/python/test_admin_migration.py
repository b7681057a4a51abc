"""Revision 0009 with data in the tables (STYLE 12): an install at 0008 with
runs in every state upgrades to 0009, where the admin functions see the old
runs and retry one; downgrading to 0008 leaves a retried run the budget it
had left, under 0008's count of every failure; upgrading again works."""

from __future__ import annotations

import os
import uuid

import psycopg
from psycopg.types.json import Jsonb

from conftest import alembic, create_database, drop_database
from runrelay import migrations


def _fail(c: psycopg.Connection, run_id: str) -> str:
    row = c.execute(
        "SELECT runrelay.fail_attempt(a.run_id, a.attempt, a.lease_token, '{\"e\": 1}',"
        " retry_at => now() - interval '1 day')"
        " FROM runrelay.claim_attempts('w', ARRAY[%s]) AS a",
        [run_id],
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_0009_upgrades_with_data_and_a_retried_run_keeps_its_budget_down_to_0008() -> None:
    name = f"rr_admin_migration_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "0008")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT runrelay.enqueue_run('spent', 'spent', max_attempts => 2)")
            assert [_fail(c, "spent") for _ in range(2)] == ["retry_scheduled", "failed"]
            c.execute("SELECT runrelay.enqueue_run('live', 'live', concurrency_key => 'k')")
            c.execute("SELECT runrelay.enqueue_run('held', 'held', concurrency_key => 'k')")
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            rows = c.execute(
                "SELECT run_id, status FROM runrelay.list_runs() ORDER BY run_id"
            ).fetchall()
            assert rows == [("held", "queued"), ("live", "queued"), ("spent", "failed")]
            assert c.execute(
                "SELECT count(*) FROM runrelay.runs WHERE series_start <> 0"
            ).fetchone() == (0,)
            retried = c.execute(
                "SELECT runrelay.retry_run('spent', max_attempts => 3, call_id => %s)",
                [uuid.uuid4()],
            ).fetchone()
            assert retried == ("retried",)
            assert _fail(c, "spent") == "retry_scheduled"  # 1 of the new series' 3
        alembic(url, "downgrade", "0008")
        with psycopg.connect(url, autocommit=True) as c:
            # 0008 counts all four failures: the budget grew by the two before
            # the series, so the run still has two more, as under 0009.
            assert c.execute(
                "SELECT max_attempts FROM runrelay.runs WHERE run_id = 'spent'"
            ).fetchone() == (5,)
            assert c.execute("SELECT count(*) FROM runrelay.calls").fetchone() == (0,)
            assert [_fail(c, "spent") for _ in range(2)] == ["retry_scheduled", "failed"]
            indexes = c.execute(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = 'runrelay'"
                " AND indexname IN ('runs_list_idx', 'runs_key_list_idx')"
            ).fetchone()
            assert indexes == (0,)
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT runrelay.retry_run('spent')").fetchone() == ("retried",)
            head = c.execute("SELECT runrelay.get_schema_version()").fetchone()
            assert head == (migrations.head(),)
    finally:
        drop_database(name)


def _deliver(c: psycopg.Connection, run_id: str, lane: str) -> list[tuple[str, int | None]]:
    """Claim a run lane's pending events as relay r and acknowledge them:
    the kinds and lags ack_ledger answers."""
    claimed = c.execute(
        "SELECT array_agg(event_id ORDER BY seq) FROM runrelay.claim_ledger("
        " relay => 'r', lane => %s, run_id => %s, max_events => 10, batch => true)",
        [lane, run_id],
    ).fetchone()
    assert claimed is not None and claimed[0], claimed
    return c.execute(
        "SELECT kind, lag_ms FROM runrelay.ack_ledger('r', %s, %s)", [run_id, claimed[0]]
    ).fetchall()


def _ledger(c: psycopg.Connection) -> list[tuple[str, str, str, str | None, bool]]:
    return c.execute(
        "SELECT run_id, type, state, delivered_by, batch_id IS NOT NULL"
        " FROM runrelay.ledger ORDER BY run_id, lane, seq"
    ).fetchall()


def test_0009_records_deliveries_by_range_and_0008_gets_them_back_on_its_events() -> None:
    """Events delivered under 0008 carry their delivery on their rows and
    still read as delivered after the upgrade (and a repeated ack of them
    answers as the first did); 0009 records an acknowledgement as one
    ledger_deliveries row; the downgrade writes each such delivery back on
    its events, as 0008 reads them."""
    name = f"rr_delivery_migration_{os.getpid()}"
    url = create_database(name)
    try:
        alembic(url, "upgrade", "0008")
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT runrelay.enqueue_run('old', 'q')")
            old_ack = _deliver(c, "old", "lifecycle")
            assert [kind for kind, _ in old_ack] == ["delivered"]
            old_ids = c.execute(
                "SELECT array_agg(event_id) FROM runrelay.ledger WHERE run_id = 'old'"
            ).fetchone()
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            assert _ledger(c) == [("old", "run.queued", "delivered", "r", True)]
            assert old_ids is not None
            again = c.execute(
                "SELECT kind, lag_ms FROM runrelay.ack_ledger('r', 'old', %s)", [old_ids[0]]
            ).fetchall()
            assert again == old_ack
            c.execute("SELECT runrelay.enqueue_run('new', 'q')")
            c.execute(
                "SELECT runrelay.append_events('new', %s)",
                [Jsonb([{"type": t, "lane": "observability"} for t in ("a", "b")])],
            )
            assert [kind for kind, _ in _deliver(c, "new", "observability")] == ["delivered"] * 2
            assert c.execute(
                "SELECT run_id, lane, last_seq - first_seq + 1, delivered_by"
                " FROM runrelay.ledger_deliveries"
            ).fetchall() == [("new", "observability", 2, "r")]
            upgraded = _ledger(c)
            assert upgraded == [
                ("new", "run.queued", "pending", None, False),
                ("new", "a", "delivered", "r", True),
                ("new", "b", "delivered", "r", True),
                ("old", "run.queued", "delivered", "r", True),
            ]
        alembic(url, "downgrade", "0008")
        with psycopg.connect(url, autocommit=True) as c:
            assert _ledger(c) == upgraded
            assert c.execute(
                "SELECT to_regclass('runrelay.ledger_deliveries') IS NULL,"
                " 'fillfactor=50' = ANY(reloptions)"
                " FROM pg_class WHERE oid = 'runrelay.ledger_events'::regclass"
            ).fetchone() == (True, True)
        alembic(url, "upgrade", "head")
        with psycopg.connect(url, autocommit=True) as c:
            assert _ledger(c) == upgraded
    finally:
        drop_database(name)
