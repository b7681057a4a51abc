"""The argument parser of every command."""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Callable
from typing import Any

from .. import _logging
from ..contract import (
    LANES,
    LEASE_SECONDS_DEFAULT,
    LEASE_SECONDS_MAX,
    LEASE_SECONDS_MIN,
    RUN_STATUSES,
)
from .common import (
    EXIT_USAGE,
    Command,
    CommandError,
    _duration,
    _json,
    _page_size,
    _positive_duration,
    _positive_float,
    _positive_int,
    _reason,
    _version,
    json_value,
    later,
    when,
)
from .dashboard import cmd_dashboard
from .demo import cmd_demo
from .ledger import cmd_ledger_blocked, cmd_ledger_requeue, cmd_ledger_show, cmd_ledger_skip
from .loops import cmd_exporter, cmd_maintain, cmd_relay, cmd_worker
from .runs import (
    cmd_runs_cancel,
    cmd_runs_enqueue,
    cmd_runs_list,
    cmd_runs_purge,
    cmd_runs_retry,
    cmd_runs_show,
    cmd_runs_signal,
)
from .schedules import cmd_schedules_delete, cmd_schedules_list, cmd_schedules_set
from .schema import cmd_downgrade, cmd_migrate
from .status import (
    cmd_processes,
    cmd_queues_list,
    cmd_queues_pause,
    cmd_queues_resume,
    cmd_status,
    status_options,
)

# The top-level --help.
DESCRIPTION = """\
The `runrelay` command line: migrate, downgrade, status, worker, relay,
maintain, exporter, schedules, demo, and the operators' runs, ledger and
queues commands.

Options common to every command (--database-url, --schema, --log-level,
--log-format) are accepted before or after the command name. Exit codes: 0
success, 1 the command failed or was refused (a demo invariant broke, a
migration error, a retry of a run that did not fail), 2 bad usage, 3 the
database could not be reached or has no runrelay schema, 4 no such run,
event or schedule.
"""


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
        prog="runrelay", description=DESCRIPTION, formatter_class=_Formatter
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

    p = command(
        "status",
        "runs by queue and status, events by lane and state, waits, paused queues",
        cmd_status,
    )
    status_options(p)

    p = command(
        "processes",
        "workers and relays seen in the last hour: what each holds, which are presumed dead",
        cmd_processes,
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

    add_commands(group, leaf)

    p = command("worker", "run a Worker loop with a handler", cmd_worker)
    p.add_argument(
        "handler",
        help="module:attribute: a runrelay.Tasks registry (claims only its tasks' runs, on its "
        "tasks' queues), or a function taking a runrelay.worker.Job (claims every run)",
    )
    p.add_argument("--queues", help="comma-separated queues to claim from (default: every queue)")
    p.add_argument("--concurrency", type=_positive_int, default=10, help="handlers at once")
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
        "--runs-per-claim",
        type=_positive_int,
        default=8,
        help="runs' batches a slot claims and acknowledges per call, delivered one after "
        "another (1: one run per call)",
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


# -- the parsers --------------------------------------------------------------------
def add_commands(
    group: Callable[[str, str], Any], leaf: Callable[[Any, str, str, Command], Any]
) -> None:
    """Add the `runs`, `ledger`, `queues` and `schedules` command groups. `group(name,
    help)` makes a command group's subparsers; `leaf(subparsers, name, help,
    func)` one command of it (both from cli.build_parser, which adds the
    common options)."""
    runs = group("runs", "find, inspect, enqueue, cancel, signal, retry and purge runs")

    p = leaf(runs, "list", "runs newest first, filtered, a page at a time", cmd_runs_list)
    p.add_argument("--queue", help="only this queue")
    p.add_argument("--status", choices=RUN_STATUSES, help="only runs in this status")
    p.add_argument("--key", help="only runs of this concurrency key")
    p.add_argument(
        "--created-after", type=when, metavar="WHEN", help="timestamp, or a duration ago (2h)"
    )
    p.add_argument(
        "--created-before", type=when, metavar="WHEN", help="timestamp, or a duration ago (2h)"
    )
    p.add_argument(
        "--finished-before",
        type=when,
        metavar="WHEN",
        help="only ended runs, ended before this (or 7d ago)",
    )
    p.add_argument("--limit", type=_page_size, default=50, help="rows a page (1-1000)")
    p.add_argument(
        "--after-created-at",
        type=when,
        metavar="TIMESTAMP",
        help="next page: the last row's created",
    )
    p.add_argument("--after-run-id", help="next page: the last row's run_id")
    p.add_argument("--all", action="store_true", help="every page, not just one")
    _json(p)

    p = leaf(runs, "show", "one run: its columns, attempts and ledger events", cmd_runs_show)
    p.add_argument("run_id")
    p.add_argument("--limit", type=_positive_int, default=100, help="attempts and events shown")
    _json(p)

    p = leaf(
        runs, "enqueue", "create a run (or confirm the identical one exists)", cmd_runs_enqueue
    )
    p.add_argument("run_id")
    p.add_argument("--queue", default="default", help="queue")
    p.add_argument(
        "--payload", type=json_value, default={}, help="JSON, @file or - (stdin) (default: {})"
    )
    p.add_argument(
        "--run-at", type=later, metavar="WHEN", help="not before: a timestamp or a delay (10m)"
    )
    p.add_argument("--priority", type=int, default=0, help="higher runs first")
    p.add_argument("--max-attempts", type=int, default=3, help="attempts before it fails")
    p.add_argument("--key", help="concurrency key: runs sharing it run one at a time, in order")
    p.add_argument(
        "--task", help="the named task that handles it (a worker of that task claims it)"
    )
    p.add_argument(
        "--payload-retention",
        choices=("keep", "drop_on_delivery"),
        default="keep",
        help="drop the payload once its terminal event is delivered",
    )
    _json(p)

    p = leaf(
        runs,
        "cancel",
        "cancel a run (a running handler is told at once: its worker listens)",
        cmd_runs_cancel,
    )
    p.add_argument("run_id")
    p.add_argument("--reason", help="recorded with the cancellation")
    _json(p)

    p = leaf(runs, "signal", "send a named event to a run (wakes it if it waits for it)",
             cmd_runs_signal)  # fmt: skip
    p.add_argument("run_id")
    p.add_argument("name", help="the event's name, as the run's wait names it")
    p.add_argument("--payload", type=json_value, default={}, help="JSON, @file or - (stdin)")
    _json(p)

    p = leaf(runs, "retry", "queue a failed or cancelled run again, with a fresh attempt budget",
             cmd_runs_retry)  # fmt: skip
    p.add_argument("run_id")
    p.add_argument(
        "--max-attempts", type=int, help="attempts of the new series (default: as before)"
    )
    p.add_argument(
        "--run-at", type=later, metavar="WHEN", help="not before: a timestamp or a delay (10m)"
    )
    p.add_argument("--reason", help="recorded in the run.retried event")
    p.add_argument("--requested-by", help="who retried it, recorded in the event")
    _json(p)

    p = leaf(runs, "purge", "delete ended runs older than a cut-off, with all their rows",
             cmd_runs_purge)  # fmt: skip
    p.add_argument(
        "--finished-before",
        type=when,
        metavar="WHEN",
        required=True,
        help="timestamp, or a duration ago (30d)",
    )
    p.add_argument(
        "--include-undelivered",
        action="store_true",
        help="also runs whose ledger events are not all delivered (their events are lost)",
    )
    p.add_argument("--batch", type=_page_size, default=1000, help="runs deleted a transaction")
    p.add_argument("--max-runs", type=_positive_int, help="stop after this many (default: all)")
    _json(p)

    ledger = group("ledger", "blocked deliveries: list, inspect, requeue or skip them")
    p = leaf(ledger, "blocked", "lanes stopped behind a failed event, with its last error",
             cmd_ledger_blocked)  # fmt: skip
    p.add_argument("--lane", choices=LANES, help="only this lane")
    p.add_argument("--run-id", help="only this run's lanes")
    p.add_argument("--limit", type=_page_size, default=100, help="rows (1-1000)")
    _json(p)

    p = leaf(ledger, "show", "a run's ledger events with their delivery state", cmd_ledger_show)
    p.add_argument("run_id")
    p.add_argument("--lane", choices=LANES, help="only this lane")
    p.add_argument("--after-seq", type=int, default=0, help="events after this seq")
    p.add_argument("--limit", type=_positive_int, default=100, help="events shown")
    _json(p)

    p = leaf(ledger, "requeue", "deliver blocked events again: one, a run's lanes, or all",
             cmd_ledger_requeue)  # fmt: skip
    p.add_argument("event_id", nargs="?", type=int, help="one blocked event")
    p.add_argument("--run-id", help="every blocked lane of this run")
    p.add_argument("--all", action="store_true", help="every blocked lane")
    p.add_argument("--lane", choices=LANES, help="with --run-id or --all: only this lane")
    _json(p)

    p = leaf(ledger, "skip",
             "give up a lane's blocked head (a failed event): skipped, its successors delivered",
             cmd_ledger_skip)  # fmt: skip
    p.add_argument("run_id")
    p.add_argument("lane", choices=LANES)
    p.add_argument("--reason", required=True, type=_reason, help="why, kept on the event")
    p.add_argument("--call-id", type=uuid.UUID, help="a uuid naming this call (a repeat: nothing)")
    _json(p)

    queues = group("queues", "queues: counts, pause and resume")
    p = leaf(
        queues, "list", "every queue: runs by status, oldest runnable, paused", cmd_queues_list
    )
    _json(p)
    p = leaf(queues, "pause", "stop claims from taking the queue's runs", cmd_queues_pause)
    p.add_argument("queue")
    p.add_argument("--reason", help="shown by queues list")
    p.add_argument("--requested-by", help="who paused it")
    _json(p)
    p = leaf(queues, "resume", "let claims take the queue's runs again", cmd_queues_resume)
    p.add_argument("queue")
    _json(p)

    schedules = group("schedules", "periodic runs: list, declare (set) or delete schedules")
    p = leaf(schedules, "list", "every schedule with its next and latest slot",
             cmd_schedules_list)  # fmt: skip
    _json(p)
    p = leaf(schedules, "set",
             "declare a schedule or change it (upsert_schedule): created, updated or unchanged",
             cmd_schedules_set)  # fmt: skip
    p.add_argument("name", help="schedule name (1-160 characters)")
    p.add_argument("cron", help="five cron fields or a macro, e.g. '*/15 * * * *' or @daily")
    p.add_argument("--time-zone", default="UTC", help="IANA time zone the fields are read in")
    p.add_argument("--queue", default="default", help="queue of the runs")
    p.add_argument(
        "--payload", type=json_value, default={}, help="JSON, @file or - (stdin) (default: {})"
    )
    p.add_argument("--priority", type=int, default=0, help="priority of the runs")
    p.add_argument("--max-attempts", type=int, default=3, help="max_attempts of the runs")
    p.add_argument("--key", "--concurrency-key", dest="key",
                   help="concurrency key of the runs: one at a time, in slot order")  # fmt: skip
    p.add_argument(
        "--missed",
        choices=("skip", "catch_up"),
        default="skip",
        help="slots missed while no maintainer ran: the latest only, or every one",
    )
    p.add_argument("--disabled", action="store_true", help="declare it but enqueue nothing")
    _json(p)
    p = leaf(schedules, "delete", "delete a schedule (its runs stay)", cmd_schedules_delete)
    p.add_argument("name", help="schedule name")
    _json(p)
