"""The code each revision installs, stored as a chain of patches.

A revision's code is a *tree*: relative path -> text, the files of the
folders of ``CODE_DIRS`` under ``plpgsql/`` and ``grants.sql``
(each normalised to end with exactly one newline). Revision ``<rev>`` stores
only what changed, in ``frozen/<rev>/code.patch``: a unified diff
(``--- a/<path>`` / ``+++ b/<path>``, ``/dev/null`` for an added or removed
file) from the previous revision's tree to its own; ``0001``'s is from the
empty tree. A patch carries no context lines (``devtools/codepatch.py``
writes them; the applier also takes hunks with context). The revisions are
the zero-padded folder names of ``frozen/``, a linear chain
(tests/python/test_revisions.py checks it is Alembic's).

``install_sql(rev)`` applies the patches of ``0001`` .. ``rev`` and
concatenates the files in install order. The applier is strict: a hunk applies
only at its stated line, with every removed (and context) line exactly as the
file holds it there (no fuzz, no offset); an insertion goes after exactly the
line its header names; and any mismatch raises `PatchError` naming the
revision, file and hunk, always before a migration runs any SQL.
``frozen/RELEASED`` records the sha256 of each released revision's tree; an
assembled tree that differs is an error too, so a released revision installs
exactly the code it shipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path


def alembic_home() -> Path:
    """The folder of the Alembic home, the package runrelay.migrations: the
    top-level migrations/ folder in a checkout, runrelay/migrations/ in a
    wheel. Found without importing it (its __init__ imports this package)."""
    spec = importlib.util.find_spec("runrelay.migrations")
    if spec is None or spec.origin is None:
        raise PatchError("the package runrelay.migrations (the Alembic home) is not installed")
    return Path(spec.origin).resolve().parent


CODE_DIRS = ("_internal", "runs", "ledger", "schedules", "meta", "views", "admin")
GRANTS = "grants.sql"
PATCH = "code.patch"
RELEASED = "RELEASED"

Tree = dict[str, str]

_REVISION = re.compile(r"^[0-9]{4}$")
_PATH = re.compile(rf"^(?:(?:{'|'.join(CODE_DIRS)})/[A-Za-z0-9_]+\.sql|grants\.sql)$")
_HUNK = re.compile(r"^@@ -([0-9]+)(?:,([0-9]+))? \+([0-9]+)(?:,([0-9]+))? @@\n$")


class PatchError(Exception):
    """A revision's stored code cannot be assembled; nothing was executed."""


FROZEN = alembic_home() / "frozen"


def install_order(paths: Iterable[str]) -> list[str]:
    """CODE_DIRS in order, each sorted by name, then grants.sql last."""

    def key(path: str) -> tuple[int, str]:
        folder = path.split("/", 1)[0]
        return (CODE_DIRS.index(folder) if folder in CODE_DIRS else len(CODE_DIRS), path)

    return sorted(paths, key=key)


def to_sql(tree: Tree) -> str:
    """The files in install order, each after a ``-- >>> plpgsql/<path>`` marker."""
    return "\n".join(f"-- >>> plpgsql/{p}\n{tree[p]}" for p in install_order(tree))


def tree_sha256(tree: Tree) -> str:
    """sha256 of ``sha256sum``'s listing of the tree's files, sorted by path.

    By hand: ``cd <tree> && sha256sum $(find . -type f -printf '%P\\n' |
    LC_ALL=C sort) | sha256sum``.
    """
    listing = "".join(
        f"{hashlib.sha256(tree[p].encode()).hexdigest()}  {p}\n" for p in sorted(tree)
    )
    return hashlib.sha256(listing.encode()).hexdigest()


def revisions(frozen: Path = FROZEN) -> list[str]:
    """The revisions, in order: the zero-padded folder names of frozen/."""
    return sorted(p.name for p in frozen.iterdir() if p.is_dir() and _REVISION.match(p.name))


def released(frozen: Path = FROZEN) -> dict[str, tuple[str, str]]:
    """frozen/RELEASED: revision -> (tree sha256, catalog checksum)."""
    path = frozen / RELEASED
    if not path.exists():
        return {}
    out: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3 or not _REVISION.match(fields[0]) or fields[0] in out:
            raise PatchError(f"frozen/{RELEASED} line {number} is malformed: {line!r}")
        out[fields[0]] = (fields[1], fields[2])
    return out


def assemble(revision: str, frozen: Path = FROZEN) -> Tree:
    """The tree of ``revision``: the patches of the chain up to it, applied in order."""
    chain = revisions(frozen)
    if revision not in chain:
        raise PatchError(f"revision {revision}: no folder frozen/{revision}/")
    recorded = released(frozen)
    tree: Tree = {}
    for rev in chain[: chain.index(revision) + 1]:
        path = frozen / rev / PATCH
        if not path.exists():
            raise PatchError(f"revision {rev}: frozen/{rev}/{PATCH} is missing")
        tree = apply(tree, path.read_text(encoding="utf-8"), rev)
        if rev in recorded and tree_sha256(tree) != recorded[rev][0]:
            raise PatchError(
                f"revision {rev}: its assembled code has sha256 {tree_sha256(tree)}, but "
                f"frozen/{RELEASED} records {recorded[rev][0]}: the code.patch of a released "
                f"revision (0001..{rev}) was changed"
            )
    return tree


def install_sql(revision: str, frozen: Path = FROZEN) -> str:
    """The SQL that installs ``revision``'s code (after all code was dropped)."""
    first = revisions(frozen)[0]
    header = (
        f"-- Code of revision {revision}, assembled from frozen/{first}..{revision}/{PATCH}.\n\n"
    )
    return header + to_sql(assemble(revision, frozen))


def apply(tree: Tree, patch: str, revision: str) -> Tree:
    """``tree`` with ``patch`` (one revision's code.patch) applied, strictly."""
    lines = patch.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        raise PatchError(f"revision {revision}: {PATCH} does not end with a newline (truncated?)")
    out = dict(tree)
    seen: set[str] = set()
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines)):
            raise PatchError(
                f"revision {revision}: {PATCH} line {i + 1}: expected a '--- a/<path>' header, "
                f"found {lines[i]!r}"
            )
        if not lines[i + 1].startswith("+++ "):
            raise PatchError(
                f"revision {revision}: {PATCH} line {i + 2}: expected a '+++ b/<path>' header, "
                f"found {lines[i + 1]!r}"
            )
        old_name, new_name = lines[i][4:].rstrip("\n"), lines[i + 1][4:].rstrip("\n")
        path, adds, removes = _file_header(revision, i + 1, old_name, new_name)
        if path in seen:
            raise PatchError(f"revision {revision}: {PATCH} patches {path} twice")
        seen.add(path)
        if adds and path in out:
            raise PatchError(f"revision {revision}: {PATCH} adds {path}, which already exists")
        if not adds and path not in out:
            raise PatchError(f"revision {revision}: {PATCH} patches {path}, which does not exist")
        i += 2
        hunks: list[tuple[int, str, list[str]]] = []
        while i < len(lines) and lines[i].startswith("@@"):
            start, header = i, lines[i]
            match = _HUNK.match(header)
            if not match:
                raise PatchError(
                    f"revision {revision}: {PATCH} line {i + 1}: {path}: malformed hunk "
                    f"header {header!r}"
                )
            old_count = 1 if match.group(2) is None else int(match.group(2))
            new_count = 1 if match.group(4) is None else int(match.group(4))
            body: list[str] = []
            i += 1
            seen_old = seen_new = 0
            while seen_old < old_count or seen_new < new_count:
                if i >= len(lines) or lines[i][:1] not in (" ", "-", "+"):
                    raise PatchError(
                        f"revision {revision}: {PATCH} line {i + 1}: {path}: hunk "
                        f"{len(hunks) + 1} ({header.strip()}) is shorter than its header says"
                    )
                seen_old += lines[i][0] in " -"
                seen_new += lines[i][0] in " +"
                body.append(lines[i])
                i += 1
            if seen_old != old_count or seen_new != new_count:
                raise PatchError(
                    f"revision {revision}: {PATCH} line {start + 1}: {path}: hunk "
                    f"{len(hunks) + 1} ({header.strip()}) does not match its header's counts"
                )
            hunks.append((start + 1, header, body))
        if not hunks:
            raise PatchError(f"revision {revision}: {PATCH}: {path} has no hunk")
        text = _apply_file(revision, path, out.get(path, ""), hunks)
        if removes:
            if text:
                raise PatchError(
                    f"revision {revision}: {PATCH} removes {path} but leaves lines in it"
                )
            del out[path]
        else:
            out[path] = text
    return out


def _file_header(revision: str, line: int, old: str, new: str) -> tuple[str, bool, bool]:
    adds, removes = old == "/dev/null", new == "/dev/null"
    if adds and removes:
        raise PatchError(f"revision {revision}: {PATCH} line {line}: /dev/null to /dev/null")
    path = new[2:] if adds else old[2:]
    ok = (adds or old.startswith("a/")) and (removes or new.startswith("b/"))
    if not ok or not _PATH.match(path) or not (adds or removes or old[2:] == new[2:]):
        raise PatchError(
            f"revision {revision}: {PATCH} line {line}: bad file header "
            f"'--- {old}' / '+++ {new}' (expected a/<path> and b/<path> of one code file)"
        )
    return path, adds, removes


def _apply_file(
    revision: str, path: str, text: str, hunks: list[tuple[int, str, list[str]]]
) -> str:
    source = text.splitlines(keepends=True)
    result: list[str] = []
    pos = 0  # source lines before pos are already copied or replaced
    for number, (patch_line, header, body) in enumerate(hunks, 1):
        where = f"revision {revision}: {PATCH} line {patch_line}: {path}: hunk {number} "
        where += f"({header.strip()})"
        match = _HUNK.match(header)
        assert match is not None
        old_start, new_start = int(match.group(1)), int(match.group(3))
        old = [ln[1:] for ln in body if ln[0] in " -"]
        new = [ln[1:] for ln in body if ln[0] in " +"]
        # A hunk with no old lines inserts after line old_start.
        start = old_start - 1 if old else old_start
        if start < pos or start + len(old) > len(source):
            raise PatchError(
                f"{where}: its lines {start + 1}..{start + len(old)} are out of order or past "
                f"the end of the file ({len(source)} lines)"
            )
        result.extend(source[pos:start])
        for offset, expected in enumerate(old):
            if source[start + offset] != expected:
                raise PatchError(
                    f"{where} does not apply: line {start + offset + 1} is "
                    f"{source[start + offset]!r}, the patch expects {expected!r}"
                )
        expected_new_start = len(result) + 1 if new else len(result)
        if new_start != expected_new_start:
            raise PatchError(f"{where}: its new start {new_start} should be {expected_new_start}")
        result.extend(new)
        pos = start + len(old)
    result.extend(source[pos:])
    return "".join(result)
