"""Named tasks on real servers: the registry refuses what it cannot run,
enqueue checks arguments against the function and joins the caller's
transaction, and a worker given a registry claims only its tasks' runs on its
tasks' queues, calling fn(job, **payload) — sync and async."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import run_in_thread
from faults import wait_for
from runrelay import AsyncClient, Client
from runrelay.tasks import Task, Tasks
from runrelay.worker import AsyncWorker, Job, Worker

# The console script of this venv (what `pip install runrelay` puts on PATH).
RUNRELAY = str(Path(sys.executable).with_name("runrelay"))


def _runs(db: psycopg.Connection) -> dict[str, tuple[str, str | None, str]]:
    rows = db.execute("SELECT run_id, queue, task, status FROM runrelay.runs").fetchall()
    return {r: (q, t, s) for r, q, t, s in rows}


def _registry() -> tuple[Tasks, list[tuple[str, dict[str, Any]]]]:
    tasks = Tasks()
    seen: list[tuple[str, dict[str, Any]]] = []

    @tasks.task("send_email", queue="email", max_attempts=5)
    def send_email(job: Job, *, to: str, subject: str = "hello") -> dict[str, str]:
        seen.append((job.run_id, {"to": to, "subject": subject}))
        return {"sent_to": to}

    @tasks.task("charge", queue="billing")
    def charge(job: Job, cents: int) -> None:
        seen.append((job.run_id, {"cents": cents}))

    return tasks, seen


# -- the registry ---------------------------------------------------------------
def test_a_registry_refuses_what_it_could_not_run() -> None:
    tasks = Tasks()

    @tasks.task("ok")
    def ok(job: Job) -> None: ...

    with pytest.raises(ValueError, match="registered twice"):
        tasks.task("ok")(lambda job: None)
    with pytest.raises(TypeError, match="'priority' is an enqueue option"):
        tasks.task("clash")(lambda job, priority: None)
    with pytest.raises(TypeError, match="job as its first argument"):
        tasks.task("nojob")(lambda: None)
    with pytest.raises(TypeError, match="cannot be given by keyword"):
        tasks.task("star")(lambda job, *rest: None)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        tasks.task("t", timeout=0)
    with pytest.raises(ValueError, match="non-blank"):
        tasks.task(" ")
    assert tasks.names == ["ok"]
    assert isinstance(ok, Task) and ok.queue == "default"


def test_enqueue_checks_the_arguments_against_the_function_and_writes_nothing_when_wrong(
    db: psycopg.Connection, client: Client
) -> None:
    tasks, _ = _registry()
    send_email = tasks["send_email"]
    for bad in ({}, {"to": "a@x", "nope": 1}, {"to": "a@x", "subject": "s", "extra": True}):
        with pytest.raises(TypeError, match="task 'send_email'"):
            send_email.enqueue(client, run_id="bad", **bad)
    assert _runs(db) == {}
    result = send_email.enqueue(client, run_id="e1", to="a@example.com")
    assert result.created
    row = db.execute(
        "SELECT queue, task, payload, max_attempts FROM runrelay.runs WHERE run_id = 'e1'"
    ).fetchone()
    assert row == ("email", "send_email", {"to": "a@example.com"}, 5)
    generated = send_email.enqueue(client, to="b@example.com")
    assert generated.run_id != "e1" and len(generated.run_id) == 36


def test_enqueue_on_a_connection_commits_and_rolls_back_with_the_callers_transaction(
    db: psycopg.Connection, db_url: str
) -> None:
    tasks, _ = _registry()
    charge = tasks["charge"]
    with psycopg.connect(db_url) as conn:  # not autocommit: one transaction
        conn.execute("CREATE TEMP TABLE orders (id text)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES ('o-1')")
        charge.enqueue(conn, run_id="charge-o-1", cents=100)
        conn.rollback()
        assert _runs(db) == {}
        conn.execute("INSERT INTO orders VALUES ('o-2')")
        charge.enqueue(conn, run_id="charge-o-2", cents=200)
        assert _runs(db) == {}  # not committed yet: invisible to others
        conn.commit()
    assert _runs(db) == {"charge-o-2": ("billing", "charge", "queued")}


def test_enqueue_with_an_async_client_or_connection(db: psycopg.Connection, db_url: str) -> None:
    tasks, _ = _registry()
    charge = tasks["charge"]

    async def main() -> None:
        await charge.enqueue(AsyncClient(db_url), run_id="a1", cents=1)
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            await charge.enqueue(conn, run_id="a2", cents=2)
            await conn.commit()

    asyncio.run(main())
    assert set(_runs(db)) == {"a1", "a2"}
    with pytest.raises(TypeError, match="needs a runrelay Client"):
        charge.enqueue("postgresql://nowhere", cents=1)  # type: ignore[arg-type]


# -- workers ---------------------------------------------------------------------
def test_a_worker_with_a_registry_runs_only_its_tasks_on_its_tasks_queues(
    db: psycopg.Connection, client: Client
) -> None:
    """Runs of another task in the same queue, untyped runs, and runs of its
    own task's name in another queue all stay queued."""
    tasks, seen = _registry()
    tasks["send_email"].enqueue(client, run_id="mail", to="a@example.com")
    tasks["charge"].enqueue(client, run_id="bill", cents=5)
    client.enqueue_run("other-app", queue="email", payload={}, task="resize_image")
    client.enqueue_run("untyped", queue="email", payload={})
    client.enqueue_run("elsewhere", queue="reports", payload={"cents": 1}, task="charge")
    worker = Worker(client, tasks, poll_interval=0.05)
    assert worker.queues == ["email", "billing"]
    thread, done = run_in_thread(worker)
    wait_for(lambda: worker.stats.get("complete:completed", 0) == 2)
    time.sleep(0.3)  # would it take anything else?
    worker.stop()
    thread.join(20)
    done.result(timeout=1)
    assert sorted(seen) == [("bill", {"cents": 5}), ("mail", {"to": "a@example.com",
                                                              "subject": "hello"})]  # fmt: skip
    runs = _runs(db)
    assert {r: s for r, (_, _, s) in runs.items()} == {
        "mail": "completed",
        "bill": "completed",
        "other-app": "queued",
        "untyped": "queued",
        "elsewhere": "queued",
    }
    assert worker.stats["claimed"] == 2


def test_an_async_worker_runs_coroutine_tasks_by_name(db: psycopg.Connection, db_url: str) -> None:
    tasks = Tasks()
    seen: list[int] = []

    @tasks.task("add", queue="math")
    async def add(job: Job, *, a: int, b: int) -> dict[str, int]:
        await asyncio.sleep(0)
        seen.append(a + b)
        return {"sum": a + b}

    Client(db).enqueue_run("untyped", queue="math", payload={"a": 0, "b": 0})

    async def main() -> AsyncWorker:
        client = AsyncClient(db_url)
        await add.enqueue(client, run_id="sum", a=2, b=3)
        worker = AsyncWorker(client, tasks, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        while worker.stats.get("complete:completed", 0) < 1:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        worker.stop()
        await asyncio.wait_for(task, 30)
        return worker

    asyncio.run(main())
    assert seen == [5]
    row = db.execute("SELECT result FROM runrelay.runs WHERE run_id = 'sum'").fetchone()
    assert row == ({"sum": 5},)
    assert _runs(db)["untyped"][2] == "queued"


def test_each_worker_refuses_the_tasks_it_cannot_run(client: Client) -> None:
    tasks = Tasks()

    @tasks.task("sync_one")
    def sync_one(job: Job) -> None: ...

    with pytest.raises(TypeError, match="'sync_one' is not a coroutine function"):
        AsyncWorker(client, tasks)
    other = Tasks()

    @other.task("async_one")
    async def async_one(job: Job) -> None: ...

    with pytest.raises(TypeError, match="'async_one' is a coroutine function"):
        Worker(client, other)
    with pytest.raises(ValueError, match="no task"):
        Worker(client, Tasks())


def test_a_run_whose_payload_does_not_fit_its_function_fails_with_the_reason(
    db: psycopg.Connection, client: Client
) -> None:
    """A run enqueued without the registry (or by an older version of the
    function) reaches the worker with arguments the function refuses: the
    attempt fails with the TypeError, and retries by policy."""
    tasks, _ = _registry()
    client.enqueue_run("stale", queue="billing", payload={"amount": 1}, task="charge",
                       max_attempts=1)  # fmt: skip
    worker = Worker(client, tasks, poll_interval=0.05)
    thread, done = run_in_thread(worker)
    wait_for(lambda: _runs(db)["stale"][2] == "failed")
    worker.stop()
    thread.join(20)
    done.result(timeout=1)
    error = db.execute("SELECT error FROM runrelay.runs WHERE run_id = 'stale'").fetchone()
    assert error is not None and error[0]["type"] == "TypeError"
    assert "amount" in error[0]["message"]


def test_runrelay_worker_runs_a_registry_named_on_the_command_line(
    db: psycopg.Connection, db_url: str, client: Client, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "jobs.py").write_text(
        textwrap.dedent(
            """
            import runrelay

            tasks = runrelay.Tasks()


            @tasks.task("greet", queue="hello")
            def greet(job, *, name):
                return {"greeting": f"hello {name}"}
            """
        )
    )
    enqueued = subprocess.run(
        [RUNRELAY, "runs", "enqueue", "greet-1", "--queue", "hello", "--task", "greet",
         "--payload", '{"name": "ada"}'],
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert enqueued.returncode == 0, enqueued.stderr
    assert _runs(db)["greet-1"] == ("hello", "greet", "queued")
    client.enqueue_run("not-mine", queue="hello", payload={"name": "bob"})
    proc = subprocess.Popen(
        [RUNRELAY, "worker", "app.jobs:tasks", "--poll-interval", "0.1"],
        cwd=tmp_path,
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _runs(db)["greet-1"][2] == "completed" or proc.poll() is not None,
                  timeout=30)  # fmt: skip
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert _runs(db)["greet-1"][2] == "completed", err
    assert _runs(db)["not-mine"][2] == "queued"
    bad = subprocess.run(
        [RUNRELAY, "worker", "app.jobs:tasks", "--timeout", "0"],
        cwd=tmp_path,
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "must be more than 0" in bad.stderr
