"""Fixtures of the fault-injection suite (loaded by test_faults.py through
``pytest_plugins``): proxies, recorded clients, child processes, and a
dedicated cluster that tests may crash (never the shared test server)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from faults import REPO, Children, History, RecordingClient, TcpProxy
from runrelay import _pgcluster

Recorded = Callable[..., RecordingClient]


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    h = History(tmp_path / "history.jsonl")
    yield h
    h.close()


@pytest.fixture
def proxy(db_url: str) -> Iterator[TcpProxy]:
    p = TcpProxy(db_url)
    yield p
    p.close()


@pytest.fixture
def recorded(proxy: TcpProxy, history: History) -> Iterator[Recorded]:
    """Make recorded clients that talk through the proxy."""
    made: list[RecordingClient] = []

    def make(name: str = "client", *, replay: bool = True, options: str = "") -> RecordingClient:
        url = proxy.url(name)
        if options:
            url += f"&options={options}"
        client = RecordingClient(url, history, name, replay=replay, proxy=proxy)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def children(db_url: str, tmp_path: Path) -> Iterator[Children]:
    kids = Children(db_url, tmp_path)
    yield kids
    kids.close()


@pytest.fixture
def fast_retries(db: psycopg.Connection) -> None:
    """Retries due almost at once, so scenarios do not wait for backoff."""
    db.execute("UPDATE runrelay.settings SET retry_base_seconds = 0.05, retry_max_seconds = 0.2")


class CrashableDatabase:
    """A migrated database on a cluster of its own, which tests may crash."""

    def __init__(self) -> None:
        self.cluster = _pgcluster.start_cluster("system", {"synchronous_commit": "on"})
        with psycopg.connect(self.cluster.url(), autocommit=True) as c:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("rr_crash")))
        self.url = self.cluster.url("rr_crash")
        subprocess.run(
            [sys.executable, "-m", "alembic", "-x", f"url={self.url}", "upgrade", "head"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("UPDATE runrelay.settings SET allow_clock_override = true")

    def crash(self) -> None:
        self.cluster.crash()

    def restart(self) -> None:
        self.cluster.start()

    def destroy(self) -> None:
        self.cluster.destroy()


@pytest.fixture
def crashable() -> Iterator[CrashableDatabase]:
    c = CrashableDatabase()
    yield c
    c.destroy()
