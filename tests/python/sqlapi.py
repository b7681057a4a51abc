"""Plain SQL calls of the runrelay API for tests that exercise the SQL layer
directly (the Python client has its own tests). Named arguments, as users of
other languages would call them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

T = TypeVar("T")

JSON_PARAMS = {"payload", "result", "error", "wait", "final_events", "events", "items"}


def call(conn: psycopg.Connection, function: str, **kwargs: Any) -> list[dict[str, Any]]:
    """SELECT * FROM runrelay.<function>(name => value, ...) and return dict rows."""
    args = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in kwargs
    )
    query = sql.SQL("SELECT * FROM runrelay.{}({})").format(sql.Identifier(function), args)
    params = {k: Jsonb(v) if k in JSON_PARAMS and v is not None else v for k, v in kwargs.items()}
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def scalar(conn: psycopg.Connection, function: str, **kwargs: Any) -> Any:
    """Call a function returning one value (an outcome string, a bool, ...)."""
    rows = call(conn, function, **kwargs)
    assert len(rows) == 1, rows
    return next(iter(rows[0].values()))


def enqueue(conn: psycopg.Connection, run_id: str, **kwargs: Any) -> dict[str, Any]:
    return call(conn, "enqueue_run", run_id=run_id, **kwargs)[0]


def claim_one(conn: psycopg.Connection, worker: str = "w1", **kwargs: Any) -> dict[str, Any]:
    rows = call(conn, "claim_attempts", worker=worker, **kwargs)
    assert len(rows) == 1, rows
    return rows[0]


def fenced(claim: dict[str, Any]) -> dict[str, Any]:
    """The (run_id, attempt, lease_token) arguments of a fenced write."""
    return {k: claim[k] for k in ("run_id", "attempt", "lease_token")}


def events(conn: psycopg.Connection, run_id: str, lane: str = "lifecycle") -> list[str]:
    rows = conn.execute(
        "SELECT type FROM runrelay.ledger WHERE run_id = %s AND lane = %s ORDER BY seq",
        [run_id, lane],
    ).fetchall()
    return [r[0] for r in rows]


def run_row(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM runrelay.runs WHERE run_id = %s", [run_id])
        row = cur.fetchone()
    assert row is not None
    return row


def backend_pid(conn: psycopg.Connection) -> int:
    return int(conn.info.backend_pid)


def wait_until_blocked(observer: psycopg.Connection, pid: int, timeout: float = 10.0) -> None:
    """Wait until backend `pid` is waiting on a lock (pg_stat_activity)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock")


def in_thread(fn: Callable[..., T], *args: Any) -> Future[T]:
    """`fn(*args)` on a thread of its own: the future holds its answer."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def queued_behind_lock(
    observer: psycopg.Connection, conn: psycopg.Connection, fn: Callable[[psycopg.Connection], T]
) -> Future[T]:
    """Start `fn(conn)` on a thread of its own and return once `conn`'s backend
    waits on a lock, so that the caller can then release the lock's holder."""
    future = in_thread(fn, conn)
    wait_until_blocked(observer, backend_pid(conn))
    return future


RUN_TABLES = (
    "runs",
    "attempts",
    "cancellations",
    "signals",
    "ledger",
    "ledger_lanes",
    "ledger_wakeups",
    "calls",
)
CHECKSUM_TABLES = (*RUN_TABLES, "paused_queues", "schedules")


def table_checksum(
    conn: psycopg.Connection, tables: Sequence[str] = CHECKSUM_TABLES, text: str = "t::text"
) -> str:
    """A digest of the runrelay tables' contents: equal before and after a
    call means the call changed nothing. `text`: the SQL expression that
    stands for a row `t` in the digest."""
    parts = []
    for table in tables:
        row = conn.execute(
            f"SELECT md5(coalesce(string_agg({text}, '|' ORDER BY {text}), ''))"
            f" FROM runrelay.{table} AS t"
        ).fetchone()
        assert row is not None
        parts.append(f"{table}:{row[0]}")
    return ";".join(parts)
