"""Backlog growth: does a claim cost the same with 1 000 or 1 000 000 pending?

For each size, one worker (no contention: this isolates plan cost) issues
serial calls against a backlog loaded straight into the tables and ANALYZEd:

* `claim_attempts` + `complete_attempt` with `size` queued runs, then the
  Worker's default path on the same backlog: `settle_and_claim` completing
  the run it holds and claiming the next;
* `claim_ledger` (head, discovery) + `ack_ledger` with `size` pending events
  spread over size / 100 runs (100 events each), and `ledger_next_due_at`
  on the same backlog — at 1 000 000 events that is 10 000 runs pending.

After the timed repetitions, one more series runs with pg_stat_statements
tracking every statement (nested ones too; untimed, since tracking costs):
the shared buffers each statement touches per call are the plan-shape
evidence next to the timing.
A small backlog is reloaded before every repetition; a large one is loaded
once (the few hundred claims do not change its size materially). Each load
ends with ANALYZE and a CHECKPOINT.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench import runrelay as rr
from bench._load import Recorder, Window, run_serial
from bench._server import tracked
from bench.stats import summarize
from runrelay import Client
from runrelay.types import LedgerKind

RELOAD_BELOW = 100_000  # sizes below this are reloaded before every repetition

TOP_STATEMENTS = """
SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query, calls,
       round((total_exec_time / calls)::numeric, 4) AS mean_ms,
       round(((shared_blks_hit + shared_blks_read)::numeric / calls), 1) AS buffers_per_call,
       round((wal_fpi::numeric / calls), 2) AS wal_fpi_per_call,
       round((wal_bytes / calls), 0) AS wal_bytes_per_call
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND calls > 0
ORDER BY total_exec_time DESC
LIMIT %s
"""


def top_statements(url: str, limit: int = 10) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(TOP_STATEMENTS, [limit])
        cols = [c.name for c in cur.description or []]
        return [
            {
                k: (float(v) if k in ("mean_ms", "buffers_per_call") else v)
                for k, v in zip(cols, r, strict=True)
            }
            for r in cur.fetchall()
        ]


def reset_statements(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _claim_complete(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    return rr.single(conn, index)


def _settle_and_claim(
    conn: psycopg.Connection[Any], index: int
) -> Callable[[Recorder], int | None]:
    return rr.fused(1)(conn, index)


def _claim_ack_ledger(
    conn: psycopg.Connection[Any], index: int
) -> Callable[[Recorder], int | None]:
    client = Client(conn)

    def step(rec: Recorder) -> int | None:
        rows = rec.timed("claim_ledger", client.claim_ledger, "relay-b")
        rows = [e for e in rows if e.kind is LedgerKind.CLAIMED]
        if not rows:
            return None
        rec.timed("ack_ledger", client.ack_ledger, "relay-b", rows[0].run_id, [rows[0].event_id])
        return 1

    return step


def _next_due(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    client = Client(conn)

    def step(rec: Recorder) -> int | None:
        rec.timed("ledger_next_due_at", client.ledger_next_due_at)
        return 1

    return step


def _load(url: str, kind: str, size: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        rr.reset(conn)
        if kind == "runs":
            rr.load_runs(conn, size)
        else:
            rr.load_ledger(conn, max(1, size // 100), min(size, 100))
        conn.execute(rr.ANALYZE)
        # Measure steady state, not the full-page writes and background
        # flushing that follow a bulk load of up to 1 GB of WAL.
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def measure(url: str, plan: Any, log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": list(plan.sizes), "samples": plan.samples, "by_size": {}}
    for size in plan.sizes:
        entry: dict[str, Any] = {"load_seconds": {}}
        for kind, factory, ops in (
            ("runs", _claim_complete, "claim_attempts"),
            ("runs", _settle_and_claim, "settle_and_claim"),
            ("ledger", _claim_ack_ledger, "claim_ledger"),
        ):
            log(f"backlog: {size:,} pending {kind} ({ops})")
            windows: list[Window] = []
            due: list[Window] = []
            if ops == "settle_and_claim" and size >= RELOAD_BELOW:
                pass  # the large runs backlog is still loaded
            else:
                entry["load_seconds"][kind] = round(_load(url, kind, size), 2)
            for rep in range(plan.reps):
                if rep and size < RELOAD_BELOW:
                    _load(url, kind, size)
                windows.append(run_serial(url, factory, plan.samples))
                if kind == "ledger":
                    due.append(run_serial(url, _next_due, plan.samples))
            if size < RELOAD_BELOW:
                _load(url, kind, size)
            reset_statements(url)
            run_serial(tracked(url), factory, plan.samples)
            if kind == "ledger":
                run_serial(tracked(url), _next_due, plan.samples)
            entry[f"{ops}_statements"] = top_statements(url)
            entry[ops] = summarize(windows, "calls/s")
            if due:
                entry["ledger_next_due_at"] = summarize(due, "calls/s")
                entry["runs_pending"] = max(1, size // 100)
        out["by_size"][str(size)] = entry
    with psycopg.connect(url, autocommit=True) as conn:
        rr.reset(conn)
    return out
