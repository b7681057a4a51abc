"""The SQL sources in plpgsql/ and the code each revision ships in the
package's migrations/frozen/.

plpgsql/ is the one readable source of truth:

* ``plpgsql/schema/*.sql`` — the current tables, sequences and indexes;
* the folders of ``CODE_DIRS`` (``_internal``, ``runs``, ``ledger``,
  ``schedules``, ``meta``, ``views``, ``admin``) — the *code*, functions and
  views, dropped and recreated whole by every revision;
* ``plpgsql/grants.sql`` — privileges, run after the code.

Each Alembic revision ships its code as a delta, ``frozen/<rev>/code.patch``:
a unified diff from the previous revision's code tree to its own (see
``runrelay._migrations.codetree``); migrations never read plpgsql/. Commands::

    python -m devtools.sqlsource freeze       # write the head revision's code.patch (make freeze)
    python -m devtools.sqlsource check        # fail if the head's code differs from plpgsql/
    python -m devtools.sqlsource show [REV]   # print the SQL that installs REV's code
    python -m devtools.sqlsource release REV  # record REV in frozen/RELEASED (needs DATABASE_URL)
    python -m devtools.sqlsource code|schema  # print what plpgsql/ builds

See docs/migrations.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg import sql

from devtools import catalog, codepatch
from runrelay import _migrations as migrations
from runrelay._migrations import codetree
from runrelay._migrations.codetree import CODE_DIRS, GRANTS, PATCH, RELEASED, PatchError, Tree

REPO = Path(__file__).resolve().parents[1]
PLPGSQL = REPO / "plpgsql"
FROZEN = codetree.FROZEN


class SourceError(Exception):
    """A command refused; the message says why and what to do."""


def schema_files() -> list[Path]:
    return sorted((PLPGSQL / "schema").glob("*.sql"))


def code_tree() -> Tree:
    """The code plpgsql/ holds now: path relative to plpgsql/ -> normalised text."""
    files = [p for folder in CODE_DIRS for p in (PLPGSQL / folder).glob("*.sql")]
    files.append(PLPGSQL / GRANTS)
    return {
        p.relative_to(PLPGSQL).as_posix(): codepatch.normalise(p.read_text(encoding="utf-8"))
        for p in files
    }


def build_schema() -> str:
    return "\n".join(
        f"-- >>> {p.relative_to(REPO)}\n{codepatch.normalise(p.read_text(encoding='utf-8'))}"
        for p in schema_files()
    )


def build_code() -> str:
    return codetree.to_sql(code_tree())


def head_revision(frozen: Path = FROZEN) -> str:
    return codetree.revisions(frozen)[-1]


def freeze(revision: str | None = None, frozen: Path = FROZEN) -> Path:
    """Write the head revision's code.patch: plpgsql/'s tree against its predecessor's.

    The head is Alembic's (a new revision's frozen/<rev>/ is created here).
    """
    revision = revision or migrations.head()
    if revision in codetree.released(frozen):
        raise SourceError(
            f"revision {revision} is released (frozen/{RELEASED}): its code can no longer "
            "change. Open a new revision (`alembic revision --rev-id NNNN -m ...`) and run "
            "`make freeze`."
        )
    if not re.fullmatch(r"[0-9]{4}", revision):
        raise SourceError(
            f"revision id {revision!r} is not four digits: create revisions with "
            "`alembic revision --rev-id NNNN -m ...`"
        )
    chain = codetree.revisions(frozen)
    if revision not in chain and (not chain or revision > chain[-1]):
        (frozen / revision).mkdir()
        chain.append(revision)
    if revision != chain[-1]:
        raise SourceError(f"only the head revision ({chain[-1]}) can be frozen, not {revision}")
    previous = codetree.assemble(chain[-2], frozen) if len(chain) > 1 else {}
    target = frozen / revision / PATCH
    target.write_text(codepatch.diff(previous, code_tree()), encoding="utf-8")
    return target


def check(frozen: Path = FROZEN) -> list[str]:
    """The code files whose head revision text differs from plpgsql/'s (empty: current)."""
    frozen_tree = codetree.assemble(head_revision(frozen), frozen)
    source = code_tree()
    return sorted(p for p in set(frozen_tree) | set(source) if frozen_tree.get(p) != source.get(p))


def release(revision: str, database_url: str, frozen: Path = FROZEN) -> str:
    """Append ``revision``'s line to frozen/RELEASED and return it.

    The catalog checksum comes from a throwaway database on DATABASE_URL's
    server, migrated to ``revision`` (and dropped afterwards).
    """
    chain, recorded = codetree.revisions(frozen), codetree.released(frozen)
    if revision not in chain:
        raise SourceError(f"no revision {revision} in frozen/")
    if revision in recorded:
        raise SourceError(f"revision {revision} is already released")
    earlier = [r for r in chain[: chain.index(revision)] if r not in recorded]
    if earlier:
        raise SourceError(f"release {', '.join(earlier)} first: revisions are released in order")
    if revision == chain[-1] and check(frozen):
        raise SourceError(f"revision {revision}'s code.patch is stale: run `make freeze` first")
    tree_sha = codetree.tree_sha256(codetree.assemble(revision, frozen))
    line = f"{revision} {tree_sha} {catalog_checksum(revision, database_url)}"
    path = frozen / RELEASED
    path.write_text(path.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    return line


def catalog_checksum(revision: str, database_url: str) -> str:
    """devtools.catalog.checksum of a fresh database migrated to ``revision``."""
    name = f"rr_release_{os.getpid()}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = f"{database_url.rsplit('/', 1)[0]}/{name}"
    try:
        subprocess.run(
            [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", revision],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        with psycopg.connect(url, autocommit=True) as conn:
            return catalog.checksum(catalog.fingerprint(conn, "runrelay"))
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(drop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.sqlsource")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fr = sub.add_parser("freeze", help="write the head revision's code.patch from plpgsql/")
    fr.add_argument("revision", nargs="?")
    sub.add_parser("check", help="fail if the head revision's code differs from plpgsql/")
    sh = sub.add_parser("show", help="print the SQL that installs a revision's code")
    sh.add_argument("revision", nargs="?")
    rel = sub.add_parser("release", help="record a revision in frozen/RELEASED")
    rel.add_argument("revision")
    sub.add_parser("code", help="print the code built from plpgsql/")
    sub.add_parser("schema", help="print the schema built from plpgsql/schema/")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "freeze":
            print(freeze(args.revision))
        elif args.cmd == "code":
            sys.stdout.write(build_code())
        elif args.cmd == "schema":
            sys.stdout.write(build_schema())
        elif args.cmd == "show":
            sys.stdout.write(codetree.install_sql(args.revision or head_revision()))
        elif args.cmd == "release":
            url = os.environ.get("DATABASE_URL")
            if not url:
                raise SourceError("release migrates a throwaway database: set DATABASE_URL")
            print(release(args.revision, url))
        elif args.cmd == "check":
            if migrations.head() != head_revision():
                raise SourceError(
                    f"Alembic's head is {migrations.head()} but frozen/ ends at "
                    f"{head_revision()}: run `make freeze`"
                )
            leftovers = sorted(str(p.relative_to(FROZEN)) for p in FROZEN.glob("*/code.sql"))
            if leftovers:
                raise SourceError(
                    f"full copies of the old storage scheme are left in frozen/: "
                    f"{', '.join(leftovers)}; delete them (code lives in code.patch)"
                )
            stale = check()
            if stale:
                print(
                    f"migrations/frozen/{head_revision()}/{PATCH} is stale ({', '.join(stale)} "
                    "differ from plpgsql/): run `make freeze`",
                    file=sys.stderr,
                )
                return 1
    except (SourceError, PatchError) as exc:
        print(f"{parser.prog} {args.cmd}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
