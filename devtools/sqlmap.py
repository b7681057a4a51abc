"""What the SQL in plpgsql/ calls and writes, read from the sources.

plpgsql/README.md is the map of the SQL: for each public function the helpers
it calls, in order, and the tables it writes (itself or through those
helpers). This module reads the same facts from the function sources so a
test can hold the map to them (tests/python/test_sql_map.py), and prints
them for whoever updates the map:

    python -m devtools.sqlmap            # every public function
    python -m devtools.sqlmap claim_attempts

It reads text, not a catalog: a call is ``_name(`` (or a public function's
name followed by ``(``) outside comments and string literals, a write is
``INSERT INTO t``, ``UPDATE t`` or ``DELETE FROM t`` for a table of
plpgsql/schema/.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from runrelay._migrations.codetree import CODE_DIRS

REPO = Path(__file__).resolve().parents[1]
PLPGSQL = REPO / "plpgsql"
PUBLIC_DIRS = ("runs", "ledger", "schedules", "meta", "admin")

_CREATE = re.compile(r"^CREATE (?:FUNCTION|VIEW) (\w+)", re.MULTILINE)
_TABLE = re.compile(r"^CREATE TABLE (\w+)", re.MULTILINE)
_CALL = re.compile(r"\b(\w+)\s*\(")
_WRITE = re.compile(r"\b(?:INSERT\s+INTO|DELETE\s+FROM|UPDATE)\s+(\w+)", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")
_STRING = re.compile(r"'(?:[^']|'')*'")


@dataclass
class Routine:
    name: str
    path: Path
    body: str
    calls: list[str] = field(default_factory=list)
    own_writes: set[str] = field(default_factory=set)

    @property
    def public(self) -> bool:
        return not self.name.startswith("_")


def _strip(sql: str) -> str:
    return _STRING.sub("''", _COMMENT.sub("", sql))


def tables() -> set[str]:
    found: set[str] = set()
    for path in sorted((PLPGSQL / "schema").glob("*.sql")):
        found.update(_TABLE.findall(path.read_text(encoding="utf-8")))
    return found


def routines() -> dict[str, Routine]:
    """Every function and view of plpgsql/, keyed by name (overloads share one)."""
    found: dict[str, Routine] = {}
    for folder in CODE_DIRS:
        for path in sorted((PLPGSQL / folder).glob("*.sql")):
            text = _strip(path.read_text(encoding="utf-8"))
            starts = list(_CREATE.finditer(text))
            for i, match in enumerate(starts):
                end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
                body = text[match.start() : end].split("\nCOMMENT ON ", 1)[0]
                name = match.group(1)
                if name in found:
                    found[name].body += "\n" + body
                else:
                    found[name] = Routine(name, path.relative_to(PLPGSQL), body)
    known = set(found)
    table_names = tables()
    for routine in found.values():
        rest = routine.body.partition("(")[2]
        for call in _CALL.findall(rest):
            if call in known and call != routine.name and call not in routine.calls:
                routine.calls.append(call)
        routine.own_writes = {t for t in _WRITE.findall(routine.body) if t in table_names}
    return found


def writes(name: str, found: dict[str, Routine]) -> set[str]:
    """Tables a routine writes itself or through any helper it calls."""
    seen: set[str] = set()
    out: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        out |= found[current].own_writes
        stack.extend(found[current].calls)
    return out


def public_functions(found: dict[str, Routine]) -> list[str]:
    return sorted(
        name
        for name, r in found.items()
        if r.public and (r.path.parts[0] in PUBLIC_DIRS or r.body.startswith("CREATE FUNCTION"))
    )


def describe(name: str, found: dict[str, Routine]) -> str:
    routine = found[name]
    return (
        f"### {name} ({routine.path})\n"
        f"- calls: {', '.join(routine.calls) or '(none)'}\n"
        f"- writes: {', '.join(sorted(writes(name, found))) or '(none)'}\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    found = routines()
    for name in args or public_functions(found):
        if name not in found:
            print(f"no function {name} in plpgsql/", file=sys.stderr)
            return 1
        print(describe(name, found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
