"""Fault tools for runrelay's reliability suite (tests/python/test_faults.py).

Everything here is real: a TCP proxy on the wire between a client and
PostgreSQL, child processes running the shipped Worker and Relay loops, and
signals, backend terminations and server crashes against a live server.

* `TcpProxy` — forwards the PostgreSQL protocol and, when armed, injects an
  *ambiguous commit*: ``drop_request`` closes before forwarding the call
  (nothing ran), ``drop_before_commit`` runs the statement but replaces its
  Sync with a Flush and cuts the link once it finished (executed, then rolled
  back by the disconnect), ``drop_reply_after_commit`` forwards the call and
  swallows the whole reply up to and including ReadyForQuery (committed) before
  cutting the link. The proxy decodes every reply it sees (RowDescription,
  DataRow, ErrorResponse, ReadyForQuery), so the checker can compare what the
  server answered to the lost call with what it answers to the replay.
* `History` / `RecordingClient` — every call logged as invoke -> ok(result) /
  fail(SQLSTATE) / info (indeterminate: the connection was lost mid-call, or
  the process died). An ``info`` call is repeated with the same arguments
  (linked by ``replay_of``) until it resolves; it is never counted as failed.
* `Checker` — reads a history, the final database and a consumer's sink log
  and reports violations of invariants I1-I11 (docs/guarantees.md) plus coverage counters.
* Process tools — `spawn_worker` / `spawn_relay` run the product's loops in
  child processes (this file's ``__main__``), recording their histories to
  JSON-lines files, so tests can SIGKILL, SIGSTOP and SIGCONT them.
* Database tools — `terminate_backend`, `row_images`, `shifted` (the database
  clock moved with ``runrelay.clock_offset``).

Clocks: lease expiries come from the database clock (runrelay._now(), i.e.
statement_timestamp() of a server on this host); the history records wall
time (time.time(), the same system clock) and monotonic time. Lease windows
are compared on the wall/database clock; tests that shift the database clock
keep those sessions out of lease-window checks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from runrelay import Client
from runrelay.errors import RunrelayError, ShardUnavailable
from sqlapi import RUN_TABLES, table_checksum, wait_until_blocked

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# SQLSTATEs that mean "the session died": the call's fate is unknown to the caller.
INDETERMINATE_SQLSTATES = {"57P01", "57P02", "57P03", "08000", "08003", "08006", "08001"}


# =============================================================================
# PostgreSQL wire protocol
# =============================================================================
def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\0", pos)
    return buf[pos:end].decode("utf-8", "replace"), end + 1


FLUSH = b"H\x00\x00\x00\x04"
_FUNCTION = re.compile(r"\.\"?([a-z_]+)\"?\(")


@dataclasses.dataclass
class Exchange:
    """One statement seen by the proxy and what the server answered to it."""

    link: int
    query: str
    function: str | None
    columns: list[str] = dataclasses.field(default_factory=list)
    rows: list[tuple[str | None, ...]] = dataclasses.field(default_factory=list)
    sqlstate: str | None = None
    status: str | None = None  # ReadyForQuery transaction status
    fault: str | None = None
    committed: bool | None = None

    def raw(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "columns": self.columns,
            "rows": [list(r) for r in self.rows],
            "sqlstate": self.sqlstate,
            "fault": self.fault,
            "committed": self.committed,
        }


@dataclasses.dataclass
class Rule:
    """An armed fault: fires once, on the first request whose bytes hold `pattern`."""

    mode: str
    pattern: bytes
    fired: threading.Event = dataclasses.field(default_factory=threading.Event)
    exchange: Exchange | None = None


MODES = ("drop_request", "drop_before_commit", "drop_reply_after_commit")


class _Link:
    """One client connection through the proxy: two pump threads."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, server: socket.socket, n: int):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.n = n
        self.mode: str | None = None
        self.rule: Rule | None = None
        self.current: Exchange | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        for target in (self._upstream, self._downstream):
            threading.Thread(target=target, daemon=True, name=f"proxy-{self.n}").start()

    def cut(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _fire(self, exchange: Exchange) -> None:
        assert self.rule is not None
        exchange.fault = self.rule.mode
        self.rule.exchange = exchange
        self.proxy._fired(self.rule)
        self.rule.fired.set()
        self.cut()

    # client -> server -------------------------------------------------------
    def _upstream(self) -> None:
        buf = b""
        started = False
        try:
            while not self._closed.is_set():
                data = self.client.recv(65536)
                if not data:
                    break
                buf += data
                out = bytearray()
                while True:
                    if not started:
                        if len(buf) < 8:
                            break
                        size = int.from_bytes(buf[:4], "big")
                        if len(buf) < size:
                            break
                        msg, buf = buf[:size], buf[size:]
                        code = int.from_bytes(msg[4:8], "big")
                        if code in (80877103, 80877104):  # SSL / GSS encryption request
                            self.client.sendall(b"N")
                            continue
                        started = code == 196608
                        out += msg
                        continue
                    if len(buf) < 5:
                        break
                    size = 1 + int.from_bytes(buf[1:5], "big")
                    if len(buf) < size:
                        break
                    msg, buf = buf[:size], buf[size:]
                    forward = self._request(msg)
                    if forward is None:
                        return
                    out += forward
                if out:
                    self.server.sendall(bytes(out))
        except OSError:
            pass
        finally:
            self.cut()

    def _request(self, msg: bytes) -> bytes | None:
        kind = msg[:1]
        if kind in (b"P", b"Q"):
            body = msg[5:]
            if kind == b"P":
                _, pos = _cstring(body, 0)
                query, _ = _cstring(body, pos)
            else:
                query, _ = _cstring(body, 0)
            match = _FUNCTION.search(query)
            exchange = Exchange(self.n, query, match.group(1) if match else None)
            self.current = exchange
            self.proxy._log(exchange)
            rule = self.proxy._take(msg)
            if rule is not None:
                self.rule = rule
                if rule.mode == "drop_request":
                    exchange.committed = False
                    self._fire(exchange)
                    return None
                self.mode = rule.mode
        if kind == b"S" and self.mode == "drop_before_commit":
            return FLUSH
        return msg

    # server -> client -------------------------------------------------------
    def _downstream(self) -> None:
        buf = b""
        try:
            while not self._closed.is_set():
                data = self.server.recv(65536)
                if not data:
                    break
                buf += data
                out = bytearray()
                while len(buf) >= 5:
                    size = 1 + int.from_bytes(buf[1:5], "big")
                    if len(buf) < size:
                        break
                    msg, buf = buf[:size], buf[size:]
                    if not self._reply(msg):
                        return
                    if self.mode is None:
                        out += msg
                if out:
                    self.client.sendall(bytes(out))
        except OSError:
            pass
        finally:
            self.cut()

    def _reply(self, msg: bytes) -> bool:
        """Decode one backend message; False once the link was cut."""
        kind, body, ex = msg[:1], msg[5:], self.current
        if ex is None:
            return True
        if kind == b"T":
            count, pos = int.from_bytes(body[:2], "big"), 2
            ex.columns = []
            for _ in range(count):
                name, pos = _cstring(body, pos)
                ex.columns.append(name)
                pos += 18
        elif kind == b"D":
            count, pos = int.from_bytes(body[:2], "big"), 2
            row: list[str | None] = []
            for _ in range(count):
                size = int.from_bytes(body[pos : pos + 4], "big", signed=True)
                pos += 4
                if size < 0:
                    row.append(None)
                else:
                    row.append(body[pos : pos + size].decode("utf-8", "replace"))
                    pos += size
            ex.rows.append(tuple(row))
        elif kind == b"E":
            pos = 0
            while pos < len(body) and body[pos] != 0:
                code = chr(body[pos])
                value, pos = _cstring(body, pos + 1)
                if code == "C":
                    ex.sqlstate = value
        elif kind == b"Z":
            ex.status = chr(body[0])
            if self.mode == "drop_reply_after_commit":
                ex.committed = ex.status == "I" and ex.sqlstate is None
                self._fire(ex)
                return False
        if self.mode == "drop_before_commit" and kind in (b"C", b"E", b"Z"):
            ex.committed = False
            self._fire(ex)
            return False
        return True


class TcpProxy:
    """A PostgreSQL-aware TCP proxy on 127.0.0.1 with one-shot fault rules."""

    def __init__(self, upstream_url: str) -> None:
        params = conninfo_to_dict(upstream_url)
        self.upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.dbname = str(params.get("dbname") or "postgres")
        self.user = str(params.get("user") or "postgres")
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._links: list[_Link] = []
        self.exchanges: list[Exchange] = []
        self.fired: list[Rule] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def url(self, application_name: str = "faults") -> str:
        return (
            f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"
            f"?sslmode=disable&gssencmode=disable&application_name={application_name}"
        )

    def arm(self, mode: str, pattern: bytes = b"runrelay") -> Rule:
        """Inject `mode` into the next request whose bytes contain `pattern`."""
        assert mode in MODES, mode
        rule = Rule(mode, pattern)
        with self._lock:
            self._rules.append(rule)
        return rule

    def disarm(self) -> None:
        with self._lock:
            self._rules.clear()

    def partition(self) -> None:
        """Cut every open link at once (a network partition)."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.cut()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.partition()

    def last_exchange(self, function: str) -> Exchange | None:
        with self._lock:
            for ex in reversed(self.exchanges):
                if ex.function == function:
                    return ex
        return None

    # internals --------------------------------------------------------------
    def _take(self, msg: bytes) -> Rule | None:
        with self._lock:
            for i, rule in enumerate(self._rules):
                if rule.pattern in msg:
                    return self._rules.pop(i)
        return None

    def _log(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)
            del self.exchanges[:-200]

    def _fired(self, rule: Rule) -> None:
        with self._lock:
            self.fired.append(rule)

    def _accept(self) -> None:
        n = 0
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            n += 1
            link = _Link(self, client, server, n)
            with self._lock:
                self._links.append(link)
                self._links = [x for x in self._links if not x._closed.is_set()]
            link.start()


# =============================================================================
# History
# =============================================================================
def jsonable(value: Any) -> Any:
    """A JSON-compatible copy of a client result or argument."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def ts(value: str | None) -> float | None:
    """An ISO timestamp from a result as seconds since the epoch."""
    return None if value is None else datetime.fromisoformat(value).timestamp()


class History:
    """An append-only log of calls; optionally mirrored to a JSON-lines file
    (two lines per call: invoke, then end) so a SIGKILLed process leaves its
    in-flight calls behind as invokes without an end."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.calls: list[dict[str, Any]] = []
        self.images: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def _write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, default=str) + "\n")
            self._fh.flush()

    def invoke(self, process: str, fn: str, args: dict[str, Any], replay_of: int | None) -> int:
        with self._lock:
            index = len(self.calls)
            call = {
                "index": index,
                "process": process,
                "fn": fn,
                "args": jsonable(args),
                "type": "invoke",
                "t0": time.monotonic(),
                "w0": time.time(),
                "replay_of": replay_of,
            }
            self.calls.append(call)
            self._write({"ev": "invoke", **call})
            return index

    def end(self, index: int, kind: str, **fields: Any) -> None:
        with self._lock:
            call = self.calls[index]
            call.update(type=kind, t1=time.monotonic(), w1=time.time(), **fields)
            self._write(
                {
                    "ev": "end",
                    "index": index,
                    **{k: call[k] for k in ("type", "t1", "w1")},
                    **fields,
                }
            )

    def image_check(self, label: str, before: str, after: str, calls: Sequence[int]) -> None:
        """Record that `calls` (rejected or raising) must have left rows identical."""
        with self._lock:
            entry = {"label": label, "same": before == after, "calls": list(calls)}
            if before != after:
                entry["before"], entry["after"] = before, after
            self.images.append(entry)
            self._write({"ev": "image", **entry})

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def load_history(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Merge the JSON-lines histories of several processes. Calls that were
    invoked but never ended (the process died) become type ``info`` with
    ``died = True``. Indexes are renumbered globally."""
    calls: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        local: dict[int, dict[str, Any]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed process
            ev = record.pop("ev")
            if ev == "invoke":
                local[record["index"]] = record
            elif ev == "end":
                call = local.get(record.pop("index"))
                if call is not None:
                    call.update(record)
            else:
                images.append(record)
        base = len(calls)
        for index in sorted(local):
            call = local[index]
            if call["type"] == "invoke":
                call.update(type="info", died=True, t1=None, w1=None)
            call["index"] = base + index
            if call.get("replay_of") is not None:
                call["replay_of"] += base
            calls.append(call)
    return calls, images


def is_shard_lost(message: str) -> bool:
    """A PL/Proxy proxy's internal_error for a shard it could not reach or
    lost mid-call (no "REMOTE ERROR:": not the shard's own error). The shard
    may have committed before the link broke: the call's fate is unknown."""
    return message.startswith("PL/Proxy function ") and "REMOTE ERROR:" not in message


def _indeterminate(error: psycopg.Error | RunrelayError) -> bool:
    if isinstance(error, ShardUnavailable):
        # The client's type for a shard it could not reach or lost mid-call:
        # the shard may have committed, so the call's fate is unknown.
        return True
    if isinstance(error, RunrelayError):
        return False
    if error.sqlstate == "XX000" and is_shard_lost(str(error)):
        return True
    if error.sqlstate is None:
        return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
    return error.sqlstate in INDETERMINATE_SQLSTATES


class RecordingClient(Client):
    """A runrelay.Client whose every call is recorded in a History.

    Its own connection is used (a conninfo string), with prepare_threshold=None
    so the function name is in every Parse message the proxy sees. An
    indeterminate call is recorded as ``info`` and, with ``replay=True``,
    repeated with identical arguments until it resolves (ok or fail); each
    repeat is its own entry with ``replay_of`` set. With a `proxy`, the
    server's answer to the lost call and to its replay are attached."""

    def __init__(
        self,
        url: str,
        history: History,
        name: str,
        *,
        replay: bool = True,
        replay_for: float = 60.0,
        proxy: TcpProxy | None = None,
    ) -> None:
        super().__init__(url, prepare_threshold=None)
        self.history = history
        self.name = name
        self.replay = replay
        self.replay_for = replay_for
        self.proxy = proxy
        self.infos = 0

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
        return self._recorded(function, values, conn, None)

    def _drop_connection(self) -> None:
        own = self._own
        self._own = None
        if own is not None:
            with contextlib.suppress(Exception):
                own.close()

    def _recorded(
        self, function: str, values: dict[str, Any], conn: Any, replay_of: int | None
    ) -> Any:
        index = self.history.invoke(self.name, function, values, replay_of)
        fired = len(self.proxy.fired) if self.proxy is not None else 0
        try:
            result = super()._call(function, values, conn)
        except (psycopg.Error, RunrelayError) as error:
            if _indeterminate(error):
                self.infos += 1
                self._drop_connection()
                extra: dict[str, Any] = {"error": str(error)[:300], "sqlstate": error.sqlstate}
                if self.proxy is not None and len(self.proxy.fired) > fired:
                    rule = self.proxy.fired[-1]
                    if rule.exchange is not None:
                        extra["original"] = rule.exchange.raw()
                self.history.end(index, "info", **extra)
                if not self.replay or conn is not None:
                    raise
                return self._replay(index, function, values, error)
            self.history.end(index, "fail", sqlstate=error.sqlstate, error=str(error)[:300])
            raise
        extra = {}
        if self.proxy is not None and replay_of is not None:
            ex = self.proxy.last_exchange(function)
            if ex is not None:
                extra["raw"] = ex.raw()
        self.history.end(index, "ok", result=jsonable(result), **extra)
        return result

    def _replay(self, index: int, function: str, values: dict[str, Any], error: Exception) -> Any:
        deadline = time.monotonic() + self.replay_for
        delay = 0.02
        while True:
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            try:
                return self._recorded(function, values, None, index)
            except (psycopg.Error, RunrelayError) as again:
                if not _indeterminate(again):
                    raise
                if time.monotonic() > deadline:
                    raise
                error = again  # still unknown: try again (anchored to the first call)
        raise AssertionError(f"unreachable: {error}")

    def replay_call(self, index: int) -> Any:
        """Repeat the recorded call `index` (same function, same arguments)."""
        call = self.history.calls[index]
        values = _revive(call["fn"], call["args"])
        return self._recorded(call["fn"], values, None, index)


_UUID_ARGS = {"lease_token", "call_id"}


def _revive(function: str, args: dict[str, Any]) -> dict[str, Any]:
    out = dict(args)
    for key in _UUID_ARGS:
        if out.get(key) is not None:
            out[key] = uuid.UUID(out[key])
    return out


# =============================================================================
# Consumer sink log (what the outside world received)
# =============================================================================
class SinkLog:
    """Deliveries as a consumer saw them: one record per batch."""

    def __init__(self, path: Path | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self.path = path
        self._lock = threading.Lock()

    def receive(self, relay: str, lane: str, events: Sequence[Any]) -> None:
        if not events:
            return
        first = events[0]
        record = {
            "relay": relay,
            "lane": lane,
            "run_id": _get(first, "run_id"),
            "keys": [_get(e, "delivery_key") for e in events],
            "seqs": [_get(e, "seq") for e in events],
            "event_ids": [_get(e, "event_id") for e in events],
            "w": time.time(),
        }
        with self._lock:
            self.records.append(record)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
                    fh.flush()


def _get(obj: Any, key: str) -> Any:
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


def load_sink(paths: Sequence[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
    return sorted(out, key=lambda r: r["w"])


# =============================================================================
# Database tools
# =============================================================================
def row_images(conn: psycopg.Connection, run_id: str) -> str:
    """Every row that belongs to a run, as text: equal images = untouched rows."""
    parts = []
    for table, order in (
        ("runs", "run_id"),
        ("attempts", "attempt"),
        ("cancellations", "run_id"),
        ("signals", "signal_id"),
        ("ledger", "event_id"),
        ("ledger_lanes", "lane"),
        ("ledger_wakeups", "lane"),
        ("calls", "call_id"),
    ):
        row = conn.execute(
            f"SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t.{order}), '')"
            f" FROM runrelay.{table} AS t WHERE t.run_id = %s",
            [run_id],
        ).fetchone()
        assert row is not None
        parts.append(f"{table}:\n{row[0]}")
    return "\n".join(parts)


TABLES = RUN_TABLES


def checksum(conn: psycopg.Connection) -> str:
    """The contents of TABLES as one digest."""
    return table_checksum(conn, TABLES)


def terminate_backend(observer: psycopg.Connection, pid: int) -> bool:
    row = observer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()
    return bool(row and row[0])


def backend_of(observer: psycopg.Connection, application_name: str) -> int | None:
    row = observer.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        " AND pid <> pg_backend_pid() ORDER BY backend_start DESC LIMIT 1",
        [application_name],
    ).fetchone()
    return int(row[0]) if row else None


def wait_until_waiting(observer: psycopg.Connection, pid: int, timeout: float = 30.0) -> None:
    """wait_until_blocked, with more patience: fault scenarios load the server."""
    wait_until_blocked(observer, pid, timeout)


@contextlib.contextmanager
def shifted(conn: psycopg.Connection, offset: str) -> Iterator[None]:
    """Move the database clock of `conn`'s session by `offset` (an interval)."""
    conn.execute("SELECT set_config('runrelay.clock_offset', %s, false)", [offset])
    try:
        yield
    finally:
        conn.execute("SELECT set_config('runrelay.clock_offset', '', false)")


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout:.0f}s")


def duration(default: float, env: str = "RUNRELAY_CHAOS_SECONDS") -> float:
    """Seconds for a bounded scenario: `default`, or longer under make chaos
    (RUNRELAY_CHAOS_SECONDS accepts 120, 90s, 20m)."""
    raw = os.environ.get(env, "").strip().lower()
    if not raw:
        return default
    if raw.endswith("m"):
        return float(raw[:-1]) * 60
    if raw.endswith("s"):
        return float(raw[:-1])
    return float(raw)


def chaos_mode() -> bool:
    return bool(os.environ.get("RUNRELAY_CHAOS_SECONDS"))


# =============================================================================
# Checker
# =============================================================================
EXACT = {
    "claim_attempts",
    "settle_and_claim",
    "complete_attempt",
    "complete_attempts",
    "fail_attempt",
    "suspend_attempt",
    "release_attempt",
    "prepare_waiting_failure",
    "claim_detached_terminal",
    "append_events",
    "claim_ledger",
    "ack_ledger",
    "claim_ledger_runs",
    "ack_ledger_runs",
}
# The relay calls whose rows report leases and acknowledgements, of one run
# or of several.
LEDGER_CLAIMS = ("claim_ledger", "ack_ledger", "claim_ledger_runs", "ack_ledger_runs")
LEDGER_ACKS = ("ack_ledger", "ack_ledger_runs")
# Columns a faithful replay may answer differently (measured at statement
# time, or a lease re-extended for the same holder).
VOLATILE_COLUMNS = {"lease_remaining_ms", "lease_expires_at"}
ALLOWED_FAILURES = {"55P03", "57014"}
TERMINAL = ("completed", "failed", "cancelled")


def settled_items(c: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """A settle_and_claim call's (item, outcome) pairs: its settled rows come
    in item order."""
    rows = [r for r in c["result"] if r["kind"] == "settled"]
    yield from zip(c["args"]["items"], (r["outcome"] for r in rows), strict=False)


def claimed_rows(c: dict[str, Any]) -> list[dict[str, Any]]:
    """The attempts a claim_attempts or settle_and_claim call opened."""
    if c["fn"] == "claim_attempts":
        return list(c["result"])
    return [r for r in c["result"] if r["kind"] == "claimed"]


def _masked(raw: dict[str, Any], function: str) -> list[tuple[Any, ...]]:
    keep = [i for i, c in enumerate(raw["columns"]) if c not in VOLATILE_COLUMNS]
    return [tuple(row[i] for i in keep) for row in raw["rows"]]


@dataclasses.dataclass
class Report:
    violations: list[str]
    counters: Counter[str]

    def __str__(self) -> str:
        head = "\n".join(self.violations[:40])
        return f"{len(self.violations)} violations:\n{head}\ncounters: {dict(self.counters)}"


class Checker:
    """Offline check of I1-I11 over a history, the final database and a sink log.

    `conn` must see the final state (superuser, autocommit); `sink` is the
    consumer's log (SinkLog records, any order of processes, sorted by time);
    `images` are the row-image checks recorded by targeted tests. An
    indeterminate call is never counted as failed: it must resolve through a
    replay (I9) unless its process died."""

    def __init__(
        self,
        calls: list[dict[str, Any]],
        conn: psycopg.Connection,
        sink: Sequence[dict[str, Any]] = (),
        images: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.calls = calls
        self.conn = conn
        self.sink = list(sink)
        self.images = list(images)
        self.violations: list[str] = []
        self.counters: Counter[str] = Counter()

    def bad(self, invariant: str, message: str) -> None:
        self.violations.append(f"{invariant}: {message}")

    def run(self) -> Report:
        self.ok = [c for c in self.calls if c["type"] == "ok"]
        for c in self.calls:
            self.counters[f"calls:{c['type']}"] += 1
        for check in (
            self.i1_i10_images,
            self.i2_one_live_attempt,
            self.i3_ledger_order,
            self.i3_ledger_rows_have_runs,
            self.i4_leases,
            self.i5_redeliveries,
            self.i6_nothing_lost,
            self.i7_terminal_final,
            self.i8_cancel_vs_complete,
            self.i9_replays,
            self.i10_failures,
            self.i11_steps,
        ):
            check()
        return Report(self.violations, self.counters)

    # I1 / I10 ---------------------------------------------------------------
    def i1_i10_images(self) -> None:
        for image in self.images:
            self.counters["image_checks"] += 1
            if not image["same"]:
                self.bad("I1/I10", f"{image['label']}: rows changed by calls {image['calls']}")

    # I2 ---------------------------------------------------------------------
    def i2_one_live_attempt(self) -> None:
        try:
            from lifecycle import check_database

            statuses = check_database(self.conn)
            self.counters.update({f"final:{k}": v for k, v in statuses.items()})
        except AssertionError as error:
            self.bad("I2/I7", f"state machine: {error}")
        # A later attempt's claim ends every earlier attempt's lease: no call
        # invoked after that may extend or complete the earlier one.
        claimed: dict[tuple[str, int], float] = {}
        for c in self.ok:
            if c["fn"] in ("claim_attempts", "settle_and_claim"):
                for row in claimed_rows(c):
                    key = (row["run_id"], row["attempt"])
                    claimed[key] = min(claimed.get(key, c["w1"]), c["w1"])
        for c in self.ok:
            if c["fn"] == "settle_and_claim":
                writes = [
                    (item, outcome == "completed")
                    for item, outcome in settled_items(c)
                    if item.get("op", "complete") == "complete"
                ]
            elif c["fn"] == "heartbeat":
                writes = [(c["args"], c["result"]["outcome"] == "ok")]
            elif c["fn"] == "complete_attempt":
                writes = [(c["args"], c["result"] == "completed")]
            else:
                continue
            for args, live in writes:
                later = claimed.get((args["run_id"], args["attempt"] + 1))
                if live and later is not None and c["w0"] > later:
                    self.bad("I2", f"{c['fn']} of {args['run_id']}#{args['attempt']} succeeded"
                             f" after attempt {args['attempt'] + 1} was claimed")  # fmt: skip

    # I3 ---------------------------------------------------------------------
    def i3_ledger_rows_have_runs(self) -> None:
        """Every ledger event, delivery, lane and wake-up belongs to a run.
        The ledger tables have no foreign key to runs (schema/06_ledger.sql):
        that every writer holds its run's row lock, or has just inserted the
        run, is what keeps this true, so the checker asserts it. And the
        deliveries of a lane never overlap (the ledger view reads an event's
        delivery as the first one ending at or after it)."""
        orphans = self.conn.execute(
            """
            SELECT t.name, count(*), min(t.run_id)
            FROM (
                SELECT 'ledger_events' AS name, l.run_id FROM runrelay.ledger_events AS l
                UNION ALL
                SELECT 'ledger_deliveries', d.run_id FROM runrelay.ledger_deliveries AS d
                UNION ALL
                SELECT 'ledger_lanes', ll.run_id FROM runrelay.ledger_lanes AS ll
                UNION ALL
                SELECT 'ledger_wakeups', w.run_id FROM runrelay.ledger_wakeups AS w
            ) AS t
            WHERE NOT EXISTS (SELECT FROM runrelay.runs AS r WHERE r.run_id = t.run_id)
            GROUP BY t.name ORDER BY t.name
            """
        ).fetchall()
        for name, count, run_id in orphans:
            self.bad("I3", f"{count} {name} rows of no run (e.g. {run_id})")
        overlapping = self.conn.execute(
            """
            SELECT d.run_id, d.lane, d.first_seq, d.last_seq
            FROM runrelay.ledger_deliveries AS d
            WHERE EXISTS (
                SELECT FROM runrelay.ledger_deliveries AS o
                WHERE o.run_id = d.run_id AND o.lane = d.lane AND o.last_seq < d.last_seq
                  AND o.last_seq >= d.first_seq
            )
            """
        ).fetchall()
        for run_id, lane, first, last in overlapping:
            self.bad("I3", f"{run_id} {lane}: delivery {first}..{last} overlaps an earlier one")

    def i3_ledger_order(self) -> None:
        rows = self.conn.execute(
            """
            SELECT l.run_id, l.lane, l.seq, l.state, l.delivery_key, l.acked_locally,
                   l.transport_only, l.delivered_at
            FROM runrelay.ledger AS l ORDER BY l.run_id, l.lane, l.seq
            """
        ).fetchall()
        lanes: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
        for row in rows:
            lanes[(row[0], row[1])].append(row)
        self.db_lanes = lanes
        # delivered_at is the acknowledging statement's start (runrelay._now()),
        # not its commit, so it is not an order; the prefix is.
        for key, events in lanes.items():
            seen_pending = False
            for e in events:
                if e[3] != "delivered":
                    seen_pending = True
                elif seen_pending:
                    self.bad("I3", f"{key}: seq {e[2]} delivered behind an undelivered event")
        # The acknowledgements the history saw: an event's acknowledgement is
        # known to lie between the invoke of the first call of its chain (a
        # lost call and its replays) and the end of the call that reported
        # it. No event may be reported acknowledged before a call that
        # acknowledged an earlier event of its lane had even started.
        by_index = {c["index"]: c for c in self.calls}
        first: dict[int, tuple[float, float, int, tuple[str, str]]] = {}
        for c in self.ok:
            if c["fn"] not in LEDGER_CLAIMS:
                continue
            anchor = by_index.get(c.get("replay_of"), c) if c.get("replay_of") is not None else c
            for row in c["result"]:
                if row["kind"] not in ("delivered", "local_ack"):
                    continue
                seen = first.get(row["event_id"])
                window = (anchor["w0"], c["w1"], row["seq"], (row["run_id"], self._lane_of(row)))
                if seen is None or window[1] < seen[1]:
                    first[row["event_id"]] = window
        per_lane: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
        for start, stop, seq, lane_key in first.values():
            per_lane[lane_key].append((seq, start, stop))
        for lane_key, acks in per_lane.items():
            earliest_later_end = float("inf")
            for seq, start, stop in sorted(acks, reverse=True):
                if start > earliest_later_end:
                    self.bad("I3", f"{lane_key}: seq {seq} acknowledged after a later event")
                earliest_later_end = min(earliest_later_end, stop)
        # The consumer's view, deduplicated by delivery key: appended order,
        # and every event the database says was delivered to it is there.
        got: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
        keys: set[str] = set()
        for record in self.sink:
            for key, seq in zip(record["keys"], record["seqs"], strict=True):
                if key not in keys:
                    keys.add(key)
                    got[(record["run_id"], record["lane"])].append((seq, key))
        for lane_key, items in got.items():
            seqs = [s for s, _ in items]
            if seqs != sorted(seqs):
                self.bad("I3", f"{lane_key}: consumer saw {seqs}")
        if self.sink:
            for lane_key, events in lanes.items():
                for e in events:
                    if e[3] == "delivered" and not e[5] and e[4] not in keys:
                        self.bad("I3", f"{lane_key}: {e[4]} acknowledged, never delivered")

    def _lane_of(self, row: dict[str, Any]) -> str:
        if not hasattr(self, "_lanes_by_id"):
            self._lanes_by_id = dict(
                self.conn.execute("SELECT event_id, lane FROM runrelay.ledger").fetchall()
            )
        return str(self._lanes_by_id.get(row["event_id"], "?"))

    def _lease_observations(self) -> dict[int, list[tuple[float, float, float, str]]]:
        """Per event, every observed lease, sorted: (end of the call that
        observed it, the server time it began, the server time it expires,
        the relay). A lease begins at its statement's start (expiry - lease
        duration); claims, ack-and-claim-next and renewals observe leases."""
        if hasattr(self, "_obs"):
            return self._obs
        obs: dict[int, list[tuple[float, float, float, str]]] = defaultdict(list)
        for c in self.calls:
            fn, args = c["fn"], c["args"]
            if c["type"] != "ok" or fn not in (*LEDGER_CLAIMS, "renew_ledger_lease"):
                continue
            lease = min(300, max(5, int(args.get("lease_seconds") or 30)))
            for row in c["result"]:
                if fn != "renew_ledger_lease" and row["kind"] != "claimed":
                    continue
                expires = ts(row["lease_expires_at"])
                if expires is not None:
                    obs[row["event_id"]].append((c["w1"], expires - lease, expires, args["relay"]))
        for items in obs.values():
            items.sort()
        self._obs: dict[int, list[tuple[float, float, float, str]]] = obs
        return obs

    def _lapsed(self, event_id: int, relay: str, since: float, until: float) -> bool:
        """Whether `relay` let its lease on the event expire and leased it
        again between two of its deliveries (wall times `since`, `until`):
        the later lease began (server time) no earlier than every lease the
        relay had been seen to hold before it expired."""
        mine = [o for o in self._lease_observations().get(event_id, []) if o[3] == relay]
        again = [o for o in mine if since < o[0] <= until + 0.05]
        if not again:
            return False
        seen, started, _, _ = again[-1]
        before = [o[2] for o in mine if o[0] < seen]
        return bool(before) and started >= max(before)

    # I4 ---------------------------------------------------------------------
    def i4_leases(self, tolerance: float = 0.05) -> None:
        """No two relays held live leases on one event.

        Each observation of a lease (a claimed row, a renewal) says: the
        relay held the event at some moment between the statement's start
        (expiry - lease duration) and the end of the call, until the expiry
        (computed by the server from the statement's start). A lease also ends
        when its holder acknowledges, releases or fails it (no later than the
        invoke of that call). Observations are ordered by the end of their
        call: a lease obtained after another ended was observed later. A
        violation is a second relay's lease observed complete (call ended)
        before the first relay's lease could have ended."""
        obs = self._lease_observations()
        ends: dict[tuple[int, str], list[float]] = defaultdict(list)
        for c in self.calls:
            fn, args = c["fn"], c["args"]
            if fn in (*LEDGER_ACKS, "release_ledger", "fail_ledger"):
                for eid in args["event_ids"]:
                    ends[(eid, args["relay"])].append(c["w0"])
        for eid, items in obs.items():
            items.sort()
            holder, holder_end, since = None, 0.0, 0.0
            for seen, started, expires, relay in items:
                if relay == holder:
                    holder_end = max(holder_end, expires)
                    continue
                if holder is not None:
                    early = [t for t in ends.get((eid, holder), []) if since <= t <= seen]
                    end = min([holder_end, *early])
                    if seen + tolerance < end:
                        self.bad("I4", f"event {eid}: {relay} held it by {seen:.3f} while "
                                 f"{holder} held it until {end:.3f}")  # fmt: skip
                    if not early:
                        self.counters["takeovers"] += 1
                holder, holder_end, since = relay, expires, started

    # I5 ---------------------------------------------------------------------
    def i5_redeliveries(self) -> None:
        """A batch that repeats keys the consumer already has repeats them
        first (a frozen batch is re-leased whole; only a head claimed without
        batch may be followed by new events), and only keys of one earlier
        batch (the batch it belongs to); and it comes from another relay than that batch
        (the lease changed hands) or from the same relay after it failed,
        released or lost an acknowledgement, or let its lease expire and leased
        the events again (a takeover by itself: nobody else claimed them in
        time). A relay that lost its lease while its claim or delivery was slow
        may deliver after the relay that took over: that late batch is also a
        repeat of one taken-over batch."""
        by_lane: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for record in self.sink:
            by_lane[(record["run_id"], record["lane"])].append(record)
        troubled: dict[str, list[float]] = defaultdict(list)
        for c in self.calls:
            if c["fn"] in ("fail_ledger", "release_ledger") or (
                c["fn"] in LEDGER_ACKS and c["type"] != "ok"
            ):
                troubled[c["process"]].append(c["w0"])
        for lane_key, batches in by_lane.items():
            seen: set[str] = set()
            for i, batch in enumerate(batches):
                again = [k for k in batch["keys"] if k in seen]
                seen.update(batch["keys"])
                if not again:
                    continue
                self.counters["redeliveries"] += 1
                if batch["keys"][: len(again)] != again:  # the taken-over part comes first
                    self.bad("I5", f"{lane_key}: redelivered {again} not first in {batch['keys']}")
                source = next(
                    (b for b in reversed(batches[:i]) if set(again) <= set(b["keys"])), None
                )
                if source is None:
                    self.bad("I5", f"{lane_key}: redelivered {again} beyond any one earlier batch")
                elif source["relay"] == batch["relay"] and not any(
                    source["w"] <= t <= batch["w"] for t in troubled[batch["relay"]]
                ):
                    ids = dict(zip(batch["keys"], batch["event_ids"], strict=True))
                    if all(
                        self._lapsed(ids[k], batch["relay"], source["w"], batch["w"]) for k in again
                    ):
                        self.counters["lapsed_leases"] += 1
                    else:
                        self.bad("I5", f"{lane_key}: {batch['relay']} redelivered {again}"
                                 " without losing its lease")  # fmt: skip

    # I6 ---------------------------------------------------------------------
    def i6_nothing_lost(self) -> None:
        runs = dict(self.conn.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
        events = {
            r[0]: (r[1], r[2], r[3])
            for r in self.conn.execute(
                "SELECT event_id, run_id, seq, delivery_key FROM runrelay.ledger"
            ).fetchall()
        }
        pruned = any(c["fn"] == "prune" and c["type"] == "ok" and c["result"] for c in self.ok)
        delivered = {
            row["event_id"]
            for c in self.ok
            if c["fn"] in LEDGER_CLAIMS
            for row in c["result"]
            if row["kind"] in ("delivered", "local_ack")
        }
        for c in self.ok:
            fn, args, result = c["fn"], c["args"], c["result"]
            if fn == "enqueue_run" and args["run_id"] not in runs:
                self.bad("I6", f"enqueued run {args['run_id']} is gone")
            elif fn == "append_events":
                self.counters["appends_ok"] += 1
                for row in result:
                    have = events.get(row["event_id"])
                    if have is None and pruned and row["event_id"] in delivered:
                        continue
                    if have != (args["run_id"], row["seq"], row["delivery_key"]):
                        self.bad("I6", f"appended event {row} of {args['run_id']} is {have}")
            elif (
                fn == "complete_attempt"
                and result == "completed"
                and runs.get(args["run_id"]) != "completed"
            ):
                self.bad("I6", f"{args['run_id']} completed, now {runs.get(args['run_id'])}")
            elif fn == "settle_and_claim":
                for item, outcome in settled_items(c):
                    if outcome == "completed" and runs.get(item["run_id"]) != "completed":
                        self.bad("I6", f"{item['run_id']} completed (settle_and_claim), "
                                 f"now {runs.get(item['run_id'])}")  # fmt: skip

    # I7 ---------------------------------------------------------------------
    def i7_terminal_final(self) -> None:
        final = dict(self.conn.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
        observed: dict[str, set[str]] = defaultdict(set)
        for c in self.ok:
            for run_id, outcome in self._terminal_observations(c):
                observed[run_id].add(outcome)
        for run_id, outcomes in observed.items():
            if len(outcomes) > 1:
                self.bad("I7", f"{run_id} reported ended as {sorted(outcomes)}")
            elif final.get(run_id) not in outcomes:
                self.bad("I7", f"{run_id} reported {outcomes}, finally {final.get(run_id)}")
        twice = self.conn.execute(
            """
            SELECT run_id, count(*) FROM runrelay.ledger
            WHERE type IN ('run.completed', 'run.failed', 'run.cancelled')
            GROUP BY run_id HAVING count(*) > 1
            """
        ).fetchall()
        for run_id, n in twice:
            self.bad("I7", f"{run_id} has {n} terminal events")

    @staticmethod
    def _terminal_observations(c: dict[str, Any]) -> Iterator[tuple[str, str]]:
        fn, args, result = c["fn"], c["args"], c["result"]
        if fn in ("complete_attempt", "fail_attempt") and result in ("completed", "failed"):
            yield args["run_id"], result
        elif (
            fn in ("complete_attempt", "fail_attempt", "suspend_attempt", "release_attempt")
            and result == "cancelled"
        ) or (fn == "cancel_run" and result == "cancelled"):
            yield args["run_id"], "cancelled"
        elif fn == "complete_attempts":
            for row in result:
                if row["outcome"] in ("completed", "cancelled"):
                    yield row["run_id"], row["outcome"]
        elif fn == "heartbeat" and result["outcome"] == "cancelled":
            yield args["run_id"], "cancelled"
        elif fn == "settle_and_claim":
            for item, outcome in settled_items(c):
                if outcome in ("completed", "failed", "cancelled"):
                    yield item["run_id"], outcome

    # I8 ---------------------------------------------------------------------
    def i8_cancel_vs_complete(self) -> None:
        final = dict(self.conn.execute("SELECT run_id, status FROM runrelay.runs").fetchall())
        cancelled_runs = set()
        for c in self.ok:
            for run_id, outcome in self._terminal_observations(c):
                if outcome == "cancelled":
                    cancelled_runs.add(run_id)
            if c["fn"] == "cancel_run" and c["result"] in ("cancelled", "cancel_requested"):
                run_id = c["args"]["run_id"]
                self.counters["cancels_requested"] += 1
                if final.get(run_id) not in TERMINAL:
                    self.bad("I8", f"{run_id}: cancel answered {c['result']}, run is "
                             f"{final.get(run_id)} (cancellation lost)")  # fmt: skip
        self.counters["cancels_won"] += len(cancelled_runs)
        both = self.conn.execute(
            """
            SELECT run_id FROM runrelay.ledger WHERE type IN ('run.completed', 'run.cancelled')
            GROUP BY run_id HAVING count(DISTINCT type) = 2
            """
        ).fetchall()
        for (run_id,) in both:
            self.bad("I8", f"{run_id} both completed and cancelled")
        stranded = self.conn.execute(
            """
            SELECT c.run_id, r.status FROM runrelay.cancellations AS c
            JOIN runrelay.runs AS r USING (run_id)
            WHERE r.status IN ('queued', 'running', 'waiting')
            """
        ).fetchall()
        for run_id, status in stranded:
            self.bad("I8", f"{run_id}: cancel marker never applied ({status})")

    # I9 ---------------------------------------------------------------------
    def i9_replays(self) -> None:
        replays: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for c in self.calls:
            if c.get("replay_of") is not None:
                replays[c["replay_of"]].append(c)
        for c in self.calls:
            if c["type"] != "info" or c.get("died") or c.get("replay_of") is not None:
                continue
            chain = self._resolve(c, replays)
            if chain is None:
                self.bad("I9", f"#{c['index']} {c['fn']} was never resolved")
                continue
            original = c.get("original")
            if original is None or original["fault"] is None:
                self.counters["replays:unobserved"] += 1
                continue
            if not original["committed"]:
                self.counters["replays:afresh"] += 1
                continue
            self.counters["replays:recorded"] += 1
            self._compare(c, original, chain)

    def _resolve(
        self, c: dict[str, Any], replays: dict[int, list[dict[str, Any]]]
    ) -> dict[str, Any] | None:
        for r in replays.get(c["index"], []):
            if r["type"] in ("ok", "fail"):
                return r
            deeper = self._resolve(r, replays)
            if deeper is not None:
                return deeper
        return None

    def _blocked_again(self, event_id: int, after: float, before: float) -> bool:
        """Whether a fail_ledger that may have committed between `after` and
        `before` (monotonic seconds) blocked the event: it ran at some point
        in that window and answered `blocked` for it."""
        for f in self.calls:
            if f["fn"] != "fail_ledger" or f["type"] != "ok":
                continue
            if f["t1"] < after or f["t0"] > before:
                continue
            if any(
                r.get("event_id") == event_id and r.get("outcome") == "blocked"
                for r in f.get("result") or []
            ):
                return True
        return False

    def _compare(self, c: dict[str, Any], original: dict[str, Any], replay: dict[str, Any]) -> None:
        fn = c["fn"]
        if replay["type"] != "ok":
            self.bad("I9", f"#{c['index']} {fn} committed, replay raised {replay.get('sqlstate')}")
            return
        raw = replay.get("raw")
        result = replay["result"]
        first = original["rows"]
        label = f"#{c['index']} {fn}"
        if fn in EXACT:
            if fn == "append_events" and not all(
                isinstance(e, dict) and e.get("delivery_key") for e in c["args"]["events"]
            ):
                return
            mine, theirs = _masked(original, fn), raw and _masked(raw, fn)
            if fn in ("claim_attempts", "claim_ledger", "claim_ledger_runs") and not mine:
                return  # the lost claim took nothing: a replay is simply a new claim
            if theirs is None or mine != theirs:
                self.bad("I9", f"{label}: replay answered {raw and raw['rows']}, first {first}")
            return
        value = first[0][0] if first and first[0] else None
        if fn in ("signal_run", "cancel_run") and c["args"].get("call_id") is not None:
            # Named by a call_id: the repeat answers exactly what the committed
            # call did (a signal stored once, a cancel_requested not turned
            # into cancelled or already_terminal).
            self.counters[f"replays:recorded:{fn}"] += 1
            if result != value:
                self.bad("I9", f"{label}: first {value}, replay {result}")
        elif fn == "enqueue_run":
            if result["run_id"] != c["args"]["run_id"] or result["created"]:
                self.bad("I9", f"{label}: replay {result}")
        elif fn == "cancel_run":
            # Without a call_id (other languages' clients): after
            # cancel_requested the marker is pending: a replay that finds
            # the locks free applies it (cancelled) - still one cancellation -
            # or finds the run ended (already_terminal) or the locks still busy.
            allowed = {
                "cancelled": {"already_terminal"},
                "already_terminal": {"already_terminal"},
                "not_found": {"not_found"},
            }.get(value, {"cancel_requested", "cancelled", "already_terminal"})
            if result not in allowed:
                self.bad("I9", f"{label}: first {value}, replay {result}")
        elif fn == "record_runner_terminal":
            if value == "recorded" and result != "duplicate":
                self.bad("I9", f"{label}: first recorded, replay {result}")
        elif fn == "reap_expired":
            first_ids = {(r[0], r[1]) for r in first}
            again = {(r["run_id"], str(r["attempt"])) for r in result}
            if first_ids & again:
                self.bad("I9", f"{label}: reaped twice: {sorted(first_ids & again)}")
        elif fn == "fail_ledger":
            first_ids = {r[0] for r in first}
            again = {str(r["event_id"]) for r in result}
            if first_ids & again:
                self.bad("I9", f"{label}: failure charged twice: {sorted(first_ids & again)}")
        elif (
            fn in ("release_ledger", "requeue_ledger_event", "prune")
            and value not in (None, "0", "f")
            and result not in (0, False)
        ):
            if fn == "requeue_ledger_event" and self._blocked_again(
                c["args"]["event_id"], c["t0"], replay["t0"]
            ):
                return  # failed again by a relay in between: requeued afresh, correctly
            self.bad("I9", f"{label}: first {value}, replay {result} (applied twice)")

    # I10 --------------------------------------------------------------------
    def i11_steps(self) -> None:
        """A step is recorded once per run, by the attempt that held the run:
        every record_step that answered recorded (a replay included) names
        the stored row, its attempt and its result; a stale attempt's or a
        second call's result is never the stored one."""
        stored = {
            (run_id, step): (attempt, result)
            for run_id, step, attempt, result in self.conn.execute(
                "SELECT run_id, step, attempt, result FROM runrelay.steps"
            ).fetchall()
        }
        self.counters["steps_stored"] = len(stored)
        for c in self.ok:
            if c["fn"] != "record_step":
                continue
            self.counters[f"steps:{c['result']}"] += 1
            if c["result"] != "recorded":
                continue
            args = c["args"]
            found = stored.get((args["run_id"], args["step"]))
            if found != (args["attempt"], args["result"]):
                where = f"{args['run_id']}#{args['attempt']} {args['step']!r}"
                self.bad("I11", f"#{c['index']} record_step of {where} answered recorded, "
                         f"but the run holds {found}")  # fmt: skip

    def i10_failures(self) -> None:
        for c in self.calls:
            if c["type"] != "fail":
                continue
            self.counters[f"fail:{c.get('sqlstate')}"] += 1
            if c.get("sqlstate") == "40P01":
                self.bad("I10", f"deadlock in #{c['index']} {c['fn']}")
            elif c.get("sqlstate") not in ALLOWED_FAILURES and not c.get("expected_failure"):
                self.bad(
                    "I10", f"#{c['index']} {c['fn']} raised {c.get('sqlstate')}: {c.get('error')}"
                )


# =============================================================================
# Child processes: the product's Worker and Relay loops, recorded
# =============================================================================
def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


@dataclasses.dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    history: Path
    log: Path  # handler log (worker) or sink log (relay)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def terminate(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class Children:
    """Child processes of one test; all killed at the end."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.all: list[Child] = []

    def _spawn(self, role: str, name: str, extra: list[str]) -> Child:
        history = self.folder / f"{name}.history.jsonl"
        log = self.folder / f"{name}.{'handler' if role == 'worker' else 'sink'}.jsonl"
        cmd = [sys.executable, str(HERE / "faults.py"), role, "--url", self.url, "--name", name,
               "--history", str(history), "--log", str(log), *extra]  # fmt: skip
        err = open(self.folder / f"{name}.stderr", "wb")  # noqa: SIM115
        proc = subprocess.Popen(cmd, env=_child_env(), stdout=err, stderr=err, cwd=REPO)
        err.close()
        child = Child(name, proc, history, log)
        self.all.append(child)
        return child

    def worker(self, name: str, *, lease: int = 5, heartbeat_every: float = 0.5,
               concurrency: int = 2) -> Child:  # fmt: skip
        return self._spawn("worker", name, ["--lease", str(lease), "--heartbeat-every",
                           str(heartbeat_every), "--concurrency", str(concurrency)])  # fmt: skip

    def relay(self, name: str, *, lease: int = 5, delay: float = 0.0, batch: int = 5) -> Child:
        return self._spawn("relay", name, ["--lease", str(lease), "--delay", str(delay),
                           "--batch", str(batch)])  # fmt: skip

    def histories(self) -> list[Path]:
        return [c.history for c in self.all]

    def logs(self) -> list[Path]:
        return [c.log for c in self.all]

    def close(self) -> None:
        for child in self.all:
            with contextlib.suppress(Exception):
                child.kill()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def _child_worker(args: argparse.Namespace) -> None:
    from runrelay.worker import Job, Worker

    history = History(Path(args.history))
    client = RecordingClient(args.url, history, args.name)
    log_lock = threading.Lock()

    def note(record: dict[str, Any]) -> None:
        with log_lock, open(args.log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({**record, "pid": os.getpid(), "w": time.time()}) + "\n")
            fh.flush()

    def handler(job: Job) -> Any:
        """A side effect per execution (the log line), then some work; a
        cooperative handler returns early when its lease is lost."""
        fence = {"run_id": job.run_id, "attempt": job.attempt.attempt}
        note({"ev": "start", **fence, "token": str(job.attempt.lease_token)})
        job.cancelled.wait(float(job.payload.get("work", 0.1)))
        note({"ev": "end", **fence, "cancelled": job.cancelled.is_set()})
        return {"by": args.name}

    worker = Worker(
        client,
        handler,
        concurrency=args.concurrency,
        name=args.name,
        lease_seconds=args.lease,
        heartbeat_every=args.heartbeat_every,
        poll_interval=0.1,
        shutdown_grace=1.0,
    )
    worker.install_signal_handlers()
    worker.run()


def _child_relay(args: argparse.Namespace) -> None:
    from runrelay.relay import Relay

    history = History(Path(args.history))
    client = RecordingClient(args.url, history, args.name)
    sink_log = SinkLog(Path(args.log))

    def sink(lane: str, events: Sequence[Any]) -> None:
        sink_log.receive(args.name, lane, events)  # the consumer has it now
        if args.delay:
            time.sleep(args.delay)  # a slow acknowledgement from the consumer

    relay = Relay(client, sink, name=args.name, batch_size=args.batch,
                  lease_seconds=args.lease, max_sleep=0.2)  # fmt: skip
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: relay.stop())
    relay.run()


# =============================================================================
# make chaos: the figures table
# =============================================================================
def print_report(path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = read_jsonl(path)
    table = Table(
        title=f"runrelay chaos ({os.environ.get('RUNRELAY_CHAOS_SECONDS', '?')} per scenario)"
    )
    columns = ("scenario", "seconds", "operations", "faults injected", "indeterminate",
               "replays (recorded / afresh)", "takeovers", "cancels won", "violations")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for r in rows:
        c = r["counters"]
        table.add_row(
            r["scenario"],
            f"{r['seconds']:.0f}",
            str(r["operations"]),
            str(r["faults"]),
            str(c.get("calls:info", 0)),
            f"{c.get('replays:recorded', 0)} / {c.get('replays:afresh', 0)}",
            str(c.get("takeovers", 0)),
            str(c.get("cancels_won", 0)),
            str(r["violations"]),
        )
    Console(width=160).print(table)


def record_figures(
    scenario: str, seconds: float, operations: int, faults: int, report: Report
) -> None:
    """Append a scenario's figures to $RUNRELAY_CHAOS_REPORT (make chaos)."""
    path = os.environ.get("RUNRELAY_CHAOS_REPORT")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({
            "scenario": scenario, "seconds": seconds, "operations": operations,
            "faults": faults, "violations": len(report.violations),
            "counters": dict(report.counters),
        }) + "\n")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faults.py")
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("worker", "relay"):
        p = sub.add_parser(role)
        p.add_argument("--url", required=True)
        p.add_argument("--name", required=True)
        p.add_argument("--history", required=True)
        p.add_argument("--log", required=True)
        p.add_argument("--lease", type=int, default=5)
        p.add_argument("--heartbeat-every", type=float, default=0.5)
        p.add_argument("--concurrency", type=int, default=2)
        p.add_argument("--delay", type=float, default=0.0)
        p.add_argument("--batch", type=int, default=5)
    p = sub.add_parser("report")
    p.add_argument("path")
    args = parser.parse_args(argv)
    if args.role == "worker":
        _child_worker(args)
    elif args.role == "relay":
        _child_relay(args)
    else:
        print_report(Path(args.path))
    return 0


if __name__ == "__main__":
    random.seed()
    sys.exit(main())
