"""The one PostgreSQL server of a bench run, started with default durability.

The test harness turns fsync off for speed; a benchmark must not, or commit
cost (the dominant cost of a job queue) disappears. So: fsync, full-page
writes and synchronous_commit all on, as a production server runs, plus
pg_stat_statements for profiling — loaded, but tracking nothing by default:
`track = all` costs every nested statement of a PL/pgSQL function a hash
update, which would tax runrelay more than a one-statement floor. Profiling
sessions opt in with `tracked(url)`. shared_buffers is 1 GB, so that the
largest backlog measured (a million runs with their indexes, about half a
gigabyte) is held in memory, as a server sized for it holds it: this
machine's kernel keeps almost no page cache (a virtual machine whose free
memory is reclaimed), so with 256 MB the million-run windows read pages
from the disk: claims at a million runs took 1.5-1.7x those at a thousand
in one check, with the same buffers per call, and 0.9-1.0x with 1 GB.
Every system under test gets its own database on this one server, so they
share the machine, the WAL device and the settings.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from runrelay import _pgcluster

REPO = Path(__file__).resolve().parents[1]

DURABLE_SETTINGS = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "none",
    "max_connections": "200",
    "shared_buffers": "1GB",
}


@dataclass
class Server:
    """A started server; `url(db)` names one of its databases."""

    cluster: _pgcluster.Cluster | None
    base_url: str  # a URL whose last path element is replaced by the database name

    def url(self, dbname: str) -> str:
        return f"{self.base_url.rsplit('/', 1)[0]}/{dbname}"

    def settings(self) -> dict[str, str]:
        names = [
            "server_version",
            "fsync",
            "full_page_writes",
            "synchronous_commit",
            "wal_sync_method",
            "shared_buffers",
            "max_connections",
        ]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = self.url(name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return url

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.destroy()
            self.cluster = None


def start(dsn: str | None = None) -> Server:
    """A fresh durable cluster (system PostgreSQL 15), or the server at `dsn`."""
    if dsn:
        return Server(cluster=None, base_url=dsn)
    cluster = _pgcluster.start_cluster("system", settings=DURABLE_SETTINGS)
    return Server(cluster=cluster, base_url=cluster.url())


def tracked(url: str) -> str:
    """`url` for sessions whose statements, nested ones included, are tracked."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-c%20pg_stat_statements.track%3Dall"


def migrate(url: str) -> None:
    """Install runrelay into `url` exactly as users do: alembic upgrade head."""
    subprocess.run(
        [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", "head"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
