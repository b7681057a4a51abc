"""Maintenance (reap + prune), the full-jitter backoff, and the LISTEN
connection that reconnects — against a real server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import run_in_thread
from faults import shifted, terminate_backend, wait_for
from runrelay import AsyncClient, Client
from runrelay._backoff import Backoff, full_jitter, jittered
from runrelay.maintenance import AsyncMaintenance, Maintenance
from runrelay.relay import Relay
from runrelay.worker import AsyncWorker, Job, Worker

REPO = Path(__file__).resolve().parents[2]


# -- backoff ------------------------------------------------------------------
def test_full_jitter_stays_within_zero_and_the_capped_exponential() -> None:
    rng = random.Random(7)
    for failures in range(12):
        ceiling = min(5.0, 0.1 * 2**failures)
        samples = [full_jitter(failures, 0.1, 5.0, rng.random) for _ in range(2000)]
        assert all(0.0 <= s <= ceiling for s in samples), failures
        # Spread over the whole range, not clustered at one end (lock-step).
        assert min(samples) < 0.1 * ceiling and max(samples) > 0.9 * ceiling, failures
    assert full_jitter(3, 0.1, 5.0, lambda: 1.0) == pytest.approx(0.8)
    assert full_jitter(200, 0.1, 5.0, lambda: 1.0) == 5.0  # no overflow, capped
    assert full_jitter(3, 0.1, 5.0, lambda: 0.0) == 0.0


def test_backoff_grows_per_failure_and_resets_on_success() -> None:
    top = Backoff(base=0.5, cap=4.0, rng=lambda: 1.0)
    assert [top.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    top.reset()
    assert top.next() == 0.5
    for base, cap in ((0.0, 1.0), (1.0, 0.5)):
        with pytest.raises(ValueError):
            Backoff(base=base, cap=cap)
    with pytest.raises(ValueError):
        full_jitter(-1, 0.1, 1.0)


def test_jittered_interval_is_within_half_either_side() -> None:
    rng = random.Random(3)
    samples = [jittered(10.0, rng=rng.random) for _ in range(2000)]
    assert all(5.0 <= s <= 15.0 for s in samples)
    assert min(samples) < 5.5 and max(samples) > 14.5
    with pytest.raises(ValueError):
        jittered(1.0, spread=1.5)


@pytest.mark.parametrize(
    ("listen_dsn", "error", "message"),
    [
        ([], ValueError, "no DSN to listen on"),
        (["postgresql://h/db", 5], TypeError, "non-empty string"),
        ([""], TypeError, "non-empty string"),
        (5, TypeError, "sequence of DSN strings"),
    ],
    ids=["empty", "not-a-string", "empty-string", "a-number"],
)
def test_a_loop_refuses_a_listen_dsn_it_cannot_listen_on(
    listen_dsn: Any, error: type[Exception], message: str
) -> None:
    """Checked when the loop is made, before it connects anywhere."""
    client = Client("postgresql://nowhere.invalid/none")
    with pytest.raises(error, match=message):
        Worker(client, lambda job: None, listen_dsn=listen_dsn)
    with pytest.raises(error, match=message):
        AsyncWorker(client, lambda job: None, listen_dsn=listen_dsn)
    with pytest.raises(error, match=message):
        Relay(client, lambda lane, events: None, listen_dsn=listen_dsn)


# -- maintenance --------------------------------------------------------------
def _expired_claim(
    connect: Callable[..., psycopg.Connection], run_id: str, ago: str = "1 hour"
) -> None:
    """A run enqueued and claimed by a worker that vanished `ago`: its lease is long past."""
    old = connect()
    with shifted(old, f"-{ago}"):
        client = Client(old)
        client.enqueue_run(run_id, max_attempts=3)
        claimed = client.claim_attempts("ghost", lease_seconds=30)
    assert [a.run_id for a in claimed] == [run_id]


def test_maintain_once_reaps_an_expired_lease_and_prunes_old_deliveries(
    db: psycopg.Connection, db_url: str, connect: Callable[..., psycopg.Connection]
) -> None:
    _expired_claim(connect, "orphan", ago="10 days")
    old = connect()
    with shifted(old, "-9 days"):  # its queued/started events delivered nine days ago
        Relay(Client(old), lambda lane, events: None, max_sleep=0.05).run(until_idle=0.2)
    Client(db_url).enqueue_run("fresh")
    Relay(Client(db_url), lambda lane, events: None, max_sleep=0.05).run(until_idle=0.2)
    old_delivered = db.execute(
        "SELECT count(*) FROM runrelay.ledger"
        " WHERE state = 'delivered' AND delivered_at < now() - interval '7 days'"
    ).fetchone()
    recent = db.execute(
        "SELECT delivery_key FROM runrelay.ledger"
        " WHERE state = 'delivered' AND delivered_at > now() - interval '1 hour'"
    ).fetchall()
    assert old_delivered is not None and old_delivered[0] >= 2 and recent

    out = subprocess.run(
        [sys.executable, "-m", "runrelay.cli", "maintain", "--once", "--prune-after", "7d"],
        env={**os.environ, "DATABASE_URL": db_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # recorded: the first round finalizes the last hour's minutes up to the
    # grace period, 58 of them, whatever the minute.
    assert json.loads(out.stdout) == {
        "reaped": 1,
        "scheduled": 0,
        "recorded": 58,
        "pruned": old_delivered[0],
        "purged": 0,
    }
    attempt = db.execute(
        "SELECT status, error->>'reason' FROM runrelay.attempts WHERE run_id = 'orphan'"
    ).fetchone()
    assert attempt == ("lost", "lease_expired")
    assert db.execute("SELECT status FROM runrelay.runs WHERE run_id = 'orphan'").fetchone() == (
        "queued",
    )
    left = db.execute(
        "SELECT count(*) FROM runrelay.ledger"
        " WHERE state = 'delivered' AND delivered_at < now() - interval '7 days'"
    ).fetchone()
    assert left == (0,)
    still = db.execute(
        "SELECT delivery_key FROM runrelay.ledger"
        " WHERE state = 'delivered' AND delivered_at > now() - interval '1 hour'"
    ).fetchall()
    assert set(recent) <= set(still)


def test_a_denied_duty_is_disabled_with_one_warning_and_the_others_go_on(
    db: psycopg.Connection,
    db_url: str,
    connect: Callable[..., psycopg.Connection],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker role may reap but not prune: prune is switched off once,
    with one warning, and reap keeps working round after round."""
    _expired_claim(connect, "orphan1")
    as_worker = connect()
    as_worker.execute("SET ROLE runrelay_worker")
    maintenance = Maintenance(Client(as_worker), prune_after=timedelta(days=1))
    with caplog.at_level(logging.WARNING, logger="runrelay.maintenance"):
        assert maintenance.run_once() == {
            "reaped": 1,
            "scheduled": 0,
            "recorded": 58,
            "pruned": 0,
            "purged": 0,
        }
        _expired_claim(connect, "orphan2")
        again = maintenance.run_once()
        # The next minute, if one has come meanwhile.
        assert again == {
            "reaped": 1,
            "scheduled": 0,
            "recorded": again["recorded"],
            "pruned": 0,
            "purged": 0,
        }
        assert again["recorded"] in (0, 1)
    warnings = [r for r in caplog.records if r.name == "runrelay.maintenance"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "maintenance duty prune disabled" in warnings[0].getMessage()
    assert maintenance.disabled == {"prune", "purge"}
    statuses = db.execute("SELECT status FROM runrelay.attempts ORDER BY run_id").fetchall()
    assert statuses == [("lost",), ("lost",)]


def test_maintenance_refuses_bad_settings_before_any_call(db_url: str) -> None:
    client = Client(db_url)
    with pytest.raises(ValueError):
        Maintenance(client, interval=0)
    with pytest.raises(ValueError):
        Maintenance(client, prune_after=timedelta(seconds=-1))
    with pytest.raises(ValueError):
        Maintenance(client, reap_batch=0)


# -- queue activity -------------------------------------------------------------
def _ended(conn: psycopg.Connection, run_id: str, queue: str, completed: bool) -> None:
    """A run of `queue` that ends at once, on `conn`'s (possibly shifted) clock."""
    client = Client(conn)
    client.enqueue_run(run_id, queue=queue, max_attempts=1)
    (claim,) = client.claim_attempts("w", queues=[queue])
    if completed:
        assert client.complete_attempt(**claim.fence) == "completed"
    else:
        assert client.fail_attempt(**claim.fence, error={"e": 1}) == "failed"


def _rollup(db: psycopg.Connection) -> list[tuple[object, ...]]:
    return db.execute(
        "SELECT minute, queue, completed, failed FROM runrelay.queue_activity ORDER BY 1, 2"
    ).fetchall()


def _ended_by_minute(db: psycopg.Connection, after: str) -> list[tuple[object, ...]]:
    """What the rollup must hold: the runs that ended (by their finished_at,
    the terminal event's time) in the minutes since `after` ago, up to the
    grace period, by queue."""
    return db.execute(
        """
        SELECT date_bin('1 minute', finished_at, '2000-01-01Z') AS minute, queue,
               count(*) FILTER (WHERE status = 'completed')::integer,
               count(*) FILTER (WHERE status = 'failed')::integer
        FROM runrelay.runs
        WHERE finished_at >= date_bin('1 minute', now() - %s::interval, '2000-01-01Z')
        GROUP BY 1, 2 ORDER BY 1, 2
        """,
        [after],
    ).fetchall()


def test_the_activity_duty_finalizes_each_minute_once_however_many_loops_run(
    db: psycopg.Connection, db_url: str, connect: Callable[..., psycopg.Connection]
) -> None:
    """Runs ended over the last hour in two queues. One caller holding the
    rollup in an open transaction: every other loop answers 0 at once (a
    lock wait would fail on their 1 s lock_timeout) and writes nothing. Then
    two loops ten minutes ahead race round after round on the minutes that
    came due: each minute is finalized by exactly one of them, and the
    rollup holds what the runs say, once."""
    for ago, run_id, queue, completed in [
        ("50 minutes", "a1", "qa", True),
        ("50 minutes", "b1", "qb", False),
        ("10 minutes", "a2", "qa", True),
        ("3 minutes", "b2", "qb", True),
    ]:
        past = connect()
        with shifted(past, f"-{ago}"):
            _ended(past, run_id, queue, completed)
    ahead = connect()
    with shifted(ahead, "5 minutes"):  # a run that ends five minutes from now
        _ended(ahead, "a3", "qa", True)
    # The overview read at one moment of the database clock, pinned on its
    # session: its hour does not move while the test runs.
    viewer = connect()
    (pinned,) = viewer.execute("SELECT now()").fetchone() or (None,)

    def overview() -> dict[str, object]:
        viewer.execute(
            "SELECT set_config('runrelay.clock_offset',"
            " (%s::timestamptz - statement_timestamp())::text, false)",
            [pinned],
        )
        return {q.queue: q for q in Client(viewer).queue_overview()}

    live = overview()
    assert sorted(live) == ["qa", "qb"]

    holder = connect(autocommit=False)
    assert Client(holder).record_queue_activity() == 58  # the hour, held uncommitted

    def loop(*options: str) -> Maintenance:
        conn = connect(options=" ".join(("-c lock_timeout=1s", *options)))
        return Maintenance(Client(conn), prune_after=None, reap=False, schedules=False)

    now_loops = [loop(), loop()]
    assert [m.run_once()["recorded"] for m in now_loops] == [0, 0]
    assert db.execute("SELECT count(*) FROM runrelay.queue_activity").fetchone() == (0,)
    holder.commit()
    final = db.execute("SELECT final_before FROM runrelay.queue_activity_watermark").fetchone()
    assert final is not None
    expected = [r for r in _ended_by_minute(db, "1 hour") if r[0] < final[0]]  # not a3's
    assert _rollup(db) == expected and len(expected) == 4
    # Counted from the rollup now, the same figures as from the ledger.
    assert overview() == live

    # Ten minutes on: the minutes up to eight minutes ahead come due, a3's
    # among them. Two loops race on them, round after round.
    ahead_loops = [loop("-c runrelay.clock_offset=600s") for _ in range(2)]
    barrier = threading.Barrier(2)

    def rounds(m: Maintenance) -> list[int]:
        barrier.wait()
        return [m.run_once()["recorded"] for _ in range(5)]

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(rounds, ahead_loops))
    assert sum(sum(r) for r in results) in (10, 11), results  # 11: a minute passed meanwhile
    assert _rollup(db) == _ended_by_minute(db, "1 hour")  # each minute counted once
    final = db.execute("SELECT final_before FROM runrelay.queue_activity_watermark").fetchone()
    minute = db.execute("SELECT date_bin('1 minute', now() + interval '8 minutes', '2000-01-01Z')")
    assert final is not None and final[0] >= minute.fetchone()[0]  # type: ignore[index]


def test_a_workers_own_maintenance_records_queue_activity(
    db: psycopg.Connection, db_url: str
) -> None:
    """What users run: a Worker with its default maintenance finalizes the
    overview's minutes with no other process."""
    client = Client(db_url)
    worker = Worker(client, lambda job: None, poll_interval=0.05, maintenance_interval=0.2)
    thread, result = run_in_thread(worker)
    try:
        wait_for(
            lambda: (
                db.execute("SELECT count(*) FROM runrelay.queue_activity_watermark").fetchone()
                == (1,)
            ),
            30,
            "the rollup's watermark",
        )
    finally:
        worker.stop()
        thread.join(30)
        client.close()
    result.result(timeout=1)


def test_async_maintenance_records_queue_activity(db: psycopg.Connection, db_url: str) -> None:
    """AsyncMaintenance (an AsyncWorker's) runs the same duty; a role that
    may not call it switches it off with one warning."""

    async def rounds() -> tuple[list[int], set[str]]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            loop = AsyncMaintenance(AsyncClient(conn), prune_after=None, reap=False)
            recorded = [(await loop.run_once())["recorded"] for _ in range(2)]
            await conn.execute("SET ROLE runrelay_relay")
            await loop.run_once()
            return recorded, loop.disabled

    recorded, disabled = asyncio.run(rounds())
    assert recorded[0] == 58 and recorded[1] in (0, 1)
    assert "activity" in disabled


# -- LISTEN reconnects ----------------------------------------------------------
def _listen_backends(db: psycopg.Connection, channel: str) -> list[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE query = %s AND datname = current_database()",
        [f"LISTEN {channel}"],
    ).fetchall()
    return [r[0] for r in rows]


def test_a_worker_whose_listen_connection_is_terminated_reconnects_and_wakes_up(
    db: psycopg.Connection, db_url: str
) -> None:
    """poll_interval is a minute: only a NOTIFY can start the run within the
    wait, and only on a LISTEN connection that came back."""
    done: list[str] = []

    def handler(job: Job) -> None:
        done.append(job.run_id)

    worker = Worker(Client(db_url), handler, poll_interval=60, listen_dsn=db_url,
                    maintenance=False)  # fmt: skip
    thread, result = run_in_thread(worker)
    try:
        wait_for(lambda: len(_listen_backends(db, "runrelay_runs")) == 1, 30, "LISTEN")
        (first,) = _listen_backends(db, "runrelay_runs")
        assert terminate_backend(db, first)
        wait_for(lambda: _listen_backends(db, "runrelay_runs") not in ([], [first]), 30,
                 "LISTEN again")  # fmt: skip
        Client(db_url).enqueue_run("woken")
        wait_for(lambda: done == ["woken"], 20, "the run picked up on NOTIFY")
    finally:
        worker.stop()
        thread.join(30)
    result.result(timeout=1)


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_worker_whose_first_listen_connect_fails_listens_once_it_can(
    db: psycopg.Connection, db_url: str, flavor: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The LISTEN login is refused at first: the worker tries again after
    its backoff (under a second at first), not after poll_interval (an hour
    here), so a run enqueued once the login works starts on its NOTIFY."""
    role = f"rr_late_listener_{flavor}"
    db.execute(f"DROP ROLE IF EXISTS {role}")
    db.execute(f"CREATE ROLE {role} NOLOGIN")
    listen_dsn = psycopg.conninfo.make_conninfo(db_url, user=role)
    done: list[str] = []

    def handler(job: Job) -> None:
        done.append(job.run_id)

    def refused_then_allowed() -> None:
        wait_for(
            lambda: any("unavailable" in r.getMessage() for r in caplog.records),
            30,
            "a refused LISTEN login",
        )
        db.execute(f"ALTER ROLE {role} LOGIN")
        wait_for(lambda: len(_listen_backends(db, "runrelay_runs")) == 1, 20, "LISTEN")
        Client(db_url).enqueue_run("woken")
        wait_for(lambda: done == ["woken"], 20, "the run picked up on NOTIFY")

    caplog.set_level(logging.WARNING, logger="runrelay.listen")
    try:
        if flavor == "sync":
            worker = Worker(Client(db_url), handler, poll_interval=3600, listen_dsn=listen_dsn,
                            maintenance=False)  # fmt: skip
            thread, result = run_in_thread(worker)
            try:
                refused_then_allowed()
            finally:
                worker.stop()
                thread.join(30)
            result.result(timeout=1)
        else:

            async def main() -> None:
                worker = AsyncWorker(AsyncClient(db_url), handler, poll_interval=3600,
                                     listen_dsn=listen_dsn, maintenance=False)  # fmt: skip
                running = asyncio.create_task(worker.run())
                try:
                    await asyncio.to_thread(refused_then_allowed)
                finally:
                    worker.stop()
                    await asyncio.wait_for(running, 30)

            asyncio.run(main())
    finally:
        db.execute("ALTER ROLE " + role + " NOLOGIN")
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        wait_for(
            lambda: (
                not db.execute("SELECT FROM pg_stat_activity WHERE usename = %s", [role]).fetchall()
            ),
            30,
            "the role's sessions gone",
        )
        db.execute(f"DROP ROLE {role}")


def test_maintain_purge_after_deletes_runs_that_ended_long_ago_and_keeps_the_rest(
    db: psycopg.Connection, db_url: str
) -> None:
    """--purge-after AGE (off by default): each round deletes runs that ended
    more than AGE ago; younger ended runs and live runs stay."""
    client = Client(db_url)
    for run_id in ("old-done", "young-done", "live"):
        client.enqueue_run(run_id)
    for _ in ("old-done", "young-done"):
        (attempt,) = client.claim_attempts("w", max_runs=1)
        client.complete_attempt(**attempt.fence)
    # Every event delivered (a run with undelivered events is never purged).
    Relay(client, lambda lane, events: None, max_sleep=0.05).run(until_idle=0.5)
    db.execute(
        "UPDATE runrelay.runs SET finished_at = now() - interval '40 days',"
        " created_at = now() - interval '41 days'"
        " WHERE finished_at IS NOT NULL AND run_id = ("
        "  SELECT run_id FROM runrelay.runs WHERE finished_at IS NOT NULL ORDER BY run_id LIMIT 1)"
    )
    old = db.execute(
        "SELECT run_id FROM runrelay.runs WHERE finished_at < now() - interval '30 days'"
    ).fetchall()
    assert len(old) == 1
    off = Maintenance(client, prune_after=None).run_once()
    assert off["purged"] == 0
    done = Maintenance(client, prune_after=None, purge_after=timedelta(days=30)).run_once()
    assert done["purged"] == 1
    left = {r for (r,) in db.execute("SELECT run_id FROM runrelay.runs").fetchall()}
    assert left == {"old-done", "young-done", "live"} - {old[0][0]}
    with pytest.raises(ValueError, match="purge_after must be positive"):
        Maintenance(client, purge_after=timedelta(0))
    bad = subprocess.run(
        [sys.executable, "-m", "runrelay.cli", "maintain", "--once", "--purge-after", "soon"],
        env={**os.environ, "DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--purge-after" in bad.stderr
