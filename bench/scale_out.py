# ruff: noqa: RUF001, RUF003  (en dashes in min–max ranges are intended)
"""`python -m bench.scale_out [--quick] [--out bench/results]`

The sharded install (runrelay.sharding, PL/Proxy) measured on this machine:

* **overhead** — the same shard called directly and through a proxy with
  one shard behind it: p50/p99 of single calls (enqueue_run,
  claim_attempts, heartbeat, complete_attempt, claim_ledger, ack_ledger) on
  one connection, and throughput at 1 and 4 clients;
* **shards** — throughput through the proxy with 1 shard and with 2 shards,
  same clients: enqueue, claim + complete (one and ten at a time),
  settle_and_claim of ten, ledger delivery head-only and in frozen batches
  of 100 (claim_ledger, then ack_ledger with claim_next);
* **cpu** — every window's server CPU: the CPU time of each cluster's
  processes (the postmaster and its children; /proc/<pid>/schedstat for
  those alive, the postmaster's cutime + cstime for those that exited) read
  when every client has warmed up and again before any disconnects, divided
  by the window's jobs; and the cost of a claim that finds nothing (one hop
  per shard it walks).

The clusters are started here, with bench._server's durable settings (fsync,
full_page_writes, synchronous_commit on): a proxy and one shard, and a proxy
and two shards, all on this machine. Both shards share its CPUs, so the
2-shard throughput here is not a scale-out result; the CPU per job is what
carries over to shards on machines of their own (see `model`).

Writes <out>/<date>-scale-out.json (quick: <date>-scale-out-quick.json) and
prints a markdown table; `bench.run` runs it after the single-server bench.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import multiprocessing as mp
import os
import platform
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import _server
from bench import runrelay as rr
from bench._load import Factory, Recorder, Window, WorkerError, run_serial, timed_steps, warm_up
from bench.stats import summarize, write
from runrelay import Client, _pgcluster
from runrelay.sharding import ShardMap
from runrelay.sharding.install import migrate
from runrelay.types import LedgerKind

PARTITIONS = 16
WARMUP = 8  # steps each worker runs before its window (prepared statements, plans)


@dataclass
class Plan:
    """Sizes of one run. Full: part of `make bench` (about 4 minutes)."""

    quick: bool = False
    reps: int = 3
    window: float = 1.5
    clients: list[int] = field(default_factory=lambda: [1, 4])
    shard_clients: int = 4
    probe_samples: int = 300
    backlog_single: int = 20_000
    backlog_batch: int = 50_000
    ledger_runs_head: int = 400
    ledger_runs_batch: int = 500
    empty_window: float = 1.0

    @classmethod
    def quick_plan(cls) -> Plan:
        return cls(
            quick=True,
            reps=1,
            window=0.3,
            clients=[1],
            shard_clients=2,
            probe_samples=20,
            backlog_single=1_000,
            backlog_batch=2_000,
            ledger_runs_head=40,
            ledger_runs_batch=40,
            empty_window=0.3,
        )


def _log(message: str) -> None:
    print(f"[scale-out {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# Installs -----------------------------------------------------------------


@dataclass
class Install:
    """A proxy and its shards, migrated; `parts[i]` = the partitions of shard i."""

    name: str
    clusters: _pgcluster.Sharded
    parts: dict[int, list[int]]

    @property
    def proxy_url(self) -> str:
        return self.clusters.proxy_url

    @property
    def shard_urls(self) -> list[str]:
        return self.clusters.shard_urls

    def cpu(self) -> dict[str, CpuSnapshot]:
        """The CPU clocks of the proxy's and every shard's server processes."""
        table = _proc_table()
        out = {"proxy": _cluster_cpu(self.clusters.proxy, table)}
        for i, shard in enumerate(self.clusters.shards):
            out[f"shard{i}"] = _cluster_cpu(shard, table)
        return out

    def each_shard(self, query: str, params: Any = None) -> list[int]:
        out = []
        for url in self.shard_urls:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(query, params).fetchone()
                out.append(int(row[0]) if row and row[0] is not None else 0)
        return out


def start(name: str, shards: int) -> Install:
    clusters = _pgcluster.start_sharded(shards, settings=_server.DURABLE_SETTINGS)
    try:
        migrate(clusters.proxy_url, clusters.shard_urls, partitions=PARTITIONS)
        with psycopg.connect(clusters.proxy_url, autocommit=True) as proxy:
            shard_map = ShardMap.load(proxy)
    except BaseException:
        clusters.destroy()
        raise
    parts: dict[int, list[int]] = {}
    for partition, shard in enumerate(shard_map.partitions):
        parts.setdefault(shard, []).append(partition)
    return Install(name, clusters, parts)


# CPU from /proc -------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class CpuSnapshot:
    """One server's processes at one moment: each live process's CPU time in
    nanoseconds (/proc/<pid>/schedstat, exact) and clock ticks (utime + stime
    of /proc/<pid>/stat), and the ticks of its children already reaped
    (the postmaster's cutime + cstime)."""

    nanoseconds: dict[int, int]
    ticks: dict[int, int]
    reaped_ticks: int


def cpu_used(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """CPU seconds the server used between two snapshots: exact for the
    processes alive at the end; for those that exited in between, what the
    postmaster reaped minus what they had used before (to a clock tick)."""
    live = sum(ns - before.nanoseconds.get(pid, 0) for pid, ns in after.nanoseconds.items())
    gone = sum(t for pid, t in before.ticks.items() if pid not in after.ticks)
    exited = max(0, after.reaped_ticks - before.reaped_ticks - gone)
    return live / 1e9 + exited / _TICK


def _proc_table() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (ppid, utime + stime, cutime + cstime in clock ticks, CPU ns)."""
    table: dict[int, tuple[int, int, int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as fh:
                text = fh.read()
            with open(f"/proc/{entry.name}/schedstat", encoding="ascii") as fh:
                nanoseconds = int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        # Fields after the command name (which may hold spaces) in ")":
        # state ppid ... utime(14) stime(15) cutime(16) cstime(17).
        rest = text[text.rindex(")") + 2 :].split()
        table[int(entry.name)] = (
            int(rest[1]),
            int(rest[11]) + int(rest[12]),
            int(rest[13]) + int(rest[14]),
            nanoseconds,
        )
    return table


def _postmaster(cluster: _pgcluster.Cluster) -> int:
    return int((cluster.datadir / "postmaster.pid").read_text().split()[0])


def _cluster_cpu(
    cluster: _pgcluster.Cluster, table: dict[int, tuple[int, int, int, int]]
) -> CpuSnapshot:
    """The postmaster and its live children; its reaped children's ticks."""
    pid = _postmaster(cluster)
    mine = {p: v for p, v in table.items() if p == pid or v[0] == pid}
    return CpuSnapshot(
        nanoseconds={p: v[3] for p, v in mine.items()},
        ticks={p: v[1] for p, v in mine.items()},
        reaped_ticks=table[pid][2] if pid in table else 0,
    )


def _client_backends(install: Install) -> int:
    """Client backends (and zombies) still attached to any of the install's servers."""
    postmasters = {_postmaster(c) for c in (install.clusters.proxy, *install.clusters.shards)}
    count = 0
    for pid, (ppid, *_) in _proc_table().items():
        if ppid not in postmasters:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        # A client backend's title is "postgres: user db host(port) state"; an
        # exiting one has an empty cmdline.
        if not cmdline or b"(" in cmdline or b"[local]" in cmdline:
            count += 1
    return count


def _quiesce(install: Install) -> None:
    """Wait until the previous window's and the load's backends are gone: a
    process that exits while /proc is read can be counted twice or not at
    all, which on a short window is a visible error."""
    deadline = time.monotonic() + 5
    while _client_backends(install) and time.monotonic() < deadline:
        time.sleep(0.05)


# Loads: each shard gets the runs whose run_id routes to it -----------------

_ROUTED = "((('x' || substr(md5({id}), 1, 8))::bit(32)::integer) & %(mask)s) = ANY(%(parts)s)"


def _routed(statement: str, id_sql: str) -> str:
    return f"{statement.rstrip()}\n    WHERE {_ROUTED.format(id=id_sql)}"


LOAD_RUNS = _routed(rr.LOAD_RUNS, "'r-' || i")
LOAD_LEDGER = [_routed(s, "'l-' || i") for s in rr.LOAD_LEDGER]


def _load(install: Install, statements: list[str], params: dict[str, Any]) -> Callable[[], None]:
    def prepare() -> None:
        for i, url in enumerate(install.shard_urls):
            with psycopg.connect(url, autocommit=True) as conn:
                rr.reset(conn)
                args = dict(params, mask=PARTITIONS - 1, parts=install.parts[i])
                for statement in statements:
                    conn.execute(statement, args)
                # VACUUM too: autovacuum would otherwise visit the freshly
                # loaded tables during the window and bill it to the jobs.
                conn.execute(rr.ANALYZE.replace("ANALYZE", "VACUUM (ANALYZE)", 1))
                conn.execute("CHECKPOINT")
        with psycopg.connect(install.proxy_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")

    return prepare


def runs_loader(install: Install, runs: int) -> Callable[[], None]:
    return _load(install, [LOAD_RUNS, *rr.LOAD_RUN_EVENTS] if runs else [], {"runs": runs})


def ledger_loader(install: Install, runs: int, events: int) -> Callable[[], None]:
    return _load(install, LOAD_LEDGER, {"runs": runs, "events": events})


# Workloads beyond bench.runrelay's ------------------------------------------


def lifecycle(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    """One run's life, each call timed: enqueue, claim it, heartbeat, complete."""
    client = Client(conn)
    tag = uuid.uuid4().hex[:8]
    counter = itertools.count()
    worker = f"probe-{index}"

    def step(rec: Recorder) -> int | None:
        rec.timed("enqueue_run", client.enqueue_run, f"p-{tag}-{next(counter)}", payload={"n": 1})
        claimed = rec.timed("claim_attempts", client.claim_attempts, worker)
        if not claimed:
            return None
        a = claimed[0]
        rec.timed("heartbeat", client.heartbeat, a.run_id, a.attempt, a.lease_token)
        rec.timed("complete_attempt", client.complete_attempt, a.run_id, a.attempt, a.lease_token)
        return 1

    return step


def ledger_probe(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    """Discover a run's head, then acknowledge it and claim its successor."""
    client = Client(conn)
    relay = f"probe-{index}"

    def step(rec: Recorder) -> int | None:
        held = rec.timed("claim_ledger", client.claim_ledger, relay)
        held = [e for e in held if e.kind is LedgerKind.CLAIMED]
        if not held:
            return None
        e = held[0]
        rec.timed("ack_ledger", client.ack_ledger, relay, e.run_id, [e.event_id], claim_next=1)
        return 1

    return step


def empty_claim(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    """A claim that finds nothing: with N shards it walks all N."""
    client = Client(conn)
    worker = f"idle-{index}"

    def step(rec: Recorder) -> int | None:
        rec.timed("claim_attempts", client.claim_attempts, worker, ["idle"], max_runs=10)
        return 1

    return step


# Cases ------------------------------------------------------------------------

DONE_RUNS = "SELECT count(*) FROM runrelay.runs"
DONE_JOBS = "SELECT count(*) FROM runrelay.runs WHERE status = 'completed'"
DONE_EVENTS = rr.DELIVERED_EVENTS


@dataclass
class Case:
    key: str
    install: Install
    route: str  # "direct" (shard 0 itself) or "proxy"
    workload: str
    workers: int
    prepare: Callable[[], None]
    factory: Factory
    done: str | None  # counts the jobs done on a shard; None: the window's calls
    unit: str = "jobs/s"

    @property
    def url(self) -> str:
        return self.install.shard_urls[0] if self.route == "direct" else self.install.proxy_url


def cases(one: Install, two: Install, plan: Plan) -> list[Case]:
    out: list[Case] = []

    def add(inst: Install, route: str, workload: str, workers: int) -> None:
        single_load = runs_loader(inst, plan.backlog_single)
        batch_load = runs_loader(inst, plan.backlog_batch)
        spec: dict[str, tuple[Callable[[], None], Factory, str, str]] = {
            "enqueue": (runs_loader(inst, 0), rr.enqueue, DONE_RUNS, "jobs/s"),
            "single": (single_load, rr.single, DONE_JOBS, "jobs/s"),
            "batch10": (batch_load, rr.batched(10), DONE_JOBS, "jobs/s"),
            "fused_batch10": (batch_load, rr.fused(10), DONE_JOBS, "jobs/s"),
            "ledger_head": (
                ledger_loader(inst, plan.ledger_runs_head, 100),
                rr.relay(1),
                DONE_EVENTS,
                "events/s",
            ),
            "ledger_batch100": (
                ledger_loader(inst, plan.ledger_runs_batch, 100),
                rr.relay(100),
                DONE_EVENTS,
                "events/s",
            ),
        }
        prepare, factory, done, unit = spec[workload]
        key = f"{inst.name}.{route}.{workload}.w{workers}"
        out.append(Case(key, inst, route, workload, workers, prepare, factory, done, unit))

    w = plan.shard_clients
    # Overhead: the same shard, directly and through the proxy.
    for route in ("direct", "proxy"):
        for c in plan.clients:
            add(one, route, "enqueue", c)
            add(one, route, "single", c)
        if not plan.quick:
            add(one, route, "fused_batch10", w)
            add(one, route, "ledger_head", w)
    # One shard against two, through the proxy, same clients.
    for inst in (one, two):
        workloads = ["enqueue", "fused_batch10", "ledger_head"]
        if not plan.quick:
            workloads += ["single", "batch10", "ledger_batch100"]
        for workload in workloads:
            key = f"{inst.name}.proxy.{workload}.w{w}"
            if not any(c.key == key for c in out):
                add(inst, "proxy", workload, w)
    return out


def _timed_worker(
    url: str,
    factory: Factory,
    index: int,
    seconds: float,
    start: Any,
    stop: Any,
    out: Any,
) -> None:
    """bench._load's worker, with barriers on both sides of its window where
    it waits while the parent reads the servers' CPU: the CPU used between
    covers the window alone (no connection set-up, warm-up, plan caching or
    disconnection)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            step = factory(conn, index)
            warm_up(step, WARMUP)
            start.wait(timeout=120)  # warmed up: the CPU is read now
            start.wait(timeout=120)  # go
            jobs, started, stopped, rec = timed_steps(step, seconds)
            stop.wait(timeout=120)  # done: the CPU is read now
            stop.wait(timeout=120)
        out.put((index, jobs, started, stopped, rec.samples, None))
    except BaseException:
        with contextlib.suppress(Exception):
            start.abort()
            stop.abort()
        out.put((index, 0, 0.0, 0.0, {}, traceback.format_exc()))


def run_window_cpu(
    install: Install, url: str, factory: Factory, workers: int, seconds: float
) -> tuple[Window, dict[str, float]]:
    """One window of `workers` processes and the CPU every server used in it."""
    ctx = mp.get_context("fork")
    start = ctx.Barrier(workers + 1)
    stop = ctx.Barrier(workers + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_timed_worker, args=(url, factory, i, seconds, start, stop, out))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    before: dict[str, CpuSnapshot] = {}
    after: dict[str, CpuSnapshot] = {}
    try:
        # The workers wait while /proc is read (slow on a busy machine), so
        # the window neither starts nor ends during a read.
        start.wait(timeout=180)
        before = install.cpu()
        start.wait(timeout=180)
        stop.wait(timeout=seconds + 180)
        after = install.cpu()
        stop.wait(timeout=180)
    except threading.BrokenBarrierError:
        pass  # a worker failed: its traceback comes through the queue
    results = [out.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [r[5] for r in results if r[5]]
    if errors:
        raise WorkerError(errors[0])
    latencies: dict[str, list[float]] = {}
    for r in results:
        for op, samples in r[4].items():
            latencies.setdefault(op, []).extend(v / 1e6 for v in samples)
    window = Window(
        jobs=sum(r[1] for r in results),
        seconds=max(r[3] for r in results) - min(r[2] for r in results),
        latencies_ms=latencies,
    )
    return window, {k: cpu_used(before[k], after[k]) for k in after}


def measure_window(case: Case, seconds: float) -> tuple[Window, dict[str, Any]]:
    """One repetition of a case: throughput, latencies, and the CPU per
    server; the window's jobs are split over the shards as the databases'
    counts of work done (warm-up included) are."""
    case.prepare()
    _quiesce(case.install)
    window, used = run_window_cpu(case.install, case.url, case.factory, case.workers, seconds)
    n = len(case.install.shard_urls)
    if case.route == "direct":
        used = {"shard0": used["shard0"]}
        n = 1
    if case.done is None:
        per_shard: list[float] = [float(window.jobs)] * n  # calls; each reached every shard
    else:
        done = case.install.each_shard(case.done)[:n]
        total = sum(done)
        per_shard = [window.jobs * d / total if total else 0.0 for d in done]
    return window, {"cpu_seconds": used, "jobs_by_shard": per_shard}


def _cpu_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU ms per job: each shard's (own CPU / own jobs), all shards' (sum / sum),
    the proxy's (its CPU / all jobs); medians over repetitions."""

    def med(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[len(ordered) // 2] if ordered else 0.0

    out: dict[str, Any] = {}
    shard_keys = sorted(k for k in samples[0]["cpu_seconds"] if k.startswith("shard"))
    for k in shard_keys:
        i = int(k[len("shard") :])
        out[f"{k}_ms_per_job"] = med(
            [
                1000 * s["cpu_seconds"][k] / s["jobs_by_shard"][i]
                for s in samples
                if s["jobs_by_shard"][i]
            ]
        )
    out["shards_ms_per_job"] = med(
        [
            1000 * sum(s["cpu_seconds"][k] for k in shard_keys) / sum(s["jobs_by_shard"])
            for s in samples
            if sum(s["jobs_by_shard"])
        ]
    )
    if "proxy" in samples[0]["cpu_seconds"]:
        out["proxy_ms_per_job"] = med(
            [
                1000 * s["cpu_seconds"]["proxy"] / sum(s["jobs_by_shard"])
                for s in samples
                if sum(s["jobs_by_shard"])
            ]
        )
    out["jobs_by_shard"] = [s["jobs_by_shard"] for s in samples]
    out["cpu_seconds"] = [s["cpu_seconds"] for s in samples]
    return out


def run_cases(all_cases: list[Case], plan: Plan) -> dict[str, Any]:
    windows: dict[str, list[Window]] = {c.key: [] for c in all_cases}
    cpu: dict[str, list[dict[str, Any]]] = {c.key: [] for c in all_cases}
    for rep in range(plan.reps):
        _log(f"repetition {rep + 1}/{plan.reps}: {len(all_cases)} cases")
        for case in all_cases:
            window, used = measure_window(case, plan.window)
            windows[case.key].append(window)
            cpu[case.key].append(used)
    out: dict[str, Any] = {}
    for case in all_cases:
        entry = summarize(windows[case.key], case.unit)
        entry.update(
            install=case.install.name,
            shards=len(case.install.shard_urls),
            route=case.route,
            workload=case.workload,
            workers=case.workers,
            cpu=_cpu_summary(cpu[case.key]),
        )
        out[case.key] = entry
    return out


def probes(one: Install, plan: Plan) -> dict[str, Any]:
    """Single-call latencies on one connection, direct and through the proxy,
    interleaved repetition by repetition."""
    found: dict[str, list[Window]] = {}
    for _ in range(plan.reps):
        for route, url in (("direct", one.shard_urls[0]), ("proxy", one.proxy_url)):
            runs_loader(one, 0)()
            found.setdefault(f"{route}.worker", []).append(
                run_serial(url, lifecycle, plan.probe_samples)
            )
            ledger_loader(one, plan.probe_samples + 2 * WARMUP, 2)()
            found.setdefault(f"{route}.ledger", []).append(
                run_serial(url, ledger_probe, plan.probe_samples)
            )
    out: dict[str, Any] = {}
    for route in ("direct", "proxy"):
        merged: dict[str, Any] = {}
        for part in ("worker", "ledger"):
            merged.update(summarize(found[f"{route}.{part}"], "calls/s")["latency_ms"])
        out[route] = merged
    return out


def discovery(one: Install, two: Install, plan: Plan) -> dict[str, Any]:
    """A claim through the proxy that finds nothing, with 1 and 2 shards:
    each shard walked costs a hop (shard CPU, a proxy call, a round trip)."""
    out: dict[str, Any] = {}
    for inst in (one, two):
        case = Case(
            f"{inst.name}.proxy.empty_claim.w1",
            inst,
            "proxy",
            "empty_claim",
            1,
            runs_loader(inst, 0),
            empty_claim,
            None,
            "calls/s",
        )
        samples = []
        wins = []
        for _ in range(plan.reps):
            window, used = measure_window(case, plan.empty_window)
            wins.append(window)
            samples.append(used)
        n = len(inst.shard_urls)

        def per_call(part: str, samples: list[dict[str, Any]] = samples) -> float:
            values = sorted(
                1000
                * sum(v for k, v in s["cpu_seconds"].items() if k.startswith(part))
                / s["jobs_by_shard"][0]
                for s in samples
            )
            return float(values[len(values) // 2])

        entry = summarize(wins, "calls/s")
        entry.update(
            shards=n,
            shards_ms_per_call=per_call("shard"),
            hop_ms=per_call("shard") / n,
            proxy_ms_per_call=per_call("proxy"),
            cpu_seconds=[s["cpu_seconds"] for s in samples],
            calls=[s["jobs_by_shard"][0] for s in samples],
        )
        out[case.key] = entry
    return out


# The model -------------------------------------------------------------------


def model(doc: dict[str, Any]) -> dict[str, Any]:
    """Ceilings from CPU per job: a shard with C cores does at most C/s jobs/s
    (s = its CPU seconds per job), N shards N*C/s; the proxy at most Cp/p
    (p = its CPU seconds per job); discovery adds a hop per empty shard walked."""
    cases = doc["cases"]
    out: dict[str, Any] = {}
    for key, case in cases.items():
        if case["route"] != "proxy" or case["install"] != "two":
            continue
        s = case["cpu"]["shards_ms_per_job"] / 1000
        p = case["cpu"].get("proxy_ms_per_job", 0) / 1000
        if s <= 0:
            continue
        out[case["workload"]] = {
            "shard_cpu_ms_per_job": round(s * 1000, 4),
            "proxy_cpu_ms_per_job": round(p * 1000, 4),
            "per_shard_ceiling_per_core": round(1 / s, 1),
            "proxy_ceiling_per_core": round(1 / p, 1) if p > 0 else None,
            "shards_per_proxy_core": round(p and (s / p), 2) if p > 0 else None,
            "measured_here": case["throughput"]["median"],
            "unit": case["unit"],
            "key": key,
        }
    hop: dict[str, Any] = {}
    for key, entry in doc.get("discovery", {}).items():
        hop[key] = {
            "shards": entry["shards"],
            "shard_cpu_ms_per_call": round(entry["shards_ms_per_call"], 4),
            "shard_cpu_ms_per_hop": round(entry["hop_ms"], 4),
            "proxy_cpu_ms_per_call": round(entry["proxy_ms_per_call"], 4),
            "p50_ms": entry["latency_ms"]["claim_attempts"]["p50"]["median"],
        }
    return {"by_workload": out, "empty_claim": hop}


# Report ------------------------------------------------------------------------


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def markdown(doc: dict[str, Any]) -> str:
    """The tables of docs/scale-out.md's measured part."""
    lines: list[str] = []
    cases = doc["cases"]
    lat = doc["probes"]
    lines.append("Single calls on one connection, median of the repetitions' percentiles (ms):\n")
    lines.append("| call | direct p50 | proxy p50 | direct p99 | proxy p99 | added p50 |")
    lines.append("|---|---|---|---|---|---|")
    for op in ("enqueue_run", "claim_attempts", "heartbeat", "complete_attempt"):
        lines.append(_lat_row(op, lat))
    for op in ("claim_ledger", "ack_ledger"):
        lines.append(_lat_row(op, lat))
    lines.append("")
    lines.append("Throughput, median [min–max] of the repetitions, and server CPU per job:\n")
    lines.append(
        "| case | shards | route | clients | throughput | unit "
        "| shard CPU ms/job | proxy CPU ms/job |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for key, case in cases.items():
        t = case["throughput"]
        cpu = case["cpu"]
        proxy = cpu.get("proxy_ms_per_job")
        lines.append(
            f"| `{key}` | {case['shards']} | {case['route']} | {case['workers']} "
            f"| {_num(t['median'])} [{_num(t['min'])}–{_num(t['max'])}] | {case['unit']} "
            f"| {cpu['shards_ms_per_job']:.3f} | {'—' if proxy is None else f'{proxy:.3f}'} |"
        )
    lines.append("")
    if doc.get("discovery"):
        lines.append("A claim that finds nothing (one hop per shard walked):\n")
        lines.append(
            "| case | shards | calls/s | p50 ms | shard CPU ms/call | per hop | proxy CPU ms/call |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for key, entry in doc["discovery"].items():
            lines.append(
                f"| `{key}` | {entry['shards']} | {_num(entry['throughput']['median'])} "
                f"| {entry['latency_ms']['claim_attempts']['p50']['median']:.2f} "
                f"| {entry['shards_ms_per_call']:.3f} | {entry['hop_ms']:.3f} "
                f"| {entry['proxy_ms_per_call']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _lat_row(op: str, lat: dict[str, Any]) -> str:
    d = lat["direct"].get(op)
    p = lat["proxy"].get(op)
    if not d or not p:
        return f"| {op} | — | — | — | — | — |"
    d50, p50 = d["p50"]["median"], p["p50"]["median"]
    d99, p99 = d["p99"]["median"], p["p99"]["median"]
    return f"| {op} | {d50:.2f} | {p50:.2f} | {d99:.2f} | {p99:.2f} | {p50 - d50:+.2f} |"


# Entry points ------------------------------------------------------------------


def measure(plan: Plan) -> dict[str, Any]:
    """Start the clusters, measure, stop them; the results document."""
    started = time.monotonic()
    stamp = dt.datetime.now(dt.UTC)
    _log("starting a proxy + 1 shard and a proxy + 2 shards (durable settings)")
    one = start("one", 1)
    try:
        two = start("two", 2)
        try:
            doc: dict[str, Any] = {
                "date": stamp.isoformat(timespec="seconds"),
                "quick": plan.quick,
                "plan": asdict(plan),
                "partitions": PARTITIONS,
                "machine": {
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                    "load_average_at_start": os.getloadavg(),
                },
                "server": _server.Server(None, one.shard_urls[0]).settings(),
            }
            _log("single-call latency, direct and through the proxy")
            doc["probes"] = probes(one, plan)
            doc["cases"] = run_cases(cases(one, two, plan), plan)
            _log("claims that find nothing")
            doc["discovery"] = discovery(one, two, plan)
            doc["model"] = model(doc)
            doc["machine"]["load_average_at_end"] = os.getloadavg()
        finally:
            two.clusters.destroy()
    finally:
        one.clusters.destroy()
    doc["elapsed_seconds"] = round(time.monotonic() - started, 1)
    return doc


def output_path(out: Path, doc: dict[str, Any]) -> Path:
    day = str(doc["date"])[:10]
    return out / f"{day}-scale-out{'-quick' if doc['quick'] else ''}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_out", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--reps", type=int, help="repetitions per figure")
    parser.add_argument("--window", type=float, help="seconds per measurement window")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="results folder")
    args = parser.parse_args(argv)
    plan = Plan.quick_plan() if args.quick else Plan()
    if args.reps:
        plan.reps = args.reps
    if args.window:
        plan.window = args.window
    doc = measure(plan)
    path = output_path(args.out, doc)
    write(doc, path)
    print(markdown(doc))
    _log(f"wrote {path} in {doc['elapsed_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
