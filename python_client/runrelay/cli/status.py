"""`runrelay status [--watch]`, `runrelay processes` and
`runrelay queues list|pause|resume`: what the install is doing now."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import UTC, datetime
from typing import Any

from ..contract import (
    RUN_STATUSES,
)
from .common import EXIT_OK, _duration, _json, _positive_int, client
from .output import as_text, console, print_json, say, show, table

# -- processes ------------------------------------------------------------------
PROCESS_COLUMNS = ("name", "kind", "last_seen", "held", "state")


def cmd_processes(args: argparse.Namespace) -> int:
    """list_processes: the workers and relays seen in the last hour."""
    with client(args) as c:
        processes = c.list_processes()
    if args.json:
        print_json(processes)
        return EXIT_OK
    rows = [
        [
            p.name,
            p.kind,
            p.last_seen_at,
            p.held,
            "presumed dead (an expired lease)" if p.presumed_dead else "alive",
        ]
        for p in processes
    ]
    show(table("workers and relays seen in the last hour", PROCESS_COLUMNS, rows))
    return EXIT_OK


# -- queues ---------------------------------------------------------------------
def queue_rows(c: Any) -> list[dict[str, Any]]:
    """One row a queue: runs by status, the oldest runnable age, waits, and
    whether (and why) it is paused. Queues with no run but a pause show too."""
    queues: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        return queues.setdefault(
            name,
            {
                "queue": name,
                **dict.fromkeys(RUN_STATUSES, 0),
                "held_by_key": 0,
                "oldest_runnable_age_seconds": None,
                "paused": False,
                "paused_reason": None,
                "paused_by": None,
                "paused_at": None,
            },
        )

    for stat in c.run_stats():
        q = row(stat["queue"])
        q[stat["status"]] = stat["runs"]
        q["held_by_key"] += stat["held_by_key"]
        age = stat["oldest_runnable_age_seconds"]
        if age is not None:
            q["oldest_runnable_age_seconds"] = float(age)
    for paused in c.list_paused_queues():
        q = row(paused.queue)
        q.update(
            paused=True,
            paused_reason=paused.reason,
            paused_by=paused.paused_by,
            paused_at=paused.paused_at,
        )
    return [queues[name] for name in sorted(queues)]


QUEUE_COLUMNS = ("queue", *RUN_STATUSES, "oldest runnable (s)", "paused")


def _queue_table(rows: list[dict[str, Any]]) -> Any:
    def paused(q: dict[str, Any]) -> str:
        if not q["paused"]:
            return ""
        return f"paused: {q['paused_reason']}" if q["paused_reason"] else "paused"

    return table(
        "queues",
        QUEUE_COLUMNS,
        [
            [q["queue"], *(q[s] for s in RUN_STATUSES), q["oldest_runnable_age_seconds"], paused(q)]
            for q in rows
        ],
    )


def cmd_queues_list(args: argparse.Namespace) -> int:
    with client(args) as c:
        rows = queue_rows(c)
    if args.json:
        print_json(rows)
    else:
        show(_queue_table(rows))
    return EXIT_OK


def cmd_queues_pause(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.pause_queue(args.queue, reason=args.reason, requested_by=args.requested_by)
    say(args, {"queue": args.queue, "outcome": str(outcome)}, f"{args.queue}: {outcome}")
    return EXIT_OK


def cmd_queues_resume(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.resume_queue(args.queue)
    say(args, {"queue": args.queue, "outcome": str(outcome)}, f"{args.queue}: {outcome}")
    return EXIT_OK


# -- status -----------------------------------------------------------------------
def status_data(c: Any) -> dict[str, Any]:
    return {
        "run_stats": c.run_stats(),
        "ledger_stats": c.ledger_stats(),
        "wait_stats": c.wait_stats(),
        "paused_queues": c.list_paused_queues(),
    }


def status_tables(data: dict[str, Any]) -> list[Any]:
    out = []
    for title, key in (("runs", "run_stats"), ("ledger", "ledger_stats"), ("waits", "wait_stats")):
        rows = data[key]
        if not rows and key == "wait_stats":
            continue
        columns = list(rows[0]) if rows else ["(empty)"]
        out.append(table(title, columns, [list(r.values()) for r in rows]))
    paused = data["paused_queues"]
    if paused:
        fields = ("queue", "reason", "paused_by", "paused_at")
        out.append(
            table("paused queues", fields, [[getattr(p, f) for f in fields] for p in paused])
        )
    return out


def cmd_status(args: argparse.Namespace) -> int:
    """The stats views once, or again every --interval with --watch (until
    Ctrl-C or --count refreshes): a live table, or a JSON line a refresh."""
    if not args.watch:
        with client(args) as c:
            data = status_data(c)
        if args.json:
            print_json(data)
        else:
            show(*status_tables(data))
        return EXIT_OK
    return _watch(args)


def _watch(args: argparse.Namespace) -> int:
    """Refresh until Ctrl-C (or --count refreshes). SIGINT only sets a flag:
    raised as KeyboardInterrupt in the middle of a query it could be lost in
    the driver's cancellation, and the watch would go on; the flag ends the
    loop after the refresh in flight."""

    from rich.console import Group
    from rich.live import Live

    interval = args.interval.total_seconds()
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    refreshes = 0

    def more() -> bool:
        nonlocal refreshes
        refreshes += 1
        if args.count is not None and refreshes >= args.count:
            return False
        return not stop.wait(interval)

    try:
        with client(args) as c:
            if args.json:
                while not stop.is_set():
                    print_json({"at": datetime.now(UTC), **status_data(c)}, lines=True)
                    if not more():
                        break
                return EXIT_OK
            with Live(console=console(), auto_refresh=False) as live:
                while not stop.is_set():
                    stamp = datetime.now(UTC).strftime("%H:%M:%SZ")
                    tables = status_tables(status_data(c))
                    heading = as_text(f"runrelay status, every {interval:g}s — {stamp}")
                    live.update(Group(heading, *tables))
                    live.refresh()
                    if not more():
                        break
        return EXIT_OK
    except KeyboardInterrupt:  # a Ctrl-C before the handler was set
        return EXIT_OK
    finally:
        signal.signal(signal.SIGINT, previous)


def status_options(p: argparse.ArgumentParser) -> None:
    _json(p)
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument(
        "--interval", type=_duration, default="2s", help="with --watch: time between refreshes"
    )
    p.add_argument(
        "--count", type=_positive_int, help="with --watch: stop after this many refreshes"
    )
