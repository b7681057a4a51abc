"""`runrelay runs list|show|enqueue|cancel|signal|retry|purge`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Any

from ..types import presumed_dead_holder
from .common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    _not_found,
    _outcome,
    _pages,
    _usage,
    client,
)
from .output import brief, count, line, plain, print_json, record, say, show, table

# -- runs -----------------------------------------------------------------------
RUN_COLUMNS = ("run_id", "queue", "status", "attempts", "created", "finished", "error")


def _run_row(run: Any) -> list[Any]:
    return [
        run.run_id,
        run.queue,
        run.status,
        f"{run.attempt_count}/{run.max_attempts}",
        run.created_at,
        run.finished_at,
        brief(run.error),
    ]


def cmd_runs_list(args: argparse.Namespace) -> int:
    filters = {
        "queue": args.queue,
        "status": args.status,
        "concurrency_key": args.key,
        "created_after": args.created_after,
        "created_before": args.created_before,
        "finished_before": args.finished_before,
    }
    after = (args.after_created_at, args.after_run_id)
    if (after[0] is None) != (after[1] is None):
        raise _usage("pass --after-created-at and --after-run-id together (a page's last row)")
    runs: list[Any] = []
    with client(args) as c:
        while True:
            page = c.list_runs(
                **filters, after_created_at=after[0], after_run_id=after[1], max_rows=args.limit
            )
            runs.extend(page)
            if not args.all or len(page) < args.limit:
                break
            after = (page[-1].created_at, page[-1].run_id)
    if args.json:
        print_json(runs)
    else:
        show(table(None, RUN_COLUMNS, [_run_row(r) for r in runs]))
        if not args.all and len(runs) == args.limit:
            last = runs[-1]
            line(
                f"next page: --after-created-at '{last.created_at.isoformat()}' "
                f"--after-run-id '{last.run_id}'",
                file=sys.stderr,
            )
    return EXIT_OK


def cmd_runs_show(args: argparse.Namespace) -> int:
    with client(args) as c:
        run = c.get_run(args.run_id)
        if run is None:
            raise _not_found(f"run: {args.run_id!r}")
        attempts = _pages(
            lambda after: c.run_attempts(args.run_id, after_attempt=after or 0, max_rows=100),
            lambda a: a.attempt,
            args.limit,
        )
        events = _pages(
            lambda after: c.run_ledger_events(args.run_id, after_seq=after or 0, max_rows=100),
            lambda e: e.seq,
            args.limit,
        )
        steps = _pages(
            lambda after: c.run_steps(args.run_id, after_position=after or 0, max_rows=100),
            lambda s: s.position,
            args.limit,
        )
        processes = []
        if str(run.status) == "running":
            import psycopg

            # Through a sharded install's proxy list_processes is not
            # available (each shard has its own): no holder is named then.
            with contextlib.suppress(psycopg.errors.FeatureNotSupported):
                processes = c.list_processes()
    dead = presumed_dead_holder(attempts, processes)
    if args.json:
        print_json(
            {
                "run": run,
                "attempts": attempts,
                "steps": steps,
                "events": events,
                "held_by_dead_worker": dead,
            }
        )
        return EXIT_OK
    fields = [(_field_name(run, f.name), getattr(run, f.name)) for f in dataclasses.fields(run)]
    show(
        record(f"run {run.run_id}", fields),
        table("attempts", ATTEMPT_COLUMNS, [_attempt_row(a) for a in attempts]),
        table("steps", STEP_COLUMNS, [_step_row(s) for s in steps]),
        table("ledger events", EVENT_COLUMNS, [_event_row(e) for e in events]),
    )
    if dead is not None:
        line(
            f"held by worker {dead}, presumed dead: a lease it holds has expired "
            "(the reaper hands the run back)"
        )
    return EXIT_OK


def _field_name(run: Any, name: str) -> str:
    """A run's error is the run's only once it failed; before, it is the
    error of an earlier attempt of a run that went on."""
    if name == "error" and run.error is not None and str(run.status) != "failed":
        return "error (an earlier attempt's; the run went on)"
    return name


ATTEMPT_COLUMNS = ("attempt", "worker", "status", "claimed", "finished", "outcome", "error")

STEP_COLUMNS = ("#", "step", "attempt", "recorded", "result")


def _step_row(s: Any) -> list[Any]:
    return [s.position, s.step, s.attempt, s.recorded_at, s.result]


def _attempt_row(a: Any) -> list[Any]:
    return [a.attempt, a.worker, a.status, a.claimed_at, a.finished_at, a.outcome, brief(a.error)]


EVENT_COLUMNS = ("seq", "event_id", "lane", "type", "state", "tries", "created", "last_error")


def _event_row(e: Any) -> list[Any]:
    return [
        e.seq,
        e.event_id,
        e.lane,
        e.type,
        e.state,
        e.delivery_attempts,
        e.created_at,
        brief(e.last_error),
    ]


def cmd_runs_enqueue(args: argparse.Namespace) -> int:
    with client(args) as c:
        result = c.enqueue_run(
            args.run_id,
            queue=args.queue,
            payload=args.payload,
            run_at=args.run_at,
            priority=args.priority,
            max_attempts=args.max_attempts,
            payload_retention=args.payload_retention,
            concurrency_key=args.key,
            task=args.task,
        )
    word = "enqueued" if result.created else "exists (same queue, task and payload)"
    say(args, plain(result), f"{result.run_id}: {word}, {result.status}")
    return EXIT_OK


# An outcome's exit code: 0 unless listed.
CANCEL_EXITS = {"already_terminal": EXIT_REFUSED, "not_found": EXIT_NOT_FOUND}

SIGNAL_EXITS = {"terminal": EXIT_REFUSED, "not_found": EXIT_NOT_FOUND}

RETRY_EXITS = {"not_retryable": EXIT_REFUSED, "not_found": EXIT_NOT_FOUND}


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.cancel_run(args.run_id, reason=args.reason)
    return _outcome(args, args.run_id, outcome, CANCEL_EXITS)


def cmd_runs_signal(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.signal_run(args.run_id, args.name, payload=args.payload)
    return _outcome(args, args.run_id, outcome, SIGNAL_EXITS)


def cmd_runs_retry(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.retry_run(
            args.run_id,
            max_attempts=args.max_attempts,
            run_at=args.run_at,
            reason=args.reason,
            requested_by=args.requested_by,
        )
    return _outcome(args, args.run_id, outcome, RETRY_EXITS)


def cmd_runs_purge(args: argparse.Namespace) -> int:
    """purge_runs in batches until none is left (or --max-runs is reached)."""
    deleted = 0
    with client(args) as c:
        while args.max_runs is None or deleted < args.max_runs:
            batch = (
                args.batch if args.max_runs is None else min(args.batch, args.max_runs - deleted)
            )
            done = c.purge_runs(
                args.finished_before,
                max_rows=batch,
                include_undelivered=args.include_undelivered,
            )
            deleted += done
            if done == 0:
                break
    cutoff = args.finished_before.isoformat()
    say(
        args,
        {"deleted": deleted, "finished_before": cutoff},
        f"deleted {count(deleted, 'run')} that ended before {cutoff}",
    )
    return EXIT_OK
