"""The `runrelay` command line, one module per command family.

    common     exit codes, the errors that carry them, argument parsers, the
               URL and the client a command connects with
    output     tables for people, JSON for scripts, every byte from the
               database escaped on its way to the terminal
    parser     the argument parser of every command
    main       the entry point: run a command, map what it raised to an exit code
    schema     migrate, downgrade
    loops      worker, relay, maintain, exporter
    dashboard  dashboard
    demo       demo
    runs       runs list|show|enqueue|cancel|signal|retry|purge
    ledger     ledger blocked|show|requeue|skip
    status     status [--watch], processes, queues list|pause|resume
    schedules  schedules list|set|delete

The operators' commands (runs, ledger, queues, schedules, status) are each
one call of the SQL API (or a few pages of one), made by the login of
--database-url: the admin functions need a role granted `<schema>_admin`,
and `runs enqueue|cancel|signal` the producer functions (`<schema>_producer`).
Tables for people; `--json` prints the same data as JSON for scripts (one
document, or one line a refresh for `status --watch --json`).

Exit codes, so a script can branch on them:

* 0 — done, or the state asked for already holds (a queue already paused, a
  cancel recorded while a worker still holds the run);
* 1 — the command failed, or was refused by the run's state (retry of a run
  that did not fail, cancel or signal of an ended run, requeue of an event
  that is not blocked), or the login lacks the role;
* 2 — bad usage, or the database rejected an argument (SQLSTATE 22023: a
  bad cron expression or time zone too);
* 3 — the database could not be reached or has no runrelay schema;
* 4 — no such run, event or schedule.
"""

from __future__ import annotations

from .common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CommandError,
)
from .main import main
from .parser import build_parser

__all__ = [
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CommandError",
    "build_parser",
    "main",
]
