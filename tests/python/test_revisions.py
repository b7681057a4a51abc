"""The revisions' stored code: a chain of patches that installs exactly what
each revision shipped.

Each revision stores only its code delta (frozen/<rev>/code.patch), and
frozen/RELEASED pins what every released revision installs: the sha256 of its
assembled code tree and the checksum of the catalog a migration to it leaves
(devtools.catalog, identical on PostgreSQL 15 and 18). These tests replay
every revision, one step at a time up from base and back down, and compare
each step's catalog with RELEASED; and they check that a damaged patch or a
freeze of a released revision is refused with a clear message.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from devtools import catalog, codepatch, sqlsource

from conftest import REPO, alembic, create_database, drop_database
from runrelay._migrations import codetree
from runrelay._migrations.codetree import PatchError

SCHEMA = "rr_revisions"  # not the default: the checksums must not depend on it


def _released_copy(tmp_path: Path) -> Path:
    frozen = tmp_path / "frozen"
    shutil.copytree(codetree.FROZEN, frozen, ignore=shutil.ignore_patterns("*.sql"))
    return frozen


def test_the_frozen_revisions_are_the_alembic_chain() -> None:
    scripts = ScriptDirectory.from_config(Config(str(REPO / "alembic.ini")))
    chain = [s.revision for s in reversed(list(scripts.walk_revisions("base", "heads")))]
    assert codetree.revisions() == chain
    for script in scripts.walk_revisions("base", "heads"):
        assert script.down_revision == (
            None if script.revision == chain[0] else chain[chain.index(script.revision) - 1]
        )
    released = list(codetree.released())
    assert released == chain[: len(released)], "RELEASED lists a prefix of the chain, in order"
    assert released, "at least one revision is released"


def test_each_released_tree_has_its_recorded_sha256() -> None:
    for revision, (tree_sha, _catalog) in codetree.released().items():
        tree = codetree.assemble(revision)
        assert codetree.tree_sha256(tree) == tree_sha, revision
        assert all(text == codepatch.normalise(text) for text in tree.values())


def test_the_head_revision_is_plpgsql() -> None:
    assert sqlsource.check() == []
    assert codetree.to_sql(codetree.assemble(sqlsource.head_revision())) == sqlsource.build_code()


def test_an_insertion_moved_by_a_line_fails_on_the_released_checksum(tmp_path: Path) -> None:
    """Without context lines an inserted block is placed by its header alone:
    moved one line up it still applies, and the released tree's sha256 is
    what catches it."""
    frozen = _released_copy(tmp_path)
    patch = frozen / "0004" / "code.patch"
    lines = patch.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        match = re.match(r"^@@ -([0-9]+),0 \+([0-9]+)(,[0-9]+)? @@\n$", line)
        if match and int(match.group(1)) > 1:
            old, new = int(match.group(1)) - 1, int(match.group(2)) - 1
            lines[i] = f"@@ -{old},0 +{new}{match.group(3) or ''} @@\n"
            break
    else:
        pytest.fail("no insertion hunk in 0004")
    patch.write_text("".join(lines))
    with pytest.raises(
        PatchError, match=r"revision 0004: its assembled code has sha256 .* changed"
    ):
        codetree.assemble("0004", frozen)


def test_each_revision_stores_little_more_than_the_lines_it_changes() -> None:
    """A code.patch carries no context lines: what a revision stores is the
    lines it removes and adds, plus a header per file and per hunk, at most
    1.2 times the bytes of those lines (docs/migrations.md, "Storage")."""
    for revision in codetree.revisions():
        text = (codetree.FROZEN / revision / codetree.PATCH).read_text()
        lines = text.splitlines(keepends=True)
        assert not [line for line in lines if line.startswith(" ")], revision
        changed = [
            line for line in lines if line[:1] in "+-" and not line.startswith(("--- ", "+++ "))
        ]
        assert len(text) <= 1.2 * sum(len(line) - 1 for line in changed), revision


def test_diff_then_apply_gives_the_new_tree() -> None:
    old = {
        "_internal/a.sql": "".join(f"line {i}\n" for i in range(40)),
        "runs/gone.sql": "bye\n",
        "grants.sql": "GRANT;\n",
    }
    new = {
        "_internal/a.sql": "first\n" + old["_internal/a.sql"].replace("line 20\n", "twenty\n"),
        "ledger/new.sql": "hello\nworld\n",
        "grants.sql": "GRANT;\n",
    }
    patch = codepatch.diff(old, new)
    assert "--- /dev/null\n+++ b/ledger/new.sql\n" in patch
    assert "--- a/runs/gone.sql\n+++ /dev/null\n" in patch
    assert "grants.sql" not in patch  # unchanged files are not in the patch
    assert codetree.apply(old, patch, "9999") == new
    assert codetree.apply(new, codepatch.diff(new, old), "9999") == old


def test_a_changed_removed_line_fails_assembly_naming_revision_file_and_hunk(
    tmp_path: Path,
) -> None:
    frozen = _released_copy(tmp_path)
    patch = frozen / "0004" / "code.patch"
    lines = patch.read_text().splitlines(keepends=True)
    # A line the second hunk of the first file that has two removes.
    path, hunk, target = "", 0, None
    for i, line in enumerate(lines):
        if line.startswith("+++ "):
            path, hunk = line[len("+++ b/") :].strip(), 0
        elif line.startswith("@@"):
            hunk += 1
        elif hunk == 2 and line.startswith("-"):
            target = i
            break
    assert target is not None
    lines[target] = "--- edited after release\n"
    patch.write_text("".join(lines))
    with pytest.raises(PatchError) as exc:
        codetree.assemble("0006", frozen)
    message = str(exc.value)
    assert message.startswith("revision 0004: code.patch line ")
    assert f": {path}: hunk {hunk} (@@ " in message
    assert "does not apply" in message and "-- edited after release" in message
    # The migration's entry point fails the same way, before anything runs.
    with pytest.raises(PatchError, match="revision 0004"):
        codetree.install_sql("0005", frozen)
    assert codetree.assemble("0003", frozen) == codetree.assemble("0003")


def test_a_released_revision_whose_code_changed_is_refused(tmp_path: Path) -> None:
    frozen = _released_copy(tmp_path)
    patch = frozen / "0005" / "code.patch"
    text = patch.read_text()
    added = next(ln for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    patch.write_text(text.replace(added, added + " -- tampered", 1))
    with pytest.raises(PatchError, match=r"^revision 0005: its assembled code has sha256 "):
        codetree.assemble("0005", frozen)
    assert codetree.assemble("0004", frozen) == codetree.assemble("0004")


def test_freeze_refuses_a_released_revision(tmp_path: Path) -> None:
    frozen = _released_copy(tmp_path)
    head = codetree.revisions(frozen)[-1]
    if head not in codetree.released(frozen):  # an open head: release it in the copy
        with (frozen / "RELEASED").open("a") as f:
            f.write(f"{head} {codetree.tree_sha256(codetree.assemble(head, frozen))} {'0' * 64}\n")
    before = (frozen / head / "code.patch").read_text()
    with pytest.raises(sqlsource.SourceError, match=f"revision {head} is released"):
        sqlsource.freeze(frozen=frozen)
    assert (frozen / head / "code.patch").read_text() == before
    released = next(iter(codetree.released()))
    assert sqlsource.main(["freeze", released]) == 1


def _checksum(url: str) -> tuple[str, dict[str, object]]:
    with psycopg.connect(url, autocommit=True) as conn:
        fp = catalog.fingerprint(conn, SCHEMA)
    return catalog.checksum(fp), fp


def test_every_revision_replays_to_its_released_catalog_up_and_down() -> None:
    """Up from base one revision at a time, then down one at a time: after
    each step the install's catalog (functions, views, types, grants) is the
    one RELEASED records for that revision; a downgrade restores exactly the
    previous revision's code."""
    chain, released = codetree.revisions(), codetree.released()
    name = f"rr_revisions_{os.getpid()}"
    url = create_database(name)
    try:
        upgraded: dict[str, tuple[str, dict[str, object]]] = {}
        for revision in chain:
            alembic(url, "-x", f"schema={SCHEMA}", "upgrade", revision)
            upgraded[revision] = _checksum(url)
            if revision in released:
                assert upgraded[revision][0] == released[revision][1], (
                    f"upgrading to {revision} gave a catalog other than RELEASED records"
                )
        for revision, previous in reversed(list(zip(chain[1:], chain, strict=False))):
            alembic(url, "-x", f"schema={SCHEMA}", "downgrade", previous)
            checksum, fp = _checksum(url)
            assert fp == upgraded[previous][1], f"downgrading {revision} to {previous}"
            if previous in released:
                assert checksum == released[previous][1]
        alembic(url, "-x", f"schema={SCHEMA}", "downgrade", "base")
        with psycopg.connect(url, autocommit=True) as conn:
            left = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = %s", [SCHEMA]
            ).fetchone()
        assert left == (0,)
    finally:
        drop_database(name)
