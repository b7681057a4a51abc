"""Durable steps on real servers: a finished step is never done again by a
later attempt of its run — after a failure, a wake, or a SIGKILLed worker —
a stale attempt's record is fenced off, a repeat after a lost reply is
exact, and misuse fails with a clear error before anything is written."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from conftest import run_in_thread
from faults import wait_for
from runrelay import AsyncClient, Client, StepOutcome
from runrelay.cli import main
from runrelay.dashboard import DashboardSettings
from runrelay.dashboard import start as start_dashboard
from runrelay.durable import StepError, StepLost, step_key, step_name
from runrelay.errors import PayloadTooLarge
from runrelay.tasks import Tasks
from runrelay.worker import AsyncWorker, Job, Retry, Worker
from sqlapi import backend_pid, wait_until_blocked

RUNRELAY = str(Path(sys.executable).with_name("runrelay"))


def _status(db: psycopg.Connection, run_id: str) -> str:
    row = db.execute("SELECT status FROM runrelay.runs WHERE run_id = %s", [run_id]).fetchone()
    assert row is not None
    return str(row[0])


def _steps(db: psycopg.Connection, run_id: str) -> list[tuple[str, int]]:
    rows = db.execute(
        "SELECT step, attempt FROM runrelay.steps WHERE run_id = %s ORDER BY position", [run_id]
    ).fetchall()
    return [(s, a) for s, a in rows]


def _events(db: psycopg.Connection, run_id: str) -> list[Any]:
    rows = db.execute(
        "SELECT payload FROM runrelay.ledger WHERE run_id = %s AND type = 'step.recorded'"
        " ORDER BY seq",
        [run_id],
    ).fetchall()
    return [p for (p,) in rows]


def _run(worker: Worker, db: psycopg.Connection, run_id: str, done: str = "completed") -> None:
    thread, future = run_in_thread(worker)
    try:
        wait_for(lambda: _status(db, run_id) == done or future.done(), timeout=30)
    finally:
        worker.stop()
        thread.join(timeout=30)
    if future.done():
        future.result()
    assert _status(db, run_id) == done


# -- a sync worker ----------------------------------------------------------------
def test_a_retried_attempt_skips_the_steps_already_recorded(
    db: psycopg.Connection, client: Client
) -> None:
    """The third step fails once: the retry returns the first two steps'
    recorded results without running them, and runs the third and fourth."""
    tasks = Tasks()
    ran: Counter[str] = Counter()
    seen: list[Any] = []

    def work(name: str, value: Any) -> Any:
        ran[name] += 1
        if name == "three" and ran[name] == 1:
            raise Retry("flaky", after=0)
        return value

    @tasks.task("order", queue="durable")
    def order(job: Job, *, n: int) -> Any:
        one = job.step("one", work, "one", {"n": n})
        two = job.step("two", work, "two", (1, 2))  # a tuple comes back as a list
        seen.append((one, two, job.step_key("two")))
        three = job.step("three", work, "three", "x")
        return {"four": job.step("four", work, "four", [one, two, three])}

    tasks["order"].enqueue(client, run_id="o1", n=7)
    _run(Worker(client, tasks, poll_interval=0.05), db, "o1")
    assert ran == {"one": 1, "two": 1, "three": 2, "four": 1}
    # Both attempts saw the same values: the first computed, the second recorded.
    assert seen == [({"n": 7}, [1, 2], "o1:two")] * 2
    assert _steps(db, "o1") == [("one", 1), ("two", 1), ("three", 2), ("four", 2)]
    assert client.get_run("o1").result == {"four": [{"n": 7}, [1, 2], "x"]}  # type: ignore[union-attr]
    assert _events(db, "o1") == [
        {"step": "one", "attempt": 1},
        {"step": "two", "attempt": 1},
        {"step": "three", "attempt": 2},
        {"step": "four", "attempt": 2},
    ]
    steps = client.run_steps("o1")
    assert [(s.step, s.position, s.attempt) for s in steps] == [
        ("one", 1, 1), ("two", 2, 1), ("three", 3, 2), ("four", 4, 2),
    ]  # fmt: skip


def test_sleep_and_wait_for_event_are_steps(db: psycopg.Connection, client: Client) -> None:
    """The first time each suspends the run; after the wake it returns what
    the wake delivered, recorded under its name, and the steps before it are
    not run again."""
    tasks = Tasks()
    ran: Counter[str] = Counter()

    def once(name: str) -> str:
        ran[name] += 1
        return name

    @tasks.task("flow", queue="durable")
    def flow(job: Job) -> Any:
        job.step("before", once, "before")
        assert job.sleep("nap", 0.2) is None
        job.step("middle", once, "middle")
        approval = job.wait_for_event("approval", event="approve:f1", timeout=60)
        late = job.wait_for_event("late", name="never", timeout=0.2)  # name= works as event=
        job.step("after", once, "after")
        return {"approval": approval, "late": late}

    tasks["flow"].enqueue(client, run_id="f1")
    worker = Worker(client, tasks, poll_interval=0.05)
    thread, future = run_in_thread(worker)
    try:
        wait_for(lambda: db.execute(
            "SELECT wait->>'kind' = 'event' FROM runrelay.runs WHERE run_id = 'f1'"
        ).fetchone() == (True,), timeout=30)  # fmt: skip
        assert client.signal_run("f1", "approve:f1", {"approved": True}) == "resumed"
        wait_for(lambda: _status(db, "f1") == "completed" or future.done(), timeout=30)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert _status(db, "f1") == "completed"
    assert ran == {"before": 1, "middle": 1, "after": 1}
    assert client.get_run("f1").result == {"approval": {"approved": True}, "late": None}  # type: ignore[union-attr]
    recorded = {s.step: s.result for s in client.run_steps("f1")}
    assert recorded["nap"] == {"slept": True}
    assert recorded["approval"] == {"name": "approve:f1", "payload": {"approved": True}}
    assert recorded["late"] == {"timed_out": True}


def test_a_step_name_used_twice_or_a_result_not_json_fails_before_anything_is_written(
    db: psycopg.Connection, client: Client
) -> None:
    tasks = Tasks()

    @tasks.task("twice", queue="durable", max_attempts=1)
    def twice(job: Job) -> None:
        job.step("a", lambda: 1)
        job.step("a", lambda: 2)

    @tasks.task("not_json", queue="durable", max_attempts=1)
    def not_json(job: Job) -> None:
        job.step("set", lambda: {1, 2})

    @tasks.task("too_big", queue="durable", max_attempts=1)
    def too_big(job: Job) -> None:
        job.step("big", lambda: "x" * 2_000_000)

    for name in ("twice", "not_json", "too_big"):
        tasks[name].enqueue(client, run_id=name)
    worker = Worker(client, tasks, poll_interval=0.05)
    thread, _ = run_in_thread(worker)
    try:
        wait_for(lambda: all(_status(db, r) == "failed" for r in ("twice", "not_json", "too_big")),
                 timeout=30)  # fmt: skip
    finally:
        worker.stop()
        thread.join(timeout=30)
    errors = {r: client.get_run(r).error for r in ("twice", "not_json", "too_big")}  # type: ignore[union-attr]
    assert errors["twice"]["type"] == "StepError" and "used twice" in errors["twice"]["message"]
    assert errors["not_json"]["type"] == "StepError" and "not JSON" in errors["not_json"]["message"]
    assert errors["too_big"]["type"] == "PayloadTooLarge"
    assert _steps(db, "twice") == [("a", 1)]
    assert _steps(db, "not_json") == [] and _steps(db, "too_big") == []
    for bad in ("", " ", "x" * 201, None):
        with pytest.raises(StepError, match="non-blank string"):
            step_name(bad)


# -- fences and replays -----------------------------------------------------------
def test_a_stale_attempts_record_is_fenced_off_and_its_result_never_returned(
    db: psycopg.Connection, client: Client
) -> None:
    client.enqueue_run("s1", queue="durable")
    (first,) = client.claim_attempts("w1", ["durable"], lease_seconds=5)
    stale = Job(first, client=client)
    assert stale.step("a", lambda: "from the first") == "from the first"
    # The lease lapses and the reaper hands the run to a second attempt.
    db.execute("UPDATE runrelay.attempts SET lease_expires_at = now() - interval '1 second'")
    assert [r.run_id for r in client.reap_expired()] == ["s1"]
    db.execute("UPDATE runrelay.runs SET run_at = now() WHERE run_id = 's1'")
    (second,) = client.claim_attempts("w2", ["durable"])
    assert second.steps == {"a": "from the first"}
    with pytest.raises(StepLost, match="fence_lost"):
        stale.step("b", lambda: "from the stale attempt")
    assert stale.cancelled.is_set()
    live = Job(second, client=client)
    assert live.step("a", lambda: pytest.fail("a recorded step runs again")) == "from the first"
    assert live.step("b", lambda: "from the second") == "from the second"
    assert client.record_step(**first.fence, step="c", result=1) == StepOutcome.FENCE_LOST
    assert _steps(db, "s1") == [("a", 1), ("b", 2)]
    assert db.execute("SELECT result FROM runrelay.steps WHERE step = 'b'").fetchone() == (
        "from the second",
    )


def test_a_repeat_after_a_lost_reply_is_exact(
    db: psycopg.Connection, client: Client, db_url: str
) -> None:
    """The reply of a committed record_step is lost (its session is
    terminated before the client reads it): the same call again answers
    recorded, and the run holds one step and one event."""
    client.enqueue_run("r1", queue="durable")
    (claim,) = client.claim_attempts("w1", ["durable"])
    args = {**claim.fence, "step": "pay", "result": {"id": "ch_1"}}
    with psycopg.connect(db_url, autocommit=True) as lost:
        pid = lost.info.backend_pid
        lost.execute(
            "SELECT runrelay.record_step(%(run_id)s, %(attempt)s, %(lease_token)s, %(step)s,"
            " %(result)s::jsonb)",
            {**args, "result": '{"id": "ch_1"}'},
        )
        db.execute("SELECT pg_terminate_backend(%s)", [pid])
    before = (_steps(db, "r1"), _events(db, "r1"))
    assert client.record_step(**args) == StepOutcome.RECORDED
    assert client.record_step(**args) == StepOutcome.RECORDED
    assert before == ([("pay", 1)], [{"step": "pay", "attempt": 1}])
    assert (_steps(db, "r1"), _events(db, "r1")) == before
    assert client.record_step(**{**args, "result": {"id": "ch_2"}}) == StepOutcome.ALREADY_RECORDED
    with pytest.raises(PayloadTooLarge):
        client.record_step(**{**args, "step": "big", "result": "x" * 2_000_000})
    assert _steps(db, "r1") == [("pay", 1)]


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_two_records_of_one_step_in_flight_store_one(
    db: psycopg.Connection, client: Client, db_url: str, first_ends: str
) -> None:
    """Two sessions record the same step of one attempt at once (a handler
    retried by its own caller while the first call is still in flight). The
    second waits for the first's run lock; when the first commits, the second
    answers already_recorded and the first result stands, one row and one
    event; when the first rolls back, the second records its own."""
    client.enqueue_run("race", queue="durable")
    (claim,) = client.claim_attempts("w1", ["durable"])
    call = (
        "SELECT runrelay.record_step(%(run_id)s, %(attempt)s, %(lease_token)s, 'pay',"
        " %(result)s::jsonb)"
    )
    with (
        psycopg.connect(db_url) as first,
        psycopg.connect(db_url, autocommit=True) as second,
        ThreadPoolExecutor(1) as pool,
    ):
        answer = first.execute(call, {**claim.fence, "result": '"first"'}).fetchone()
        assert answer == ("recorded",)
        pid = backend_pid(second)
        pending = pool.submit(
            lambda: second.execute(call, {**claim.fence, "result": '"second"'}).fetchone()
        )
        wait_until_blocked(db, pid)
        assert not pending.done()
        if first_ends == "commit":
            first.commit()
        else:
            first.rollback()
        outcome = pending.result(timeout=30)
    stored = "first" if first_ends == "commit" else "second"
    expected = "already_recorded" if first_ends == "commit" else "recorded"
    assert outcome == (expected,)
    assert db.execute("SELECT step, result FROM runrelay.steps").fetchall() == [("pay", stored)]
    assert _events(db, "race") == [{"step": "pay", "attempt": 1}]


def test_step_keys_are_stable_and_bounded() -> None:
    assert step_key("run-1", "charge") == "run-1:charge"
    long = step_key("r" * 200, "s" * 200)
    assert long.startswith("sha256:") and len(long) <= 255
    assert long == step_key("r" * 200, "s" * 200)


# -- an async worker ----------------------------------------------------------------
def test_an_async_worker_awaits_steps_and_waits(db: psycopg.Connection, db_url: str) -> None:
    tasks = Tasks()
    ran: Counter[str] = Counter()

    async def fetch(name: str) -> str:
        ran[name] += 1
        await asyncio.sleep(0)
        return name

    @tasks.task("async_flow", queue="durable")
    async def async_flow(job: Job) -> Any:
        first = await job.step("first", fetch, "first")
        await job.sleep("nap", 0.2)
        second = await job.step("second", lambda: "plain")  # a sync fn works too
        if ran["second-side"] == 0:
            ran["second-side"] += 1
            raise Retry("once", after=0)
        return [first, second]

    async def main() -> None:
        client = AsyncClient(db_url)
        await tasks["async_flow"].enqueue(client, run_id="a1")
        worker = AsyncWorker(client, tasks, poll_interval=0.05)
        task = asyncio.ensure_future(worker.run())
        try:
            for _ in range(600):
                if _status(db, "a1") == "completed" or task.done():
                    break
                await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())
    assert _status(db, "a1") == "completed"
    assert ran == {"first": 1, "second-side": 1}
    assert [s for s, _ in _steps(db, "a1")] == ["first", "nap", "second"]


# -- a SIGKILLed worker ---------------------------------------------------------------
APP = """
import os
import time

import psycopg
import runrelay

tasks = runrelay.Tasks()


def count(step):
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO durable_runs (step) VALUES (%s)", [step])
    return step


@tasks.task("four_steps", queue="durable")
def four_steps(job):
    job.step("s1", count, "s1")
    job.step("s2", count, "s2")
    while not os.path.exists(os.environ["GATE"]):  # the test kills the worker here
        time.sleep(0.05)
    job.step("s3", count, "s3")
    job.step("s4", count, "s4")
    return {"done": True}
"""


def test_a_worker_sigkilled_after_step_two_of_four_is_followed_by_steps_three_and_four(
    db: psycopg.Connection, db_url: str, client: Client, tmp_path: Path
) -> None:
    db.execute("DROP TABLE IF EXISTS durable_runs")
    db.execute("CREATE TABLE durable_runs (step text NOT NULL)")
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    gate = tmp_path / "gate"
    env = {"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin", "GATE": str(gate)}
    cmd = [RUNRELAY, "worker", "app:tasks", "--poll-interval", "0.1", "--lease-seconds", "5"]

    def executions() -> Counter[str]:
        return Counter(s for (s,) in db.execute("SELECT step FROM durable_runs").fetchall())

    client.enqueue_run("k1", queue="durable", task="four_steps")
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(_steps(db, "k1")) == 2, timeout=30, what="steps 1 and 2 recorded")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert executions() == {"s1": 1, "s2": 1}
    gate.touch()
    second = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    try:
        # The second worker's own maintenance reaps the first one's lease.
        wait_for(lambda: _status(db, "k1") == "completed", timeout=60, what="the run completed")
    finally:
        second.terminate()
        second.communicate(timeout=30)
    assert executions() == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}
    assert [(s, a) for s, a in _steps(db, "k1")] == [("s1", 1), ("s2", 1), ("s3", 2), ("s4", 2)]
    db.execute("DROP TABLE durable_runs")


def test_claims_return_steps_after_every_way_a_run_comes_back(
    db: psycopg.Connection, client: Client
) -> None:
    """Release and snooze hand a run back with its steps; so does a retry."""
    client.enqueue_run("b1", queue="durable")
    (claim,) = client.claim_attempts("w", ["durable"])
    assert claim.steps is None
    assert client.record_step(**claim.fence, step="x", result=[1]) == "recorded"
    assert client.release_attempt(**claim.fence) == "released"
    (again,) = client.claim_attempts("w", ["durable"])
    assert again.steps == {"x": [1]}
    assert client.fail_attempt(**again.fence, error={"e": 1}, retry_at=None) in ("retry_scheduled",)
    db.execute("UPDATE runrelay.runs SET run_at = now() - interval '1 second' WHERE run_id = 'b1'")
    (third,) = client.claim_attempts("w", ["durable"])
    assert third.steps == {"x": [1]}


# -- where users look -------------------------------------------------------------
def test_runs_show_and_the_run_page_list_a_runs_steps(
    db: psycopg.Connection, db_url: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.enqueue_run("v1", queue="durable")
    (claim,) = client.claim_attempts("w1", ["durable"])
    for name, result in (("charge", {"id": "ch_9"}), ("ship", "shipped")):
        assert client.record_step(**claim.fence, step=name, result=result) == "recorded"

    def show(*extra: str) -> str:
        capsys.readouterr()
        assert main(["--database-url", db_url, "runs", "show", "v1", *extra]) == 0
        return capsys.readouterr().out

    shown = json.loads(show("--json"))
    assert [(s["step"], s["position"], s["attempt"], s["result"]) for s in shown["steps"]] == [
        ("charge", 1, 1, {"id": "ch_9"}),
        ("ship", 2, 1, "shipped"),
    ]
    plain = show()
    assert "steps" in plain and "ch_9" in plain and "shipped" in plain
    server = start_dashboard(DashboardSettings(db_url))
    try:
        page = httpx.get(f"{server.url.rstrip('/')}/run", params={"id": "v1"}).text
    finally:
        server.stop()
    assert 'data-testid="steps"' in page
    assert 'data-step="charge"' in page and 'data-step="ship"' in page and "ch_9" in page
