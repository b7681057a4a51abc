"""`python -m bench.shipped [--processes 4] [--window 6] [--reps 3] [--quick]`

Shipped loops: each system's own worker, as its documentation starts it,
with its defaults, against the same backlog of no-op jobs on one fresh
durable server. Where the main table runs each library's SQL through one
harness (the database work per job), this measures what a user gets: the
library's loop with its threads or event loop, its connection handling, its
logging and its defaults.

* runrelay: `Worker(Client(ConnectionPool(url, kwargs={"autocommit": True})),
  handler)` (docs/python-client.md), a no-op handler.
* runrelay TypeScript: `new Worker(new Client(new pg.Pool(...)), handler)`
  (docs/typescript-client.md), a no-op handler, on Node (skipped without
  `node`; its npm packages come from the package's lock file).
* PgQueuer: `QueueManager(Queries(PsycopgDriver(connection)))`, a no-op async
  entrypoint, `run()` with its defaults (batches of 10).
* Procrastinate: `App(connector=PsycopgConnector(...))`, a no-op async task,
  `run_worker_async()` with its defaults (concurrency 1).

And the relays: one runrelay `Relay` as docs/python-client.md starts it
(`Relay(client, sink, listen_dsn=url)`, every other option its default: 16
lanes in flight, batches of 100, 8 runs per claim; its client's pool of 18
connections, as the Relay's docs ask), a no-op sink, over runs' lanes of
100 events and again over lanes of three (what a run's lifecycle lane
usually holds); the TypeScript `Relay` the same way (docs/typescript-client.md,
skipped without `node`); against one PgQ consumer
written as PgQ's own consumer loop runs (next_batch, get_batch_events,
finish_batch and a commit per batch; a second's sleep when no batch is
ready), each over enough pending events to last the window, in batches of
100.

Each system runs `processes` worker processes (a relay, one process). They start, report ready,
and run until SIGTERM; the window opens a second after the last is ready
and closes `window` seconds later. Throughput is the change in the jobs the
database holds as done across the window, counted from outside (runrelay:
completed runs; PgQueuer: jobs gone from its queue table; Procrastinate:
succeeded jobs; relays: events delivered, or for PgQ the consumer's
position), so no library reports its own figure. Systems take turns
repetition by repetition, so drift on a shared machine hits each alike. The
peers come from bench/.venv-peers (bench.peers); without it they are
reported as skipped. `make bench` runs it after the main table;
bench/notes.md records it.
"""

from __future__ import annotations

import argparse
import os
import shutil
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


RELAY = """
import sys
from psycopg_pool import ConnectionPool
from runrelay import Client
from runrelay.relay import Relay

# Sized as the Relay's docs ask: its delivery slots (16) and two more.
client = Client(ConnectionPool(sys.argv[1], max_size=18, kwargs={"autocommit": True}))
relay = Relay(client, lambda relay_name, events: None, listen_dsn=sys.argv[1])
relay.install_signal_handlers()
print("ready", flush=True)
relay.run()
"""

# PgQ's consumer loop (as pgq's Python Consumer runs it): one transaction per
# batch, finished with the batch; a pause of loop_delay (1 s) when none is ready.
PGQ_CONSUMER = f"""
import signal, sys, time
import psycopg

stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
conn = psycopg.connect(sys.argv[1])
print("ready", flush=True)
while not stopping:
    batch = conn.execute("SELECT pgq.next_batch('{peers.PGQ_QUEUE}', 'c1')").fetchone()[0]
    if batch is None:
        conn.commit()
        time.sleep(1.0)
        continue
    events = conn.execute("SELECT ev_id, ev_type, ev_data FROM pgq.get_batch_events(%s)", [batch])
    for _event in events:
        pass
    conn.execute("SELECT pgq.finish_batch(%s)", [batch])
    conn.commit()
"""

# PgQ's consumer moves several times as many events per second as a Relay:
# it is loaded with this many times the Relay's events.
PGQ_FACTOR = 5

# Runs loaded for the Relays over lanes of three events (150 000 events).
SHORT_RUNS = 50_000

# Where PgQ's consumer c1 stands: the queue's event count at its last tick.
PGQ_DONE = f"""
SELECT t.tick_event_seq
FROM pgq.subscription AS s
JOIN pgq.consumer AS c ON c.co_id = s.sub_consumer
JOIN pgq.queue AS q ON q.queue_id = s.sub_queue
JOIN pgq.tick AS t ON t.tick_queue = s.sub_queue AND t.tick_id = s.sub_last_tick
WHERE c.co_name = 'c1' AND q.queue_name = '{peers.PGQ_QUEUE}'
"""


@dataclass
class System:
    name: str
    python: str
    code: str
    url: str
    load: Callable[[], None]
    done: str  # SQL: how many jobs (or events) the database holds as done
    processes: int | None = None  # None: the --processes of the run
    unit: str = "jobs/s"
    loaded: int | None = None  # the work loaded, when not the group's backlog
    command: list[str] | None = None  # the program, when not `python -c code`


def _count(url: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def measure(
    system: System, processes: int, window: float, backlog: int, strict: bool = True
) -> float:
    """Jobs (or events) per second done by the worker processes of `system`.
    A system that runs out of work inside the window raises; not `strict`
    (the quick smoke test), it is logged and the figure is a lower bound."""
    processes = system.processes or processes
    backlog = system.loaded or backlog
    option = "events" if system.unit == "events/s" else "backlog"
    system.load()
    env = {**os.environ, "PYTHONPATH": str(REPO / "python_client")}
    command = system.command or [system.python, "-c", system.code]
    procs = [
        subprocess.Popen(
            [*command, system.url],
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
        if after >= backlog or after == before:
            message = (
                f"{system.name} ran out of work (or did none) inside the window:"
                f" raise --{option} above {backlog}"
            )
            if strict:
                raise RuntimeError(message)
            log(f"{message} (quick: the figure is a lower bound)")
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
    node = shutil.which("node")
    if node is None:
        skipped["runrelay TypeScript Worker"] = "no node on PATH"
    else:
        subprocess.run(["bash", str(REPO / "scripts" / "ts_install.sh")], check=True, cwd=REPO)
        url = server.create_database("shipped_runrelay_ts")
        _server.migrate(url)
        script = REPO / "clients" / "typescript" / "build" / "test" / "fixtures" / "bench-worker.js"
        out.append(
            System(
                "runrelay TypeScript Worker",
                node,
                "",
                url,
                rr.runs_loader(url, backlog),
                "SELECT count(*) FROM runrelay.runs WHERE status = 'completed'",
                command=[node, str(script)],
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


def relays(
    server: _server.Server, events: int, install: bool, quick: bool
) -> tuple[list[System], dict[str, str]]:
    """A runrelay Relay over `events` pending events (100 per run's lane) and
    a PgQ consumer over PGQ_FACTOR times as many (a tick per 100): enough for
    each to last the settling second and the window. The quick smoke test
    runs the Relay only."""
    skipped: dict[str, str] = {}
    url = server.create_database("shipped_relay")
    _server.migrate(url)
    out = [
        System(
            "runrelay Relay",
            sys.executable,
            RELAY,
            url,
            rr.ledger_loader(url, max(1, events // 100), 100),
            rr.DELIVERED_EVENTS,
            processes=1,
            unit="events/s",
        )
    ]
    if quick:
        skipped["PgQ consumer"] = "measured in full runs only"
        return out, skipped
    # A run's lifecycle lane usually holds a few events (queued, started,
    # completed): the same Relay over lanes of three.
    short = System(
        "runrelay Relay, runs of 3 events",
        sys.executable,
        RELAY,
        url,
        rr.ledger_loader(url, SHORT_RUNS, 3),
        rr.DELIVERED_EVENTS,
        processes=1,
        unit="events/s",
        loaded=SHORT_RUNS * 3,
    )
    out.append(short)
    node = shutil.which("node")
    if node is None:
        skipped["runrelay TypeScript Relay"] = "no node on PATH"
    else:
        subprocess.run(["bash", str(REPO / "scripts" / "ts_install.sh")], check=True, cwd=REPO)
        script = REPO / "clients" / "typescript" / "build" / "test" / "fixtures" / "bench-relay.js"
        for name, loader, loaded in [
            ("runrelay TypeScript Relay", rr.ledger_loader(url, max(1, events // 100), 100), None),
            ("runrelay TypeScript Relay, runs of 3 events", short.load, short.loaded),
        ]:
            out.append(
                System(
                    name,
                    node,
                    "",
                    url,
                    loader,
                    short.done,
                    processes=1,
                    unit="events/s",
                    loaded=loaded,
                    command=[node, str(script)],
                )
            )
    url = server.create_database("shipped_pgq")
    try:
        peers.ensure_pgq(url, install)
    except peers.Skipped as why:
        skipped["PgQ consumer"] = str(why)
        return out, skipped
    out.append(
        System(
            "PgQ consumer",
            sys.executable,
            PGQ_CONSUMER,
            url,
            peers.pgq_loader(url, max(1, events * PGQ_FACTOR // 100), 100),
            PGQ_DONE,
            processes=1,
            unit="events/s",
            loaded=events * PGQ_FACTOR,
        )
    )
    return out, skipped


def table(title: str, results: dict[str, list[float]], skipped: dict[str, str], unit: str) -> None:
    """The results of one group, runrelay's loop first, as a markdown table."""
    names = list(results)
    base = statistics.median(results[names[0]])
    print(f"\n{title}\n")
    print(f"| loop | {unit} (min-max) | runrelay ÷ it |")
    print("|---|---|---|")
    for name, rates in results.items():
        median = statistics.median(rates)
        ratio = "" if name == names[0] or not median else f"{base / median:.2f}x"
        print(f"| {name} | {median:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | {ratio} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} | |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shipped", description=__doc__)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--window", type=float, default=6.0, help="seconds per measurement")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=800_000, help="events for the relays")
    parser.add_argument("--quick", action="store_true", help="one short repetition, no install")
    parser.add_argument("--dsn", help="use this server instead of a fresh durable cluster")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.window, args.backlog, args.events = 1, 1.5, 30_000, 100_000
    server = _server.start(args.dsn)
    try:
        workers, skipped = systems(server, args.backlog, install=not args.quick)
        relay_loops, relays_skipped = relays(
            server, args.events, install=not args.quick, quick=args.quick
        )
        groups = [(workers, args.backlog), (relay_loops, args.events)]
        results: dict[str, list[float]] = {c.name: [] for c, _ in _cases(groups)}
        for rep in range(args.reps):
            for case, backlog in _cases(groups):
                rate = measure(case, args.processes, args.window, backlog, strict=not args.quick)
                results[case.name].append(rate)
                log(f"shipped: {case.name} rep {rep + 1}: {rate:,.0f} {case.unit}")
    finally:
        server.stop()
    table(
        f"Shipped loops, {args.processes} processes each, defaults, medians of {args.reps}:",
        {c.name: results[c.name] for c in workers},
        skipped,
        "jobs/s",
    )
    table(
        f"Relays, one process each, defaults, batches of 100, medians of {args.reps}:",
        {c.name: results[c.name] for c in relay_loops},
        relays_skipped,
        "events/s",
    )
    return 0


def _cases(groups: list[tuple[list[System], int]]) -> list[tuple[System, int]]:
    return [(case, backlog) for cases, backlog in groups for case in cases]


if __name__ == "__main__":
    sys.exit(main())
