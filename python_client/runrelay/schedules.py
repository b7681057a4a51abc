"""Periodic runs: what a handler can read off a scheduled run.

Schedules are declared with `Client.upsert_schedule` (or
`Client.declare_schedules` for a list of `Schedule`s) and enqueued by the
maintenance loop (runrelay.maintenance) through enqueue_due_schedules: one
run per slot, named ``schedule:<name>:<slot in UTC>``, with ``run_at`` the
slot. See docs/operations.md, "Periodic runs".
"""

from __future__ import annotations

from datetime import UTC, datetime

PREFIX = "schedule:"
# The slot's part of a run_id: ISO 8601 in UTC to the second, e.g.
# 2030-01-01T02:00:00Z (_schedule_run_id in plpgsql/schedules/slots.sql).
_STAMP = len("2030-01-01T02:00:00Z")


def schedule_slot(run_id: str) -> tuple[str, datetime] | None:
    """(schedule name, slot) of a run a schedule enqueued; None for any other
    run_id. ``job.run_id`` in a handler tells which slot it runs for."""
    if not run_id.startswith(PREFIX) or len(run_id) < len(PREFIX) + _STAMP + 2:
        return None
    name, sep, stamp = run_id[len(PREFIX) : -_STAMP - 1], run_id[-_STAMP - 1], run_id[-_STAMP:]
    if sep != ":" or not name:
        return None
    try:
        slot = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return name, slot
