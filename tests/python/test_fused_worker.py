"""The Worker loops' fused path: each job's outcome is written, and the next
run claimed, in one settle_and_claim call (Worker/AsyncWorker fused=True,
the default). Real server; a lost reply is injected on the wire by the
fault proxy of faults.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
import pytest

from faults import TcpProxy, backend_of, wait_for
from runrelay import AsyncClient, Client
from runrelay.worker import AsyncWorker, Job, Worker, settled_and_claimed

Call = tuple[str, dict[str, Any]]


class Recording(Client):
    """A Client that records every call it sends (function, values) and
    every answer it got (function, result); `before_settle` runs before each
    settle_and_claim is sent."""

    def __init__(self, source: Any, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self.sent: list[Call] = []
        self.answers: list[tuple[str, Any]] = []
        self.before_settle: Callable[[], None] = lambda: None

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
        if function == "settle_and_claim":
            self.before_settle()
        self.sent.append((function, values))
        result = super()._call(function, values, conn)
        self.answers.append((function, result))
        return result


class AsyncRecording(AsyncClient):
    """Recording, for AsyncWorker."""

    def __init__(self, source: Any, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self.sent: list[Call] = []
        self.answers: list[tuple[str, Any]] = []
        self.before_settle: Callable[[], None] = lambda: None

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Coroutine[Any, Any, Any]:
        if function == "settle_and_claim":
            self.before_settle()
        self.sent.append((function, values))
        call = super()._call(function, values, conn)

        async def run() -> Any:
            result = await call
            self.answers.append((function, result))
            return result

        return run()


Recorder = Recording | AsyncRecording


def _run(flavor: str, url: str, handler: Callable[[Job], Any], setup: Any = None,
         **options: Any) -> tuple[Recorder, Worker | AsyncWorker]:  # fmt: skip
    """Run a worker of `flavor` on a recording client until idle; `setup`
    sees (client, worker) before it starts."""
    options = {"poll_interval": 0.05, "maintenance": False, **options}
    if flavor == "sync":
        with Recording(url, prepare_threshold=None) as client:
            worker = Worker(client, handler, **options)
            if setup is not None:
                setup(client, worker)
            worker.run(until_idle=0.3)
            return client, worker

    async def main() -> tuple[Recorder, Worker | AsyncWorker]:
        async def ahandler(job: Job) -> Any:
            return handler(job)

        async with AsyncRecording(url, prepare_threshold=None) as client:
            worker = AsyncWorker(client, ahandler, **options)
            if setup is not None:
                setup(client, worker)
            await worker.run(until_idle=0.3)
            return client, worker

    return asyncio.run(main())


def _claimed_by(client: Recorder, function: str) -> int:
    """Runs claimed by the successful calls of `function`."""
    total = 0
    for fn, result in client.answers:
        if fn == function == "claim_attempts":
            total += len(result)
        elif fn == function == "settle_and_claim":
            total += len(settled_and_claimed(result)[1])
    return total


def _nothing_claimed_unworked(db: psycopg.Connection) -> None:
    running = db.execute(
        "SELECT count(*) FROM runrelay.attempts WHERE status = 'running'"
    ).fetchone()
    assert running == (0,)
    assert db.execute("SELECT count(*) FROM runrelay.runs WHERE status = 'running'").fetchone() == (
        0,
    )


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_one_settle_and_claim_per_job_and_no_separate_writes(
    db: psycopg.Connection, db_url: str, flavor: str, concurrency: int
) -> None:
    """N jobs: every outcome is written by a settle_and_claim, which also
    claims the next runs; claim_attempts only fills the slots at the start
    (and polls once the queue is empty), and no other write is sent."""
    n = 30
    for i in range(n):
        db.execute("SELECT runrelay.enqueue_run(%s)", (f"j{i:02}",))
    client, worker = _run(flavor, db_url, lambda job: {"ok": job.run_id}, concurrency=concurrency)
    statuses = Counter(s for (s,) in db.execute("SELECT status FROM runrelay.runs"))
    assert statuses == {"completed": n}
    sent = Counter(fn for fn, _ in client.sent)
    # Each job's outcome is written once, by a settle_and_claim call; with
    # several handlers, outcomes that finish together share a call.
    settled = [
        item["run_id"] for fn, v in client.sent if fn == "settle_and_claim" for item in v["items"]
    ]
    assert sorted(settled) == [f"j{i:02}" for i in range(n)]
    assert sent["settle_and_claim"] <= n
    if concurrency == 1:
        assert sent["settle_and_claim"] == n
    writes = ("complete_attempt", "complete_attempts", "fail_attempt", "suspend_attempt",
              "release_attempt")  # fmt: skip
    assert not any(sent[w] for w in writes), sent
    # The loop's own claims took at most one run per slot; every other run
    # came with the settlement of the job before it.
    assert _claimed_by(client, "claim_attempts") <= concurrency
    assert _claimed_by(client, "settle_and_claim") == n - _claimed_by(client, "claim_attempts")
    assert worker.stats["complete:completed"] == n
    assert worker.stats["claimed"] == n


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_batches_settle_and_claim_the_next_batch_in_one_call(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """batch_size 10: each settle_and_claim settles a whole batch (a failure
    and a retry among the completions) and claims the next batch."""
    for i in range(40):
        db.execute(
            "SELECT runrelay.enqueue_run(%s, payload => %s::jsonb, max_attempts => 1)",
            (f"b{i:02}", '{"boom": true}' if i == 7 else "{}"),
        )

    def handler(job: Job) -> Any:
        if job.payload.get("boom"):
            raise ValueError("boom")
        return {"i": job.run_id}

    client, worker = _run(flavor, db_url, handler, concurrency=10, batch_size=10)
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == {f"b{i:02}": "failed" if i == 7 else "completed" for i in range(40)}
    sent = Counter(fn for fn, _ in client.sent)
    settles = [v for fn, v in client.sent if fn == "settle_and_claim"]
    assert sum(len(v["items"]) for v in settles) == 40
    assert len(settles) <= 8 and max(len(v["items"]) for v in settles) == 10
    assert {v["max_runs"] for v in settles} <= set(range(11))
    ops = Counter(item.get("op") for v in settles for item in v["items"])
    assert ops == {"complete": 39, "fail": 1}
    assert sent["complete_attempts"] == sent["fail_attempt"] == 0
    assert worker.stats["fail:failed"] == 1


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_lost_reply_is_replayed_with_the_same_call_id_and_nothing_happens_twice(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """The reply of the settle_and_claim that completes r1 and claims r2 is
    lost after COMMIT. The worker repeats the call with the same items and
    call_id: r1's completion answers what it recorded and r2's claim returns
    the attempt the lost call opened; r2 runs once, as attempt 1."""
    db.execute("SELECT runrelay.enqueue_run('r1', priority => 1)")
    db.execute("SELECT runrelay.enqueue_run('r2')")
    proxy = TcpProxy(db_url)
    ran: list[str] = []
    try:
        rule = proxy.arm("drop_reply_after_commit", b'"settle_and_claim"(')

        def handler(job: Job) -> Any:
            ran.append(f"{job.run_id}#{job.attempt.attempt}")
            return {"ok": True}

        client, worker = _run(flavor, proxy.url(f"fused-{flavor}"), handler, concurrency=1)
        assert rule.fired.is_set() and rule.exchange is not None and rule.exchange.committed
    finally:
        proxy.close()
    wait_for(lambda: backend_of(db, f"fused-{flavor}") is None, 30, "backend exit")
    assert ran == ["r1#1", "r2#1"]
    assert worker.stats["settle_errors"] == 1
    settles = [v for fn, v in client.sent if fn == "settle_and_claim"]
    lost, replay = settles[0], settles[1]
    assert lost == replay and lost["call_id"] is not None  # same items, same call_id
    assert [i["run_id"] for i in lost["items"]] == ["r1"] and lost["max_runs"] == 1
    (answer,) = [r for fn, r in client.answers if fn == "settle_and_claim"][:1]
    settled, claimed = settled_and_claimed(answer)
    assert settled == {("r1", 1): "completed"} and [a.run_id for a in claimed] == ["r2"]
    attempts = db.execute(
        "SELECT run_id, attempt, status, call_id FROM runrelay.attempts ORDER BY run_id"
    ).fetchall()
    assert [(r, a, s) for r, a, s, _ in attempts] == [
        ("r1", 1, "completed"),
        ("r2", 1, "completed"),
    ]
    assert attempts[1][3] == lost["call_id"]  # r2 was claimed by the lost call
    events = Counter(
        (r, t)
        for r, t in db.execute(
            "SELECT run_id, type FROM runrelay.ledger"
            " WHERE type IN ('run.started', 'run.completed')"
        )
    )
    assert set(events.values()) == {1}, events  # one start and one completion each
    _nothing_claimed_unworked(db)


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_stopping_worker_settles_without_claiming(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """stop() mid-stream: the jobs in flight are settled with max_runs 0, so
    nothing is left claimed and unworked, and the rest stays queued."""
    for i in range(20):
        db.execute("SELECT runrelay.enqueue_run(%s)", (f"s{i:02}",))
    handled: list[str] = []
    lock = threading.Lock()
    holder: dict[str, Any] = {}

    def handler(job: Job) -> Any:
        with lock:
            handled.append(job.run_id)
            if len(handled) == 5:
                holder["worker"].stop()
        return {}

    def setup(_client: Any, worker: Any) -> None:
        holder["worker"] = worker

    client, worker = _run(flavor, db_url, handler, setup, concurrency=3)
    _nothing_claimed_unworked(db)
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    done = {r for r, s in statuses.items() if s == "completed"}
    assert done == set(handled)
    assert all(s == "queued" for r, s in statuses.items() if r not in done)
    # Every run claimed was worked or handed back: the settlements sent after
    # stop() claim nothing (one sent just before it may have: its runs go back).
    released = worker.stats.get("released_on_shutdown", 0)
    assert worker.stats["claimed"] == len(handled) + released
    # The settlement of the job that stopped the worker asks for no run. It
    # may share a call with a settlement that still asked for one (group
    # commit), so count what the calls asked for against what they settled.
    calls = [v for fn, v in client.sent if fn == "settle_and_claim"]
    assert sum(v["max_runs"] for v in calls) < sum(len(v["items"]) for v in calls)


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_runs_claimed_as_the_worker_stops_are_handed_back_not_run(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """stop() lands while a settle_and_claim that claims is on its way: the
    run it claims is handed back at once (release_attempt, no attempt used)
    and never reaches the handler."""
    db.execute("SELECT runrelay.enqueue_run('first', priority => 1)")
    db.execute("SELECT runrelay.enqueue_run('second')")
    handled: list[str] = []

    def setup(client: Any, worker: Any) -> None:
        if isinstance(worker, Worker):
            # The threaded loop waits for a slot while the handler runs. Make
            # that wait the one that gets the slot the hand-back frees (the
            # race this test is about), rather than leave it to timing: stop()
            # only once the loop is waiting, and the wait no longer times out.
            loop_waits = threading.Event()
            wait_for_slot = worker._wait_for_slot

            def wait_until_freed(seconds: float) -> None:
                loop_waits.set()
                wait_for_slot(10)

            worker._wait_for_slot = wait_until_freed  # type: ignore[method-assign]

            def stop_once_waiting() -> None:
                assert loop_waits.wait(5), "the main loop never waited for a slot"
                worker.stop()

            client.before_settle = stop_once_waiting  # after max_runs 1 was chosen
        else:
            # One event loop: the main loop runs only when the settling task
            # yields, and it checks stop() first whenever it runs.
            client.before_settle = worker.stop

    client, worker = _run(flavor, db_url, lambda job: handled.append(job.run_id), setup,
                          concurrency=1)  # fmt: skip
    assert handled == ["first"]
    settles = [v for fn, v in client.sent if fn == "settle_and_claim"]
    assert [v["max_runs"] for v in settles] == [1]
    assert worker.stats["released_on_shutdown"] == 1
    _nothing_claimed_unworked(db)
    row = db.execute(
        "SELECT r.status, a.status FROM runrelay.runs AS r JOIN runrelay.attempts AS a"
        " USING (run_id) WHERE run_id = 'second'"
    ).fetchone()
    assert row == ("queued", "released")


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_the_two_call_path_stays_available(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """fused=False: complete_attempt, then claim_attempts, as before."""
    for i in range(5):
        db.execute("SELECT runrelay.enqueue_run(%s)", (f"t{i}",))
    client, _ = _run(flavor, db_url, lambda job: {}, concurrency=1, fused=False)
    sent = Counter(fn for fn, _ in client.sent)
    assert sent["settle_and_claim"] == 0
    assert sent["complete_attempt"] == 5
    assert sent["claim_attempts"] >= 6


def _busy_calls(flavor: str, db: psycopg.Connection, db_url: str, b2_result: Any) -> Recorder:
    """a1 and a2 finish first, and their settle_and_claim calls (as many as
    a worker makes at once) wait on their runs' rows, which a session holds;
    b1 and b2 finish while both calls wait, b2 with `b2_result`. Then the
    session lets go. Returns the recording client once the worker is idle.
    a2 finishes only once a1's call is on its way: finished together, the
    two would share one call (gathering), and only one call would wait."""
    for run_id in ("a1", "a2", "b1", "b2"):
        db.execute("SELECT runrelay.enqueue_run(%s)", (run_id,))
    locked = threading.Event()
    holder: dict[str, Any] = {}

    def busy(worker: Worker | AsyncWorker) -> bool:
        return worker._settle_calls == worker.settle_calls_in_flight == 2

    def a1_sent(worker: Worker | AsyncWorker) -> bool:
        # One call on its way and nothing queued: a1's (b1 and b2 wait for
        # both calls to be busy before they finish).
        return worker._settle_calls == 1 and not worker._queued

    def result_of(job: Job) -> Any:
        return b2_result if job.run_id == "b2" else {"ok": job.run_id}

    def control() -> None:
        with psycopg.connect(db_url) as locker:
            wait_for(
                lambda: (
                    locker.execute(
                        "SELECT count(*) FROM runrelay.attempts"
                        " WHERE run_id IN ('a1', 'a2') AND status = 'running'"
                    ).fetchone()
                    == (2,)
                ),
                what="a1 and a2 running",
            )
            locker.commit()
            locker.execute(
                "SELECT 1 FROM runrelay.runs WHERE run_id IN ('a1', 'a2') FOR UPDATE"
            ).fetchall()
            locked.set()
            wait_for(lambda: "worker" in holder and len(holder["worker"]._queued) == 2,
                     what="b1 and b2 queued behind the busy calls")  # fmt: skip
            locker.commit()

    controller = threading.Thread(target=control)
    controller.start()
    try:
        if flavor == "sync":

            def handler(job: Job) -> Any:
                if job.run_id.startswith("a"):
                    locked.wait(30)
                    if job.run_id == "a2":
                        wait_for(lambda: a1_sent(holder["worker"]), what="a1's call on its way")
                else:
                    wait_for(lambda: busy(holder["worker"]), what="both calls busy")
                return result_of(job)

            with Recording(db_url, prepare_threshold=None) as client:
                worker = Worker(client, handler, concurrency=4, poll_interval=0.05,
                                maintenance=False)  # fmt: skip
                holder["worker"] = worker
                worker.run(until_idle=0.5)
                return client

        async def ahandler(job: Job) -> Any:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if job.run_id == "a1":
                    ready = locked.is_set()
                elif job.run_id == "a2":
                    ready = locked.is_set() and a1_sent(holder["worker"])
                else:
                    ready = busy(holder["worker"])
                if ready:
                    break
                await asyncio.sleep(0.01)
            return result_of(job)

        async def main() -> Recorder:
            async with AsyncRecording(db_url, prepare_threshold=None) as client:
                worker = AsyncWorker(client, ahandler, concurrency=4, poll_interval=0.05,
                                     maintenance=False)  # fmt: skip
                holder["worker"] = worker
                await worker.run(until_idle=0.5)
                return client

        return asyncio.run(main())
    finally:
        controller.join(60)


def _settled_runs(client: Recorder) -> list[set[str]]:
    return [
        {item["run_id"] for item in values["items"]}
        for fn, values in client.sent
        if fn == "settle_and_claim" and values["items"]
    ]


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_outcomes_that_finish_while_the_calls_are_busy_go_out_in_one_call(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """Group commit: a worker makes at most two settle_and_claim calls at
    once; outcomes that finish meanwhile wait in a queue and the next call
    carries all of them (and claims as many runs), without waiting for any
    handler still running."""
    client = _busy_calls(flavor, db, db_url, {"ok": "b2"})
    calls = _settled_runs(client)
    assert {"b1", "b2"} in calls, calls
    assert sorted(run for call in calls for run in call) == ["a1", "a2", "b1", "b2"]
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == dict.fromkeys(("a1", "a2", "b1", "b2"), "completed")
    results = dict(db.execute("SELECT run_id, result->>'ok' FROM runrelay.runs").fetchall())
    assert results == {run: run for run in ("a1", "a2", "b1", "b2")}


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_an_outcome_the_server_refuses_does_not_sink_those_sent_with_it(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """b2's result is over the payload cap, so the shared call of b1 and b2
    is refused whole (54000, nothing written); each is then sent alone: b1
    completes, only b2's write fails (its run goes back when its lease
    expires, as after any failed write)."""
    client = _busy_calls(flavor, db, db_url, {"big": "x" * (1 << 20)})
    calls = _settled_runs(client)
    shared = calls.index({"b1", "b2"})
    assert {"b1"} in calls[shared + 1 :] and {"b2"} in calls[shared + 1 :], calls
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == {"a1": "completed", "a2": "completed", "b1": "completed", "b2": "running"}


def _run_handlers(flavor: str, url: str, sync_handler: Callable[[Job], Any],
                  async_handler: Callable[[Job], Coroutine[Any, Any, Any]], setup: Any,
                  **options: Any) -> Recorder:  # fmt: skip
    """_run with a handler of each flavor (one that blocks a thread, one
    that awaits), for handlers that wait for each other."""
    options = {"poll_interval": 0.05, "maintenance": False, **options}
    if flavor == "sync":
        with Recording(url, prepare_threshold=None) as client:
            worker = Worker(client, sync_handler, **options)
            setup(client, worker)
            worker.run(until_idle=0.3)
            return client

    async def main() -> Recorder:
        async with AsyncRecording(url, prepare_threshold=None) as client:
            worker = AsyncWorker(client, async_handler, **options)
            setup(client, worker)
            await worker.run(until_idle=0.3)
            return client

    return asyncio.run(main())


async def _until(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_runs_claimed_together_are_settled_in_one_call(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """Gathering: four runs start, and their handlers end at once. The first
    outcome does not go out alone with the rest queued behind it: the call
    waits for the handlers of the runs claimed within the gathering window
    (a long one here, so that the test does not depend on the machine's
    speed), and one call writes all four."""
    runs = [f"g{i}" for i in range(4)]
    for run_id in runs:
        db.execute("SELECT runrelay.enqueue_run(%s)", (run_id,))
    started: list[str] = []
    barrier = threading.Barrier(len(runs), timeout=30)

    def handler(job: Job) -> Any:
        barrier.wait()
        return {"ok": job.run_id}

    async def ahandler(job: Job) -> Any:
        started.append(job.run_id)
        await _until(lambda: len(started) == len(runs), "every handler started")
        return {"ok": job.run_id}

    def setup(_client: Recorder, worker: Worker | AsyncWorker) -> None:
        worker.gather_seconds = 30.0

    client = _run_handlers(flavor, db_url, handler, ahandler, setup, concurrency=len(runs))
    assert _settled_runs(client) == [set(runs)]
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == dict.fromkeys(runs, "completed")


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_a_call_does_not_wait_for_a_handler_longer_than_the_gathering_window(
    db: psycopg.Connection, db_url: str, flavor: str
) -> None:
    """`slow` and `quick` start together; quick ends at once, slow only once
    a settle_and_claim call is on its way. Quick's call gathers for the
    window (0.2 s) and then goes without slow: gathering bounds the wait, it
    never ties an outcome to a long handler."""
    for run_id in ("slow", "quick"):
        db.execute("SELECT runrelay.enqueue_run(%s)", (run_id,))
    started: list[str] = []
    barrier = threading.Barrier(2, timeout=30)
    sent = threading.Event()

    def handler(job: Job) -> Any:
        barrier.wait()
        if job.run_id == "slow":
            assert sent.wait(30), "no call went out while slow ran"
        return {"ok": job.run_id}

    async def ahandler(job: Job) -> Any:
        started.append(job.run_id)
        await _until(lambda: len(started) == 2, "both handlers started")
        if job.run_id == "slow":
            await _until(sent.is_set, "a call while slow ran")
        return {"ok": job.run_id}

    def setup(client: Recorder, worker: Worker | AsyncWorker) -> None:
        worker.gather_seconds = 0.2
        client.before_settle = sent.set

    client = _run_handlers(flavor, db_url, handler, ahandler, setup, concurrency=2)
    calls = _settled_runs(client)
    assert calls[0] == {"quick"}, calls
    assert {"slow"} in calls[1:], calls
    statuses = dict(db.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
    assert statuses == {"slow": "completed", "quick": "completed"}
