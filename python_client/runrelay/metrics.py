"""Prometheus metrics: the exporter's view of the database, and the loops'
own counters and histograms.

Two sources, one naming scheme (every name starts with ``runrelay_``):

* **The exporter** (`runrelay exporter`, `serve`): a custom collector that,
  on each scrape and only then, reads the `run_stats`, `ledger_stats` and
  `wait_stats` views in one statement and turns their rows into gauges — runs
  by queue and status, waiting runs by wait kind, the oldest runnable run per
  queue (the most active queues only, the rest summed under queue="_other"
  so the series stay bounded however many queues exist), ledger events by
  lane and state, the delivery lag and the blocked heads per lane (the lag
  of deliverable events apart from the age of blocked heads), workers and
  relays alive or presumed dead (list_processes), plus ``runrelay_up`` and
  ``runrelay_scrape_duration_seconds``. No thread polls in the background, so
  what Prometheus sees is what the database held when it asked. A database
  that cannot be reached or read makes that scrape report ``runrelay_up 0``
  and nothing else; the next scrape tries again.
* **The loops** (`Worker(..., metrics=registry)`, `AsyncWorker`, `Relay`):
  counters and histograms of what one process did — runs claimed, outcomes
  written, handler time, heartbeats; events delivered, failed deliveries,
  lease renewals, delivery time. Loops that share a registry share its
  metrics (the counts add up), as several workers in one process should.

This module imports prometheus_client (the ``runrelay[metrics]`` extra); the
rest of the package imports it only when metrics are asked for, so a loop
without a registry neither needs the library nor pays for it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from wsgiref.simple_server import WSGIServer

import psycopg
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from psycopg import sql

from ._backoff import first_line
from .contract import WAIT_KINDS
from .types import Lane, RunStatus

log = logging.getLogger("runrelay.metrics")

DEFAULT_PORT = 9464
# Handler and delivery times range from milliseconds to minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Every state an event can read as in the `ledger` view; each is exported
# for every lane, zero when no event is in it, so a series never vanishes.
LEDGER_STATES = ("pending", "leased", "delivered", "failed", "skipped")
# list_processes's kinds and the two states a process is exported in.
PROCESS_KINDS = ("worker", "relay")
PROCESS_STATES = ("alive", "presumed_dead")
# The wait kinds (a waiting run's wait.kind); each is exported for
# every queue, zero when no run waits that way.

# The queue label that sums every queue beyond the exporter's bound.
OTHER_QUEUE = "_other"
# How many queues get their own series by default; the rest are summed
# under OTHER_QUEUE (each queue costs about a dozen series).
DEFAULT_MAX_QUEUES = 50

# The one statement of a scrape: the three views as rows of one shape. The
# run and wait rows keep the `max_queues` most active queues (most runs not
# yet finished, then most runs, then by name) and fold every other queue into
# one OTHER_QUEUE row per status or wait kind: counts summed, ages the
# oldest. So a scrape returns at most (max_queues + 1) rows per status however
# many queues exist, and the totals of every gauge are unchanged.
STATS_QUERY = """
WITH run_rows AS (
    SELECT queue, status, runs, held_by_key, oldest_runnable_age_seconds
    FROM {schema}.run_stats
),
top_queues AS (
    SELECT queue
    FROM run_rows
    GROUP BY queue
    ORDER BY sum(runs) FILTER (WHERE status IN ('queued', 'running', 'waiting')) DESC NULLS LAST,
             sum(runs) DESC, queue
    LIMIT %(max_queues)s
)
SELECT 'run' AS source, coalesce(t.queue, %(other)s) AS name, r.status AS state,
       sum(r.runs) AS count, sum(r.held_by_key) AS held,
       max(r.oldest_runnable_age_seconds) AS age, NULL::bigint AS blocked,
       NULL::double precision AS deliverable_age, NULL::double precision AS blocked_age
FROM run_rows AS r LEFT JOIN top_queues AS t ON t.queue = r.queue
GROUP BY 2, 3
UNION ALL
SELECT 'ledger', lane, state, events, NULL, oldest_pending_age_seconds, blocked_heads,
       oldest_deliverable_age_seconds, oldest_blocked_age_seconds
FROM {schema}.ledger_stats
UNION ALL
SELECT 'wait', coalesce(t.queue, %(other)s), w.kind, sum(w.runs), NULL, NULL, NULL, NULL, NULL
FROM {schema}.wait_stats AS w LEFT JOIN top_queues AS t ON t.queue = w.queue
GROUP BY 2, 3
UNION ALL
SELECT 'process', p.kind, CASE WHEN p.presumed_dead THEN 'presumed_dead' ELSE 'alive' END,
       count(*), NULL, NULL, NULL, NULL, NULL
FROM {schema}.list_processes() AS p
GROUP BY 2, 3
"""


# -- the exporter -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StatsRow:
    """One row of STATS_QUERY: a run_stats row (source 'run': queue, status),
    a ledger_stats row (source 'ledger': lane, state), a wait_stats row
    (source 'wait': queue, wait kind) or a count of list_processes (source
    'process': kind, alive or presumed_dead)."""

    source: str
    name: str
    state: str
    count: int
    held: int | None
    age: float | None
    blocked: int | None
    deliverable_age: float | None = None
    blocked_age: float | None = None


def _number(value: Decimal | float | int | None) -> float | None:
    return None if value is None else float(value)


def stats_families(rows: Iterable[StatsRow]) -> list[GaugeMetricFamily]:
    """The gauges of one scrape's rows. Every status of a queue the database
    knows and every state of every lane is present, zero when empty, and the
    ages are 0 when nothing waits: an alert on a threshold then sees a value,
    not a missing series."""
    runs: dict[tuple[str, str], int] = {}
    held: dict[str, int] = {}
    runnable_age: dict[str, float] = {}
    events: dict[tuple[str, str], int] = {}
    pending_age: dict[str, float] = {}
    blocked: dict[str, int] = {}
    deliverable_age: dict[str, float] = {}
    blocked_age: dict[str, float] = {}
    waiting: dict[tuple[str, str], int] = {}
    processes: dict[tuple[str, str], int] = {}
    for row in rows:
        if row.source == "process":
            processes[(row.name, row.state)] = row.count
        elif row.source == "wait":
            waiting[(row.name, row.state)] = row.count
        elif row.source == "run":
            runs[(row.name, row.state)] = row.count
            held[row.name] = held.get(row.name, 0) + (row.held or 0)
            age = row.age if row.age is not None else 0.0
            runnable_age[row.name] = max(runnable_age.get(row.name, 0.0), age)
        else:
            events[(row.name, row.state)] = row.count
            age = row.age if row.age is not None else 0.0
            pending_age[row.name] = max(pending_age.get(row.name, 0.0), age)
            blocked[row.name] = max(blocked.get(row.name, 0), row.blocked or 0)
            for ages, value in (
                (deliverable_age, row.deliverable_age),
                (blocked_age, row.blocked_age),
            ):
                ages[row.name] = max(ages.get(row.name, 0.0), value or 0.0)
    queues = sorted({queue for queue, _ in runs})
    lanes = sorted({lane.value for lane in Lane} | {lane for lane, _ in events})

    families = _stats_family_shells()
    by_name = {f.name: f for f in families}
    for queue in queues:
        for status in RunStatus:
            count = runs.get((queue, status.value), 0)
            by_name["runrelay_runs"].add_metric([queue, status.value], count)
        by_name["runrelay_runs_held_by_key"].add_metric([queue], held.get(queue, 0))
        by_name["runrelay_runs_oldest_runnable_age_seconds"].add_metric(
            [queue], runnable_age.get(queue, 0.0)
        )
        for kind in WAIT_KINDS:
            count = waiting.get((queue, kind), 0)
            by_name["runrelay_runs_waiting"].add_metric([queue, kind], count)
    for lane in lanes:
        for state in LEDGER_STATES:
            count = events.get((lane, state), 0)
            by_name["runrelay_ledger_events"].add_metric([lane, state], count)
        by_name["runrelay_ledger_oldest_pending_age_seconds"].add_metric(
            [lane], pending_age.get(lane, 0.0)
        )
        by_name["runrelay_ledger_blocked_heads"].add_metric([lane], blocked.get(lane, 0))
        by_name["runrelay_ledger_deliverable_age_seconds"].add_metric(
            [lane], deliverable_age.get(lane, 0.0)
        )
        by_name["runrelay_ledger_blocked_age_seconds"].add_metric(
            [lane], blocked_age.get(lane, 0.0)
        )
    for kind in PROCESS_KINDS:
        for state in PROCESS_STATES:
            by_name["runrelay_processes"].add_metric([kind, state], processes.get((kind, state), 0))
    return families


def _stats_family_shells() -> list[GaugeMetricFamily]:
    """The exporter's gauges read from the views, with their HELP, empty."""
    return [
        GaugeMetricFamily(
            "runrelay_runs",
            "Runs by queue and status (run_stats.runs).",
            labels=["queue", "status"],
        ),
        GaugeMetricFamily(
            "runrelay_runs_held_by_key",
            "Runs of a queue held behind another run of their concurrency key "
            "(run_stats.held_by_key).",
            labels=["queue"],
        ),
        GaugeMetricFamily(
            "runrelay_runs_oldest_runnable_age_seconds",
            "Seconds the oldest runnable run of a queue has been due, 0 when none is "
            "(run_stats.oldest_runnable_age_seconds): growing means too few workers.",
            labels=["queue"],
        ),
        GaugeMetricFamily(
            "runrelay_runs_waiting",
            "Waiting runs by queue and wait kind: sleep, event, detached_runner (wait_stats.runs).",
            labels=["queue", "kind"],
        ),
        GaugeMetricFamily(
            "runrelay_ledger_events",
            "Ledger events by lane and state: pending, leased, delivered, failed, skipped "
            "(ledger_stats.events).",
            labels=["lane", "state"],
        ),
        GaugeMetricFamily(
            "runrelay_ledger_oldest_pending_age_seconds",
            "Seconds since the oldest undelivered event of a lane was appended, 0 when "
            "all are delivered (ledger_stats.oldest_pending_age_seconds): the delivery lag.",
            labels=["lane"],
        ),
        GaugeMetricFamily(
            "runrelay_ledger_blocked_heads",
            "Runs whose lane is stopped behind a failed event until it is requeued "
            "(ledger_stats.blocked_heads).",
            labels=["lane"],
        ),
        GaugeMetricFamily(
            "runrelay_ledger_deliverable_age_seconds",
            "Seconds since the oldest pending or leased event of a lane that is not blocked "
            "was appended, 0 when none (ledger_stats.oldest_deliverable_age_seconds): "
            "growing means the relays fall behind.",
            labels=["lane"],
        ),
        GaugeMetricFamily(
            "runrelay_ledger_blocked_age_seconds",
            "Seconds since the oldest failed event of a lane was appended, 0 when none "
            "(ledger_stats.oldest_blocked_age_seconds): a head that waits for an operator "
            "(requeue or skip), whatever the relays do.",
            labels=["lane"],
        ),
        GaugeMetricFamily(
            "runrelay_processes",
            "Workers and relays seen in the last hour or holding work (list_processes), by "
            "kind and state: alive, or presumed_dead (a lease it holds has expired).",
            labels=["kind", "state"],
        ),
    ]


def _health_families(up: bool, seconds: float) -> list[GaugeMetricFamily]:
    return [
        GaugeMetricFamily(
            "runrelay_up",
            "1 if this scrape read the stats views, 0 if the database could not be "
            "reached or read.",
            value=1 if up else 0,
        ),
        GaugeMetricFamily(
            "runrelay_scrape_duration_seconds",
            "Seconds this scrape took to connect (if it had to) and read the stats views.",
            value=seconds,
        ),
    ]


class StatsCollector:
    """Reads run_stats and ledger_stats when Prometheus scrapes, in one
    statement on one connection kept between scrapes (reopened after any
    error). Scrapes that arrive together take turns on it.

    `timeout` bounds a scrape's time in the database: it is the connect
    timeout (whole seconds, at least 2, as libpq counts them) and the
    session's statement_timeout, so a slow or stuck server makes the scrape
    answer ``runrelay_up 0`` instead of hanging past Prometheus's own timeout.
    The session also turns JIT off (see _read)."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "runrelay",
        timeout: float = 5.0,
        max_queues: int = DEFAULT_MAX_QUEUES,
    ) -> None:
        if max_queues < 1:
            raise ValueError(f"max_queues must be at least 1, got {max_queues}")
        self.url = url
        self.schema = schema
        self.timeout = timeout
        self.max_queues = max_queues
        self._query = sql.SQL(STATS_QUERY).format(schema=sql.Identifier(schema))
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._was_up: bool | None = None

    def describe(self) -> list[Metric]:
        """The metrics without values: registering the collector must not
        query a database that may not be up yet."""
        return [*_health_families(False, 0.0), *_stats_family_shells()]

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        rows = self._scrape()
        seconds = time.perf_counter() - started
        yield from _health_families(rows is not None, seconds)
        if rows is not None:
            yield from stats_families(rows)

    def _scrape(self) -> list[StatsRow] | None:
        """The views' rows, or None when the database could not be read
        (the connection is then dropped, to be reopened next time)."""
        with self._lock:
            try:
                rows = self._read()
            except psycopg.Error as exc:
                self._drop_connection()
                self._note(False, first_line(exc))
                return None
            self._note(True, "")
            return rows

    def _read(self) -> list[StatsRow]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(2, math.ceil(self.timeout))
            )
            # The views' row estimates are large enough to make PostgreSQL
            # JIT-compile the aggregate, which costs more than the query
            # (hundreds of ms on every scrape); a count needs no JIT.
            self._conn.execute(
                "SELECT set_config('statement_timeout', %s, false),"
                " set_config('jit', 'off', false)",
                (f"{round(self.timeout * 1000)}ms",),
            )
        cursor = self._conn.execute(
            self._query, {"max_queues": self.max_queues, "other": OTHER_QUEUE}
        )
        return [
            StatsRow(
                source=source,
                name=name,
                state=state,
                count=int(count),
                held=None if held_ is None else int(held_),
                age=_number(age),
                blocked=None if blocked_ is None else int(blocked_),
                deliverable_age=_number(deliverable),
                blocked_age=_number(blocked_for),
            )
            for (
                source,
                name,
                state,
                count,
                held_,
                age,
                blocked_,
                deliverable,
                blocked_for,
            ) in cursor.fetchall()
        ]

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _note(self, up: bool, reason: str) -> None:
        """One log line when the database goes away or comes back, not one
        per scrape."""
        if up == self._was_up:
            return
        self._was_up = up
        if up:
            log.info("reading the stats views of schema %r", self.schema)
        else:
            log.warning("scrape failed, reporting runrelay_up 0: %s", reason)

    def close(self) -> None:
        with self._lock:
            self._drop_connection()


@dataclass
class Exporter:
    """A running exporter: its HTTP server (serving thread) and collector."""

    server: WSGIServer
    thread: threading.Thread
    collector: StatsCollector
    registry: CollectorRegistry

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose when asked for 0)."""
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving, wait for the serving thread, close the connection."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        self.collector.close()


def serve(
    url: str,
    *,
    schema: str = "runrelay",
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    timeout: float = 5.0,
    max_queues: int = DEFAULT_MAX_QUEUES,
) -> Exporter:
    """Serve the Prometheus text format on http://host:port/ (any path) from
    a daemon thread; port 0 picks a free one. The registry holds only the
    StatsCollector, so a scrape is exactly one read of the views. At most
    `max_queues` queues get series of their own; the others are summed under
    queue="_other". Raises OSError when the address cannot be bound, and
    ValueError when max_queues is below 1."""
    collector = StatsCollector(url, schema=schema, timeout=timeout, max_queues=max_queues)
    registry = CollectorRegistry()
    registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return Exporter(server, thread, collector, registry)


# -- the loops ----------------------------------------------------------------
def serve_process_metrics(
    host: str, port: int, loop: type[WorkerMetrics] | type[RelayMetrics] | None = None
) -> CollectorRegistry:
    """Serve prometheus_client's default registry (this process's CPU,
    memory and Python metrics, and the `loop` metrics the process's loop
    records into it) on http://host:port/ from a daemon thread, and return
    it for the loop (`runrelay worker|relay --metrics-port`). Raises
    OSError when the address cannot be bound.

    The `loop` metrics are registered before the port opens, so the first
    scrape already lists them (the loop itself is built afterwards).

    The process is runrelay's own, so it also drops the `*_created` series
    prometheus_client adds for every counter and histogram by default (a
    process-wide switch a library must leave to its application): they
    double the series and Prometheus needs none of them to compute rates."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    if loop is not None:
        loop.of(REGISTRY)
    start_http_server(port, addr=host, registry=REGISTRY)
    return REGISTRY


_shared: weakref.WeakKeyDictionary[CollectorRegistry, Any] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def _for_registry(kind: type[Any], registry: CollectorRegistry) -> Any:
    """The one `kind` instance of `registry`: a registry refuses a second
    metric of the same name, and loops sharing a registry should add up."""
    with _shared_lock:
        per_kind = _shared.setdefault(registry, {})
        if kind not in per_kind:
            per_kind[kind] = kind(registry)
        return per_kind[kind]


class WorkerMetrics:
    """The counters and histograms of Worker and AsyncWorker."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.claimed = Counter(
            "runrelay_worker_runs_claimed",
            "Runs this process's workers claimed, by queue.",
            ["queue"],
            registry=registry,
        )
        self.outcomes = Counter(
            "runrelay_worker_outcomes",
            "Outcomes written for claimed runs: `write` is complete, fail, suspend, "
            "release (Snooze), hand_back (shutdown) or fail_waiting; `outcome` is what "
            "the database answered (completed, retry_scheduled, failed, waiting, "
            "resumed, released, cancelled, fence_lost, ...).",
            ["queue", "write", "outcome"],
            registry=registry,
        )
        self.handler_seconds = Histogram(
            "runrelay_worker_handler_duration_seconds",
            "Seconds a handler ran for one run (returned or raised), by queue.",
            ["queue"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.heartbeats = Counter(
            "runrelay_worker_heartbeats",
            "Lease renewals (heartbeats) by outcome: ok, cancelled, fence_lost, or "
            "error when the call failed.",
            ["outcome"],
            registry=registry,
        )
        self.call_retries = Counter(
            "runrelay_worker_call_retries",
            "Claim and settle_and_claim calls replayed after a connection error, by call.",
            ["call"],
            registry=registry,
        )
        self.write_errors = Counter(
            "runrelay_worker_write_errors",
            "Outcome writes that failed for good (logged; the run's lease then expires "
            "and it is reaped).",
            registry=registry,
        )

    @classmethod
    def of(cls, registry: CollectorRegistry) -> WorkerMetrics:
        """The WorkerMetrics of `registry`, created on first use."""
        metrics: WorkerMetrics = _for_registry(cls, registry)
        return metrics


class RelayMetrics:
    """The counters and histograms of Relay."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.deliveries = Counter(
            "runrelay_relay_deliveries",
            "Batches the sink accepted and the relay acknowledged, by lane.",
            ["lane"],
            registry=registry,
        )
        self.delivered = Counter(
            "runrelay_relay_events_delivered",
            "Events acknowledged as delivered, by lane.",
            ["lane"],
            registry=registry,
        )
        self.failures = Counter(
            "runrelay_relay_delivery_failures",
            "Events whose delivery failed, by lane and what fail_ledger answered: "
            "retrying (backoff) or blocked (the lane stops until requeued).",
            ["lane", "outcome"],
            registry=registry,
        )
        self.local_acks = Counter(
            "runrelay_relay_local_acks",
            "Transport-only events acknowledged without reaching the sink, by lane.",
            ["lane"],
            registry=registry,
        )
        self.renewals = Counter(
            "runrelay_relay_lease_renewals",
            "Lease renewals during slow deliveries, by lane and result: renewed, lost "
            "(some leases had gone) or error (the call failed).",
            ["lane", "result"],
            registry=registry,
        )
        self.lost_leases = Counter(
            "runrelay_relay_lost_leases",
            "Delivered events the relay no longer held when it acknowledged them "
            "(another relay delivers them again), by lane.",
            ["lane"],
            registry=registry,
        )
        self.delivery_seconds = Histogram(
            "runrelay_relay_delivery_duration_seconds",
            "Seconds one sink call took, by lane and result (ok or error).",
            ["lane", "result"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.call_retries = Counter(
            "runrelay_relay_call_retries",
            "Relay calls repeated after a connection error.",
            registry=registry,
        )
        self.pass_errors = Counter(
            "runrelay_relay_pass_errors",
            "Relay passes that failed after their retries (the loop backs off and goes on).",
            registry=registry,
        )

    @classmethod
    def of(cls, registry: CollectorRegistry) -> RelayMetrics:
        """The RelayMetrics of `registry`, created on first use."""
        metrics: RelayMetrics = _for_registry(cls, registry)
        return metrics
