"""The `runrelay` command line: migrate, status, worker, relay, demo."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table


def _database_url(args: argparse.Namespace) -> str | None:
    url = args.database_url or os.environ.get("DATABASE_URL")
    return str(url) if url else None


def _require_url(args: argparse.Namespace) -> str:
    url = _database_url(args)
    if not url:
        raise SystemExit("runrelay: set DATABASE_URL or pass --database-url")
    return url


def migrate(url: str, schema: str = "runrelay", revision: str = "head") -> int:
    from . import migrations

    migrations.upgrade(url, schema, revision)
    return 0


def _load(path: str) -> Any:
    """Import 'package.module:attribute'."""
    module, _, attribute = path.partition(":")
    if not attribute:
        raise SystemExit(f"runrelay: expected module:attribute, got {path!r}")
    return getattr(importlib.import_module(module), attribute)


def cmd_migrate(args: argparse.Namespace) -> int:
    return migrate(_require_url(args), args.schema, args.revision)


def cmd_status(args: argparse.Namespace) -> int:
    from .client import Client

    with Client(_require_url(args), schema=args.schema) as client:
        runs, events = client.run_stats(), client.ledger_stats()
    if args.json:
        print(json.dumps({"run_stats": runs, "ledger_stats": events}, default=str, indent=2))
        return 0
    console = Console()
    for title, rows in (("runs", runs), ("ledger", events)):
        table = Table(title=title)
        columns = list(rows[0]) if rows else ["(empty)"]
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row.values()))
        console.print(table)
    return 0


def _pooled_client(url: str, size: int, schema: str) -> Any:
    from psycopg_pool import ConnectionPool

    from .client import Client

    pool = ConnectionPool(url, min_size=1, max_size=size, kwargs={"autocommit": True})
    return Client(pool, schema=schema)


def cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    url = _require_url(args)
    handler: Callable[..., Any] = _load(args.handler)
    worker = Worker(
        _pooled_client(url, args.concurrency + 2, args.schema),
        handler,
        queues=args.queues.split(",") if args.queues else None,
        concurrency=args.concurrency,
        name=args.name,
        lease_seconds=args.lease_seconds,
        batch_size=args.batch_size,
        listen_dsn=url,
    )
    worker.install_signal_handlers()
    worker.run()
    return 0


def cmd_relay(args: argparse.Namespace) -> int:
    import signal

    from .relay import Relay
    from .sinks import JsonLinesSink, WebhookSink

    url = _require_url(args)
    if args.webhook:
        sink: Any = WebhookSink(args.webhook)
    elif args.jsonl:
        sink = JsonLinesSink(args.jsonl)
    elif args.sink:
        sink = _load(args.sink)
    else:
        raise SystemExit("runrelay relay: pass --webhook URL, --jsonl PATH or --sink module:fn")
    relay = Relay(
        _pooled_client(url, 3, args.schema),
        sink,
        name=args.name,
        lanes=args.lanes.split(","),
        batch_size=args.batch_size,
        lease_seconds=args.lease_seconds,
        listen_dsn=url,
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: relay.stop())
    relay.run()
    return 0


@contextmanager
def _demo_database(url: str | None) -> Iterator[str]:
    """DATABASE_URL when given; otherwise a throwaway embedded PostgreSQL."""
    if url:
        yield url
        return
    from . import _pgcluster

    with _pgcluster.cluster("embedded") as cluster:
        Console().print(f"[dim]embedded PostgreSQL {cluster.version} on port {cluster.port}[/dim]")
        if migrate(cluster.url()) != 0:
            raise SystemExit("runrelay demo: migration failed")
        yield cluster.url()


def cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    with _demo_database(_database_url(args)) as url:
        return demo.run(
            url, runs=args.runs, workers=args.workers, relays=args.relays, reset=args.reset
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runrelay", description=__doc__)
    parser.add_argument("--database-url", help="defaults to $DATABASE_URL")
    parser.add_argument("--schema", default="runrelay", help="the install's schema")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="install or upgrade the schema (Alembic)")
    p.add_argument("--revision", default="head")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("status", help="runs by queue/status and events by lane/state")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("worker", help="run a Worker loop with a handler")
    p.add_argument("handler", help="module:function taking a runrelay.worker.Job")
    p.add_argument("--queues", help="comma-separated; default: every queue")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--lease-seconds", type=int, default=30)
    p.add_argument("--name")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("relay", help="run a Relay loop to a webhook, a file or a sink")
    p.add_argument("--webhook", help="POST batches to this URL")
    p.add_argument("--jsonl", help="append events to this JSON-lines file")
    p.add_argument("--sink", help="module:callable(lane, events)")
    p.add_argument("--lanes", default="lifecycle,observability")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lease-seconds", type=int, default=30)
    p.add_argument("--name")
    p.set_defaults(func=cmd_relay)

    p = sub.add_parser("demo", help="the whole system on this machine, checked end to end")
    p.add_argument("--runs", type=int, default=5000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--relays", type=int, default=2)
    p.add_argument("--reset", action="store_true", help="delete existing runs first")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
