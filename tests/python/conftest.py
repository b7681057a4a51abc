"""Shared fixtures: a real PostgreSQL database migrated to head.

The server is the one in DATABASE_URL (`make test` starts a throwaway cluster
and sets it). Each pytest session creates its own database, migrates it with
Alembic exactly as users do, and enables the test clock. Each test starts from
empty tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from installed import Installed, build_wheel, install
from runrelay import Client
from runrelay.worker import Worker

REPO = Path(__file__).resolve().parents[2]
TABLES = (
    "call_locks",
    "concurrency_keys",
    "queue_activity_watermark",
    "queue_activity",
    "schedules",
    "paused_queues",
    "calls",
    "ledger_wakeups",
    "ledger_lanes",
    "ledger_events",
    "signals",
    "cancellations",
    "attempts",
    "runs",
)


def _server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.exit("DATABASE_URL is not set: run the tests with `make test`", returncode=2)
    return url


def url_for(dbname: str) -> str:
    base = _server_url().rsplit("/", 1)[0]
    return f"{base}/{dbname}"


def alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-x", f"url={url}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )


def create_database(name: str) -> str:
    with psycopg.connect(_server_url(), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url_for(name)


def drop_database(name: str) -> None:
    with psycopg.connect(_server_url(), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel of this checkout in a fresh venv outside the repository, with
    the extras the tests run from it: embedded (the demo's PostgreSQL) and
    dashboard (the browser tests' `runrelay dashboard`)."""
    workdir = tmp_path_factory.mktemp("wheel")
    return install(build_wheel(workdir), workdir, extras="embedded,dashboard")


@pytest.fixture(scope="session")
def db_url() -> Iterator[str]:
    name = f"rr_pytest_{os.getpid()}"
    url = create_database(name)
    alembic(url, "upgrade", "head")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("UPDATE runrelay.settings SET allow_clock_override = true")
    yield url
    drop_database(name)


def reset(conn: psycopg.Connection) -> None:
    conn.execute(
        sql.SQL("TRUNCATE {} CASCADE").format(
            sql.SQL(", ").join(sql.Identifier("runrelay", t) for t in TABLES)
        )
    )
    conn.execute(
        "DELETE FROM runrelay.settings;"
        " INSERT INTO runrelay.settings (allow_clock_override) VALUES (true)"
    )


@pytest.fixture
def connect(db_url: str) -> Iterator[Callable[..., psycopg.Connection]]:
    """Open extra autocommit connections (each a real session); all closed after the test."""
    opened: list[psycopg.Connection] = []

    def _connect(autocommit: bool = True, **kwargs: object) -> psycopg.Connection:
        c = psycopg.connect(db_url, autocommit=autocommit, **kwargs)  # type: ignore[arg-type]
        opened.append(c)
        return c

    yield _connect
    for c in opened:
        c.close()


@pytest.fixture
def db(db_url: str, connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    """A superuser autocommit connection to a database with empty runrelay tables."""
    conn = connect()
    reset(conn)
    return conn


@pytest.fixture
def client(db: psycopg.Connection, db_url: str) -> Iterator[Client]:
    """A Client on a pool of autocommit connections to the empty test
    database (db), as a worker or relay process would hold one."""
    from psycopg_pool import ConnectionPool

    with ConnectionPool(db_url, min_size=1, max_size=20, kwargs={"autocommit": True}) as pool:
        yield Client(pool)


def capture_plans(
    conn: psycopg.Connection, *, analyze: bool = False, json: bool = False
) -> Callable[[], list[str]]:
    """From now on, the plan of every statement the server runs for `conn`,
    nested statements inside functions included (auto_explain at NOTICE
    level); with `analyze`, with the rows and buffers each node touched (no
    timing), and with `json` in auto_explain's JSON format. Returns a
    function that takes the messages captured since it was last called."""
    captured: list[str] = []
    conn.add_notice_handler(lambda d: captured.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    settings = [
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_level = notice",
        f"auto_explain.log_analyze = {'on' if analyze else 'off'}",
        f"auto_explain.log_format = {'json' if json else 'text'}",
    ]
    if analyze:
        settings += ["auto_explain.log_buffers = on", "auto_explain.log_timing = off"]
    for setting in settings:
        conn.execute(f"SET {setting}")

    def take() -> list[str]:
        out = list(captured)
        captured.clear()
        return out

    return take


@pytest.fixture
def plans(db: psycopg.Connection) -> Callable[[], list[str]]:
    """Plans of every statement the server runs for this connection, nested
    statements inside functions included (auto_explain at NOTICE level)."""
    return capture_plans(db)


def handed_back(db: psycopg.Connection, run_id: str) -> tuple[str, str, str]:
    """(run status, its latest attempt's status, the release reason)."""
    row = db.execute(
        "SELECT r.status, a.status, l.payload ->> 'reason'"
        " FROM runrelay.runs AS r"
        " JOIN runrelay.attempts AS a ON a.run_id = r.run_id"
        " JOIN runrelay.ledger AS l ON l.run_id = r.run_id AND l.type = 'run.retry_scheduled'"
        " WHERE r.run_id = %s ORDER BY a.attempt DESC, l.seq DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    assert row is not None
    return row


def run_in_thread(worker: Worker) -> tuple[threading.Thread, Future[None]]:
    """Start `worker.run()` in a thread; the future carries its exception."""
    future: Future[None] = Future()

    def target() -> None:
        try:
            worker.run()
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)

    thread = threading.Thread(target=target, name=f"worker-{worker.name}", daemon=True)
    thread.start()
    return thread, future


# The sharded install's fixtures (sharded_harness.py); its servers start only
# for the tests that ask for them.
from sharded_harness import sharded, sharded_install  # noqa: E402, F401
