"""`runrelay ledger blocked|show|requeue|skip`."""

from __future__ import annotations

import argparse
from typing import Any

from .common import EXIT_OK, EXIT_REFUSED, _not_found, _pages, _usage, client
from .output import brief, count, line, plain, print_json, say, show, table
from .runs import EVENT_COLUMNS, _event_row

# -- ledger ---------------------------------------------------------------------
BLOCKED_COLUMNS = ("run_id", "lane", "event_id", "seq", "type", "tries", "failed", "last_error")


def cmd_ledger_blocked(args: argparse.Namespace) -> int:
    with client(args) as c:
        heads = c.list_blocked_heads(lane=args.lane, run_id=args.run_id, max_rows=args.limit)
    if args.json:
        print_json(heads)
        return EXIT_OK
    rows = [
        [
            h.run_id,
            h.lane,
            h.event_id,
            h.seq,
            h.type,
            h.delivery_attempts,
            h.failed_at,
            brief(h.last_error),
        ]
        for h in heads
    ]
    show(table(None, BLOCKED_COLUMNS, rows))
    return EXIT_OK


def cmd_ledger_show(args: argparse.Namespace) -> int:
    with client(args) as c:
        if c.get_run(args.run_id) is None:
            raise _not_found(f"run: {args.run_id!r}")
        events = _pages(
            lambda after: c.run_ledger_events(
                args.run_id, lane=args.lane, after_seq=after or args.after_seq, max_rows=100
            ),
            lambda e: e.seq,
            args.limit,
        )
    if args.json:
        print_json(events)
    else:
        show(table(f"ledger of {args.run_id}", EVENT_COLUMNS, [_event_row(e) for e in events]))
    return EXIT_OK


def cmd_ledger_requeue(args: argparse.Namespace) -> int:
    """One blocked event by id, or the blocked lanes of a run, or every
    blocked lane (--all), optionally of one lane."""
    chosen = [args.event_id is not None, args.run_id is not None, args.all]
    if sum(chosen) != 1:
        raise _usage("pass exactly one of EVENT_ID, --run-id RUN or --all")
    if args.lane is not None and args.event_id is not None:
        raise _usage("--lane goes with --run-id or --all, not with an event id")
    with client(args) as c:
        if args.event_id is not None:
            requeued = bool(c.requeue_ledger_event(args.event_id))
            text = "requeued" if requeued else "not blocked (or no such event): nothing requeued"
            say(args, {"event_id": args.event_id, "requeued": requeued}, f"{args.event_id}: {text}")
            return EXIT_OK if requeued else EXIT_REFUSED
        lanes: list[Any] = []
        while True:
            batch = c.requeue_blocked_heads(run_id=args.run_id, lane=args.lane, max_lanes=100)
            lanes.extend(batch)
            if len(batch) < 100:
                break
    if args.json:
        print_json(lanes)
    else:
        for lane in lanes:
            line(f"{lane.run_id} {lane.lane}: {count(lane.requeued, 'event')} requeued")
        line(f"{count(len(lanes), 'lane')} unblocked")
    return EXIT_OK


def cmd_ledger_skip(args: argparse.Namespace) -> int:
    """Give up a lane's blocked head: it ends as skipped and the lane goes on
    with its successors. Exit 1 when the lane was not blocked."""
    with client(args) as c:
        [row] = c.skip_ledger_events(args.run_id, args.lane, args.reason, call_id=args.call_id)
    where = f"{args.run_id} {args.lane}"
    if row.outcome == "skipped":
        text = f"{where}: event {row.event_id} (seq {row.seq}) skipped; the lane goes on"
    else:
        text = f"{where}: not blocked, nothing skipped"
    say(args, plain(row), text)
    return EXIT_OK if row.outcome == "skipped" else EXIT_REFUSED
