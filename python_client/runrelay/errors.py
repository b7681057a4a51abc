"""Typed exceptions for the SQLSTATEs of SPEC §6 (and the few others a caller
handles). The table ERRORS is the one list: docs/errors.md is generated from
it and a test keeps the two equal.

Every exception keeps the server's message and hint, the parameter it names
(PostgreSQL's COLUMN field, which runrelay sets to the offending parameter) and
the original psycopg error as ``__cause__``.
"""

from __future__ import annotations

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
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate or type(self).sqlstate
        self.hint = hint
        self.parameter = parameter

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
    """The role may not call this function (see the roles of SPEC §5)."""

    sqlstate = "42501"


class SchemaMissing(RunrelayError):
    """The runrelay schema or function does not exist: run `runrelay migrate`."""

    sqlstate = "42883"


ERRORS: tuple[type[RunrelayError], ...] = (
    InvalidArgument,
    PayloadTooLarge,
    WrongIsolation,
    LockTimeout,
    StatementTimeout,
    PermissionDenied,
    SchemaMissing,
)
_BY_SQLSTATE = {cls.sqlstate: cls for cls in ERRORS}
_BY_SQLSTATE["3F000"] = SchemaMissing  # invalid_schema_name


def translate(error: psycopg.Error) -> RunrelayError | None:
    """The typed exception for a psycopg error, or None to let it propagate."""
    cls = _BY_SQLSTATE.get(error.sqlstate or "")
    if cls is None:
        return None
    diag = error.diag
    return cls(
        diag.message_primary or str(error),
        sqlstate=error.sqlstate,
        hint=diag.message_hint,
        parameter=diag.column_name,
    )
