"""Typed exceptions for the SQLSTATEs runrelay's functions raise (and the
few others a caller handles). The table ERRORS is the one list:
docs/errors.md is generated from it and a test keeps the two equal.

Every exception keeps the server's message, hint and detail, the parameter it
names (PostgreSQL's COLUMN field, which runrelay sets to the offending
parameter) and the original psycopg error as ``__cause__``.

Through a sharded install's proxy (PL/Proxy) a shard's error keeps its
SQLSTATE but arrives wrapped: "<function>(<pid>): [<db>] REMOTE ERROR: " before
the message, "Remote hint: " before the hint (and likewise the detail), and
without the COLUMN field. `translate` unwraps it, so a call through the proxy
raises what the same call on the shard raises.
"""

from __future__ import annotations

import re

import psycopg


class RunrelayError(Exception):
    """Base class: an error raised by a runrelay call."""

    sqlstate: str | None = None

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        hint: str | None = None,
        parameter: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate or type(self).sqlstate
        self.hint = hint
        self.parameter = parameter
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class InvalidArgument(RunrelayError):
    """Bad input: the call changed nothing; `parameter` names the argument."""

    sqlstate = "22023"


class PayloadTooLarge(RunrelayError):
    """A JSON argument exceeds settings.max_payload_bytes; nothing changed."""

    sqlstate = "54000"


class WrongIsolation(RunrelayError):
    """runrelay functions require READ COMMITTED; nothing changed."""

    sqlstate = "25000"


class LockTimeout(RunrelayError):
    """A lock wait outlasted the function's bound (10 s) or the caller's tighter
    lock_timeout; nothing changed."""

    sqlstate = "55P03"


class StatementTimeout(RunrelayError):
    """The statement was cancelled by statement_timeout; nothing changed."""

    sqlstate = "57014"


class PermissionDenied(RunrelayError):
    """The role may not call this function (see the roles in docs/security.md)."""

    sqlstate = "42501"


class SchemaMissing(RunrelayError):
    """The runrelay schema or function does not exist: run `runrelay migrate`."""

    sqlstate = "42883"


class ShardUnavailable(RunrelayError):
    """Sharded install: a shard the call needs is down or unreachable from the
    proxy; `shard` names it when known. The call did not complete there:
    repeat it when the shard is back (replays are exact). Also raised for
    PL/Proxy's own connection errors (XX000) and a shard's shutdown during
    the call (57P01, 57P02, 57P03)."""

    sqlstate = "08006"

    def __init__(self, message: str, *, shard: int | None = None, **kwargs: str | None) -> None:
        super().__init__(message, **kwargs)
        self.shard = shard


class ProxyTransaction(ValueError):
    """A producer call on a connection to a sharded install's proxy inside a
    transaction: the proxy commits on the shard at once, so a rollback would
    not undo it. Open the transaction on the run's shard instead
    (ShardMap.transaction(run_id)). Raised before any SQL."""

    def __init__(self, function: str, run_id: str) -> None:
        super().__init__(
            f"runrelay: {function} on a connection to the proxy inside a transaction would"
            f" commit on the shard at once, whatever the transaction does; open the"
            f" transaction on the run's shard with ShardMap.transaction({run_id!r})"
            " (or Client.shard_transaction) and pass that connection as conn="
        )
        self.function = function
        self.run_id = run_id


class WrongShard(ValueError):
    """A per-run call on a connection to a shard that does not own the run.
    Raised before any SQL."""

    def __init__(self, function: str, run_id: str, owner: int, connected: int) -> None:
        super().__init__(
            f"runrelay: {function}: run {run_id!r} lives on shard {owner}, but conn= is"
            f" connected to shard {connected}; use ShardMap.transaction({run_id!r}) for a"
            f" connection to shard {owner}"
        )
        self.function = function
        self.run_id = run_id
        self.shard = owner
        self.connected = connected


ERRORS: tuple[type[RunrelayError], ...] = (
    InvalidArgument,
    PayloadTooLarge,
    WrongIsolation,
    LockTimeout,
    StatementTimeout,
    PermissionDenied,
    SchemaMissing,
    ShardUnavailable,
)
_BY_SQLSTATE = {cls.sqlstate: cls for cls in ERRORS}
_BY_SQLSTATE["3F000"] = SchemaMissing  # invalid_schema_name


# PL/Proxy's wrapping of a shard's error: "runrelay.heartbeat(4): [postgres]
# REMOTE ERROR: " (a walker's one-shard callee is named runrelay_proxy.on_...).
_REMOTE = re.compile(
    r"^(?:PL/Proxy function )?[\w.\"]+\(\d+\): \[[^\]]*\] REMOTE (?:ERROR|FATAL): "
)
# A shard's server shutting down or starting up (admin_shutdown,
# crash_shutdown, cannot_connect_now), reported as a remote FATAL: the shard's
# session ended before its transaction committed.
_SHARD_GONE = frozenset({"57P01", "57P02", "57P03"})
# A PL/Proxy error of its own connection to a shard (no REMOTE ERROR in it).
_PLPROXY_CONNECTION = re.compile(r"^PL/Proxy function .*(?:\bPQ\w+: |connection)", re.S)
# The proxy's walkers name the shard: "runrelay: shard 1 is unavailable ...".
_SHARD = re.compile(r"^runrelay: shard (\d+) is unavailable")
# The two messages that carry a COLUMN field (runrelay._invalid and
# _check_json's size cap), which PL/Proxy drops: the parameter is the text
# they put where the COLUMN's value goes.
_PARAMETER = {
    "22023": re.compile(r"^runrelay: invalid (.+?): "),
    "54000": re.compile(r"^runrelay: (.+?) is too large: \d+ bytes, the limit is \d+$"),
}


def _unwrap(text: str | None, prefix: str) -> str | None:
    if text is not None and text.startswith(prefix):
        return text[len(prefix) :]
    return text


def translate(error: psycopg.Error, shard: int | None = None) -> RunrelayError | None:
    """The typed exception for a psycopg error, or None to let it propagate.

    `shard` is the shard the call went to, if the caller knows it: a
    ShardUnavailable names it unless the message names one."""
    diag = error.diag
    sqlstate = error.sqlstate or ""
    message = diag.message_primary or str(error)
    if sqlstate == "XX000" and _PLPROXY_CONNECTION.match(message):
        return ShardUnavailable(message, sqlstate=sqlstate, shard=shard)
    remote = _REMOTE.match(message)
    if sqlstate in _SHARD_GONE and remote is not None:
        return ShardUnavailable(message, sqlstate=sqlstate, shard=shard)
    cls = _BY_SQLSTATE.get(sqlstate)
    if cls is None:
        return None
    hint, detail, parameter = diag.message_hint, diag.message_detail, diag.column_name
    if remote is not None:
        message = message[remote.end() :]
        hint = _unwrap(hint, "Remote hint: ")
        detail = _unwrap(detail, "Remote detail: ")
        pattern = _PARAMETER.get(sqlstate)
        found = pattern.match(message) if pattern is not None else None
        if parameter is None and found is not None:
            parameter = found.group(1)
    if cls is ShardUnavailable:
        named = _SHARD.match(message)
        return ShardUnavailable(
            message,
            sqlstate=sqlstate,
            hint=hint,
            detail=detail,
            shard=int(named.group(1)) if named else shard,
        )
    return cls(message, sqlstate=sqlstate, hint=hint, parameter=parameter, detail=detail)
