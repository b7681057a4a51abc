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
