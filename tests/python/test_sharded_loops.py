"""The Worker, Relay and Maintenance loops against a sharded install, through
the proxy, unchanged: they LISTEN on every shard (a NOTIFY is sent on the
shard that holds the run and the proxy relays none), reconnect a lost LISTEN
session of one shard without losing the others, and go on through a shard
that is down.

Every loop here polls every two minutes (jittered to at least one): a run
done within the waits below was started by a notification, not a poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import run_in_thread
from faults import terminate_backend, wait_for
from runrelay import AsyncClient, Client
from runrelay._backoff import CONNECTION_ERRORS
from runrelay._listen import MultiListener
from runrelay.errors import ShardUnavailable
from runrelay.maintenance import Maintenance
from runrelay.relay import Relay
from runrelay.sharding import shard_listen_dsns
from runrelay.types import LedgerEvent
from runrelay.worker import AsyncWorker, Job, Worker
from sharded_harness import ShardedInstall, run_ids_on

pytestmark = pytest.mark.sharded

REPO = Path(__file__).resolve().parents[2]
POLL = 120.0  # jittered to 60..180 s: far beyond every wait below
WAIT = 30.0


def listen_pids(conn: psycopg.Connection[Any], channel: str = "runrelay_runs") -> list[int]:
    """The backends LISTENing on `channel` on conn's server."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE query = %s AND pid <> pg_backend_pid()",
        [f"LISTEN {channel}"],
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


def wait_listening(sharded: ShardedInstall, channel: str = "runrelay_runs") -> list[int]:
    """Until one backend on each shard LISTENs on `channel`; their pids."""
    pids: list[int] = []

    def listening() -> bool:
        pids[:] = [p for i in range(2) for p in listen_pids(sharded.shard(i), channel)]
        return all(len(listen_pids(sharded.shard(i), channel)) == 1 for i in range(2))

    wait_for(listening, WAIT, f"LISTEN {channel} on both shards")
    return pids


def recording() -> tuple[list[str], Callable[[Job], None]]:
    done: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            done.append(job.run_id)

    return done, handler


@contextlib.contextmanager
def listening_worker(
    sharded: ShardedInstall, handler: Callable[[Job], Any]
) -> Iterator[Future[None]]:
    """A Worker through the proxy, in a thread, once it LISTENs on both
    shards; stopped at the end of the block, and its failure raised. Yields
    the outcome of its run."""
    worker = Worker(
        Client(sharded.proxy_url),
        handler,
        poll_interval=POLL,
        listen_dsn=shard_listen_dsns(sharded.proxy_url),
        maintenance=False,
    )
    thread, result = run_in_thread(worker)
    try:
        wait_listening(sharded)
        yield result
    finally:
        worker.stop()
        thread.join(30)
    result.result(timeout=1)


def test_a_worker_through_the_proxy_is_woken_by_either_shard(sharded: ShardedInstall) -> None:
    done, handler = recording()
    with listening_worker(sharded, handler):
        producer = sharded.client()
        (a,) = run_ids_on(sharded, 0, 1, "a")
        (b,) = run_ids_on(sharded, 1, 1, "b")
        producer.enqueue_run(a)
        wait_for(lambda: a in done, WAIT, "the run on shard 0, on its NOTIFY")
        producer.enqueue_run(b)
        wait_for(lambda: b in done, WAIT, "the run on shard 1, on its NOTIFY")
        statuses = sharded.everywhere("SELECT run_id, status FROM runrelay.runs ORDER BY 1")
        assert statuses == [(a, "completed"), (b, "completed")]
    # Stopped: its LISTEN sessions are closed on both shards.
    wait_for(lambda: not any(listen_pids(sharded.shard(i)) for i in range(2)), WAIT, "UNLISTEN")


def test_a_shard_whose_listen_session_is_killed_reconnects_without_stalling_the_other(
    sharded: ShardedInstall,
) -> None:
    done, handler = recording()
    with listening_worker(sharded, handler):
        (killed,) = listen_pids(sharded.shard(1))
        assert terminate_backend(sharded.shard(1), killed)
        producer = sharded.client()
        a = run_ids_on(sharded, 0, 2, "a")
        b = run_ids_on(sharded, 1, 2, "b")
        # Shard 0's session is untouched: its runs are woken for at once.
        producer.enqueue_run(a[0])
        wait_for(lambda: a[0] in done, WAIT, "the run on shard 0")
        # Shard 1's session comes back (a new backend), and wakes the loop
        # for runs enqueued while it was away as well as after.
        producer.enqueue_run(b[0])
        wait_for(lambda: listen_pids(sharded.shard(1)) not in ([], [killed]), WAIT, "LISTEN again")
        wait_for(lambda: b[0] in done, WAIT, "the run enqueued during the reconnect")
        producer.enqueue_run(b[1])
        producer.enqueue_run(a[1])
        wait_for(lambda: {a[1], b[1]} <= set(done), WAIT, "runs on both shards after it")
        assert len(listen_pids(sharded.shard(0))) == 1
    assert sorted(done) == sorted(a + b)


def test_a_worker_goes_on_through_a_stopped_shard_and_loses_nothing(
    sharded: ShardedInstall,
) -> None:
    """Shard 1 stops while a run of it is in its handler: the worker goes on
    with shard 0's runs; once shard 1 is back the held run's outcome is
    written (its settle call was repeated meanwhile) and new runs there are
    woken for again."""
    done: list[str] = []
    started = threading.Event()
    release = threading.Event()
    a = run_ids_on(sharded, 0, 3, "a")
    b = run_ids_on(sharded, 1, 2, "b")

    def handler(job: Job) -> dict[str, str]:
        if job.run_id == b[0]:
            started.set()
            release.wait(60)
        done.append(job.run_id)
        return {"ok": job.run_id}

    shard1 = sharded.clusters.shards[1]
    with listening_worker(sharded, handler) as result:
        try:
            producer = sharded.client()
            producer.enqueue_run(a[0])
            producer.enqueue_run(b[0])
            wait_for(started.is_set, WAIT, "the run on shard 1 in its handler")
            wait_for(lambda: a[0] in done, WAIT, "the run on shard 0")
            shard1.stop("immediate")
            release.set()  # its outcome cannot be written while shard 1 is down
            producer.enqueue_run(a[1])
            wait_for(lambda: a[1] in done, WAIT, "a run on shard 0 while shard 1 is down")
            assert not result.done()
            shard1.start()
            wait_for(
                lambda: (
                    sharded.shard(1)
                    .execute("SELECT status FROM runrelay.runs WHERE run_id = %s", [b[0]])
                    .fetchone()
                    == ("completed",)
                ),
                WAIT,
                "the held run's outcome written once shard 1 is back",
            )
            wait_for(
                lambda: len(listen_pids(sharded.shard(1))) == 1, WAIT, "LISTEN on shard 1 again"
            )
            again(lambda: producer.enqueue_run(b[1]))
            producer.enqueue_run(a[2])
            wait_for(lambda: {a[2], b[1]} <= set(done), WAIT, "runs on both shards after it")
        finally:
            release.set()
    statuses = sharded.everywhere("SELECT status, count(*) FROM runrelay.runs GROUP BY 1")
    assert statuses == [("completed", 3), ("completed", 2)]
    assert sorted(done) == sorted(a + b)


def again(call: Callable[[], Any]) -> None:
    """A call through a proxy session that may hold a connection to a shard
    from before it restarted: PL/Proxy's first call on it may fail (XX000,
    "server closed the connection unexpectedly") and drops it; the call is
    repeated as the loops repeat theirs."""
    try:
        call()
    except (psycopg.errors.InternalError_, ShardUnavailable) as exc:
        assert "closed the connection" in str(exc)
        call()


def test_an_async_worker_through_the_proxy_listens_on_every_shard(
    sharded: ShardedInstall,
) -> None:
    done: list[str] = []
    a = run_ids_on(sharded, 0, 2, "a")
    b = run_ids_on(sharded, 1, 2, "b")

    async def handler(job: Job) -> None:
        done.append(job.run_id)

    async def until(predicate: Callable[[], bool], what: str) -> None:
        await asyncio.to_thread(wait_for, predicate, WAIT, what)

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(sharded.proxy_url, autocommit=True) as c:
            worker = AsyncWorker(
                AsyncClient(c),
                handler,
                poll_interval=POLL,
                listen_dsn=shard_listen_dsns(sharded.proxy_url),
                maintenance=False,
            )
            running = asyncio.create_task(worker.run())
            try:
                await asyncio.to_thread(wait_listening, sharded)
                producer = sharded.client()
                producer.enqueue_run(a[0])
                producer.enqueue_run(b[0])
                await until(lambda: {a[0], b[0]} <= set(done), "runs on both shards")
                (killed,) = listen_pids(sharded.shard(0))
                assert terminate_backend(sharded.shard(0), killed)
                await until(
                    lambda: listen_pids(sharded.shard(0)) not in ([], [killed]), "LISTEN again"
                )
                producer.enqueue_run(a[1])
                producer.enqueue_run(b[1])
                await until(lambda: {a[1], b[1]} <= set(done), "runs on both shards after it")
            finally:
                worker.stop()
                await asyncio.wait_for(running, 30)

    asyncio.run(scenario())
    assert sorted(done) == sorted(a + b)
    wait_for(lambda: not any(listen_pids(sharded.shard(i)) for i in range(2)), WAIT, "UNLISTEN")


def test_a_relay_through_the_proxy_is_woken_by_either_shard(sharded: ShardedInstall) -> None:
    delivered: list[tuple[str, str]] = []

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        delivered.extend((e.run_id, str(e.type)) for e in events)

    calls: Counter[str] = Counter()
    relay = Relay(
        Client(sharded.proxy_url, on_call=lambda function, _seconds: calls.update([function])),
        sink,
        lanes=("observability",),
        max_sleep=POLL,
        listen_dsn=shard_listen_dsns(sharded.proxy_url),
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    producer = sharded.client()
    (a,) = run_ids_on(sharded, 0, 1, "a")
    (b,) = run_ids_on(sharded, 1, 1, "b")
    producer.enqueue_run(a)
    producer.enqueue_run(b)
    thread.start()
    try:
        wait_listening(sharded, "runrelay_ledger")
        for run_id in (a, b):
            producer.append_events(run_id, [{"type": "step", "lane": "observability"}])
            wait_for(lambda r=run_id: (r, "step") in delivered, WAIT, f"{run_id}'s event")
        (killed,) = listen_pids(sharded.shard(1), "runrelay_ledger")
        assert terminate_backend(sharded.shard(1), killed)
        wait_for(
            lambda: listen_pids(sharded.shard(1), "runrelay_ledger") not in ([], [killed]),
            WAIT,
            "LISTEN again",
        )
        producer.append_events(b, [{"type": "again", "lane": "observability"}])
        wait_for(lambda: (b, "again") in delivered, WAIT, "the event on the reconnected shard")
        # Shard 1 stopped: the relay goes on with shard 0, then both again.
        sharded.clusters.shards[1].stop("immediate")
        producer.append_events(a, [{"type": "alone", "lane": "observability"}])
        wait_for(lambda: (a, "alone") in delivered, WAIT, "shard 0's event, shard 1 down")
        assert thread.is_alive()
        sharded.ensure_up()
        again(lambda: producer.append_events(b, [{"type": "back", "lane": "observability"}]))
        wait_for(lambda: (b, "back") in delivered, WAIT, "shard 1's event once it is back")
    finally:
        relay.stop()
        thread.join(30)
    assert not thread.is_alive()
    # Woken for each event, never polling meanwhile: the lifecycle events
    # (run.queued) it does not deliver are due all along, and wake it not.
    assert 3 <= calls["claim_ledger"] + calls["claim_ledger_runs"] < 50, calls


def test_maintenance_rounds_go_on_through_a_stopped_shard(
    sharded: ShardedInstall, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client(sharded.proxy_url)
    maintenance = Maintenance(client, interval=0.2, prune_after=timedelta(0))
    # (recorded: the minutes of activity earlier tests left on the shards)
    assert maintenance.run_once().keys() == {"reaped", "scheduled", "recorded", "pruned", "purged"}
    maintenance.next_slot()  # through the proxy: no slot, and no error
    sharded.clusters.shards[1].stop("immediate")
    # One shard down: the walkers skip it (a WARNING notice) and answer.
    assert maintenance.run_once()["reaped"] == 0
    # Both down: the round fails with an error the loop retries after a backoff.
    sharded.clusters.shards[0].stop("immediate")
    with pytest.raises(CONNECTION_ERRORS):
        maintenance.run_once()
    caplog.set_level(logging.DEBUG, "runrelay.maintenance")
    thread = threading.Thread(target=maintenance.run, daemon=True)
    thread.start()

    def rounds(message: str, since: int = 0) -> int:
        return sum(r.getMessage().startswith(message) for r in caplog.records[since:])

    def good_round(since: int) -> bool:
        return any(r.getMessage() == "maintenance round" for r in caplog.records[since:])

    try:
        wait_for(lambda: rounds("maintenance round failed") >= 2, WAIT, "two failed rounds")
        assert thread.is_alive()
        sharded.ensure_up()
        since = len(caplog.records)
        wait_for(lambda: good_round(since), WAIT, "a round once the shards are back")
    finally:
        maintenance.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert maintenance.disabled == {"purge"}  # off unless purge_after is given


def test_the_multi_listener_follows_the_dsns_its_provider_returns(
    sharded: ShardedInstall,
) -> None:
    urls = sharded.shard_urls
    current = [urls[0]]
    listener = MultiListener(lambda: list(current), "runrelay_test", refresh=0.1)
    stop = threading.Event()

    def settled(shard: int, listening: bool) -> bool:
        """Whether a wait (which reads the provider) was not woken and
        `shard` LISTENs as expected."""
        woken = listener.wait(0.2, stop)
        return not woken and bool(listen_pids(sharded.shard(shard), "runrelay_test")) == listening

    try:
        assert listener.wait(WAIT, stop)  # woken once its session is up
        assert listen_pids(sharded.shard(0), "runrelay_test")
        assert not listen_pids(sharded.shard(1), "runrelay_test")
        current.append(urls[1])
        wait_for(lambda: settled(1, True), WAIT, "LISTEN on the added shard")
        sharded.shard(1).execute("NOTIFY runrelay_test")
        assert listener.wait(WAIT, stop)
        current.remove(urls[0])
        wait_for(lambda: settled(0, False), WAIT, "no LISTEN on the removed shard")
        assert listener.dsns == [urls[1]]
        sharded.shard(0).execute("NOTIFY runrelay_test")
        assert not listener.wait(1.0, stop)
        sharded.shard(1).execute("NOTIFY runrelay_test")
        assert listener.wait(WAIT, stop)
    finally:
        listener.close()
    wait_for(lambda: not listen_pids(sharded.shard(1), "runrelay_test"), WAIT, "UNLISTEN")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_worker_and_relay_commands_listen_on_every_shard_of_a_proxy(
    sharded: ShardedInstall, tmp_path: Path, use_async: bool
) -> None:
    """Given the proxy's URL and no --listen-database-url, the commands see a
    proxy and LISTEN on each shard of its map."""
    (tmp_path / "cli_handlers.py").write_text(
        "async def handle(job):\n    return {'handled': job.run_id}\n"
        if use_async
        else "def handle(job):\n    return {'handled': job.run_id}\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "RUNRELAY_LISTEN_URL"},
        "DATABASE_URL": sharded.proxy_url,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    out_file = tmp_path / "events.jsonl"
    worker = [sys.executable, "-m", "runrelay.cli", "worker", "cli_handlers:handle"]
    worker += ["--poll-interval", str(POLL), "--no-maintenance"]
    worker += ["--async"] if use_async else []
    relay = [sys.executable, "-m", "runrelay.cli", "relay", "--jsonl", str(out_file)]
    procs = [subprocess.Popen(cmd, env=env, cwd=REPO) for cmd in (worker, relay)]
    try:
        wait_listening(sharded, "runrelay_runs")
        wait_listening(sharded, "runrelay_ledger")
        producer = sharded.client()
        ids = run_ids_on(sharded, 0, 1, "a") + run_ids_on(sharded, 1, 1, "b")
        for run_id in ids:
            producer.enqueue_run(run_id)

        def completed() -> bool:
            rows = sharded.everywhere("SELECT run_id FROM runrelay.runs WHERE status = 'completed'")
            return sorted(r[0] for r in rows) == sorted(ids)

        wait_for(completed, WAIT, "runs on both shards, on their NOTIFY")

        def relayed() -> bool:
            lines = out_file.read_text().splitlines() if out_file.exists() else []
            return {json.loads(line)["run_id"] for line in lines} == set(ids)

        wait_for(relayed, WAIT, "both runs' events relayed")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in procs]
    assert codes == [0, 0]
