"""Periodic runs (docs/operations.md, "Periodic runs") against a real server:
each slot is enqueued exactly once by concurrent maintainers, across a
restart, after downtime (catch_up and skip), across daylight-saving changes
in Europe/Berlin and America/New_York, and when the clock is set back; the
due-slot query stays an index seek among many schedules that are not due;
the maintenance loops (runrelay maintain's and a worker's) enqueue slots and
wake for the next one; the CLI and the client helpers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from conftest import run_in_thread
from faults import wait_for
from runrelay import AsyncClient, Client, Schedule, schedule_slot
from runrelay.maintenance import MIN_WAKE, SLOT_GRACE, AsyncMaintenance, Maintenance
from runrelay.types import ScheduleDue
from runrelay.worker import Job, Worker
from sqlapi import call, scalar
from test_admin_plans import assert_seeks, buffers, explained, nested

REPO = Path(__file__).resolve().parents[2]
Connect = Callable[..., psycopg.Connection]


def at(conn: psycopg.Connection, when: datetime) -> None:
    """Set the database clock of `conn`'s session to `when` (it runs on from there)."""
    conn.execute(
        "SELECT set_config('runrelay.clock_offset', (%s::timestamptz - now())::text, false)",
        [when],
    )


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def scheduled(db: psycopg.Connection, name: str) -> list[datetime]:
    """The slots (run_at) of the runs a schedule enqueued, in order."""
    rows = db.execute(
        "SELECT run_at FROM runrelay.runs WHERE run_id LIKE %s ORDER BY run_at",
        [f"schedule:{name}:%"],
    ).fetchall()
    return [r[0] for r in rows]


def every(start: datetime, step: timedelta, count: int) -> list[datetime]:
    return [start + i * step for i in range(count)]


# -- exactly once ---------------------------------------------------------------
def test_two_maintainers_racing_enqueue_every_slot_exactly_once(
    db: psycopg.Connection, connect: Connect
) -> None:
    """Twenty minutely catch_up schedules three hours late: two maintainers on
    their own connections, started together, drain them in batches of 25.
    Every slot is one run, every created row names a run no other created
    row names, and the schedules end just past now."""
    at(db, utc("2030-06-01 09:00:30"))
    for i in range(20):
        assert scalar(db, "upsert_schedule", name=f"m{i}", cron="* * * * *", missed="catch_up") == (
            "created"
        )
    start = threading.Barrier(2)
    results: list[list[tuple[str, datetime, str, bool]]] = [[], []]

    def maintainer(index: int) -> None:
        conn = connect()
        at(conn, utc("2030-06-01 12:00:30"))
        client = Client(conn)
        start.wait()
        while rows := client.enqueue_due_schedules(25):
            results[index] += [(r.schedule, r.slot, r.run_id, r.created) for r in rows]

    threads = [threading.Thread(target=maintainer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()

    every_row = results[0] + results[1]
    assert all(created for *_, created in every_row)
    per_run = Counter(run_id for _, _, run_id, _ in every_row)
    assert len(per_run) == 20 * 180 and max(per_run.values()) == 1
    expected = every(utc("2030-06-01 09:01"), timedelta(minutes=1), 180)
    for i in range(20):
        assert scheduled(db, f"m{i}") == expected
        mine = sorted(slot for name, slot, _, _ in every_row if name == f"m{i}")
        assert mine == expected
    state = db.execute(
        "SELECT DISTINCT next_slot_at, last_slot_at FROM runrelay.list_schedules()"
    ).fetchall()
    assert state == [(utc("2030-06-01 12:01"), utc("2030-06-01 12:00"))]


def test_a_maintainer_skips_a_schedule_another_holds_and_never_waits(
    db: psycopg.Connection, connect: Connect
) -> None:
    """A maintainer whose transaction holds a due schedule (not committed yet)
    is passed by another, at once (SKIP LOCKED, no lock wait); if the holder
    rolls back, the slot is still due and the other enqueues it; if it
    commits, there is nothing left to enqueue."""
    at(db, utc("2030-06-01 09:00:30"))
    call(db, "upsert_schedule", name="held", cron="*/5 * * * *", missed="catch_up")
    holder, other = connect(autocommit=False), connect()
    for conn in (holder, other):
        conn.execute("SET lock_timeout = '2s'")
        at(conn, utc("2030-06-01 09:20:30"))
    holder.commit()
    taken = call(holder, "enqueue_due_schedules")
    assert [r["run_id"] for r in taken] == [
        f"schedule:held:2030-06-01T09:{m}:00Z" for m in ("05", "10", "15", "20")
    ]
    assert call(other, "enqueue_due_schedules") == []  # skipped, not waited for
    holder.rollback()
    again = call(other, "enqueue_due_schedules")
    assert [r["run_id"] for r in again] == [r["run_id"] for r in taken]
    assert all(r["created"] for r in again)
    taken = call(holder, "enqueue_due_schedules")
    assert taken == []
    holder.commit()
    assert len(scheduled(db, "held")) == 4


def test_a_restarted_maintainer_enqueues_no_slot_twice_and_misses_none(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The state is the schedule's row: a maintenance loop stopped after a
    round and a new one on a new connection go on from it."""
    at(db, utc("2030-06-01 09:00:30"))
    call(db, "upsert_schedule", name="tick", cron="*/10 * * * *", missed="catch_up")
    first = connect()
    at(first, utc("2030-06-01 09:35:00"))
    assert Maintenance(Client(first), prune_after=None).run_once()["scheduled"] == 3
    first.close()
    second = connect()
    at(second, utc("2030-06-01 09:35:00"))
    again = Maintenance(Client(second), prune_after=None)
    assert again.run_once()["scheduled"] == 0
    at(second, utc("2030-06-01 10:05:00"))
    assert again.run_once()["scheduled"] == 3
    assert scheduled(db, "tick") == every(utc("2030-06-01 09:10"), timedelta(minutes=10), 6)


# -- missed slots ---------------------------------------------------------------
def test_downtime_catch_up_enqueues_every_missed_slot_and_skip_only_the_latest(
    db: psycopg.Connection, connect: Connect
) -> None:
    at(db, utc("2030-06-01 09:00:30"))
    call(db, "upsert_schedule", name="all", cron="*/10 * * * *", missed="catch_up")
    call(db, "upsert_schedule", name="latest", cron="*/10 * * * *", missed="skip")
    maintainer = connect()
    at(maintainer, utc("2030-06-01 11:05:00"))  # two hours without maintenance
    Maintenance(Client(maintainer), prune_after=None).run_once()
    assert scheduled(db, "all") == every(utc("2030-06-01 09:10"), timedelta(minutes=10), 12)
    assert scheduled(db, "latest") == [utc("2030-06-01 11:00")]
    at(maintainer, utc("2030-06-01 11:10:30"))
    Maintenance(Client(maintainer), prune_after=None).run_once()
    assert scheduled(db, "all")[-1] == scheduled(db, "latest")[-1] == utc("2030-06-01 11:10")


def test_a_clock_set_back_enqueues_no_old_slot(db: psycopg.Connection, connect: Connect) -> None:
    at(db, utc("2030-06-01 09:00:30"))
    call(db, "upsert_schedule", name="tick", cron="0 * * * *", missed="catch_up")
    maintainer = connect()
    client = Client(maintainer)
    at(maintainer, utc("2030-06-01 12:00:30"))
    assert len(client.enqueue_due_schedules()) == 3
    at(maintainer, utc("2030-05-31 12:00:30"))  # a day back
    assert client.enqueue_due_schedules() == []
    at(maintainer, utc("2030-06-01 12:59:30"))
    assert client.enqueue_due_schedules() == []
    at(maintainer, utc("2030-06-01 13:00:30"))
    assert [r.slot for r in client.enqueue_due_schedules()] == [utc("2030-06-01 13:00")]
    assert scheduled(db, "tick") == every(utc("2030-06-01 10:00"), timedelta(hours=1), 4)


# -- daylight saving ------------------------------------------------------------
def walk(conn: psycopg.Connection, start: datetime, end: datetime, step: timedelta) -> None:
    """A maintainer calling every `step` of database time from start to end."""
    client = Client(conn)
    now = start
    while now <= end:
        at(conn, now)
        while client.enqueue_due_schedules(100):
            pass
        now += step


@pytest.mark.parametrize(
    ("zone", "start", "cron", "expected"),
    [
        # New York springs forward on 2030-03-10: 02:00 EST -> 03:00 EDT.
        (
            "America/New_York",
            "2030-03-10 03:00",
            "0 * * * *",
            # 22:00, 23:00, 00:00, 01:00 EST; 02:00 (skipped) and 03:00 are one slot,
            # 03:00 EDT; 04:00 EDT.
            ["03:00", "04:00", "05:00", "06:00", "07:00", "08:00"],
        ),
        ("America/New_York", "2030-03-09 12:00", "30 2 * * *", ["07:00"]),
        # New York falls back on 2030-11-03: 02:00 EDT -> 01:00 EST.
        (
            "America/New_York",
            "2030-11-03 03:00",
            "0 * * * *",
            # 23:00, 00:00, 01:00 EDT; 01:00 EST repeats 01:00 (no slot); 02:00, 03:00 EST.
            ["03:00", "04:00", "05:00", "07:00", "08:00"],
        ),
        ("America/New_York", "2030-11-02 12:00", "30 1 * * *", ["05:30"]),
        # Berlin springs forward on 2030-03-31: 02:00 CET -> 03:00 CEST.
        (
            "Europe/Berlin",
            "2030-03-30 21:00",
            "0 * * * *",
            # 22:00, 23:00, 00:00, 01:00 CET; 02:00 (skipped) and 03:00 are one slot,
            # 03:00 CEST; 04:00 CEST.
            ["21:00", "22:00", "23:00", "00:00", "01:00", "02:00"],
        ),
        ("Europe/Berlin", "2030-03-30 12:00", "30 2 * * *", ["01:00"]),
        # Berlin falls back on 2030-10-27: 03:00 CEST -> 02:00 CET.
        (
            "Europe/Berlin",
            "2030-10-26 21:00",
            "0 * * * *",
            # 23:00, 00:00, 01:00, 02:00 CEST; 02:00 CET repeats 02:00 (no slot); 03:00 CET.
            ["21:00", "22:00", "23:00", "00:00", "02:00"],
        ),
        ("Europe/Berlin", "2030-10-26 12:00", "30 2 * * *", ["00:30"]),
    ],
)
def test_one_run_per_intended_slot_across_a_dst_change(
    db: psycopg.Connection,
    connect: Connect,
    zone: str,
    start: str,
    cron: str,
    expected: list[str],
) -> None:
    """The database clock walks a DST night in ten-minute steps (and a daily
    schedule's whole day in hourly ones); every intended slot is enqueued
    once, a skipped local time at the first instant after the gap, a
    repeated one at its first occurrence."""
    begin = utc(start)
    daily = cron.startswith("30")
    at(db, begin - timedelta(minutes=1))
    call(db, "upsert_schedule", name="dst", cron=cron, time_zone=zone, missed="catch_up")
    maintainer = connect()
    span = timedelta(hours=36) if daily else timedelta(hours=5, minutes=59)
    walk(maintainer, begin, begin + span, timedelta(hours=1) if daily else timedelta(minutes=10))
    slots = scheduled(db, "dst")
    assert [s.astimezone(UTC).strftime("%H:%M") for s in slots] == expected
    assert len(set(slots)) == len(slots)
    if not daily:
        assert slots[0] >= begin and slots[-1] < begin + timedelta(hours=6)


# -- plans ----------------------------------------------------------------------
@pytest.fixture
def many_schedules(db: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """100 000 enabled schedules not due for a year, 3 due ones, and 100 000
    ended runs."""
    db.execute(
        """
        INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                   attempt_count, result, created_at, updated_at, finished_at)
        SELECT 'old-' || i, 'q', 'completed', '{}', now(), 3, 1, '{}', now(), now(), now()
        FROM generate_series(1, 100000) AS i
        """
    )
    db.execute(
        """
        INSERT INTO runrelay.schedules (name, cron, time_zone, queue, payload, priority,
                                        max_attempts, missed, enabled, next_slot_at,
                                        created_at, updated_at)
        SELECT 'idle-' || i, '0 0 1 1 *', 'UTC', 'q', '{}', 0, 3, 'skip', true,
               date_trunc('year', now()) + interval '1 year', now(), now()
        FROM generate_series(1, 100000) AS i
        """
    )
    for name in ("due-a", "due-b", "due-c"):
        call(db, "upsert_schedule", name=name, cron="* * * * *", missed="catch_up")
    db.execute("VACUUM ANALYZE runrelay.schedules, runrelay.runs")
    yield db


def test_due_slots_are_found_by_an_index_seek_among_100k_schedules_not_due(
    many_schedules: psycopg.Connection, connect: Connect
) -> None:
    """enqueue_due_schedules reads the due schedules through schedules_due_idx
    and stops at the first that is not due; schedules_next_due_at is one
    probe: no scan of schedules, a few buffers, whatever the 100 000."""
    conn = connect()
    at(conn, datetime.now(UTC) + timedelta(minutes=5))
    take = explained(conn)
    for _ in range(7):  # past PL/pgSQL's switch to generic plans
        with conn.transaction(force_rollback=True):
            take()
            rows = call(conn, "enqueue_due_schedules", max_runs=6)
            assert len(rows) == 6
            plans = take()
        text = "\n".join(plans)
        assert "Seq Scan on schedules" not in text, text
        picks = [p for p in plans if "FROM schedules AS s" in p and "SKIP LOCKED" in p]
        assert picks and all("schedules_due_idx" in p for p in picks), picks
        assert max(buffers(p) for p in picks) < 20, picks
        # The six runs' enqueue (_enqueue: the rows, their run.queued events
        # and lanes) is the rest, some 150 buffers a run.
        assert_seeks(plans, 6 * 250)
        take()
        (due,) = call(conn, "schedules_next_due_at")
        assert due["due_in_ms"] == 0
        plans = nested(take())
        assert plans and "Seq Scan on schedules" not in "\n".join(plans)
        (probe,) = [p for p in plans if "min(s.next_slot_at)" in p]
        assert "schedules_due_idx" in probe and buffers(probe) < 10, probe
        assert max(buffers(p) for p in plans) < 30, plans


# -- maintenance loops ------------------------------------------------------------
def test_the_loop_sleeps_no_longer_than_until_the_next_slot() -> None:
    loop = Maintenance(Client("postgresql://unused"), interval=30.0)
    assert loop._until_slot(30.0, None) == 30.0
    assert loop._until_slot(30.0, ScheduleDue(None, None)) == 30.0
    soon = ScheduleDue(datetime.now(UTC), 2000)
    assert loop._until_slot(30.0, soon) == pytest.approx(2.0 + SLOT_GRACE)
    assert loop._until_slot(1.0, soon) == 1.0
    assert loop._until_slot(30.0, ScheduleDue(datetime.now(UTC), 0)) == MIN_WAKE
    off = Maintenance(Client("postgresql://unused"), schedules=False)
    assert off.disabled == {"schedule", "purge"} and off.next_slot() is None


def test_the_async_loop_enqueues_due_slots_and_reads_the_next_one(
    db: psycopg.Connection, db_url: str
) -> None:
    """AsyncMaintenance (an AsyncWorker's) runs the same schedule duty."""
    at(db, utc("2030-06-01 09:00:30"))
    call(db, "upsert_schedule", name="tick", cron="*/10 * * * *", missed="catch_up")

    async def rounds() -> tuple[dict[str, int], ScheduleDue | None]:
        options = "-c runrelay.clock_offset=" + str(
            int((utc("2030-06-01 09:35:00") - datetime.now(UTC)).total_seconds())
        )
        async with await psycopg.AsyncConnection.connect(
            db_url, autocommit=True, options=options
        ) as conn:
            loop = AsyncMaintenance(AsyncClient(conn), prune_after=None)
            return await loop.run_once(), await loop.next_slot()

    done, due = asyncio.run(rounds())
    assert done == {"reaped": 0, "scheduled": 3, "recorded": 58, "pruned": 0, "purged": 0}
    assert due is not None and due.next_slot_at == utc("2030-06-01 09:40")
    assert due.due_in_ms is not None and 4 * 60_000 < due.due_in_ms <= 6 * 60_000
    assert scheduled(db, "tick") == every(utc("2030-06-01 09:10"), timedelta(minutes=10), 3)


def test_a_loop_with_an_hour_between_rounds_wakes_for_a_minutely_slot(
    db: psycopg.Connection, connect: Connect
) -> None:
    """The maintenance loop asks schedules_next_due_at after each round and
    sleeps until the slot: with an interval of an hour, the next minute's
    slot is still enqueued (within this test's minute-long patience)."""
    conn = connect()
    db_now = db.execute("SELECT now()").fetchone()
    assert db_now is not None
    boundary = db_now[0].replace(second=0, microsecond=0) + timedelta(minutes=1)
    at(conn, boundary - timedelta(seconds=2))  # two seconds before a slot
    call(conn, "upsert_schedule", name="minutely", cron="* * * * *")
    loop = Maintenance(Client(conn), interval=3600.0, prune_after=None)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bool(scheduled(db, "minutely")), timeout=60, what="the slot's run")
    finally:
        loop.stop()
    assert scheduled(db, "minutely") == [boundary]


def test_a_workers_own_maintenance_enqueues_a_schedule_and_runs_it(
    db: psycopg.Connection, db_url: str
) -> None:
    """What users run: a Worker with its default maintenance and a schedule
    due now; the worker enqueues the slot's run and its handler gets it."""
    call(db, "upsert_schedule", name="report", cron="* * * * *", payload={"kind": "report"})
    seen: list[tuple[str, Any]] = []

    def handler(job: Job) -> dict[str, str]:
        seen.append((job.run_id, job.payload))
        return {"done": job.run_id}

    # The worker's clock is two minutes ahead: the schedule's first slot has come.
    client = Client(f"{db_url}?options=-c%20runrelay.clock_offset%3D120s")
    worker = Worker(client, handler, poll_interval=0.05, maintenance_interval=0.2)
    thread, future = run_in_thread(worker)
    try:
        wait_for(lambda: bool(seen), timeout=60, what="the scheduled run")
    finally:
        worker.stop()
        thread.join(timeout=30)
        client.close()
    future.result(timeout=1)
    run_id, payload = seen[0]
    parsed = schedule_slot(run_id)
    assert parsed is not None and parsed[0] == "report" and payload == {"kind": "report"}


# -- client helpers and CLI -------------------------------------------------------
def test_declare_schedules_upserts_a_list_and_can_delete_the_rest(db: psycopg.Connection) -> None:
    client = Client(db)
    client.upsert_schedule("legacy", "@daily")
    wanted = [
        Schedule("nightly", "0 2 * * *", time_zone="Europe/Berlin", queue="reports"),
        Schedule("tick", "*/5 * * * *", payload={"k": 1}, missed="catch_up"),
    ]
    assert client.declare_schedules(wanted) == {"nightly": "created", "tick": "created"}
    assert client.declare_schedules(wanted, delete_others=True) == {
        "nightly": "unchanged",
        "tick": "unchanged",
        "legacy": "deleted",
    }
    listed = {s.name: s for s in client.list_schedules()}
    assert sorted(listed) == ["nightly", "tick"]
    assert listed["tick"].payload == {"k": 1} and listed["tick"].missed == "catch_up"
    with pytest.raises(ValueError, match="declared twice"):
        client.declare_schedules([wanted[0], wanted[0]])


def test_schedule_slot_reads_the_run_ids_the_database_writes(db: psycopg.Connection) -> None:
    at(db, utc("2030-06-01 09:00:30"))
    call(db, "upsert_schedule", name="a:b c", cron="*/30 * * * *")
    at(db, utc("2030-06-01 09:30:30"))
    (row,) = call(db, "enqueue_due_schedules")
    assert row["run_id"] == "schedule:a:b c:2030-06-01T09:30:00Z"
    assert schedule_slot(row["run_id"]) == ("a:b c", row["slot"])
    for other in (
        "plain",
        "schedule:",
        "schedule:x:2030-06-01T09:30:00",
        "schedule::2030-06-01T09:30:00Z",
        "schedule:x:2030-13-01T09:30:00Z",
    ):
        assert schedule_slot(other) is None


def runrelay_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runrelay.cli", *args],
        env={**os.environ, "DATABASE_URL": url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_schedules_set_list_delete_with_exit_codes(db: psycopg.Connection, db_url: str) -> None:
    out = runrelay_cli(
        "schedules", "set", "nightly", "0 2 * * *", "--time-zone", "Europe/Berlin",
        "--queue", "reports", "--payload", '{"report": "daily"}', "--json", url=db_url,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["outcome"] == "created" and answer["next_slot_at"]
    again = runrelay_cli(
        "schedules", "set", "nightly", "0 2 * * *", "--time-zone", "Europe/Berlin",
        "--queue", "reports", "--payload", '{"report": "daily"}', url=db_url,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout.startswith("nightly: unchanged, next slot ")
    listed = runrelay_cli("schedules", "list", "--json", url=db_url)
    assert listed.returncode == 0
    (row,) = json.loads(listed.stdout)
    assert row["payload"] == {"report": "daily"} and row["time_zone"] == "Europe/Berlin"
    assert "nightly" in runrelay_cli("schedules", "list", url=db_url).stdout

    before = db.execute("SELECT updated_at FROM runrelay.schedules").fetchall()
    for bad in (("nightly", "0 25 * * *"), ("nightly", "@daily", "--time-zone", "Nowhere/City")):
        refused = runrelay_cli("schedules", "set", *bad, url=db_url)
        assert refused.returncode == 2, refused
        assert "runrelay: invalid" in refused.stderr
    bad_json = runrelay_cli("schedules", "set", "nightly", "@daily", "--payload", "{", url=db_url)
    assert bad_json.returncode == 2 and "--payload: not JSON" in bad_json.stderr
    assert db.execute("SELECT updated_at FROM runrelay.schedules").fetchall() == before

    gone = runrelay_cli("schedules", "delete", "nightly", "--json", url=db_url)
    assert gone.returncode == 0 and json.loads(gone.stdout)["outcome"] == "deleted"
    missing = runrelay_cli("schedules", "delete", "nightly", url=db_url)
    assert missing.returncode == 4 and missing.stdout == "nightly: not_found\n"
    assert runrelay_cli("schedules", url=db_url).returncode == 2


def test_cli_schedules_refused_for_a_role_without_the_privilege(
    db: psycopg.Connection, db_url: str
) -> None:
    """A worker may enqueue due slots but not declare schedules: exit 1."""
    db.execute("DROP ROLE IF EXISTS rr_sched_worker")
    db.execute("CREATE ROLE rr_sched_worker LOGIN IN ROLE runrelay_worker")
    try:
        url = make_conninfo(db_url, user="rr_sched_worker")
        refused = runrelay_cli("schedules", "set", "x", "@daily", url=url)
        assert refused.returncode == 1, refused
        assert "permission denied for function upsert_schedule" in refused.stderr
        assert "the login needs runrelay_admin" in refused.stderr
    finally:
        db.execute("DROP ROLE rr_sched_worker")
