"""`python -m bench.keys [--workers 1 4] [--reps 3] [--window 1.5] [--backlog N]`

A targeted run of what concurrency keys cost, without the whole bench: the
runrelay cases `enqueue` / `enqueue_keyed` and `single` / `single_keyed`
(bench.runrelay), interleaved repetition by repetition on one fresh durable
server, printed as `make bench` prints its table. `make bench` measures the
same cases among all the others; bench/notes.md records what keys cost.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench import _server
from bench import runrelay as rr
from bench._load import Case
from bench.run import Plan, log, run_cases


def keyed_cases(url: str, workers: list[int], backlog: int) -> list[Case]:
    single_load = rr.runs_loader(url, backlog)
    keyed_load = rr.keyed_runs_loader(url, backlog)
    empty = rr.runs_loader(url, 0)
    out: list[Case] = []
    for w in workers:
        out += [
            Case(f"runrelay.enqueue.w{w}", "runrelay", "enqueue", w, url, empty, rr.enqueue),
            Case(
                f"runrelay.enqueue_keyed.w{w}",
                "runrelay",
                "enqueue_keyed",
                w,
                url,
                empty,
                rr.enqueue_keyed,
            ),
            Case(f"runrelay.single.w{w}", "runrelay", "single", w, url, single_load, rr.single),
            Case(
                f"runrelay.single_keyed.w{w}",
                "runrelay",
                "single_keyed",
                w,
                url,
                keyed_load,
                rr.single,
            ),
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keys", description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window", type=float, default=1.5)
    parser.add_argument("--backlog", type=int, default=5_000, help="queued runs per single case")
    parser.add_argument("--dsn", help="use this server instead of starting a fresh durable cluster")
    args = parser.parse_args(argv)
    plan = Plan(reps=max(3, args.reps), window=args.window)
    server = _server.start(args.dsn)
    try:
        url = server.create_database("bench_keys")
        _server.migrate(url)
        doc: dict[str, Any] = {
            "cases": run_cases(keyed_cases(url, args.workers, args.backlog), plan)
        }
    finally:
        server.stop()
    for key, case in doc["cases"].items():
        t = case["throughput"]
        latency = "; ".join(
            f"{op} p50 {lat['p50']['median']:.2f} ms"
            for op, lat in case["latency_ms"].items()
            if lat["samples"]
        )
        print(
            f"{key:32} {t['median']:8.0f} [{t['min']:.0f}-{t['max']:.0f}] {case['unit']}  {latency}"
        )
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
