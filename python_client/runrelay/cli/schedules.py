"""`runrelay schedules list|set|delete`."""

from __future__ import annotations

import argparse
from typing import Any

from .common import EXIT_NOT_FOUND, EXIT_OK, client
from .output import print_json, say, show, table

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
