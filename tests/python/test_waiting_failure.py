"""The typed-wait failure protocol against concurrent signals and cancels, and
the client helper and worker step built on it."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from runrelay import AsyncClient, Client, WaitingFailureOutcome
from runrelay.worker import AsyncWorker, Job, Suspend, Worker
from sqlapi import call, claim_one, enqueue, events, fenced, run_row, scalar, table_checksum

Connect = Callable[..., psycopg.Connection]
WAIT = {"kind": "event", "name": "approve"}


def _waiting(db: psycopg.Connection, run_id: str, max_attempts: int = 1) -> dict[str, Any]:
    enqueue(db, run_id, max_attempts=max_attempts, queue=run_id)
    claim = claim_one(db, queues=[run_id])
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=WAIT) == "waiting"
    return claim


def test_prepare_then_protected_failure_applies(db: psycopg.Connection) -> None:
    claim = _waiting(db, "r1")
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    assert run_row(db, "r1")["wait"] == WAIT  # never cleared by preparing
    assert "run.resumed" not in events(db, "r1")
    outcome = scalar(
        db,
        "fail_attempt",
        **fenced(claim),
        error={"why": "rejected"},
        protect_waiting_suspension=True,
    )
    assert outcome == "failed"
    assert run_row(db, "r1")["status"] == "failed"
    assert events(db, "r1") == ["run.queued", "run.started", "run.waiting", "run.failed"]


def test_signal_after_prepare_wins_and_failure_is_fenced(db: psycopg.Connection) -> None:
    claim = _waiting(db, "r1")
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    assert scalar(db, "signal_run", run_id="r1", name="approve", payload={"ok": True}) == "resumed"
    outcome = scalar(
        db, "fail_attempt", **fenced(claim), error={"e": 1}, protect_waiting_suspension=True
    )
    assert outcome == "fence_lost"
    run = run_row(db, "r1")
    assert run["status"] == "queued"
    assert run["resume"] == {"name": "approve", "payload": {"ok": True}}


def test_cancel_after_prepare_wins(db: psycopg.Connection) -> None:
    claim = _waiting(db, "r1")
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    assert scalar(db, "cancel_run", run_id="r1") == "cancelled"
    outcome = scalar(
        db, "fail_attempt", **fenced(claim), error={"e": 1}, protect_waiting_suspension=True
    )
    assert outcome == "cancelled"
    assert run_row(db, "r1")["status"] == "cancelled"


def test_prepare_is_not_applicable_to_running_or_detached(db: psycopg.Connection) -> None:
    enqueue(db, "r1")
    claim = claim_one(db)
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "not_applicable"
    detached = {"kind": "detached_runner", "runner": "lambda"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=detached) == "waiting"
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "not_applicable"


def _race(
    connect: Connect,
    first: Callable[[psycopg.Connection], str],
    second: Callable[[psycopg.Connection], str],
) -> tuple[str, str]:
    a, b = connect(), connect()
    start = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(lambda: (start.wait(), first(a))[1])
        fb = pool.submit(lambda: (start.wait(), second(b))[1])
        return fa.result(timeout=10), fb.result(timeout=10)


def test_protected_failure_races_signal(db: psycopg.Connection, connect: Connect) -> None:
    """Exactly one of them takes effect, whichever gets the locks first."""
    winners: set[str] = set()
    for i in range(40):
        run_id = f"r{i}"
        claim = _waiting(db, run_id)
        assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
        fail, signal = _race(
            connect,
            lambda c, cl=claim: scalar(
                c, "fail_attempt", **fenced(cl), error={"e": 1}, protect_waiting_suspension=True
            ),
            lambda c, r=run_id: scalar(c, "signal_run", run_id=r, name="approve"),
        )
        status = run_row(db, run_id)["status"]
        if fail == "failed":
            assert signal == "terminal" and status == "failed"
            winners.add("fail")
        else:
            assert (fail, signal, status) == ("fence_lost", "resumed", "queued")
            winners.add("signal")
        types = events(db, run_id)
        assert types.count("run.failed") + types.count("run.resumed") == 1
    assert winners  # at least one winner kind; both usually appear


def test_protected_failure_races_cancel(db: psycopg.Connection, connect: Connect) -> None:
    for i in range(40):
        run_id = f"c{i}"
        claim = _waiting(db, run_id)
        assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
        fail, cancel = _race(
            connect,
            lambda c, cl=claim: scalar(
                c, "fail_attempt", **fenced(cl), error={"e": 1}, protect_waiting_suspension=True
            ),
            lambda c, r=run_id: scalar(c, "cancel_run", run_id=r),
        )
        status = run_row(db, run_id)["status"]
        if fail == "failed":
            assert status == "failed" and cancel in {"already_terminal", "cancel_requested"}
        else:
            assert fail == "cancelled" and status == "cancelled"
        types = events(db, run_id)
        assert types.count("run.failed") + types.count("run.cancelled") == 1
    # Nothing may be left half-done: no live attempt on an ended run.
    live = db.execute(
        "SELECT count(*) FROM runrelay.attempts a JOIN runrelay.runs r USING (run_id)"
        " WHERE a.status IN ('running', 'waiting') AND r.finished_at IS NOT NULL"
    ).fetchone()
    assert live == (0,)
    assert call(db, "reap_expired") == []


def test_protected_failure_after_timeout_loses_to_the_timeout(db: psycopg.Connection) -> None:
    """Past timeout_at the suspension is over even before a claim woke it: the
    protected failure is fenced and the next attempt sees the timeout."""
    enqueue(db, "t1", queue="t1")
    claim = claim_one(db, queues=["t1"])
    wait = {"kind": "event", "name": "approve", "timeout_at": "2000-01-01T00:00:00Z"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=wait) == "waiting"
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "prepared"
    outcome = scalar(
        db, "fail_attempt", **fenced(claim), error={"e": 1}, protect_waiting_suspension=True
    )
    assert outcome == "fence_lost"
    nxt = claim_one(db, queues=["t1"])
    assert (nxt["attempt"], nxt["resume"]) == (2, {"timed_out": True})


# -- The client's fail_waiting helper and the workers' on_waiting step --------
# Both orders of a signal against the two calls of the waiting-failure
# protocol, with real sessions: the signal is committed on another connection
# right after prepare_waiting_failure has returned and before the protected
# failure is sent (the client's prepare is wrapped to do so), or after the
# whole helper has returned.

FLAVORS = ("sync", "async")


def _client(flavor: str, url: str) -> Client | AsyncClient:
    return Client(url) if flavor == "sync" else AsyncClient(url)


def _signal_after_prepare(
    client: Client | AsyncClient, db: psycopg.Connection, run_id: str
) -> None:
    """Make `client`'s prepare_waiting_failure commit the awaited signal on
    another session once the prepare has returned: the signal lands between
    the helper's two calls."""
    real = client.prepare_waiting_failure

    def signal() -> None:
        assert (
            scalar(db, "signal_run", run_id=run_id, name="approve", payload={"ok": 1}) == "resumed"
        )

    if isinstance(client, Client):

        def prepare(*args: Any, **kwargs: Any) -> Any:
            answer = real(*args, **kwargs)
            signal()
            return answer

    else:

        async def prepare(*args: Any, **kwargs: Any) -> Any:
            answer = await real(*args, **kwargs)
            signal()
            return answer

    client.prepare_waiting_failure = prepare  # type: ignore[method-assign,assignment]


def _fail_waiting(client: Client | AsyncClient, claim: dict[str, Any], **kwargs: Any) -> Any:
    """One fail_waiting call on a fresh client of either flavor, closed after."""

    async def run() -> Any:
        try:
            value = client.fail_waiting(**fenced(claim), error={"why": "rejected"}, **kwargs)
            return await value if inspect.isawaitable(value) else value
        finally:
            closed = client.close()
            if inspect.isawaitable(closed):
                await closed

    return asyncio.run(run())


def _attempt_statuses(db: psycopg.Connection, run_id: str) -> list[str]:
    rows = db.execute(
        "SELECT status FROM runrelay.attempts WHERE run_id = %s ORDER BY attempt", [run_id]
    ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fail_waiting_is_refused_when_a_signal_lands_between_its_calls(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    claim = _waiting(db, "s1")
    client = _client(flavor, db_url)
    _signal_after_prepare(client, db, "s1")
    outcome = _fail_waiting(client, claim)
    assert type(outcome) is WaitingFailureOutcome and outcome is WaitingFailureOutcome.FENCE_LOST
    run = run_row(db, "s1")
    assert (run["status"], run["error"]) == ("queued", None)
    assert run["resume"] == {"name": "approve", "payload": {"ok": 1}}
    assert _attempt_statuses(db, "s1") == ["resumed"]
    assert events(db, "s1") == ["run.queued", "run.started", "run.waiting", "run.resumed"]
    nxt = claim_one(db, queues=["s1"])  # the run goes on with what the signal delivered
    assert (nxt["attempt"], nxt["resume"]) == (2, {"name": "approve", "payload": {"ok": 1}})


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fail_waiting_that_applied_first_is_not_undone_by_a_late_signal(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    claim = _waiting(db, "f1", max_attempts=1)
    outcome = _fail_waiting(_client(flavor, db_url), claim)
    assert outcome is WaitingFailureOutcome.FAILED
    assert scalar(db, "signal_run", run_id="f1", name="approve") == "terminal"
    run = run_row(db, "f1")
    assert (run["status"], run["wait"], run["resume"]) == ("failed", None, None)
    assert run["error"] == {"why": "rejected"}
    assert events(db, "f1") == ["run.queued", "run.started", "run.waiting", "run.failed"]
    # Attempts left: the failure schedules a retry and the late signal is only
    # stored for a later wait; it does not resume the run.
    claim = _waiting(db, "f2", max_attempts=2)
    outcome = _fail_waiting(_client(flavor, db_url), claim, retry_at=None)
    assert outcome is WaitingFailureOutcome.RETRY_SCHEDULED
    assert scalar(db, "signal_run", run_id="f2", name="approve") == "stored"
    assert (run_row(db, "f2")["status"], run_row(db, "f2")["resume"]) == ("queued", None)
    assert "run.resumed" not in events(db, "f2")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fail_waiting_repeated_answers_the_same_and_writes_nothing(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    claim = _waiting(db, "p1", max_attempts=1)
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FAILED
    before = table_checksum(db)
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FAILED
    assert table_checksum(db) == before


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fail_waiting_refused_after_a_signal_is_refused_the_same_on_every_repeat(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """The prepare answered prepared, a signal won, the protected failure
    answered fence_lost, and the reply was lost. The repeat's prepare sees the
    run queued (not_applicable), and once the next attempt waits, a newer
    attempt (fence_lost): the helper answers fence_lost each time, writing
    nothing, because only the protected failure's answer decides."""
    claim = _waiting(db, "s1")
    client = _client(flavor, db_url)
    _signal_after_prepare(client, db, "s1")
    assert _fail_waiting(client, claim) is WaitingFailureOutcome.FENCE_LOST
    before = table_checksum(db)
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "not_applicable"
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FENCE_LOST
    assert table_checksum(db) == before
    nxt = claim_one(db, queues=["s1"])
    assert scalar(db, "suspend_attempt", **fenced(nxt), wait=WAIT) == "waiting"
    assert scalar(db, "prepare_waiting_failure", **fenced(claim)) == "fence_lost"
    before = table_checksum(db)
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FENCE_LOST
    assert table_checksum(db) == before
    # A signal that won before the prepare is refused the same way.
    claim = _waiting(db, "s2")
    assert scalar(db, "signal_run", run_id="s2", name="approve") == "resumed"
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FENCE_LOST


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fail_waiting_refuses_running_or_detached_attempts(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """An attempt that never suspended on a sleep or event wait has no
    suspension the protocol can fail: fence_lost, nothing written."""
    enqueue(db, "n1", queue="n1")
    claim = claim_one(db, queues=["n1"])
    before = table_checksum(db)
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FENCE_LOST
    assert table_checksum(db) == before  # the running attempt is not failed
    detached = {"kind": "detached_runner", "runner": "gpu"}
    assert scalar(db, "suspend_attempt", **fenced(claim), wait=detached) == "waiting"
    before = table_checksum(db)
    assert _fail_waiting(_client(flavor, db_url), claim) is WaitingFailureOutcome.FENCE_LOST
    assert table_checksum(db) == before
    assert run_row(db, "n1")["status"] == "waiting"


def _run_worker(flavor: str, client: Client | AsyncClient, handler: Any) -> dict[str, int]:
    if isinstance(client, Client):
        worker = Worker(client, handler, poll_interval=0.05, maintenance=False)
        try:
            worker.run(until_idle=0.5)
        finally:
            client.close()
        return worker.stats

    async def main() -> dict[str, int]:
        assert isinstance(client, AsyncClient)
        aworker = AsyncWorker(client, handler, poll_interval=0.05, maintenance=False)
        try:
            await aworker.run(until_idle=0.5)
        finally:
            await client.close()
        return aworker.stats

    return asyncio.run(main())


def _approval_handler(flavor: str, steps: list[int]) -> Any:
    """Suspends on "approve", then asks for the approval (the on_waiting step),
    which fails; once resumed, completes with what the signal delivered."""

    def ask() -> None:
        steps.append(1)
        raise RuntimeError("mail server down")

    async def ask_async() -> None:
        ask()

    def outcome(job: Job) -> Any:
        if job.resume is None:
            raise Suspend.event("approve", on_waiting=ask if flavor == "sync" else ask_async)
        return {"resume": job.resume}

    if flavor == "sync":
        return outcome

    async def handler(job: Job) -> Any:
        return outcome(job)

    return handler


@pytest.mark.parametrize("flavor", FLAVORS)
def test_worker_on_waiting_failure_loses_to_a_signal_and_the_run_resumes(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    enqueue(db, "ws", max_attempts=1)
    client = _client(flavor, db_url)
    _signal_after_prepare(client, db, "ws")
    steps: list[int] = []
    stats = _run_worker(flavor, client, _approval_handler(flavor, steps))
    assert steps == [1]
    assert stats.get("fail_waiting:fence_lost") == 1
    run = run_row(db, "ws")
    assert (run["status"], run["error"]) == ("completed", None)
    assert run["result"] == {"resume": {"name": "approve", "payload": {"ok": 1}}}
    assert _attempt_statuses(db, "ws") == ["resumed", "completed"]
    types = events(db, "ws")
    assert "run.failed" not in types and "run.retry_scheduled" not in types


@pytest.mark.parametrize("flavor", FLAVORS)
def test_worker_on_waiting_failure_fails_the_waiting_run_and_a_late_signal_finds_it_failed(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    enqueue(db, "wf", max_attempts=1)
    steps: list[int] = []
    stats = _run_worker(flavor, _client(flavor, db_url), _approval_handler(flavor, steps))
    assert steps == [1]
    assert stats.get("fail_waiting:failed") == 1
    assert stats.get("heartbeat:fence_lost") is None  # a waiting run is not heartbeaten
    assert scalar(db, "signal_run", run_id="wf", name="approve") == "terminal"
    run = run_row(db, "wf")
    assert (run["status"], run["error"]["type"], run["error"]["message"]) == (
        "failed",
        "RuntimeError",
        "mail server down",
    )
    assert _attempt_statuses(db, "wf") == ["failed"]
    assert events(db, "wf") == ["run.queued", "run.started", "run.waiting", "run.failed"]
