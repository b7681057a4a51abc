"""The admin functions at a million runs (docs/admin.md): every nested
statement's plan, captured with auto_explain past PL/pgSQL's switch to
generic plans, reads index ranges only, never a sequential scan of runs or
attempts, and touches a bounded number of buffers, whatever the filters and
however deep the page."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from conftest import capture_plans, reset
from sqlapi import call, scalar

RUNS = 1_000_000
RUNNING = 200
QUEUES = 4


@pytest.fixture(scope="module")
def million(db_url: str) -> Iterator[str]:
    """1 000 000 runs over four queues, loaded in bulk: 90 % completed, 5 %
    failed, 2 % cancelled, 1 % waiting, the rest queued but for 200 running
    (with their running attempts); every tenth run keyed (1 000 keys of 100
    runs). created_at one second apart, oldest first; an ended run ended a
    second after it was created."""
    with psycopg.connect(db_url, autocommit=True) as c:
        reset(c)
        c.execute(
            """
            INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                       attempt_count, result, wait, error, concurrency_key,
                                       key_position, created_at, updated_at, finished_at)
            SELECT 'm-' || i, 'q' || (i %% %(queues)s), s.status, '{}', now(), 3,
                   CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END,
                   CASE WHEN s.status = 'completed' THEN '{}'::jsonb END,
                   CASE WHEN s.status = 'waiting' THEN '{"kind": "event", "name": "go"}'::jsonb END,
                   CASE WHEN s.status = 'failed' THEN '{"e": 1}'::jsonb END,
                   CASE WHEN i %% 10 = 0 THEN 'key-' || (i %% 1000) END,
                   CASE WHEN i %% 10 = 0 THEN i END,
                   now() - make_interval(secs => %(runs)s - i), now(),
                   CASE WHEN s.status IN ('completed', 'failed', 'cancelled')
                        THEN now() - make_interval(secs => %(runs)s - i - 1) END
            FROM generate_series(1, %(runs)s) AS i
            CROSS JOIN LATERAL (SELECT CASE
                WHEN i %% 100 < 90 THEN 'completed'
                WHEN i %% 100 < 95 THEN 'failed'
                WHEN i %% 100 < 97 THEN 'cancelled'
                WHEN i %% 100 < 98 THEN 'waiting'
                WHEN i %% 5000 = 99 THEN 'running'
                ELSE 'queued' END AS status) AS s
            """,
            {"runs": RUNS, "queues": QUEUES},
        )
        c.execute(
            """
            INSERT INTO runrelay.attempts (run_id, attempt, worker, lease_token, status,
                                           claimed_at, heartbeat_at, lease_expires_at, wait)
            SELECT r.run_id, 1, 'w', gen_random_uuid(),
                   CASE r.status WHEN 'running' THEN 'running' ELSE 'waiting' END,
                   now(), now(), now() + interval '1 hour', r.wait
            FROM runrelay.runs AS r WHERE r.status IN ('running', 'waiting')
            """
        )
        # Every run has a lifecycle lane with nothing pending; 100 of them
        # are blocked behind a failed head.
        c.execute(
            """
            INSERT INTO runrelay.ledger_lanes (run_id, lane, head_seq, blocked, delivered_below)
            SELECT 'm-' || i, 'lifecycle', CASE WHEN i %% 10000 = 7 THEN 1 END,
                   i %% 10000 = 7, 1
            FROM generate_series(1, %(runs)s) AS i
            """,
            {"runs": RUNS},
        )
        c.execute(
            """
            INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                                created_at, next_attempt_at, failed_at,
                                                delivery_attempts, last_error)
            SELECT 'm-' || i, 'lifecycle', 1, 'run.queued', '{}', 'm-' || i || ':1', now(), now(),
                   now(), 10, '{"http": 500}'
            FROM generate_series(7, %(runs)s, 10000) AS i
            """,
            {"runs": RUNS},
        )
        c.execute(
            "VACUUM ANALYZE runrelay.runs, runrelay.attempts, runrelay.ledger_lanes,"
            " runrelay.ledger_events"
        )
        running = c.execute("SELECT count(*) FROM runrelay.runs WHERE status = 'running'")
        assert running.fetchone() == (RUNNING,)
    yield db_url
    with psycopg.connect(db_url, autocommit=True) as c:
        reset(c)


def explained(conn: psycopg.Connection) -> Callable[[], list[str]]:
    """Every nested statement's plan with its buffers, as auto_explain logs it."""
    return capture_plans(conn, analyze=True)


def nested(plans: list[str]) -> list[str]:
    """The statements inside the function (the top-level call's own count
    includes them all and, on a first call, loading the catalog)."""
    return [p for p in plans if 'Query Text: SELECT * FROM runrelay."' not in p]


def buffers(plan: str) -> int:
    return max((int(x) for x in re.findall(r"(?:hit|read)=(\d+)", plan)), default=0)


def assert_seeks(plans: list[str], limit: int) -> None:
    inner = nested(plans)
    assert inner, plans
    text = "\n".join(inner)
    assert "Seq Scan on runs" not in text, text
    assert "Seq Scan on attempts" not in text, text
    worst = max(inner, key=buffers)
    assert buffers(worst) < limit, worst


def created(conn: psycopg.Connection, run_id: str) -> datetime:
    row = conn.execute("SELECT created_at FROM runrelay.runs WHERE run_id = %s", [run_id])
    value = row.fetchone()
    assert value is not None
    return value[0]


def test_list_runs_reads_index_ranges_at_a_million_runs(million: str) -> None:
    """A page costs its rows (one primary-key probe each, about four
    buffers), the index entries of each (queue, status) range up to the page
    size (a few buffers: index-only), and, when running runs can match, two
    probes per run in flight (running runs are not in runs_list_idx, so a
    claim writes nothing there). Nothing grows with the million."""
    with psycopg.connect(million, autocommit=True) as conn:
        take = explained(conn)
        deep = created(conn, "m-100000")
        now = conn.execute("SELECT now()").fetchone()
        assert now is not None
        cases: list[dict[str, Any]] = [
            {"max_rows": 50},
            {"max_rows": 1000},
            {"status": "failed", "max_rows": 50},
            {"status": "failed", "queue": "q1", "max_rows": 50},
            {"status": "queued", "max_rows": 100},
            {"status": "running", "max_rows": 100},
            {"queue": "q2", "max_rows": 100, "after_created_at": deep, "after_run_id": "m-100000"},
            {"status": "completed", "after_created_at": deep, "after_run_id": "m-100000"},
            {"concurrency_key": "key-10", "max_rows": 50},
            {"concurrency_key": "key-10", "status": "completed", "max_rows": 20},
            {"finished_before": now[0] - timedelta(days=5), "max_rows": 100},
            {"created_after": now[0] - timedelta(hours=1), "status": "failed"},
        ]
        for kwargs in cases:
            rows = kwargs.get("max_rows", 100)
            running = kwargs.get("status", "running") == "running"
            running = running and "finished_before" not in kwargs
            limit = 5 * rows + (6 * RUNNING if running else 0) + 100
            for _ in range(7):  # past PL/pgSQL's switch to a generic plan
                take()
                got = call(conn, "list_runs", **kwargs)
                assert len(got) == rows, kwargs
                keys = [(r["created_at"], r["run_id"]) for r in got]
                assert keys == sorted(keys, reverse=True), kwargs
                assert_seeks(take(), limit)


def test_inspecting_one_run_is_primary_key_ranges_at_a_million_runs(million: str) -> None:
    """get_run, run_attempts and run_ledger_events read one run's rows by
    their keys: a page of a run's 500 events costs the page (up to max_rows
    events per lane, each with a probe of its lane row, as the ledger view
    reads it: about five buffers an event)."""
    with psycopg.connect(million, autocommit=True) as conn:
        events = [{"type": "e", "lane": "observability"}] * 250 + [{"type": "l"}] * 250
        call(conn, "append_events", run_id="m-99", events=events)
        take = explained(conn)
        for _ in range(7):
            take()
            (run,) = call(conn, "get_run", run_id="m-99")
            assert run["status"] == "running"
            assert_seeks(take(), 20)
            (attempt,) = call(conn, "run_attempts", run_id="m-99")
            assert attempt["status"] == "running"
            assert_seeks(take(), 20)
            page = call(conn, "run_ledger_events", run_id="m-99", after_seq=100, max_rows=50)
            assert [e["seq"] for e in page] == list(range(101, 151))
            assert_seeks(take(), 2 * 50 * 5)
            page = call(conn, "run_ledger_events", run_id="m-99", lane="lifecycle", max_rows=50)
            assert [e["seq"] for e in page] == list(range(251, 301))
            assert_seeks(take(), 50 * 5)


def test_blocked_heads_are_read_from_the_blocked_lanes_alone(million: str) -> None:
    """A million lanes, a hundred blocked: listing them, a page at a time
    and by lane, and requeueing a batch of them, read the blocked lanes'
    index entries and their heads, never the million."""
    with psycopg.connect(million, autocommit=True) as conn:
        take = explained(conn)
        for _ in range(7):
            take()
            page = call(conn, "list_blocked_heads", max_rows=10)
            assert len(page) == 10 and all(h["last_error"] == {"http": 500} for h in page)
            assert_seeks(take(), 60)
            last = page[-1]
            more = call(
                conn,
                "list_blocked_heads",
                lane="lifecycle",
                after_run_id=last["run_id"],
                after_lane=last["lane"],
                max_rows=10,
            )
            assert len(more) == 10 and more[0]["run_id"] > last["run_id"]
            assert_seeks(take(), 60)
            with conn.transaction(force_rollback=True):
                requeued = call(conn, "requeue_blocked_heads", max_lanes=10)
                assert [r["requeued"] for r in requeued] == [1] * 10
                plans = take()
                # Refreshing a lane, as every relay call that changes one does,
                # is some fifty buffers (its run's row, its events, the lane).
                assert_seeks(plans, 10 * 100)
                assert "Seq Scan on ledger_lanes" not in "\n".join(plans)
                assert "Seq Scan on ledger_events" not in "\n".join(plans)


# The tables this fixture makes big (a million rows; attempts 12 000). The
# young-install tour (test_plans_young_install.py) purges too, with 100 000
# rows in attempts, calls and ledger_events.
PURGE_TABLES = ("runs", "attempts", "ledger_lanes")


def test_purge_runs_reads_index_ranges_and_keys_at_a_million_runs(million: str) -> None:
    """A batch of 200 ended runs out of a million (each with its lane row to
    check and delete): the candidates come from runs_list_idx ranges up to
    the cut-off, each run's rows go by their keys, and no big table is
    scanned; the work is the batch's, whatever the million. Rolled back, so
    the fixture stays."""
    with psycopg.connect(million, autocommit=True) as conn:
        cut = conn.execute("SELECT now() - interval '5 days'").fetchone()
        assert cut is not None
        take = explained(conn)
        for _ in range(6):  # past PL/pgSQL's switch to generic plans
            with conn.transaction(force_rollback=True):
                take()
                assert scalar(conn, "purge_runs", finished_before=cut[0], max_rows=200) == 200
                plans = take()
            text = "\n".join(plans)
            for table in PURGE_TABLES:
                assert f"Seq Scan on {table} " not in text, text
            # m-7, among the oldest, waits for its blocked lane: a second
            # window of keys replaces it.
            windows = [p for p in plans if "generate_subscripts(v_queues, 1)" in p]
            assert len(windows) == 2 and sum(buffers(w) for w in windows) < 400, windows
            checks = [p for p in plans if "_ledger_undelivered(k.run_id)" in p]
            assert sum(buffers(c) for c in checks) < 201 * 10, checks
            deletes = [p for p in plans if "DELETE FROM runs AS r" in p]
            assert len(deletes) == 1 and buffers(deletes[0]) < 200 * 40, deletes


# -- the overview ------------------------------------------------------------

# A terminal event for every second ended run of the million: the ledger's
# history, some 485 000 events over eleven days, about 1 700 of them in the
# last hour (the fixture's runs end a second apart).
ORIGIN = "2000-01-01 00:00:00+00"


@pytest.fixture(scope="module")
def ended(million: str) -> Iterator[str]:
    """The million, with the terminal events (run.completed, run.failed,
    run.cancelled) of every run with an even number that ended, each created
    when its run finished and delivered then."""
    with psycopg.connect(million, autocommit=True) as c:
        c.execute(
            """
            INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                                created_at, next_attempt_at, delivered_at,
                                                delivered_by)
            SELECT r.run_id, 'lifecycle', 2, 'run.' || r.status, '{}', r.run_id || ':2',
                   r.finished_at, r.finished_at, r.finished_at, 'relay'
            FROM runrelay.runs AS r
            WHERE r.status IN ('completed', 'failed', 'cancelled')
              AND substring(r.run_id FROM 3)::integer % 2 = 0
            """
        )
        c.execute("VACUUM ANALYZE runrelay.ledger_events")
    yield million
    with psycopg.connect(million, autocommit=True) as c:
        c.execute("DELETE FROM runrelay.ledger_events WHERE seq = 2")
        c.execute("TRUNCATE runrelay.queue_activity, runrelay.queue_activity_watermark")


def pin_clock(conn: psycopg.Connection, at: datetime) -> None:
    """The database clock (runrelay._now()) at `at` for the next statements:
    a session offset from the real clock, set again before each call so that
    the overview's hour stays where the expected figures put it."""
    offset = "(%s::timestamptz - statement_timestamp())::text"
    conn.execute(f"SELECT set_config('runrelay.clock_offset', {offset}, false)", [at])


def expected_minutes(conn: psycopg.Connection, at: datetime) -> dict[str, tuple[list[int], ...]]:
    """The per-minute figures at `at`, from the runs themselves: the ended
    runs with an even number, by the minute they finished in (absolute
    minutes), over the current minute and the 59 before it."""
    rows = conn.execute(
        f"""
        WITH w AS (
            SELECT date_bin('1 minute', %(at)s::timestamptz, '{ORIGIN}') - interval '59 minutes'
                AS first
        )
        SELECT r.queue,
               (extract(EPOCH FROM date_bin('1 minute', r.finished_at, '{ORIGIN}') - w.first)
                / 60)::integer AS i,
               count(*) FILTER (WHERE r.status = 'completed'),
               count(*) FILTER (WHERE r.status = 'failed')
        FROM runrelay.runs AS r CROSS JOIN w
        WHERE r.finished_at >= w.first AND r.finished_at < w.first + interval '60 minutes'
          AND substring(r.run_id FROM 3)::integer %% 2 = 0
        GROUP BY 1, 2
        """,
        {"at": at},
    ).fetchall()
    out: dict[str, tuple[list[int], ...]] = {}
    for queue, i, completed, failed in rows:
        done, fail = out.setdefault(queue, ([0] * 60, [0] * 60))
        done[i], fail[i] = completed, failed
    return out


def test_queue_overview_reads_the_backlog_and_the_hour_never_the_history(ended: str) -> None:
    """A million runs, 970 000 of them ended, half a million terminal events
    in the ledger: the overview reads each queue's live backlog (index
    ranges, index-only: about 5 000 queued and 2 500 waiting runs a queue)
    and its 200 running runs (a probe each), and for the hour the rollup's
    rows and the ledger's events after its watermark. Without a rollup the
    whole hour is counted from the ledger (some 1 700 terminal events, a
    probe of runs each), with one only the last few minutes; the figures are
    the same, and exact. Nothing grows with the history."""
    with psycopg.connect(ended, autocommit=True) as conn:
        now = conn.execute("SELECT now()").fetchone()
        assert now is not None
        at = now[0].replace(second=30, microsecond=0)  # mid-minute, a moment ago or on
        expected = expected_minutes(conn, at)
        assert sum(sum(c) + sum(f) for c, f in expected.values()) > 1000, expected
        backlog = {
            q: (queued, waiting, running)
            for q, queued, waiting, running in conn.execute(
                "SELECT queue, count(*) FILTER (WHERE status = 'queued'),"
                " count(*) FILTER (WHERE status = 'waiting'),"
                " count(*) FILTER (WHERE status = 'running')"
                " FROM runrelay.runs WHERE status IN ('queued', 'waiting', 'running')"
                " GROUP BY queue"
            ).fetchall()
        }
        take = explained(conn)

        def overview(limit: int) -> None:
            for _ in range(7):  # past PL/pgSQL's switch to a generic plan
                pin_clock(conn, at)
                take()
                rows = call(conn, "queue_overview")
                plans = take()
                assert [r["queue"] for r in rows] == [f"q{i}" for i in range(QUEUES)]
                for r in rows:
                    queued, waiting, running = backlog.get(r["queue"], (0, 0, 0))
                    assert r["queued"] + r["scheduled"] + r["held_by_key"] == queued
                    assert (r["waiting"], r["running"]) == (waiting, running)
                    completed, failed = expected.get(r["queue"], ([0] * 60, [0] * 60))
                    assert r["completed_per_minute"] == completed, r["queue"]
                    assert r["failed_per_minute"] == failed, r["queue"]
                    assert r["completed_last_hour"] == sum(completed)
                text = "\n".join(nested(plans))
                assert "Seq Scan on ledger_events" not in text, text
                assert "Index Scan using ledger_created_idx" in text, text
                assert_seeks(plans, limit)

        # No rollup yet: the hour from the ledger, ~1 700 events and a
        # probe of runs each (about five buffers an event), and the backlog.
        overview(limit=6 * 1800 + 3000)
        pin_clock(conn, at)
        assert scalar(conn, "record_queue_activity") == 58
        # The rollup: the last three minutes from the ledger, ~90 events.
        overview(limit=6 * 100 + 3000)
        conn.execute("RESET runrelay.clock_offset")


def test_record_queue_activity_reads_one_range_of_the_ledger(ended: str) -> None:
    """Finalizing the hour is one range of ledger_created_idx (the hour's
    events) with a probe of runs per terminal event; a call with nothing due
    reads nothing. Rolled back, so the fixture stays."""
    with psycopg.connect(ended, autocommit=True) as conn:
        take = explained(conn)
        for _ in range(6):
            with conn.transaction(force_rollback=True):
                conn.execute("TRUNCATE runrelay.queue_activity, runrelay.queue_activity_watermark")
                take()
                assert scalar(conn, "record_queue_activity") == 58
                plans = take()
                assert scalar(conn, "record_queue_activity") == 0
            text = "\n".join(nested(plans))
            assert "Seq Scan on ledger_events" not in text, text
            assert "Index Scan using ledger_created_idx" in text, text
            assert_seeks(plans, 6 * 1800)
            rolled = [p for p in plans if "INSERT INTO queue_activity AS a" in p]
            assert len(rolled) == 1, plans


def test_ledger_overview_reads_the_pending_lanes_never_the_events(ended: str) -> None:
    """A million lanes, a hundred of them blocked behind a failed head, half
    a million delivered events and a thousand runs with pending ones: the
    overview reads the pending lanes' index entries and rows and probes each
    head, never a lane with nothing pending, never an event but a head."""
    with psycopg.connect(ended, autocommit=True) as conn:
        # The tests before may have left a run's lanes pending (m-99's).
        before = [(r["lane"], r["pending_lanes"]) for r in call(conn, "ledger_overview")]
        assert before[0][1] in (100, 101), before
        take = explained(conn)
        with conn.transaction(force_rollback=True):
            call(
                conn,
                "enqueue_runs",
                items=[{"run_id": f"p-{i}", "queue": "pending"} for i in range(1000)],
            )
            conn.execute("ANALYZE runrelay.ledger_lanes")
            for _ in range(7):
                take()
                rows = call(conn, "ledger_overview")
                plans = take()
                assert [(r["lane"], r["pending_lanes"], r["blocked_heads"]) for r in rows] == [
                    ("lifecycle", before[0][1] + 1000, 100),
                    ("observability", before[1][1], 0),
                ]
                assert rows[0]["oldest_pending_age_seconds"] is not None
                text = "\n".join(nested(plans))
                assert "Seq Scan on ledger_lanes" not in text, text
                assert "Seq Scan on ledger_events" not in text, text
                # A pending lane: its index entry, its row, its head (a
                # probe of ledger_lane_seq_idx): about seven buffers.
                assert_seeks(plans, 1101 * 8)


def test_the_dashboards_pages_at_a_million_runs(million: str) -> None:
    """The dashboard over a million runs, in process: the overview's counts
    are the table's, a filtered page of runs and the next one are the newest
    rows in order with none repeated or skipped, and a run's page shows it."""
    from starlette.testclient import TestClient

    from runrelay.dashboard import DashboardSettings, create_app

    with psycopg.connect(million) as c:
        waiting = dict(
            c.execute(
                "SELECT queue, count(*) FILTER (WHERE status = 'waiting')"
                " FROM runrelay.runs GROUP BY queue"
            ).fetchall()
        )
        newest = [
            r[0]
            for r in c.execute(
                "SELECT run_id FROM runrelay.runs WHERE queue = 'q1' AND status = 'completed'"
                " ORDER BY created_at DESC, run_id DESC LIMIT 100"
            )
        ]
    settings = DashboardSettings(database_url=million, page_size=50)
    with TestClient(create_app(settings), base_url="http://localhost") as web:
        overview = web.get("/")
        assert overview.status_code == 200, overview.text
        for queue, count in waiting.items():
            row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', overview.text, re.S)
            assert row is not None, queue
            cell = re.search(r'data-col="waiting"><a [^>]*>(\d+)</a>', row.group(1))
            assert cell is not None and int(cell.group(1)) == count, (queue, row.group(1))
        first = web.get("/runs", params={"queue": "q1", "status": "completed"})
        assert first.status_code == 200, first.text
        link = re.search(r'<a href="([^"]+)" data-testid="next-page">', first.text)
        assert link is not None
        second = web.get(html.unescape(link.group(1)))
        pages = [re.findall(r'<tr data-run-id="([^"]+)">', p.text) for p in (first, second)]
        assert pages[0] + pages[1] == newest
        one = web.get("/run", params={"id": newest[0]})
        assert one.status_code == 200 and f">{newest[0]}<" in one.text
