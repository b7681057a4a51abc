"""The operators' commands of `runrelay`: find, inspect and act on runs,
deliveries and queues without writing SQL.

    runrelay runs list|show|enqueue|cancel|signal|retry|purge
    runrelay ledger blocked|show|requeue
    runrelay queues list|pause|resume
    runrelay schedules list|set|delete
    runrelay status --watch

Each is one call of the SQL API (or a few pages of one), made by the login of
--database-url: the admin functions need a role granted `<schema>_admin`,
and `runs enqueue|cancel|signal` the producer functions (`<schema>_producer`).
Tables for people; `--json` prints the same data as JSON for scripts (one
document, or one line a refresh for `status --watch --json`).

Whatever came from the database reaches the terminal through `printable`
(plain lines, error messages) or `text` (table cells and titles): rich
markup in data (`[bold]`, `[link=...]`, a traceback's `HANDLERS[job.queue]`)
is printed as it is, never interpreted, and control characters are shown
escaped (`\x1b`, `\n`), so a run id, payload or error cannot move the cursor,
recolour the screen, hide text or forge a line. JSON output is exact JSON
(its encoder escapes every control character).

Exit codes, so a script can branch on them:

* 0 — done, or the state asked for already holds (a queue already paused, a
  cancel recorded while a worker still holds the run);
* 1 — refused by the run's state (retry of a run that did not fail, cancel or
  signal of an ended run, requeue of an event that is not blocked), or the
  login lacks the role;
* 2 — bad usage, or the database rejected an argument (SQLSTATE 22023: a
  bad cron expression or time zone too);
* 3 — the database could not be reached or has no runrelay schema;
* 4 — no such run, event or schedule.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from .cli import CommandError, _duration, _positive_int, _reason, _require_url
from .contract import LANES, RUN_STATUSES
from .types import presumed_dead_holder

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 4


# Command: (args) -> exit code. Registered by cli.build_parser through add_commands.
Command = Callable[[argparse.Namespace], int]


class Refused(Exception):
    """An outcome that is not an error but that a script must see: printed,
    then the command exits with `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# -- values on the command line ---------------------------------------------
def _moment(text: str, direction: int, example: str) -> datetime:
    """An ISO 8601 timestamp (UTC when it names no offset), or a duration
    from this host's clock: back (direction -1) or ahead (+1)."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:
            return datetime.now(UTC) + direction * _duration(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"not a timestamp or a duration: {text!r} (e.g. 2026-12-01T10:00:00Z, {example})"
            ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def when(text: str) -> datetime:
    """A moment: a timestamp, or a duration ago ('15m', '2h', '7d')."""
    return _moment(text, -1, "2h, 7d")


def later(text: str) -> datetime:
    """A moment ahead: a timestamp, or a duration from now ('10m')."""
    return _moment(text, +1, "10m")


def json_value(text: str) -> Any:
    """A JSON document: inline, '@path' to read a file, or '-' for stdin."""
    if text == "-":
        source = sys.stdin.read()
    elif text.startswith("@"):
        try:
            source = Path(text[1:]).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]!r}: {exc.strerror}") from None
    else:
        source = text
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _page_size(text: str) -> int:
    value = _positive_int(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"at most 1000: {value}")
    return value


# -- output -----------------------------------------------------------------
# What a terminal would act on instead of showing: C0 and C1 control
# characters, DEL, and the bidirectional marks, embeddings, overrides and
# isolates that reorder the text after them on the screen.
_BIDI = "\u200e\u200f\u202a-\u202e\u2066-\u2069"
_ANY_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
# The same but the newline, for the texts that are several lines.
_CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_BIDI}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: Any, *, lines: bool = False) -> str:
    """Data as the terminal may show it: every control character escaped
    (ESC as `\\x1b`, a newline as `\\n`, U+202E as `\\u202e`), except the
    newlines of a multi-line text when `lines` is set. The one rule for all
    the output of the commands; with rich, `as_text`."""
    return (_CONTROL_BUT_NEWLINE if lines else _ANY_CONTROL).sub(_escaped, str(value))


def as_text(value: Any, *, lines: bool = False) -> Any:
    """`printable(value)` as a rich Text, which rich prints as it is: markup
    such as `[bold]` or `[link=...]` in data is never interpreted."""
    from rich.text import Text

    return Text(printable(value, lines=lines))


def line(value: Any, *, file: Any = None) -> None:
    """Print one line of data (printable) to stdout, or to `file`."""
    print(printable(value), file=file or sys.stdout, flush=True)


def plain(value: Any) -> Any:
    """A result as JSON-ready data: dataclasses as objects, enums as their
    value, timestamps in ISO 8601, uuids as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def print_json(value: Any, *, lines: bool = False) -> None:
    text = json.dumps(plain(value), default=str, indent=None if lines else 2)
    print(text, flush=True)


def cell(value: Any) -> str:
    """One table cell: timestamps to the second in UTC, JSON compact, None empty."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    if isinstance(value, float | Decimal):
        return f"{value:.1f}"
    return str(value)


def brief(error: Any) -> Any:
    """An error for a table cell: its message when it has one (--json and
    `runs show`'s record give all of it)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return error


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    from rich.table import Table

    out = Table(
        title=None if title is None else as_text(title), title_justify="left", show_lines=False
    )
    for number, column in enumerate(columns, 1):
        # Every column but the last keeps a value on one line; the last folds.
        out.add_column(as_text(column), no_wrap=number < len(columns), overflow="fold")
    for row in rows:
        out.add_row(*(as_text(cell(v)) for v in row))
    return out


def record(title: str, fields: Sequence[tuple[str, Any]]) -> Any:
    """A table of one record: a name and a value per line."""
    from rich.table import Table

    out = Table(title=as_text(title), title_justify="left", show_header=False)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for name, value in fields:
        out.add_row(as_text(name), as_text(cell(value)))
    return out


def console() -> Any:
    """A rich console. Piped (not a terminal) and without $COLUMNS, lines may
    be as wide as a table needs, up to 240 characters, instead of rich's 80:
    a script or a pager then gets one line a row. Markup and emoji codes
    are off: what it prints is data (see `as_text`)."""
    import os

    from rich.console import Console

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(
        soft_wrap=False, width=240 if wide else None, markup=False, emoji=False, highlight=False
    )


def show(*renderables: Any) -> None:
    out = console()
    for item in renderables:
        out.print(item)


def count(n: int, noun: str) -> str:
    """'1 run', '3 runs'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def say(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    """An action's answer: `data` as JSON with --json, else one line."""
    if args.json:
        print_json(data)
    else:
        line(text)


# -- the connection -----------------------------------------------------------
@contextmanager
def client(args: argparse.Namespace) -> Iterator[Any]:
    """A Client on one connection of --database-url. The database's typed
    errors become the command's exit codes: bad input 2, a missing role 1."""
    from .client import Client
    from .errors import (
        InvalidArgument,
        PayloadTooLarge,
        PermissionDenied,
        RunrelayError,
        SchemaMissing,
    )

    url = _require_url(args)
    try:
        with Client(url, schema=args.schema) as c:
            # First the install's version: a missing schema is then one line
            # ("run runrelay migrate"), whatever the command reads after.
            c.get_schema_version()
            yield c
    except (InvalidArgument, PayloadTooLarge) as exc:
        raise CommandError(f"rejected: {exc}", EXIT_USAGE) from None
    except PermissionDenied as exc:
        raise CommandError(
            f"{exc}: the login needs {args.schema}_admin (runs enqueue, cancel and signal: "
            f"{args.schema}_producer)",
            EXIT_REFUSED,
        ) from None
    except SchemaMissing:
        raise
    except RunrelayError as exc:
        raise CommandError(str(exc), EXIT_REFUSED) from None


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


def _usage(message: str) -> Exception:
    return CommandError(message, EXIT_USAGE)


def _not_found(what: str) -> Exception:
    return CommandError(f"no such {what}", EXIT_NOT_FOUND)


def _pages(
    fetch: Callable[[Any], list[Any]], position: Callable[[Any], Any], limit: int
) -> list[Any]:
    """Rows of a paged read, page after page, up to `limit` rows."""
    rows: list[Any] = []
    after = None
    while len(rows) < limit:
        page = fetch(after)
        rows.extend(page[: limit - len(rows)])
        if not page:
            break
        after = position(page[-1])
    return rows


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


def _outcome(args: argparse.Namespace, run_id: str, outcome: Any, exits: dict[str, int]) -> int:
    text = str(outcome)
    say(args, {"run_id": run_id, "outcome": text}, f"{run_id}: {text}")
    return exits.get(text, EXIT_OK)


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


# -- schedules --------------------------------------------------------------------
SCHEDULE_COLUMNS = ("name", "cron", "time_zone", "queue", "missed", "enabled", "next slot",
                    "last slot")  # fmt: skip


def _schedules(c: Any) -> list[Any]:
    """Every schedule, by name, a page of list_schedules after another."""
    found: list[Any] = []
    while page := c.list_schedules(found[-1].name if found else None, 1000):
        found += page
    return found


def cmd_schedules_list(args: argparse.Namespace) -> int:
    with client(args) as c:
        schedules = _schedules(c)
    if args.json:
        print_json(schedules)
        return EXIT_OK
    rows = [
        [s.name, s.cron, s.time_zone, s.queue, s.missed, s.enabled, s.next_slot_at, s.last_slot_at]
        for s in schedules
    ]
    show(table("schedules", SCHEDULE_COLUMNS, rows))
    return EXIT_OK


def cmd_schedules_set(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.upsert_schedule(
            args.name,
            args.cron,
            time_zone=args.time_zone,
            queue=args.queue,
            payload=args.payload,
            priority=args.priority,
            max_attempts=args.max_attempts,
            concurrency_key=args.key,
            missed=args.missed,
            enabled=not args.disabled,
        )
        (schedule,) = [s for s in _schedules(c) if s.name == args.name]
    next_slot = schedule.next_slot_at.isoformat() if schedule.next_slot_at else None
    say(
        args,
        {"name": args.name, "outcome": str(outcome), "next_slot_at": next_slot},
        f"{args.name}: {outcome}, next slot {next_slot or 'none (disabled)'}",
    )
    return EXIT_OK


def cmd_schedules_delete(args: argparse.Namespace) -> int:
    with client(args) as c:
        outcome = c.delete_schedule(args.name)
    say(args, {"name": args.name, "outcome": str(outcome)}, f"{args.name}: {outcome}")
    return EXIT_OK if outcome == "deleted" else EXIT_NOT_FOUND


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
    import signal
    import threading

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


def status_options(p: argparse.ArgumentParser) -> None:
    _json(p)
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument(
        "--interval", type=_duration, default="2s", help="with --watch: time between refreshes"
    )
    p.add_argument(
        "--count", type=_positive_int, help="with --watch: stop after this many refreshes"
    )


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
