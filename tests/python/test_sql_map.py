"""plpgsql/README.md, the map of the SQL, is held to the sources.

The map names, for each public function, the helpers it calls in order and
the tables it writes; for each file of plpgsql/_internal the helpers it
defines; for each planner workaround the test that pins it. These tests read
the same facts from plpgsql/ (devtools.sqlmap) and fail when the map and the
code part: a public function or helper missing, a call added or reordered, a
table written that the map does not say, a file or test that no longer
exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from devtools import sqlmap

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "plpgsql" / "README.md"


def _sections(level: str) -> dict[str, str]:
    text = MAP.read_text(encoding="utf-8")
    parts = re.split(rf"^{level} (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _listed(section: str, label: str) -> list[str]:
    match = re.search(rf"^- {label}: (.*)$", section, flags=re.MULTILINE)
    assert match, f"no '- {label}:' line"
    value = match.group(1).strip()
    return [] if value == "(none)" else [v.strip().strip("`") for v in value.split(",")]


FOUND = sqlmap.routines()
PUBLIC = sqlmap.public_functions(FOUND)
ENTRIES = {name.split()[0].strip("`"): body for name, body in _sections("###").items()}


def test_every_public_function_is_on_the_map() -> None:
    missing = [name for name in PUBLIC if name not in ENTRIES]
    assert not missing, f"plpgsql/README.md has no entry for {missing}"


@pytest.mark.parametrize("name", PUBLIC)
def test_the_map_says_what_a_function_calls_and_writes(name: str) -> None:
    entry = ENTRIES.get(name)
    assert entry is not None, f"plpgsql/README.md has no entry for {name}"
    routine = FOUND[name]
    assert f"`{routine.path}`" in entry, f"{name} is defined in {routine.path}"
    assert _listed(entry, "calls") == routine.calls, sqlmap.describe(name, FOUND)
    assert set(_listed(entry, "writes")) == sqlmap.writes(name, FOUND), sqlmap.describe(name, FOUND)
    assert re.search(r"^- locks: \S", entry, flags=re.MULTILINE), f"{name}: say what it locks"


def test_every_helper_is_listed_under_the_file_that_defines_it() -> None:
    by_file: dict[str, set[str]] = {}
    for routine in FOUND.values():
        if not routine.public or routine.path.parts[0] == "_internal":
            by_file.setdefault(str(routine.path), set()).add(routine.name)
    files = {name.split()[0].strip("`"): body for name, body in _sections("####").items()}
    for path, defined in sorted(by_file.items()):
        assert path in files, f"plpgsql/README.md has no '#### `{path}`' section"
        listed = set(re.findall(r"^- `(\w+)`", files[path], flags=re.MULTILINE))
        assert listed == defined, f"{path}: the map lists {sorted(listed)}, not {sorted(defined)}"


def test_every_file_and_test_the_map_names_exists() -> None:
    text = MAP.read_text(encoding="utf-8")
    for rel in re.findall(
        r"`((?:_internal|runs|ledger|schedules|meta|views|admin|schema)/[\w./]+\.sql)`", text
    ):
        assert (REPO / "plpgsql" / rel).is_file(), f"the map names plpgsql/{rel}, which is gone"
    pinned = re.findall(r"`(tests/python/\w+\.py)::(\w+)`", text)
    assert pinned, "the map names the tests that pin the planner workarounds"
    for path, test in pinned:
        source = (REPO / path).read_text(encoding="utf-8")
        assert re.search(rf"^(?:async )?def {test}\(", source, flags=re.MULTILINE), (
            f"the map cites {path}::{test}, which does not exist"
        )
