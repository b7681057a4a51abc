"""Output: tables for people, JSON for scripts.

Whatever came from the database reaches the terminal through `printable`
(plain lines, error messages) or `text` (table cells and titles): rich
markup in data (`[bold]`, `[link=...]`, a traceback's `HANDLERS[job.queue]`)
is printed as it is, never interpreted, and control characters are shown
escaped (``, `
`), so a run id, payload or error cannot move the cursor,
recolour the screen, hide text or forge a line. JSON output is exact JSON
(its encoder escapes every control character).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import re
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

# -- output -----------------------------------------------------------------
# What a terminal would act on instead of showing: C0 and C1 control
# characters, DEL, and the bidirectional marks, embeddings, overrides and
# isolates that reorder the text after them on the screen.
_BIDI = "\u200e\u200f\u202a-\u202e\u2066-\u2069"

_ANY_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")

# The same but the newline, for the texts that are several lines.
_CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_BIDI}]")

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: Any, *, lines: bool = False) -> str:
    """Data as the terminal may show it: every control character escaped
    (ESC as `\\x1b`, a newline as `\\n`, U+202E as `\\u202e`), except the
    newlines of a multi-line text when `lines` is set. The one rule for all
    the output of the commands; with rich, `as_text`."""
    return (_CONTROL_BUT_NEWLINE if lines else _ANY_CONTROL).sub(_escaped, str(value))


def as_text(value: Any, *, lines: bool = False) -> Any:
    """`printable(value)` as a rich Text, which rich prints as it is: markup
    such as `[bold]` or `[link=...]` in data is never interpreted."""
    from rich.text import Text

    return Text(printable(value, lines=lines))


def line(value: Any, *, file: Any = None) -> None:
    """Print one line of data (printable) to stdout, or to `file`."""
    print(printable(value), file=file or sys.stdout, flush=True)


def plain(value: Any) -> Any:
    """A result as JSON-ready data: dataclasses as objects, enums as their
    value, timestamps in ISO 8601, uuids as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def print_json(value: Any, *, lines: bool = False) -> None:
    text = json.dumps(plain(value), default=str, indent=None if lines else 2)
    print(text, flush=True)


def cell(value: Any) -> str:
    """One table cell: timestamps to the second in UTC, JSON compact, None empty."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    if isinstance(value, float | Decimal):
        return f"{value:.1f}"
    return str(value)


def brief(error: Any) -> Any:
    """An error for a table cell: its message when it has one (--json and
    `runs show`'s record give all of it)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return error


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    from rich.table import Table

    out = Table(
        title=None if title is None else as_text(title), title_justify="left", show_lines=False
    )
    for number, column in enumerate(columns, 1):
        # Every column but the last keeps a value on one line; the last folds.
        out.add_column(as_text(column), no_wrap=number < len(columns), overflow="fold")
    for row in rows:
        out.add_row(*(as_text(cell(v)) for v in row))
    return out


def record(title: str, fields: Sequence[tuple[str, Any]]) -> Any:
    """A table of one record: a name and a value per line."""
    from rich.table import Table

    out = Table(title=as_text(title), title_justify="left", show_header=False)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for name, value in fields:
        out.add_row(as_text(name), as_text(cell(value)))
    return out


def console() -> Any:
    """A rich console. Piped (not a terminal) and without $COLUMNS, lines may
    be as wide as a table needs, up to 240 characters, instead of rich's 80:
    a script or a pager then gets one line a row. Markup and emoji codes
    are off: what it prints is data (see `as_text`)."""

    from rich.console import Console

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(
        soft_wrap=False, width=240 if wide else None, markup=False, emoji=False, highlight=False
    )


def show(*renderables: Any) -> None:
    out = console()
    for item in renderables:
        out.print(item)


def count(n: int, noun: str) -> str:
    """'1 run', '3 runs'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def say(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    """An action's answer: `data` as JSON with --json, else one line."""
    if args.json:
        print_json(data)
    else:
        line(text)
