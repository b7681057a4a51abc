"""What the SQL and this package must agree on, in one place.

Each value names its home in the SQL beside it, and
tests/python/test_contract.py holds each to an installed schema, so a change
on one side that misses the other fails there instead of in production (a
new wait kind the metrics did not list would have exported nothing).
"""

from __future__ import annotations

from .types import Lane, RunStatus

# runs.status: the rule runs_status of the runs table (_runs_rules).
RUN_STATUSES: tuple[RunStatus, ...] = tuple(RunStatus)

# A run that ended: the rule runs_finished_iff_terminal (finished_at is set
# exactly for these).
TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
)

# A run's two ledger lanes: _check_lane.
LANES: tuple[Lane, ...] = tuple(Lane)

# The kinds of typed wait: the rows of _wait_kinds().
WAIT_KINDS = ("sleep", "event", "detached_runner")

# A lease, in seconds: _lease clamps a requested length to MIN..MAX, and
# null is DEFAULT.
LEASE_SECONDS_MIN = 5
LEASE_SECONDS_MAX = 300
LEASE_SECONDS_DEFAULT = 30

# A reason (cancel_run, release_attempt, pause_queue, skip_ledger_events):
# at most this many characters, _check_reason.
REASON_CHARS = 2000

# The message of a handler's or a sink's exception, as the worker and the
# relay store it in an error: cut to this many characters (the package's own
# cap; the error as a whole is held to the payload cap by the SQL).
MESSAGE_CHARS = 2000

# The kinds of NOTIFY channel an install has: a queue has runnable work
# (runs), a lane has events to deliver (ledger), a run ended (terminal),
# events were acknowledged (delivered), a held run was cancelled (cancel).
# _channel(kind) names them in SQL.
CHANNEL_KINDS = ("runs", "ledger", "terminal", "delivered", "cancel")


def channel(schema: str, kind: str) -> str:
    """The name of an install's NOTIFY channel of one kind: `<schema>_<kind>`
    (`runrelay_runs` for the default install); SQL's `_channel(kind)` gives
    the same. NOTIFY is database-wide, so the install's schema is part of the
    name and two installs in one database never wake each other."""
    if kind not in CHANNEL_KINDS:
        raise ValueError(
            f"no NOTIFY channel of kind {kind!r}: use one of {', '.join(CHANNEL_KINDS)}"
        )
    return f"{schema}_{kind}"
