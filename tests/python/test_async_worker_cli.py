"""AsyncWorker, and the `runrelay` command line against a real server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import handed_back
from runrelay import AsyncClient, Client
from runrelay.worker import AsyncWorker, Job, Suspend

REPO = Path(__file__).resolve().parents[2]


def test_async_worker_runs_handlers_as_tasks(db: psycopg.Connection, db_url: str) -> None:
    seen_cancel: list[str] = []

    async def handler(job: Job) -> Any:
        kind = job.payload["kind"]
        if kind == "boom":
            raise RuntimeError("x")
        if kind == "sleep" and job.resume is None:
            raise Suspend.sleep(0.1)
        if kind == "slow":
            for _ in range(100):
                if job.cancelled.is_set():
                    seen_cancel.append(job.run_id)
                    return None
                await asyncio.sleep(0.05)
        return {"kind": kind}

    async def main() -> None:
        async with AsyncClient(db_url) as client:
            for kind in ("ok", "boom", "sleep", "slow"):
                await client.enqueue_run(kind, payload={"kind": kind}, max_attempts=1)
            worker = AsyncWorker(
                client, handler, concurrency=4, poll_interval=0.05, heartbeat_every=0.1
            )
            task = asyncio.create_task(worker.run(until_idle=1.0))
            running = ("running",)
            query = "SELECT status FROM runrelay.runs WHERE run_id = 'slow'"
            while db.execute(query).fetchone() != running:
                await asyncio.sleep(0.02)
            assert await client.cancel_run("slow") in ("cancelled", "cancel_requested")
            await task

    asyncio.run(main())
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == {
        "ok": "completed",
        "boom": "failed",
        "sleep": "completed",
        "slow": "cancelled",
    }
    assert seen_cancel == ["slow"]


def _cli(db_url: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": db_url}
    return subprocess.run(
        [sys.executable, "-m", "runrelay.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_cli_migrate_is_idempotent_and_status_reports(db: psycopg.Connection, db_url: str) -> None:
    assert _cli(db_url, "migrate").returncode == 0
    Client(db_url).enqueue_run("s1", queue="mail")
    out = _cli(db_url, "status", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["run_stats"] == [
        {
            "queue": "mail",
            "status": "queued",
            "runs": 1,
            "held_by_key": 0,
            "oldest_run_at": data["run_stats"][0]["oldest_run_at"],
            "oldest_runnable_age_seconds": data["run_stats"][0]["oldest_runnable_age_seconds"],
        }
    ]
    assert {r["lane"] for r in data["ledger_stats"]} == {"lifecycle"}
    human = _cli(db_url, "status")
    assert "mail" in human.stdout and "queued" in human.stdout


def test_cli_worker_and_relay_run_until_signalled(
    db: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    client = Client(db_url)
    for i in range(5):
        client.enqueue_run(f"c{i}")
    (tmp_path / "cli_handlers.py").write_text(
        "def handle(job):\n    return {'handled': job.run_id}\n"
    )
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    out_file = tmp_path / "events.jsonl"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runrelay.cli",
                "worker",
                "cli_handlers:handle",
                "--concurrency",
                "2",
            ],
            env=env,
            cwd=REPO,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "runrelay.cli", "relay", "--jsonl", str(out_file)],
            env=env,
            cwd=REPO,
        ),
    ]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = db.execute(
                "SELECT count(*) FROM runrelay.runs WHERE status = 'completed'"
            ).fetchone()
            lines = out_file.read_text().splitlines() if out_file.exists() else []
            if done == (5,) and len(lines) == 15:
                break
            time.sleep(0.2)
        assert done == (5,)
        assert len(lines) == 15  # queued, started, completed per run
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(timeout=30) == 0


# -- AsyncWorker parity with Worker ---------------------------------------------
def _wait(predicate: Any, timeout: float, what: str) -> Any:
    async def waiting() -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout}s")
            await asyncio.sleep(0.05)

    return waiting()


def _status(db: psycopg.Connection, run_id: str) -> Any:
    row = db.execute("SELECT status FROM runrelay.runs WHERE run_id = %s", [run_id]).fetchone()
    return None if row is None else row[0]


def test_async_worker_wakes_on_notify_long_before_its_poll(
    db: psycopg.Connection, db_url: str
) -> None:
    listening = "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN runrelay_runs'"

    async def handler(job: Job) -> Any:
        return {"ok": True}

    async def main() -> None:
        async with AsyncClient(db_url) as client:
            worker = AsyncWorker(client, handler, poll_interval=120, listen_dsn=db_url,
                                 maintenance=False)  # fmt: skip
            task = asyncio.create_task(worker.run())
            await _wait(lambda: db.execute(listening).fetchone() == (1,), 30, "LISTEN")
            await client.enqueue_run("woken")
            await _wait(lambda: _status(db, "woken") == "completed", 20, "woken by NOTIFY")
            worker.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(main())


def test_async_worker_hands_back_unfinished_runs_and_cancels_their_tasks(
    db: psycopg.Connection, db_url: str
) -> None:
    cancelled: list[str] = []

    async def handler(job: Job) -> Any:
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            cancelled.append(job.run_id)
            raise

    async def main() -> None:
        async with AsyncClient(db_url) as client:
            await client.enqueue_run("stuck", max_attempts=3)
            worker = AsyncWorker(client, handler, poll_interval=0.05, shutdown_grace=0.3)
            task = asyncio.create_task(worker.run())
            await _wait(lambda: _status(db, "stuck") == "running", 30, "running")
            worker.stop()
            await asyncio.wait_for(task, 30)
            assert worker.stats.get("released_on_shutdown") == 1

    asyncio.run(main())
    assert cancelled == ["stuck"]
    status, attempt, reason = handed_back(db, "stuck")
    assert (status, attempt) == ("queued", "released")
    assert reason.startswith("WorkerShutdown: ")


def test_async_worker_replays_a_claim_whose_reply_was_lost(
    db: psycopg.Connection, db_url: str
) -> None:
    """The first claim commits but the worker sees a connection error: the
    repeat with the same call_id returns the same run, which runs once."""
    call_ids: list[Any] = []
    ran: list[tuple[str, int]] = []

    class LossyClient(AsyncClient):
        async def claim_attempts(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            rows = await super().claim_attempts(*args, **kwargs)
            call_ids.append(kwargs["call_id"])
            if len(call_ids) == 1:
                raise psycopg.OperationalError("connection lost after COMMIT")
            return rows

    async def handler(job: Job) -> Any:
        ran.append((job.run_id, job.attempt.attempt))
        return {}

    async def main() -> None:
        async with LossyClient(db_url) as client:
            await client.enqueue_run("once")
            worker = AsyncWorker(client, handler, poll_interval=0.05, maintenance=False)
            await worker.run(until_idle=0.5)
            assert worker.stats.get("claim_errors") == 1

    asyncio.run(main())
    assert call_ids[0] == call_ids[1]
    assert ran == [("once", 1)]
    assert _status(db, "once") == "completed"


@pytest.mark.parametrize("fused", [True, False])
def test_async_batched_worker_completes_with_one_call_per_batch(
    db: psycopg.Connection, db_url: str, fused: bool
) -> None:
    calls: dict[str, int] = {}

    class CountingClient(AsyncClient):
        def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
            calls[function] = calls.get(function, 0) + 1
            return super()._call(function, values, conn)

    async def handler(job: Job) -> Any:
        await asyncio.sleep(0.01)
        if job.payload.get("boom"):
            raise ValueError("boom")
        return {"i": job.run_id}

    async def main() -> None:
        async with CountingClient(db_url) as client:
            for i in range(30):
                await client.enqueue_run(f"b{i}", payload={"boom": i == 7}, max_attempts=1)
            worker = AsyncWorker(client, handler, concurrency=10, batch_size=5,
                                 poll_interval=0.05, maintenance=False, fused=fused)  # fmt: skip
            await worker.run(until_idle=0.5)

    asyncio.run(main())
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == {f"b{i}": "failed" if i == 7 else "completed" for i in range(30)}
    assert calls.get("complete_attempt", 0) == 0
    if fused:  # each batch settled, and the next one claimed, in one call
        assert calls.get("complete_attempts", 0) == calls.get("fail_attempt", 0) == 0
        assert 6 <= calls["settle_and_claim"] <= 30
    else:
        assert calls.get("settle_and_claim", 0) == 0
        assert 6 <= calls["complete_attempts"] <= calls["claim_attempts"]
    (error,) = db.execute("SELECT error FROM runrelay.runs WHERE run_id = 'b7'").fetchone()
    assert error["type"] == "ValueError" and "boom" in error["traceback"]


def test_cli_async_worker_second_signal_hands_the_run_back(
    db: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    Client(db_url).enqueue_run("long", payload={"sleep": 300}, max_attempts=3)
    record, err = tmp_path / "record.jsonl", tmp_path / "stderr.txt"
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "RR_TEST_RECORD": str(record),
        "PYTHONPATH": f"{REPO / 'tests' / 'python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    with open(err, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runrelay.cli", "worker", "loop_handlers:arecord", "--async",
             "--shutdown-grace", "300", "--poll-interval", "0.2"],
            env=env, cwd=REPO, stdout=fh, stderr=fh,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _status(db, "long") == "running"
        proc.send_signal(signal.SIGTERM)
        while "waiting up to 300.0s" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and _status(db, "long") == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    status, attempt, reason = handed_back(db, "long")
    assert (status, attempt) == ("queued", "released")
    assert reason.startswith("WorkerShutdown: ")
    assert "SIGTERM again: handing in-flight runs back now" in err.read_text()
