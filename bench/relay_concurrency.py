"""`python -m bench.relay_concurrency [--latency 0.2] [--runs 2000] [--seconds 10]`

What a relay's delivery slots buy against a slow consumer: one relay,
default options, against a sink that answers every batch in `latency`
seconds (a webhook consumer at 200 ms), compared with the same relay at
concurrency 1 (one batch in flight: the relay before slots). Each case
delivers for `seconds` from a backlog of `runs` runs with a few events on
each lane, on one fresh durable server; printed as events/s and batches/s.
`make bench` runs it after the main table; docs/benchmarks.md records it.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from psycopg_pool import ConnectionPool

from bench import _server
from bench.run import log
from runrelay import Client, LedgerEvent
from runrelay.relay import Relay


def _backlog(client: Client, runs: int, events: int) -> None:
    client.enqueue_runs([{"run_id": f"b{i}"} for i in range(runs)])
    for i in range(runs):
        client.append_events(f"b{i}", [{"type": f"e{k}"} for k in range(events)])


def measure(url: str, concurrency: int | None, latency: float, seconds: float) -> dict[str, Any]:
    """Events and batches delivered per second by one relay for `seconds`."""
    counts = {"events": 0, "batches": 0}
    lock = threading.Lock()

    def sink(lane: str, events: list[LedgerEvent]) -> None:
        time.sleep(latency)
        with lock:
            counts["events"] += len(events)
            counts["batches"] += 1

    options: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
    slots = concurrency or 16
    with ConnectionPool(url, min_size=2, max_size=slots + 2, kwargs={"autocommit": True}) as pool:
        relay = Relay(Client(pool), sink, max_sleep=0.2, **options)
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        time.sleep(seconds)
        with lock:
            done = dict(counts)
        relay.stop()
        thread.join(60)
    return {
        "concurrency": relay.concurrency,
        "events_per_s": done["events"] / seconds,
        "batches_per_s": done["batches"] / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_concurrency", description=__doc__)
    parser.add_argument("--latency", type=float, default=0.2, help="the sink's seconds per batch")
    parser.add_argument("--runs", type=int, default=2000, help="runs in the backlog of each case")
    parser.add_argument("--events", type=int, default=3, help="events appended to each run")
    parser.add_argument("--seconds", type=float, default=10.0, help="delivery time per case")
    parser.add_argument("--dsn", help="use this server instead of starting a fresh durable cluster")
    args = parser.parse_args(argv)
    server = _server.start(args.dsn)
    results = []
    try:
        for name, concurrency in (("one batch in flight", 1), ("default options", None)):
            url = server.create_database(f"bench_relay_{concurrency or 'default'}")
            _server.migrate(url)
            with ConnectionPool(url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
                _backlog(Client(pool), args.runs, args.events)
            log(f"relay, {name}: delivering for {args.seconds:g}s at {args.latency:g}s per batch")
            results.append((name, measure(url, concurrency, args.latency, args.seconds)))
    finally:
        server.stop()
    base = results[0][1]["events_per_s"]
    for name, r in results:
        ratio = r["events_per_s"] / base if base else float("nan")
        print(
            f"relay {name:22} concurrency {r['concurrency']:3}  {r['events_per_s']:8.1f} events/s"
            f"  {r['batches_per_s']:6.1f} batches/s  {ratio:5.1f}x"
        )
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
