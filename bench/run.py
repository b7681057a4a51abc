"""`python -m bench.run [--quick] [--sizes N ...] [--out bench/results]`

Starts one durable PostgreSQL (bench._server), installs every system into its
own database, then measures in one run: the floor, runrelay and the peers
(cases interleaved repetition by repetition, so slow drift on a shared
machine hits every system alike), backlog growth, round trips; then, in a
full run, the sharded install (bench.scale_out: its own proxy and shard
clusters, after the single server is stopped). Writes
<out>/<date>.json (quick: <date>-quick.json), prints a rich table and, for a
full run, regenerates docs/benchmarks.md and docs/img/*.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

from bench import _server, backlog, floor, peers, report, scale_out
from bench import runrelay as rr
from bench._load import Case, Window, run_window
from bench.stats import summarize, write

console = Console(stderr=True)


@dataclass
class Plan:
    """Sizes of one run. Full: `make bench` (< 10 minutes, then bench.scale_out's
    5 or 6). Quick: a smoke test (without bench.scale_out, which has its own)."""

    quick: bool = False
    reps: int = 3
    window: float = 1.5
    connections: list[int] = field(default_factory=lambda: [1, 4, 16])
    workers: list[int] = field(default_factory=lambda: [1, 4, 8])
    enqueue_workers: list[int] = field(default_factory=lambda: [1, 4])
    batch100_workers: list[int] = field(default_factory=lambda: [1, 4])
    relays: list[int] = field(default_factory=lambda: [1, 4])
    peer_single_workers: list[int] = field(default_factory=lambda: [4])
    backlog_single: int = 20_000
    backlog_batch: int = 50_000
    ledger_runs_head: int = 200
    ledger_runs_batch: int = 500
    hot_events: int = 10_000
    pgq_events: int = 50_000
    sizes: list[int] = field(default_factory=lambda: [1_000, 100_000, 1_000_000])
    samples: int = 150
    install: bool = True

    @classmethod
    def quick_plan(cls) -> Plan:
        return cls(
            quick=True,
            window=0.3,
            connections=[1, 4],
            workers=[1, 4],
            enqueue_workers=[1],
            batch100_workers=[1],
            relays=[1],
            peer_single_workers=[],
            backlog_single=1_500,
            backlog_batch=4_000,
            ledger_runs_head=10,
            ledger_runs_batch=20,
            hot_events=1_000,
            pgq_events=2_000,
            sizes=[1_000, 10_000],
            samples=30,
            install=False,
        )


def log(message: str) -> None:
    console.log(message)


def checkpoint(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def run_cases(cases: list[Case], plan: Plan) -> dict[str, Any]:
    """Every case `plan.reps` times, interleaved: rep 1 of all, then rep 2, …"""
    windows: dict[str, list[Window]] = {c.key: [] for c in cases}
    failed: dict[str, str] = {}
    for rep in range(plan.reps):
        log(f"repetition {rep + 1}/{plan.reps}: {len(cases)} cases")
        for case in cases:
            if case.key in failed:
                continue
            try:
                case.prepare()
                checkpoint(case.url)
                windows[case.key].append(
                    run_window(case.url, case.factory, case.workers, plan.window)
                )
            except Exception as error:
                if not case.optional:
                    raise
                failed[case.key] = str(error).strip().splitlines()[-1]
                log(f"[red]{case.key} failed: {failed[case.key]}")
    out: dict[str, Any] = {}
    for case in cases:
        if case.key in failed:
            out[case.key] = {
                "system": case.system,
                "workload": case.workload,
                "workers": case.workers,
                "error": failed[case.key],
            }
            continue
        entry = summarize(windows[case.key], case.unit)
        entry.update(system=case.system, workload=case.workload, workers=case.workers)
        out[case.key] = entry
    return out


def profile(url: str, plan: Plan) -> dict[str, Any]:
    """pg_stat_statements over one extra window of each runrelay worker mode at 4 workers."""
    out: dict[str, Any] = {}
    for key, factory, rows in (
        ("runrelay.single.w4", rr.single, plan.backlog_single),
        ("runrelay.batch10.w4", rr.batched(10), plan.backlog_batch),
    ):
        rr.runs_loader(url, rows)()
        checkpoint(url)
        backlog.reset_statements(url)
        window = run_window(_server.tracked(url), factory, 4, plan.window)
        out[key] = {"jobs": window.jobs, "statements": backlog.top_statements(url, 12)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test (~1 min)")
    parser.add_argument("--sizes", type=int, nargs="+", help="backlog sizes (pending runs/events)")
    parser.add_argument("--reps", type=int, help="repetitions per figure (at least 3)")
    parser.add_argument("--window", type=float, help="seconds per measurement window")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="results folder")
    parser.add_argument("--dsn", help="use this server instead of starting a fresh durable cluster")
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="regenerate docs/benchmarks.md and docs/img (default: full runs only)",
    )
    parser.add_argument(
        "--scale-out",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the sharded install too, bench.scale_out (default: full runs only; "
        "its quick form is a test of its own, tests/python/test_bench_scale_out.py)",
    )
    parser.add_argument(
        "--install",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="install missing peers (default: full runs only)",
    )
    args = parser.parse_args(argv)

    plan = Plan.quick_plan() if args.quick else Plan()
    if args.sizes:
        plan.sizes = sorted(args.sizes)
    if args.reps:
        plan.reps = max(3, args.reps)
    if args.window:
        plan.window = args.window
    if args.install is not None:
        plan.install = args.install
    docs = (not args.quick) if args.docs is None else args.docs
    sharded = (not args.quick) if args.scale_out is None else args.scale_out

    started = time.monotonic()
    stamp = dt.datetime.now(dt.UTC)
    log("starting a durable PostgreSQL (fsync, full_page_writes, synchronous_commit on)")
    server = _server.start(args.dsn)
    try:
        doc: dict[str, Any] = {
            "date": stamp.isoformat(timespec="seconds"),
            "quick": plan.quick,
            "plan": asdict(plan),
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "load_average_at_start": os.getloadavg(),
            },
            "server": server.settings(),
        }
        floor_url = server.create_database("bench_floor")
        floor.setup(floor_url)
        rr_url = server.create_database("bench_runrelay")
        _server.migrate(rr_url)
        cases = floor.cases(floor_url, plan) + rr.cases(rr_url, plan)
        peer_cases, doc["peers"] = peers.cases(server, plan, log)
        cases += peer_cases
        doc["cases"] = run_cases(cases, plan)
        log("profile: pg_stat_statements over runrelay at 4 workers")
        doc["profile"] = profile(rr_url, plan)
        log("backlog growth")
        doc["backlog"] = backlog.measure(rr_url, plan, log)
        log("round trips per client method")
        doc["round_trips"] = rr.round_trips(rr_url)
        doc["machine"]["load_average_at_end"] = os.getloadavg()
        doc["elapsed_seconds"] = round(time.monotonic() - started, 1)
    finally:
        server.stop()
    if sharded:
        log("scale-out: a proxy with 1 and with 2 shards (bench.scale_out)")
        sharded_plan = scale_out.Plan.quick_plan() if plan.quick else scale_out.Plan()
        doc["scale_out"] = scale_out.measure(sharded_plan)
        doc["elapsed_seconds"] = round(time.monotonic() - started, 1)

    name = stamp.strftime("%Y-%m-%d") + ("-quick" if plan.quick else "") + ".json"
    path = args.out / name
    write(doc, path)
    report.print_table(doc, Console())
    if "scale_out" in doc:
        print(scale_out.markdown(doc["scale_out"]))
    if docs:
        report.write_docs(doc, path)
        log("wrote docs/benchmarks.md and docs/img/")
    log(f"wrote {path} in {doc['elapsed_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
