"""`python -m bench.shipped [--processes 4] [--window 6] [--reps 3] [--quick]`

Shipped loops: each system's own worker, as its documentation starts it,
with its defaults, against the same backlog of no-op jobs on one fresh
durable server. Where the main table runs each library's SQL through one
harness (the database work per job), this measures what a user gets: the
library's loop with its threads or event loop, its connection handling, its
logging and its defaults.

* runrelay: `Worker(Client(ConnectionPool(url, kwargs={"autocommit": True})),
  handler)` (docs/python-client.md), a no-op handler.
* PgQueuer: `QueueManager(Queries(PsycopgDriver(connection)))`, a no-op async
  entrypoint, `run()` with its defaults (batches of 10).
* Procrastinate: `App(connector=PsycopgConnector(...))`, a no-op async task,
  `run_worker_async()` with its defaults (concurrency 1).

Each system runs `processes` worker processes. They start, report ready,
and run until SIGTERM; the window opens a second after the last is ready
and closes `window` seconds later. Throughput is the change in the jobs the
database holds as done across the window, counted from outside (runrelay:
completed runs; PgQueuer: jobs gone from its queue table; Procrastinate:
succeeded jobs), so no library reports its own figure. Systems take turns
repetition by repetition, so drift on a shared machine hits each alike. The
peers come from bench/.venv-peers (bench.peers); without it they are
reported as skipped. `make bench` runs it after the main table;
bench/notes.md records it.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import _server, peers
from bench import runrelay as rr
from bench.run import log

REPO = Path(__file__).resolve().parents[1]

RUNRELAY = """
import json, os, sys
from psycopg_pool import ConnectionPool
from runrelay import Client
from runrelay.worker import Worker

client = Client(ConnectionPool(sys.argv[1], kwargs={"autocommit": True}))
worker = Worker(client, lambda job: None, **json.loads(os.environ.get("RUNRELAY_WORKER", "{}")))
worker.install_signal_handlers()
print("ready", flush=True)
worker.run()
"""

PGQUEUER = """
import asyncio, signal, sys
import psycopg
from pgqueuer import PsycopgDriver, QueueManager
from pgqueuer.queries import Queries

async def main():
    connection = await psycopg.AsyncConnection.connect(sys.argv[1], autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(connection)))

    @qm.entrypoint("noop")
    async def noop(job):
        pass

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    print("ready", flush=True)
    await qm.run()

asyncio.run(main())
"""

PROCRASTINATE = """
import asyncio, sys
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=sys.argv[1]))

@app.task(name="noop")
async def noop(n):
    pass

async def main():
    async with app.open_async():
        print("ready", flush=True)
        await app.run_worker_async()

asyncio.run(main())
"""


@dataclass
class System:
    name: str
    python: str
    code: str
    url: str
    load: Callable[[], None]
    done: str  # SQL: how many jobs the database holds as done


def _count(url: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def measure(system: System, processes: int, window: float, backlog: int) -> float:
    """Jobs per second done by `processes` worker processes of `system`."""
    system.load()
    env = {**os.environ, "PYTHONPATH": str(REPO / "python_client")}
    procs = [
        subprocess.Popen(
            [system.python, "-c", system.code, system.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        for _ in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                p.kill()
                raise RuntimeError(f"{system.name} worker did not start: {p.stderr.read()[-800:]}")  # type: ignore[union-attr]
        time.sleep(1.0)
        before, started = _count(system.url, system.done), time.perf_counter()
        time.sleep(window)
        after, stopped = _count(system.url, system.done), time.perf_counter()
        if after >= backlog:
            raise RuntimeError(
                f"{system.name} ran out of work inside the window: raise --backlog above {backlog}"
            )
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return (after - before) / (stopped - started)


def systems(
    server: _server.Server, backlog: int, install: bool
) -> tuple[list[System], dict[str, str]]:
    out: list[System] = []
    skipped: dict[str, str] = {}
    url = server.create_database("shipped_runrelay")
    _server.migrate(url)
    out.append(
        System(
            "runrelay Worker",
            sys.executable,
            RUNRELAY,
            url,
            rr.runs_loader(url, backlog),
            "SELECT count(*) FROM runrelay.runs WHERE status = 'completed'",
        )
    )
    try:
        python = str(peers.ensure_venv(install))
        sql = peers.extract(Path(python))
    except peers.Skipped as why:
        skipped["PgQueuer QueueManager"] = skipped["Procrastinate worker"] = str(why)
        return out, skipped
    url = server.create_database("shipped_pgqueuer")
    peers.pgqueuer_setup(url, sql["pgqueuer"])
    out.append(
        System(
            "PgQueuer QueueManager",
            python,
            PGQUEUER,
            url,
            peers.pgqueuer_loader(url, backlog),
            f"SELECT {backlog} - count(*) FROM pgqueuer",
        )
    )
    url = server.create_database("shipped_procrastinate")
    peers.procrastinate_setup(url, sql["procrastinate"])
    out.append(
        System(
            "Procrastinate worker",
            python,
            PROCRASTINATE,
            url,
            peers.procrastinate_loader(url, backlog),
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        )
    )
    return out, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shipped", description=__doc__)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--window", type=float, default=6.0, help="seconds per measurement")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=150_000)
    parser.add_argument("--quick", action="store_true", help="one short repetition, no install")
    parser.add_argument("--dsn", help="use this server instead of a fresh durable cluster")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.window, args.backlog = 1, 1.5, 30_000
    server = _server.start(args.dsn)
    try:
        cases, skipped = systems(server, args.backlog, install=not args.quick)
        results: dict[str, list[float]] = {c.name: [] for c in cases}
        for rep in range(args.reps):
            for case in cases:
                rate = measure(case, args.processes, args.window, args.backlog)
                results[case.name].append(rate)
                log(f"shipped: {case.name} rep {rep + 1}: {rate:,.0f} jobs/s")
    finally:
        server.stop()
    base = statistics.median(results["runrelay Worker"])
    print(f"\nShipped loops, {args.processes} processes each, defaults, medians of {args.reps}:\n")
    print("| loop | jobs/s (min-max) | runrelay ÷ it |")
    print("|---|---|---|")
    for name, rates in results.items():
        median = statistics.median(rates)
        ratio = "" if name == "runrelay Worker" else f"{base / median:.2f}x"
        print(f"| {name} | {median:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | {ratio} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
