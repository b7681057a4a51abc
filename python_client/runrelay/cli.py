"""The `runrelay` command line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]


def _database_url(args: argparse.Namespace) -> str:
    url = args.database_url or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("runrelay: set DATABASE_URL or pass --database-url")
    return str(url)


def cmd_migrate(args: argparse.Namespace) -> int:
    command = [
        sys.executable,
        "-m",
        "alembic",
        "-c",
        str(REPO / "alembic.ini"),
        "-x",
        f"schema={args.schema}",
        "-x",
        f"url={_database_url(args)}",
        "upgrade",
        args.revision,
    ]
    return subprocess.run(command, check=False).returncode


def cmd_demo(args: argparse.Namespace) -> int:
    console = Console()
    url = _database_url(args)
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SELECT runrelay.get_schema_version()").fetchone()
        tables = conn.execute(
            """
            SELECT c.relname, c.reltuples::bigint
            FROM pg_class AS c
            WHERE c.relnamespace = 'runrelay'::regnamespace AND c.relkind = 'r'
            ORDER BY c.relname
            """
        ).fetchall()
        roles = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'runrelay\\_%' ORDER BY 1"
        ).fetchall()
    table = Table(title=f"runrelay schema, revision {version[0] if version else '?'}")
    table.add_column("table")
    for name, _ in tables:
        table.add_row(name)
    console.print(table)
    console.print("roles: " + ", ".join(r[0] for r in roles))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runrelay", description=__doc__)
    parser.add_argument("--database-url", help="defaults to $DATABASE_URL")
    sub = parser.add_subparsers(dest="command", required=True)
    migrate = sub.add_parser("migrate", help="install or upgrade the schema (Alembic)")
    migrate.add_argument("--schema", default="runrelay")
    migrate.add_argument("--revision", default="head")
    migrate.set_defaults(func=cmd_migrate)
    demo = sub.add_parser("demo", help="show runrelay working end to end")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
