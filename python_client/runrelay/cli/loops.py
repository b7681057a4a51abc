"""The long-running commands: `runrelay worker`, `relay`, `maintain` and
`exporter`, each one of the package's loops on a pooled client."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from .common import EXIT_FAILED, EXIT_USAGE, CommandError, _require_url

log = logging.getLogger("runrelay.cli")


def _listen_source(args: argparse.Namespace, url: str, proxy: bool) -> Any:
    """The loops' listen_dsn. LISTEN needs a session connection: behind
    PgBouncer in transaction mode, point --listen-database-url at PostgreSQL
    itself (or a session-mode pool). Without one, `url`; when `url` is a
    sharding proxy, every shard in its map (re-read every 30 s): a NOTIFY is
    sent on the shard that holds the run, and the proxy relays none."""
    given = args.listen_database_url or os.environ.get("RUNRELAY_LISTEN_URL")
    if given:
        return str(given)
    if proxy:
        from ..sharding import shard_listen_dsns

        return shard_listen_dsns(url, args.schema)
    return url


def _prepare_threshold(args: argparse.Namespace) -> int | None:
    from ..client import DEFAULT_PREPARE_THRESHOLD

    return None if getattr(args, "no_prepare", False) else DEFAULT_PREPARE_THRESHOLD


def _is_async(handler: Any) -> bool:
    """Whether a handler (or every task of a registry) is a coroutine
    function: such a worker runs as an AsyncWorker without --async."""
    from ..tasks import Tasks

    if isinstance(handler, Tasks):
        return len(handler) > 0 and all(task.is_async for task in handler)
    return inspect.iscoroutinefunction(handler)


def _load(path: str) -> Any:
    """Import 'package.module:attribute', from the working directory too (as
    gunicorn and uvicorn do): `runrelay worker myapp.jobs:handle` run in the
    project folder finds myapp without PYTHONPATH."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module, _, attribute = path.partition(":")
    if not attribute:
        raise CommandError(f"expected module:attribute, got {path!r}", EXIT_USAGE)
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"cannot load {path!r}: {exc}", EXIT_USAGE) from exc


def _pool_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"autocommit": True, "prepare_threshold": _prepare_threshold(args)}


def _pooled_client(args: argparse.Namespace, url: str, size: int, *, probed: bool = False) -> Any:
    """A Client on a pool of `size` connections, checked once (unless the
    caller already did: `probed`) so that a wrong URL or a missing schema is
    one clear line, not a retry loop."""
    from psycopg_pool import ConnectionPool

    from ..client import Client

    tracing = _tracing(args)
    if not probed:
        _probe(args, url)
    pool = ConnectionPool(url, min_size=1, max_size=size, kwargs=_pool_kwargs(args), open=True)
    return Client(pool, schema=args.schema, tracing=tracing)


def _tracing(args: argparse.Namespace) -> bool:
    """--tracing: trace with OpenTelemetry's global TracerProvider (set up by
    the application, or by `opentelemetry-instrument runrelay ...`); one
    clear line when the runrelay[tracing] extra is not installed."""
    if not getattr(args, "tracing", False):
        return False
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise CommandError(
            "--tracing needs opentelemetry-api: pip install 'runrelay[tracing]'", EXIT_FAILED
        ) from None
    return True


def _probe(args: argparse.Namespace, url: str) -> bool:
    """Connect once, directly, and read the schema version: an unreachable
    server or a missing install fails here in one line, before a pool would
    retry in the background and log every attempt. Returns whether `url` is a
    sharding proxy (runrelay.sharding)."""
    import psycopg

    from ..client import Client
    from ..sharding.install import is_proxy

    with psycopg.connect(url, **_pool_kwargs(args)) as conn:
        Client(conn, schema=args.schema).get_schema_version()
        return is_proxy(conn, args.schema)


class _StoppedBeforeStart(Exception):
    """SIGTERM arrived before a loop installed its own handlers."""


def _stop_before_start() -> None:
    """Until a loop installs its own SIGTERM handling, SIGTERM ends the
    command with exit 0: nothing was claimed yet, so stopping now is the
    graceful stop (an orchestrator may stop a process that is still opening
    its pool). The loop's install_signal_handlers replaces this."""

    def stop(_signum: int, _frame: Any) -> None:
        raise _StoppedBeforeStart

    signal.signal(signal.SIGTERM, stop)


def cmd_worker(args: argparse.Namespace) -> int:
    _stop_before_start()
    url = _require_url(args)
    handler: Callable[..., Any] = _load(args.handler)
    if not callable(handler):
        raise CommandError(
            f"{args.handler} is neither a handler nor a runrelay.Tasks registry", EXIT_USAGE
        )
    options: dict[str, Any] = {
        "queues": args.queues.split(",") if args.queues else None,
        "concurrency": args.concurrency,
        "name": args.name,
        "lease_seconds": args.lease_seconds,
        "batch_size": args.batch_size,
        "poll_interval": args.poll_interval,
        "shutdown_grace": args.shutdown_grace,
        "maintenance": args.maintenance,
        "fused": args.fused,
        "metrics": _loop_metrics(args, "worker"),
        "timeout": args.timeout,
    }
    if args.use_async or _is_async(handler):
        return asyncio.run(_run_async_worker(args, url, handler, options))
    from ..worker import Worker

    _tracing(args)
    options["listen_dsn"] = _listen_source(args, url, _probe(args, url))
    client = _pooled_client(args, url, args.concurrency + 2, probed=True)
    worker = _worker_of(Worker, client, handler, options)
    worker.install_signal_handlers()
    worker.run()
    return 0


def _worker_of(cls: Any, client: Any, handler: Any, options: dict[str, Any]) -> Any:
    """The worker, or a usage error naming what its options got wrong (a
    sync task given to an async worker, a queue list given as a string)."""
    try:
        return cls(client, handler, **options)
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


async def _run_async_worker(
    args: argparse.Namespace, url: str, handler: Callable[..., Any], options: dict[str, Any]
) -> int:
    from psycopg_pool import AsyncConnectionPool

    from ..client import AsyncClient
    from ..worker import AsyncWorker

    options["listen_dsn"] = _listen_source(args, url, _probe(args, url))
    size = args.concurrency + 2
    async with AsyncConnectionPool(
        url, min_size=1, max_size=size, kwargs=_pool_kwargs(args), open=False
    ) as pool:
        client = AsyncClient(pool, schema=args.schema, tracing=_tracing(args))
        worker = _worker_of(AsyncWorker, client, handler, options)
        worker.install_signal_handlers()
        await worker.run()
    return 0


def _sink(args: argparse.Namespace) -> Any:
    from ..sinks import JsonLinesSink, WebhookSink

    chosen = [x for x in (args.webhook, args.jsonl, args.sink) if x]
    if len(chosen) != 1:
        raise CommandError("pass exactly one of --webhook URL, --jsonl PATH, --sink mod:fn", 2)
    if args.webhook:
        secret = args.webhook_secret or os.environ.get("RUNRELAY_WEBHOOK_SECRET")
        try:
            return WebhookSink(
                args.webhook,
                connect_timeout=args.connect_timeout,
                read_timeout=args.read_timeout,
                secret=secret,
                **({} if args.webhook_deadline is None else {"deadline": args.webhook_deadline}),
            )
        except ValueError as err:  # the messages never repeat a secret or the URL's
            raise CommandError(f"--webhook: {err}", EXIT_USAGE) from None
    if args.jsonl:
        return JsonLinesSink(args.jsonl)
    return _load(args.sink)


def cmd_relay(args: argparse.Namespace) -> int:
    _stop_before_start()
    from ..relay import Relay

    url = _require_url(args)
    sink = _sink(args)
    _tracing(args)
    listen = _listen_source(args, url, _probe(args, url))
    relay = Relay(
        # A connection per delivery slot, and two for the renewals and the
        # idle slots' look at the next due time.
        _pooled_client(args, url, args.concurrency + 2, probed=True),
        sink,
        name=args.name,
        lanes=args.lanes.split(","),
        batch_size=args.batch_size,
        lease_seconds=args.lease_seconds,
        listen_dsn=listen,
        metrics=_loop_metrics(args, "relay"),
        concurrency=args.concurrency,
        runs_per_claim=args.runs_per_claim,
    )
    relay.install_signal_handlers()
    relay.run()
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    if not args.once:
        _stop_before_start()
    from ..maintenance import Maintenance

    client = _pooled_client(args, _require_url(args), 2)
    maintenance = Maintenance(
        client,
        interval=args.interval,
        prune_after=None if args.no_prune else args.prune_after,
        schedules=not args.no_schedules,
        purge_after=args.purge_after,
    )
    if args.once:
        done = maintenance.run_once()
        print(json.dumps(done))
        return 0
    maintenance.install_signal_handlers()
    maintenance.run()
    return 0


def _metrics_module() -> Any:
    """runrelay.metrics, or one clear line when prometheus_client (the
    `runrelay[metrics]` extra) is not installed."""
    try:
        from .. import metrics
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise CommandError(
            "needs prometheus_client: pip install 'runrelay[metrics]'", EXIT_FAILED
        ) from None
    return metrics


def _loop_metrics(args: argparse.Namespace, loop: str) -> Any:
    """With --metrics-port: serve this process's metrics (the `loop`'s,
    "worker" or "relay", and prometheus_client's process and Python ones)
    and return the registry the loop records into; None without it."""
    if args.metrics_port is None:
        return None
    metrics = _metrics_module()
    kind = {"worker": metrics.WorkerMetrics, "relay": metrics.RelayMetrics}[loop]
    try:
        return metrics.serve_process_metrics(args.metrics_host, args.metrics_port, kind)
    except OSError as exc:
        where = f"{args.metrics_host}:{args.metrics_port}"
        raise CommandError(f"cannot listen on {where}: {exc.strerror or exc}") from None


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve Prometheus metrics read from the stats views until SIGTERM or
    SIGINT. It starts whether or not the database is up (a scrape then says
    runrelay_up 0), so an orchestrator does not restart it in a loop while
    PostgreSQL is away."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    metrics = _metrics_module()
    url = _require_url(args)
    try:
        exporter = metrics.serve(
            url,
            schema=args.schema,
            host=args.host,
            port=args.port,
            timeout=args.scrape_timeout,
            max_queues=args.max_queues,
        )
    except OSError as exc:
        where = f"{args.host}:{args.port}"
        raise CommandError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    log.info(
        "serving metrics of schema %r on http://%s:%d/metrics",
        args.schema,
        args.host,
        exporter.port,
    )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        exporter.close()
    return 0
