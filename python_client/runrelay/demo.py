"""`runrelay demo`: the whole system on one machine, checked end to end.

A producer enqueues runs of eight kinds over four queues; workers run them
(complete, fail then succeed, fail for good, sleep, wait for a signal, get
cancelled mid-flight, hand off to a detached runner, and durable runs of
three steps with an event wait in the middle, run by a worker process the
demo SIGKILLs mid-flight and finished by the next attempt without redoing a
recorded step); relays deliver both ledger
lanes to a local HTTP receiver that injects 5xx errors and slow replies, dedupes
by delivery key and checks every run's per-lane order. The summary shows final
statuses, deliveries, and the two numbers that must be zero: ordering
violations and lost events. The command exits non-zero if an invariant broke,
or if the work did not finish by the deadline (--deadline; by default it grows
with --runs): then the runs still live and the events not delivered yet are
reported as unfinished and pending, never as broken.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .client import Client
from .contract import TERMINAL_STATUSES
from .relay import Relay
from .sharding import shard_listen_dsns
from .sinks import WebhookSink
from .tasks import Tasks
from .worker import Job, Retry, Suspend, Worker

KINDS = {  # kind: (share, expected final status)
    "ok": (0.62, "completed"),
    "flaky": (0.08, "completed"),
    "doomed": (0.04, "failed"),
    "sleeper": (0.07, "completed"),
    "waiter": (0.07, "completed"),
    "cancelled": (0.05, "cancelled"),
    "detached": (0.07, "completed"),
    "durable": (0.06, "completed"),
}
QUEUES = ("email", "billing", "reports")

# The eighth kind: a durable run (runrelay.durable). Its task runs in a
# worker process of its own (`runrelay worker runrelay.demo:durable_tasks`),
# which the demo SIGKILLs once it is mid-flight; in-process workers of the
# same task finish what it held, from the steps it recorded.
DURABLE_QUEUE = "orders"
DURABLE_TASK = "demo.order"
DURABLE_STEPS = ("reserve", "approval", "charge", "ship")
durable_tasks = Tasks()


def _step_work(step: str, n: int, seconds: float) -> dict[str, Any]:
    time.sleep(seconds)  # the kill lands in or between these
    return {"step": step, "n": n}


@durable_tasks.task(DURABLE_TASK, queue=DURABLE_QUEUE, max_attempts=5)
def demo_order(job: Job, *, n: int) -> dict[str, Any]:
    job.step("reserve", _step_work, "reserve", n, 0.05)
    approval = job.wait_for_event("approval", event="approval", timeout=60)
    job.step("charge", _step_work, "charge", n, 0.3)
    job.step("ship", _step_work, "ship", n, 0.05)
    return {"kind": "durable", "approval": approval}


# -- the receiver -------------------------------------------------------------
@dataclass
class Receiver:
    """A webhook consumer: dedupes by delivery key, checks per-run lane order."""

    fail_rate: float = 0.03
    reply_lost_rate: float = 0.02  # processed, but the reply fails: a redelivery follows
    slow_rate: float = 0.002
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: set[str] = field(default_factory=set)
    last_seq: dict[tuple[str, str], int] = field(default_factory=dict)
    order: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    unique: int = 0
    duplicates: int = 0
    violations: int = 0
    injected_errors: int = 0
    lost_replies: int = 0
    slow_replies: int = 0

    def accept(self, body: dict[str, Any]) -> int:
        rng = random.random()
        if rng < self.fail_rate:
            with self.lock:
                self.injected_errors += 1
            return 503
        if rng > 1 - self.slow_rate:
            with self.lock:
                self.slow_replies += 1
            time.sleep(random.uniform(1.0, 3.0))  # past half the 5 s lease: renewals
        lane = body["lane"]
        with self.lock:
            for event in body["events"]:
                key = event["delivery_key"]
                if key in self.seen:
                    self.duplicates += 1
                    continue
                stream = (event["run_id"], lane)
                if self.last_seq.get(stream, 0) >= event["seq"]:
                    self.violations += 1
                self.last_seq[stream] = event["seq"]
                self.order[stream].append(event["seq"])
                self.seen.add(key)
                self.unique += 1
            if rng < self.fail_rate + self.reply_lost_rate:
                self.lost_replies += 1
                return 500
        return 200


@contextmanager
def serve(receiver: Receiver) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            status = receiver.accept(json.loads(self.rfile.read(length)))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks"
    finally:
        server.shutdown()
        server.server_close()


# -- latency ------------------------------------------------------------------
class Latencies:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: dict[str, list[float]] = defaultdict(list)

    def __call__(self, function: str, seconds: float) -> None:
        with self.lock:
            self.samples[function].append(seconds)

    def table(self) -> list[tuple[str, int, float, float]]:
        rows = []
        for function, values in sorted(self.samples.items()):
            ordered = sorted(values)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            rows.append((function, len(values), statistics.median(ordered) * 1000, p99 * 1000))
        return rows


# -- the databases ---------------------------------------------------------------
class Admin:
    """The demo's own reads and settings on every database that holds runs:
    the one install, or each shard of a sharded one (the proxy has no tables)."""

    def __init__(self, conns: Sequence[psycopg.Connection[Any]], sharded: bool) -> None:
        self.conns = list(conns)
        self.sharded = sharded

    def execute(self, query: str, params: Any = None) -> None:
        for conn in self.conns:
            conn.execute(query, params)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """The query's rows on every database, concatenated."""
        out: list[tuple[Any, ...]] = []
        for conn in self.conns:
            out += conn.execute(query, params).fetchall()
        return out

    def total(self, query: str) -> int:
        """The sum over the databases of a query's single number."""
        return sum(int(row[0] or 0) for row in self.rows(query))

    def counts(self, query: str) -> Counter[Any]:
        """(key, count) rows summed by key over the databases."""
        out: Counter[Any] = Counter()
        for key, count in self.rows(query):
            out[key] += int(count)
        return out


# -- the scenario ---------------------------------------------------------------
def default_deadline(runs: int) -> float:
    """Seconds the demo waits for `runs` runs to finish and their events to be
    delivered: two minutes, plus 25 ms a run (245 s for the default 5000), so
    a bigger demo on a busy machine is not cut short by a fixed limit."""
    return 120.0 + 0.025 * runs


class Scenario:
    def __init__(
        self,
        url: str,
        runs: int,
        workers: int,
        relays: int,
        seed: int,
        listen: Any,  # a DSN, or a callable giving every shard's
    ) -> None:
        self.url = url
        self.listen = listen
        self.runs = runs
        self.workers = workers
        self.relays = relays
        self.rng = random.Random(seed)
        self.latencies = Latencies()
        self.detached: queue.Queue[Job] = queue.Queue()
        self.stop = threading.Event()
        self.expected: dict[str, str] = {}
        self.kinds: dict[str, str] = {}
        self.deadline = default_deadline(runs)
        # The durable kind's chaos: the durable runs mid-flight when their
        # worker process was SIGKILLed, and the in-process workers that
        # took over.
        self.killed_mid_flight = 0
        self.durable_workers: list[Worker] = []

    def client(self, size: int) -> Client:
        pool = ConnectionPool(
            self.url, min_size=1, max_size=size, kwargs={"autocommit": True}, open=True
        )
        return Client(pool, on_call=self.latencies)

    # handlers run in worker threads
    def handle(self, job: Job) -> Any:
        kind = job.payload["kind"]
        if kind == "flaky" and job.attempt.attempt == 1:
            raise Retry("flaky dependency", after=0.2)
        if kind == "doomed":
            raise RuntimeError("this run can never succeed")
        if kind == "sleeper" and job.resume is None:
            raise Suspend.sleep(0.5)
        if kind == "waiter" and job.resume is None:
            raise Suspend.event("approval", timeout=60)
        if kind == "cancelled":
            deadline = time.monotonic() + 20
            while not job.cancelled.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
            return {"gave_up": True}
        if kind == "detached" and job.resume is None:
            self.detached.put(job)
            raise Suspend.detached("external-runner", timeout=60)
        return {"kind": kind, "attempt": job.attempt.attempt}

    def produce(self, client: Client) -> None:
        names = list(KINDS)
        weights = [KINDS[k][0] for k in names]
        pending_signals: list[tuple[float, str]] = []
        pending_cancels: list[tuple[float, str]] = []
        for i in range(self.runs):
            kind = self.rng.choices(names, weights)[0]
            run_id = f"demo-{i:05d}-{kind}"
            self.kinds[run_id] = kind
            self.expected[run_id] = KINDS[kind][1]
            if kind == "durable":
                client.enqueue_run(
                    run_id, queue=DURABLE_QUEUE, payload={"n": i}, max_attempts=5, task=DURABLE_TASK
                )
            else:
                client.enqueue_run(
                    run_id,
                    queue=QUEUES[i % len(QUEUES)],
                    payload={"kind": kind, "n": i},
                    max_attempts=2 if kind == "doomed" else 3,
                )
            client.append_events(
                run_id, [{"type": "demo.progress", "lane": "observability", "payload": {"n": i}}]
            )
            now = time.monotonic()
            if kind in ("waiter", "durable"):
                pending_signals.append((now + self.rng.uniform(0.2, 1.5), run_id))
            if kind == "cancelled":
                pending_cancels.append((now + self.rng.uniform(0.3, 1.0), run_id))
            self._due(client, pending_signals, pending_cancels, now)
        while (pending_signals or pending_cancels) and not self.stop.is_set():
            self._due(client, pending_signals, pending_cancels, time.monotonic())
            time.sleep(0.05)

    def _due(
        self,
        client: Client,
        signals: list[tuple[float, str]],
        cancels: list[tuple[float, str]],
        now: float,
    ) -> None:
        while signals and signals[0][0] <= now:
            _, run_id = signals.pop(0)
            client.signal_run(run_id, "approval", {"approved_by": "demo"})
        while cancels and cancels[0][0] <= now:
            _, run_id = cancels.pop(0)
            client.cancel_run(run_id, "the demo changed its mind")

    def detached_runner(self, client: Client) -> None:
        """Plays the external system: pushes a terminal, then the owner claims
        it back and writes the run's outcome."""
        while not self.stop.is_set():
            try:
                job = self.detached.get(timeout=0.2)
            except queue.Empty:
                continue
            run_id, attempt = job.run_id, job.attempt.attempt
            result = {"answer": 42, "runner": "external"}
            for _ in range(200):
                outcome = client.record_runner_terminal(run_id, attempt, result)
                if outcome != "not_found":  # not suspended yet: try again
                    break
                time.sleep(0.02)
            if client.claim_detached_terminal(**job.attempt.fence):
                terminal = client.read_runner_terminal(run_id, attempt)
                # None only if the attempt vanished after the claim; its lease
                # then lapses and the reaper settles it.
                if terminal is not None:
                    client.complete_attempt(**job.attempt.fence, result=terminal.result)

    def durable_chaos(self, admin: Admin) -> None:
        """Start the durable task's worker process, SIGKILL it once a
        durable run it holds is past its event wait (or after 30 s), then
        run the task in process: the reaper hands the killed worker's runs
        back when their leases lapse, and the next attempts skip the steps
        it recorded."""
        script = "import sys; from runrelay.cli import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.Popen(
            [sys.executable, "-c", script, "--database-url", self.url, "worker",
             "runrelay.demo:durable_tasks", "--lease-seconds", "5", "--poll-interval", "0.1",
             "--concurrency", "8"],
            env={**os.environ, "RUNRELAY_SCHEMA": "runrelay"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            give_up = time.monotonic() + 30
            while not self.stop.is_set() and time.monotonic() < give_up:
                self.killed_mid_flight = admin.total(MID_FLIGHT)
                if self.killed_mid_flight:
                    break
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        if self.stop.is_set():
            return
        worker = Worker(
            self.client(4),
            durable_tasks,
            concurrency=8,
            name="worker-durable",
            lease_seconds=10,
            heartbeat_every=0.5,
            poll_interval=0.1,
            listen_dsn=self.listen,
        )
        self.durable_workers.append(worker)
        if not self.stop.is_set():
            worker.run()

    def reaper(self, client: Client) -> None:
        while not self.stop.wait(1.0):
            client.reap_expired()


def run(
    database_url: str,
    runs: int = 5000,
    workers: int = 4,
    relays: int = 2,
    seed: int = 7,
    console: Console | None = None,
    reset: bool = False,
    shard_urls: Sequence[str] = (),
    deadline: float | None = None,
) -> int:
    """The demo against `database_url`: one install, or a sharded install's
    proxy when `shard_urls` (its shards, in order) are given. Producers,
    workers and relays call the proxy; the demo's own counts read each shard.
    `deadline`: seconds the runs may take to finish and their events to be
    delivered (default_deadline(runs) when None)."""
    console = console or Console()
    # LISTEN works per database, and NOTIFY happens on the shard that wrote,
    # so through a proxy the loops listen on every shard of its map.
    listen: Any = shard_listen_dsns(database_url) if shard_urls else database_url
    scenario = Scenario(database_url, runs, workers, relays, seed, listen)
    scenario.deadline = default_deadline(runs) if deadline is None else deadline
    receiver = Receiver()
    with contextlib.ExitStack() as stack:
        admin = Admin(
            [
                stack.enter_context(psycopg.connect(url, autocommit=True))
                for url in (shard_urls or [database_url])
            ],
            sharded=bool(shard_urls),
        )
        # Demo-sized backoff for the receiver's injected faults (restored below).
        saved = admin.rows("SELECT retry_base_seconds, retry_max_seconds FROM runrelay.settings")[0]
        if admin.total("SELECT count(*) FROM (SELECT 1 FROM runrelay.runs LIMIT 1) AS r"):
            if not reset:
                console.print(
                    "[red]runrelay demo needs an empty runrelay schema[/red] (it counts every "
                    "run and event). Use a fresh database, or pass --reset to delete ALL runs."
                )
                return 2
            admin.execute(
                "TRUNCATE runrelay.ledger_lanes, runrelay.ledger_events, runrelay.signals,"
                " runrelay.cancellations, runrelay.attempts, runrelay.steps, runrelay.runs"
            )
        admin.execute(
            "UPDATE runrelay.settings SET retry_base_seconds = 0.1, retry_max_seconds = 1"
        )
        started = time.monotonic()
        try:
            result = _scenario(console, admin, scenario, receiver, started)
        finally:
            admin.execute(
                "UPDATE runrelay.settings SET retry_base_seconds = %s, retry_max_seconds = %s",
                saved,
            )
        return result


def _per_shard(console: Console, admin: Admin) -> None:
    """Where the runs went: each shard's own run_stats."""
    for shard, conn in enumerate(admin.conns):
        counts = {
            str(status): int(runs)
            for status, runs in conn.execute(
                "SELECT status, sum(runs) FROM runrelay.run_stats GROUP BY status"
            ).fetchall()
        }
        detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        console.print(
            f"shard {shard}: {sum(counts.values())} runs ({detail or 'none'})",
            highlight=False,
            soft_wrap=True,
        )


def _scenario(
    console: Console,
    admin: Admin,
    scenario: Scenario,
    receiver: Receiver,
    started: float,
) -> int:
    """Start the receiver, workers, relays, runner and producer; wait; report."""
    with serve(receiver) as hook:
        workers = [
            Worker(
                scenario.client(10),
                scenario.handle,
                concurrency=8,
                name=f"worker-{n}",
                lease_seconds=10,
                heartbeat_every=0.5,
                poll_interval=0.1,
                listen_dsn=scenario.listen,
                queues=list(QUEUES),
            )
            for n in range(scenario.workers)
        ]
        relays = [
            Relay(
                scenario.client(4),
                WebhookSink(hook, timeout=10),
                name=f"relay-{n}",
                batch_size=100,
                lease_seconds=5,
                listen_dsn=scenario.listen,
                max_sleep=0.2,
            )
            for n in range(scenario.relays)
        ]
        helper = scenario.client(4)
        targets: list[Callable[[], None]] = [w.run for w in workers]
        targets += [r.run for r in relays]
        targets += [lambda: scenario.detached_runner(helper), lambda: scenario.reaper(helper)]
        targets += [lambda: scenario.durable_chaos(admin)]
        threads = [threading.Thread(target=target, daemon=True) for target in targets]
        for thread in threads:
            thread.start()
        producer = threading.Thread(
            target=scenario.produce, args=(scenario.client(2),), daemon=True
        )
        producer.start()
        _progress(console, admin, receiver, scenario.runs, producer, scenario.deadline)
        scenario.stop.set()
        for worker in [*workers, *scenario.durable_workers]:
            worker.stop()
        for relay in relays:
            relay.stop()
        for thread in threads:
            thread.join(timeout=15)
    elapsed = time.monotonic() - started
    return _summary(console, admin, scenario, receiver, workers, relays, elapsed)


# A durable run held by a worker past its event wait: the moment to kill it.
MID_FLIGHT = f"""
    SELECT count(*) FROM runrelay.runs AS r
    WHERE r.task = '{DURABLE_TASK}' AND r.status = 'running'
      AND EXISTS (SELECT FROM runrelay.steps AS s WHERE s.run_id = r.run_id AND s.step = 'approval')
"""
# Each durable run: its steps in the order recorded, its step.recorded
# events, and whether the reaper ended one of its attempts (a killed worker's).
DURABLE = f"""
    SELECT r.run_id,
           ARRAY(SELECT s.step FROM runrelay.steps AS s
                 WHERE s.run_id = r.run_id ORDER BY s.position),
           (SELECT count(*) FROM runrelay.ledger_events AS e
            WHERE e.run_id = r.run_id AND e.type = 'step.recorded'),
           EXISTS (SELECT FROM runrelay.attempts AS a
                   WHERE a.run_id = r.run_id AND a.status = 'lost')
    FROM runrelay.runs AS r
    WHERE r.task = '{DURABLE_TASK}' AND r.status = 'completed'
"""

# Ledger events a relay still has to deliver: every event not delivered,
# except a transport-only one that ends its lane (nothing follows to
# acknowledge it). The test suites wait on the same query.
UNDELIVERED = """
    SELECT count(*) FROM runrelay.ledger AS l
    WHERE l.state <> 'delivered'
      AND NOT (l.transport_only AND NOT EXISTS (
          SELECT 1 FROM runrelay.ledger AS n
          WHERE n.run_id = l.run_id AND n.lane = l.lane AND n.seq > l.seq))
"""


def _progress(
    console: Console,
    admin: Admin,
    receiver: Receiver,
    runs: int,
    producer: threading.Thread,
    deadline_seconds: float,
) -> bool:
    """Show progress until every run ended and every event was delivered
    (True), or the deadline passed (False)."""
    columns = (
        TextColumn("{task.description:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    deadline = time.monotonic() + deadline_seconds
    with Progress(*columns, console=console, transient=False) as progress:
        t_enq = progress.add_task("runs enqueued", total=runs)
        t_done = progress.add_task("runs finished", total=runs)
        t_events = progress.add_task("events delivered", total=None)
        while time.monotonic() < deadline:
            rows = admin.rows(
                "SELECT count(*), count(*) FILTER (WHERE finished_at IS NOT NULL)"
                " FROM runrelay.runs"
            )
            enqueued, finished = (sum(int(r[i]) for r in rows) for i in (0, 1))
            undelivered = admin.total(UNDELIVERED)
            progress.update(t_enq, completed=enqueued)
            progress.update(t_done, completed=finished)
            progress.update(
                t_events, completed=receiver.unique, total=receiver.unique + undelivered
            )
            if not producer.is_alive() and finished == runs and undelivered == 0:
                return True
            time.sleep(0.25)
    return False


@dataclass
class Verdict:
    """What the demo's end state says. A run still live or an event not
    delivered yet when the deadline passed is unfinished work (`unfinished`,
    `pending`), never a broken invariant; the invariants are `wrong` (a run
    ended in another status than its kind's), `lost` (an event the database
    records as delivered that the receiver never got) and `violations` (a
    run's lane received out of order, or acknowledged past an event still
    undelivered)."""

    unfinished: int
    pending: int
    wrong: Counter[str]
    lost: int
    violations: int
    # Completed durable runs whose steps are not each recorded once, in
    # order, with one step.recorded event each; and those a reaped
    # attempt (the killed worker's) handed on.
    durable_bad: int = 0
    durable_taken_over: int = 0

    @property
    def finished(self) -> bool:
        return self.unfinished == 0 and self.pending == 0

    @property
    def broken(self) -> list[str]:
        """The broken invariants, one phrase each (empty: none)."""
        out = []
        if self.wrong:
            out.append(f"unexpected final states by kind: {dict(self.wrong)}")
        if self.violations:
            out.append(f"{self.violations} ordering violations")
        if self.lost:
            out.append(f"{self.lost} lost events")
        if self.durable_bad:
            out.append(f"{self.durable_bad} durable runs without each step recorded once")
        return out

    def unfinished_text(self, deadline: float) -> str:
        return (
            f"did not finish within {deadline:g} s: {self.unfinished} runs unfinished, "
            f"{self.pending} events pending (not delivered yet); try a longer --deadline"
        )


# Every event of the runs, with what the check needs; a stream is one run's lane.
EVENTS = """
    SELECT run_id, lane, seq, delivery_key, state = 'delivered', acked_locally
    FROM runrelay.ledger ORDER BY run_id, lane, seq
"""


def check(
    admin: Admin, expected: dict[str, str], kinds: dict[str, str], runs: int, receiver: Receiver
) -> Verdict:
    """Judge the databases' state against what the receiver got: `expected`
    is each enqueued run's expected final status, `runs` how many the
    scenario meant to enqueue (those never enqueued are unfinished)."""
    final = dict(admin.rows("SELECT run_id, status FROM runrelay.runs"))
    ended = {
        run_id: final.get(run_id) for run_id in expected if final.get(run_id) in TERMINAL_STATUSES
    }
    wrong = Counter(kinds[run_id] for run_id, status in ended.items() if status != expected[run_id])
    delivered: dict[tuple[str, str], list[int]] = defaultdict(list)
    undelivered: dict[tuple[str, str], set[int]] = defaultdict(set)
    lost = 0
    # Each run's events live on one database, so its order survives the
    # concatenation.
    for run_id, lane, seq, key, is_delivered, acked_locally in admin.rows(EVENTS):
        if not is_delivered:
            undelivered[(run_id, lane)].add(seq)
        elif not acked_locally:  # transport-only events acked locally are never sent
            delivered[(run_id, lane)].append(seq)
            lost += key not in receiver.seen
    violations = receiver.violations  # received out of order, counted as they came
    for stream, received in receiver.order.items():
        done = set(delivered.get(stream, ()))
        highest = max(done, default=0)
        for seq in received:
            if seq in done:
                continue
            # Received but not acknowledged (yet): in flight when the loops
            # stopped, unless a later event of its lane was acknowledged.
            if seq not in undelivered.get(stream, ()) or seq < highest:
                violations += 1
    durable = admin.rows(DURABLE)
    return Verdict(
        unfinished=runs - len(ended),
        pending=admin.total(UNDELIVERED),
        wrong=wrong,
        lost=lost,
        violations=violations,
        durable_bad=sum(
            1 for _, steps, events, _ in durable if tuple(steps) != DURABLE_STEPS or events != 4
        ),
        durable_taken_over=sum(1 for *_, reaped in durable if reaped),
    )


def _summary(
    console: Console,
    admin: Admin,
    scenario: Scenario,
    receiver: Receiver,
    workers: list[Worker],
    relays: list[Relay],
    elapsed: float,
) -> int:
    statuses = admin.counts("SELECT status, count(*) FROM runrelay.runs GROUP BY 1")
    verdict = check(admin, scenario.expected, scenario.kinds, scenario.runs, receiver)
    local_acks = admin.total("SELECT count(*) FROM runrelay.ledger WHERE acked_locally")

    table = Table(title="runrelay demo", show_lines=False)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for status in ("completed", "failed", "cancelled", "queued", "running", "waiting"):
        if statuses.get(status):
            table.add_row(f"runs {status}", str(statuses[status]))
    if verdict.unfinished:
        table.add_row("runs not finished by the deadline", str(verdict.unfinished))
    table.add_row("runs ended in another state than expected", str(sum(verdict.wrong.values())))
    table.add_row("events delivered (unique)", str(receiver.unique))
    table.add_row("redeliveries deduplicated", str(receiver.duplicates))
    table.add_row("transport-only events acked locally", str(local_acks))
    table.add_row(
        "receiver 5xx injected / replies lost / slow replies",
        f"{receiver.injected_errors} / {receiver.lost_replies} / {receiver.slow_replies}",
    )
    table.add_row(
        "lease renewals (slow deliveries)", str(sum(r.stats.get("renewals", 0) for r in relays))
    )
    if verdict.pending:
        table.add_row("events pending (not delivered yet)", str(verdict.pending))
    if scenario.killed_mid_flight:
        table.add_row(
            "durable runs mid-flight when their worker was SIGKILLed / finished after",
            f"{scenario.killed_mid_flight} / {verdict.durable_taken_over}",
        )
    table.add_row(
        "[bold]durable runs without each step recorded once[/bold]",
        f"[bold]{verdict.durable_bad}[/bold]",
    )
    table.add_row("[bold]ordering violations[/bold]", f"[bold]{verdict.violations}[/bold]")
    table.add_row("[bold]lost events[/bold]", f"[bold]{verdict.lost}[/bold]")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    table.add_row(
        "throughput",
        f"{scenario.runs / elapsed:.0f} runs/s, {receiver.unique / elapsed:.0f} events/s",
    )
    console.print(table)

    lat = Table(title="latency per operation (client side)")
    for column in ("operation", "calls", "p50 ms", "p99 ms"):
        lat.add_column(column, justify="right" if column != "operation" else "left")
    for function, calls, p50, p99 in scenario.latencies.table():
        lat.add_row(function, str(calls), f"{p50:.2f}", f"{p99:.2f}")
    console.print(lat)
    if admin.sharded:
        _per_shard(console, admin)

    problems = verdict.broken
    for worker in workers:
        if worker.stats.get("write_errors"):
            problems.append(f"{worker.name}: {worker.stats['write_errors']} write errors")
    if problems:
        console.print("[bold red]FAILED:[/bold red] " + "; ".join(problems))
        return 1
    if not verdict.finished:
        console.print(
            "[bold yellow]DID NOT FINISH[/bold yellow] (no invariant broke so far): "
            + verdict.unfinished_text(scenario.deadline)
        )
        return 1
    console.print(
        "[bold green]OK[/bold green]: every run ended as expected; "
        "0 ordering violations, 0 lost events."
    )
    return 0
