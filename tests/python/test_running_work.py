"""Handlers under a deadline and under cancellation, on real servers: a
handler past its timeout fails its attempt with a `timeout` error (an async
one is cancelled, a sync one is fenced off), and cancel_run reaches a running
handler through a notification, long before its next heartbeat."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from conftest import run_in_thread
from faults import wait_for
from runrelay import AsyncClient, Client
from runrelay.worker import AsyncWorker, Job, Worker

# Heartbeats this far apart cannot be what delivers a cancellation within
# the few seconds the tests wait: only the notification can.
SLOW_BEATS = 60.0


def _status(db: psycopg.Connection, run_id: str) -> str:
    row = db.execute("SELECT status FROM runrelay.runs WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _attempts(db: psycopg.Connection, run_id: str) -> list[tuple[int, str, Any]]:
    return db.execute(
        "SELECT attempt, status, error FROM runrelay.attempts WHERE run_id = %s ORDER BY attempt",
        (run_id,),
    ).fetchall()


def _run_async(worker: AsyncWorker, until: Callable[[], bool]) -> None:
    async def main() -> None:
        task = asyncio.create_task(worker.run())
        while not await asyncio.to_thread(until):
            await asyncio.sleep(0.05)
        worker.stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())


# -- timeouts -------------------------------------------------------------------
def test_a_sync_handler_past_its_timeout_fails_its_attempt_and_its_late_result_is_fenced_off(
    db: psycopg.Connection, client: Client
) -> None:
    """The worker fails the attempt at the deadline (error type timeout), the
    run retries by its policy, and the first handler's result, returned
    later, changes nothing: its write answers fence_lost."""
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05")
    client.enqueue_run("slow", max_attempts=3)
    first_returned = threading.Event()

    def handler(job: Job) -> Any:
        if job.attempt.attempt == 1:
            assert job.cancelled.wait(20), "the timed-out handler was not told"
            time.sleep(0.5)  # returns well after the deadline
            first_returned.set()
            return {"late": True}
        return {"attempt": job.attempt.attempt}

    worker = Worker(client, handler, concurrency=2, poll_interval=0.05, timeout=1.0)
    thread, done = run_in_thread(worker)
    wait_for(lambda: _status(db, "slow") == "completed")
    assert first_returned.wait(10)
    wait_for(lambda: worker.stats.get("complete:fence_lost", 0) == 1)
    worker.stop()
    thread.join(20)
    done.result(timeout=1)
    attempts = _attempts(db, "slow")
    assert [(a, s) for a, s, _ in attempts] == [(1, "failed"), (2, "completed")]
    assert attempts[0][2]["type"] == "timeout"
    assert attempts[0][2]["timeout_seconds"] == 1.0
    result = db.execute("SELECT result FROM runrelay.runs WHERE run_id = 'slow'").fetchone()
    assert result == ({"attempt": 2},)
    assert worker.stats["timeout:retry_scheduled"] == 1


def test_an_async_handler_past_its_timeout_is_cancelled_and_its_attempt_fails(
    db: psycopg.Connection, db_url: str
) -> None:
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05")
    Client(db).enqueue_run("slow", max_attempts=2)
    cancelled: list[int] = []

    async def handler(job: Job) -> Any:
        if job.attempt.attempt == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(job.attempt.attempt)
                raise
        return {"attempt": job.attempt.attempt}

    async def main() -> AsyncWorker:
        client = AsyncClient(db_url)
        worker = AsyncWorker(client, handler, poll_interval=0.05, timeout=0.5)
        task = asyncio.create_task(worker.run())
        while await asyncio.to_thread(_status, db, "slow") != "completed":
            await asyncio.sleep(0.05)
        worker.stop()
        await asyncio.wait_for(task, 30)
        return worker

    worker = asyncio.run(main())
    assert cancelled == [1]
    attempts = _attempts(db, "slow")
    assert [(a, s) for a, s, _ in attempts] == [(1, "failed"), (2, "completed")]
    assert attempts[0][2]["type"] == "timeout"
    assert worker.stats["fail:retry_scheduled"] == 1


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_timeout_must_be_positive(client: Client, flavor: str) -> None:
    cls: Any = Worker if flavor == "sync" else AsyncWorker
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            cls(client, lambda job: None, timeout=bad)


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_queue_list_given_as_a_string_is_refused_not_split_into_letters(
    client: Client, flavor: str
) -> None:
    cls: Any = Worker if flavor == "sync" else AsyncWorker
    with pytest.raises(TypeError, match=r"queues=\['email'\]"):
        cls(client, lambda job: None, queues="email")


# -- prompt cancellation --------------------------------------------------------
def test_cancel_run_reaches_a_running_sync_handler_through_a_notification(
    db: psycopg.Connection, db_url: str, client: Client
) -> None:
    client.enqueue_run("long")
    started, saw_cancel = threading.Event(), threading.Event()

    def handler(job: Job) -> Any:
        started.set()
        if job.cancelled.wait(30):
            saw_cancel.set()
        return {}

    worker = Worker(
        client, handler, poll_interval=0.05, heartbeat_every=SLOW_BEATS, listen_dsn=db_url
    )
    thread, done = run_in_thread(worker)
    assert started.wait(20)
    wait_for(lambda: worker.stats.get("claimed") == 1)
    time.sleep(0.5)  # the worker's cancel session is listening
    assert client.cancel_run("long", reason="operator said so") == "cancelled"
    assert saw_cancel.wait(5), "the handler did not learn of the cancellation"
    worker.stop()
    thread.join(20)
    done.result(timeout=1)
    assert worker.stats["cancel_notified"] == 1
    assert "heartbeat:cancelled" not in worker.stats
    assert worker.stats["complete:cancelled"] == 1
    assert _status(db, "long") == "cancelled"


def test_cancel_run_cancels_a_running_async_handler_task(
    db: psycopg.Connection, db_url: str
) -> None:
    Client(db).enqueue_run("long")
    started = threading.Event()
    outcome: list[str] = []

    async def handler(job: Job) -> Any:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        return {}

    async def main() -> AsyncWorker:
        client = AsyncClient(db_url)
        worker = AsyncWorker(
            client, handler, poll_interval=0.05, heartbeat_every=SLOW_BEATS, listen_dsn=db_url
        )
        task = asyncio.create_task(worker.run())
        while not started.is_set():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the worker's cancel session is listening
        assert await client.cancel_run("long") == "cancelled"
        for _ in range(100):
            if outcome:
                break
            await asyncio.sleep(0.05)
        worker.stop()
        await asyncio.wait_for(task, 30)
        return worker

    worker = asyncio.run(main())
    assert outcome == ["cancelled"]
    assert worker.stats["cancel_notified"] == 1
    assert worker.stats["fail:cancelled"] == 1
    assert _status(db, "long") == "cancelled"


def test_a_cancel_notification_for_another_worker_or_garbage_is_ignored(
    db: psycopg.Connection, client: Client
) -> None:
    """The payload names the worker; a notification naming another, or one
    that is not the engine's JSON, stops nothing."""
    client.enqueue_run("mine")
    [claimed] = client.claim_attempts("me", lease_seconds=60)
    worker = Worker(client, lambda job: None, name="me")
    from runrelay.worker import claimed_job

    job = claimed_job(claimed, 60)
    worker._swap([], [job])
    for payload in (
        '{"run_id": "mine", "attempt": 1, "worker": "someone else"}',
        "not json",
        '{"run_id": "mine"}',
        "[]",
    ):
        worker._cancel_notified(payload)
        assert not job.cancelled.is_set(), payload
    worker._cancel_notified('{"run_id": "mine", "attempt": 1, "worker": "me"}')
    assert job.cancelled.is_set()
