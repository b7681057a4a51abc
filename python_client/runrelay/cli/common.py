"""What every command shares: exit codes, the errors that carry them, argument
parsers, the database URL, and the client a command connects with."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .output import say

# Command: (args) -> exit code.
Command = Callable[[argparse.Namespace], int]


EXIT_FAILED = 1

EXIT_USAGE = 2

EXIT_UNREACHABLE = 3

EXIT_OK = 0

EXIT_REFUSED = 1

EXIT_NOT_FOUND = 4


class CommandError(Exception):
    """A failure the CLI reports as one line (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


class Refused(Exception):
    """An outcome that is not an error but that a script must see: printed,
    then the command exits with `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _version() -> str:
    try:
        return version("runrelay")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def _database_url(args: argparse.Namespace) -> str | None:
    url = args.database_url or os.environ.get("DATABASE_URL")
    return str(url) if url else None


def _require_url(args: argparse.Namespace) -> str:
    url = _database_url(args)
    if not url:
        raise CommandError("set DATABASE_URL or pass --database-url", EXIT_USAGE)
    return url


def _duration(text: str) -> timedelta:
    """'90s', '15m', '12h', '7d' or plain seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in units:
            return timedelta(seconds=float(text[:-1]) * units[text[-1]])
        return timedelta(seconds=float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (e.g. 90s, 15m, 12h, 7d)"
        ) from None


def _positive_duration(text: str) -> timedelta:
    """A _duration above zero."""
    value = _duration(text)
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r} (e.g. 300s, 10m)")
    return value


def _reason(text: str) -> str:
    """A reason an operator must give (a skip's): not blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be blank: say why")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


# -- values on the command line ---------------------------------------------
def _moment(text: str, direction: int, example: str) -> datetime:
    """An ISO 8601 timestamp (UTC when it names no offset), or a duration
    from this host's clock: back (direction -1) or ahead (+1)."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:
            return datetime.now(UTC) + direction * _duration(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"not a timestamp or a duration: {text!r} (e.g. 2026-12-01T10:00:00Z, {example})"
            ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def when(text: str) -> datetime:
    """A moment: a timestamp, or a duration ago ('15m', '2h', '7d')."""
    return _moment(text, -1, "2h, 7d")


def later(text: str) -> datetime:
    """A moment ahead: a timestamp, or a duration from now ('10m')."""
    return _moment(text, +1, "10m")


def json_value(text: str) -> Any:
    """A JSON document: inline, '@path' to read a file, or '-' for stdin."""
    if text == "-":
        source = sys.stdin.read()
    elif text.startswith("@"):
        try:
            source = Path(text[1:]).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]!r}: {exc.strerror}") from None
    else:
        source = text
    try:
        return json.loads(source)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _page_size(text: str) -> int:
    value = _positive_int(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"at most 1000: {value}")
    return value


def _usage(message: str) -> Exception:
    return CommandError(message, EXIT_USAGE)


def _not_found(what: str) -> Exception:
    return CommandError(f"no such {what}", EXIT_NOT_FOUND)


# -- the connection -----------------------------------------------------------
@contextmanager
def client(args: argparse.Namespace) -> Iterator[Any]:
    """A Client on one connection of --database-url. The database's typed
    errors become the command's exit codes: bad input 2, a missing role 1."""
    from ..client import Client
    from ..errors import (
        InvalidArgument,
        PayloadTooLarge,
        PermissionDenied,
        RunrelayError,
        SchemaMissing,
    )

    url = _require_url(args)
    try:
        with Client(url, schema=args.schema) as c:
            # First the install's version: a missing schema is then one line
            # ("run runrelay migrate"), whatever the command reads after.
            c.get_schema_version()
            yield c
    except (InvalidArgument, PayloadTooLarge) as exc:
        raise CommandError(f"rejected: {exc}", EXIT_USAGE) from None
    except PermissionDenied as exc:
        raise CommandError(
            f"{exc}: the login needs {args.schema}_admin (runs enqueue, cancel and signal: "
            f"{args.schema}_producer)",
            EXIT_REFUSED,
        ) from None
    except SchemaMissing:
        raise
    except RunrelayError as exc:
        raise CommandError(str(exc), EXIT_REFUSED) from None


def _pages(
    fetch: Callable[[Any], list[Any]], position: Callable[[Any], Any], limit: int
) -> list[Any]:
    """Rows of a paged read, page after page, up to `limit` rows."""
    rows: list[Any] = []
    after = None
    while len(rows) < limit:
        page = fetch(after)
        rows.extend(page[: limit - len(rows)])
        if not page:
            break
        after = position(page[-1])
    return rows


def _outcome(args: argparse.Namespace, run_id: str, outcome: Any, exits: dict[str, int]) -> int:
    text = str(outcome)
    say(args, {"run_id": run_id, "outcome": text}, f"{run_id}: {text}")
    return exits.get(text, EXIT_OK)


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
