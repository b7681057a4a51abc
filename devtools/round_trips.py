"""Protocol round trips of the client's calls, counted in a libpq trace.

Every client method is one round trip (docs/python-client.md). The tests
hold every method to it (tests/python/test_client.py) and `make bench`
reports it, both with the calls below: arguments for every method that
succeed (with some outcome) when repeated on a database holding run "rt"
(enqueue it first), each call made CALLS_PER_METHOD times so that psycopg's
prepared path is counted too.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import pq

from runrelay.types import EnqueueItem

# psycopg runs a statement unnamed five times (its prepare_threshold), then
# prepares it on the sixth; the client sends those in pipeline mode and,
# from the seventh on, a prepared statement without it. Eight calls count
# every path twice but the preparing one.
CALLS_PER_METHOD = 8
TOKEN = uuid.UUID(int=1)


def calls(now: datetime) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Arguments for every method that succeed (with some outcome) when
    repeated on a database holding run "rt"."""
    fence = ("rt", 1, TOKEN)
    return {
        "get_schema_version": ((), {}),
        "enqueue_run": (("rt",), {"payload": {"k": 1}}),
        "enqueue_runs": (([EnqueueItem("rt", payload={"k": 1}), {"run_id": "rt2"}],), {}),
        "append_events": (("rt", [{"type": "x", "lane": "observability"}]), {}),
        "signal_run": (("missing", "go"), {}),
        "cancel_run": (("missing",), {}),
        "claim_attempts": (("w1",), {"queues": ["empty"]}),
        "heartbeat": (fence, {}),
        "record_step": ((*fence, "step-1", {"r": 1}), {}),
        "complete_attempt": (fence, {}),
        "complete_attempts": (([{"run_id": "rt", "attempt": 1, "lease_token": TOKEN}],), {}),
        "settle_and_claim": (
            ([{"run_id": "rt", "attempt": 1, "lease_token": TOKEN}], "w1"),
            {"queues": ["empty"]},
        ),
        "fail_attempt": ((*fence, {"e": 1}), {}),
        "suspend_attempt": ((*fence, {"kind": "event", "name": "n"}), {}),
        "release_attempt": (fence, {"reason": "shutdown"}),
        "prepare_waiting_failure": (fence, {}),
        "record_runner_terminal": (("missing", 1, {}), {}),
        "claim_detached_terminal": (fence, {}),
        "read_runner_terminal": (("rt", 1), {}),
        "reap_expired": ((), {}),
        "claim_ledger": (("relay-1",), {"run_id": "missing"}),
        "ack_ledger": (("relay-1", "rt", [1]), {"claim_next": 1}),
        "claim_ledger_runs": (("relay-1",), {"max_runs": 2}),
        "ack_ledger_runs": (("relay-1", [1]), {"claim_runs": 1}),
        "renew_ledger_lease": (("relay-1", [1]), {}),
        "release_ledger": (("relay-1", [1]), {}),
        "fail_ledger": (("relay-1", [1], {"e": 1}), {}),
        "ledger_next_due_at": ((), {}),
        "requeue_ledger_event": ((1,), {}),
        "prune": ((now - timedelta(days=1),), {}),
        "list_runs": ((), {"queue": "rt-none"}),
        "get_run": (("rt",), {}),
        "run_attempts": (("rt",), {}),
        "run_steps": (("rt",), {}),
        "run_ledger_events": (("rt",), {"max_rows": 5}),
        "retry_run": (("missing",), {}),
        "list_blocked_heads": ((), {"run_id": "rt"}),
        "requeue_blocked_heads": ((), {"run_id": "missing"}),
        "skip_ledger_events": (("missing", "lifecycle", "gone"), {}),
        "list_processes": ((), {}),
        "pause_queue": (("rt-paused",), {"reason": "test"}),
        "resume_queue": (("rt-never-paused",), {}),
        "list_paused_queues": ((), {}),
        "purge_runs": ((now - timedelta(days=1),), {}),
        "run_trace_context": (("rt",), {}),
        "upsert_schedule": (("rt-tick", "@hourly"), {"payload": {"k": 1}}),
        "delete_schedule": (("rt-none",), {}),
        "list_schedules": ((), {}),
        "enqueue_due_schedules": ((), {}),
        "schedules_next_due_at": ((), {}),
        "queue_overview": ((), {}),
        "ledger_overview": ((), {}),
        "record_queue_activity": ((), {}),
        "run_stats": ((), {}),
        "ledger_stats": ((), {}),
        "wait_stats": ((), {}),
    }


def frontend_round_trips(trace: str) -> int:
    """Round trips in a libpq trace: each frontend Sync (extended protocol)
    or Query (simple protocol) is answered by one ReadyForQuery."""
    count = 0
    for line in trace.splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and fields[0] == "F" and fields[2].split(" ")[0] in ("Sync", "Query"):
            count += 1
    return count


@contextlib.contextmanager
def traced(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Iterator[list[str]]:
    """Trace the connection's protocol messages; the text lands in the list."""
    out: list[str] = []
    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield out
        finally:
            conn.pgconn.untrace()
            f.seek(0)
            out.append(f.read())
