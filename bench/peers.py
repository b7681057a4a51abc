"""Peer queues on the identical workload, installed at bench time, never vendored.

* Procrastinate and PgQueuer come from PyPI into a separate virtualenv,
  `bench/.venv-peers` (created here with `python -m venv`; never part of
  runrelay's own dependencies). We take from each library its own schema and
  the exact SQL its worker issues — Procrastinate's `fetch_job` and
  `finish_job` queries, PgQueuer's composed dequeue and log-job statements —
  and run them through the same harness as the floor and runrelay: same
  driver (psycopg 3), same process-per-worker model, same backlog, same
  window. What is compared is the database work per job, not the two
  libraries' Python event loops.
* PgQ comes from Debian (`postgresql-15-pgq3`, apt-get when missing and root):
  one consumer, `next_batch` + `get_batch_events` + `finish_batch`, ticks of
  100 events — the counterpart of runrelay's batched ledger delivery.
* pgmq: no package for PostgreSQL 15 in the registries this machine reaches
  (Debian bookworm has none; the PyPI `pgmq` is a client only), so it is
  reported as skipped with that reason.

In quick mode nothing is installed: a peer is measured only if it is already
there, otherwise reported as skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.composite import CompositeInfo, register_composite
from psycopg.types.json import Jsonb

from bench._load import Case, Factory, Recorder

VENV = Path(__file__).resolve().parent / ".venv-peers"
PINNED = {"procrastinate": "3.10.0", "pgqueuer": "1.6.0"}
PGQ_PACKAGE = "postgresql-15-pgq3"


class Skipped(Exception):
    """A peer that cannot be measured here; the message says why."""


# PyPI peers --------------------------------------------------------------

EXTRACT = r"""
import importlib.metadata as md, json, pathlib, uuid, datetime
import procrastinate
from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment, QueryQueueBuilder

sql_dir = pathlib.Path(procrastinate.__file__).parent / "sql"
queries = {}
name = None
for line in (sql_dir / "queries.sql").read_text().splitlines():
    if line.startswith("-- ") and line.endswith(" --"):
        name = line[3:-3]
        queries[name] = []
    elif name and not line.startswith("--"):
        queries[name].append(line)
queries = {k: "\n".join(v).strip() for k, v in queries.items()}
qb = QueryQueueBuilder()
dequeue = {
    n: qb.build_dequeue_query(
        batch_size=n, entrypoints=["noop"], concurrency_limits=[0],
        queue_manager_id=uuid.uuid4(), global_concurrency_limit=None,
        heartbeat_timeout=datetime.timedelta(seconds=30),
    ).sql
    for n in (1, 10)
}
print(json.dumps({
    "versions": {p: md.version(p) for p in ("procrastinate", "pgqueuer")},
    "procrastinate": {
        "schema": (sql_dir / "schema.sql").read_text(),
        "fetch_job": queries["fetch_job"],
        "finish_job": queries["finish_job"],
        "defer_jobs": queries["defer_jobs"],
        "register_worker": queries["register_worker"],
    },
    "pgqueuer": {
        "install": QueryBuilderEnvironment().build_install_query(),
        "dequeue": dequeue,
        "log_job": qb.build_log_job_query(),
        "enqueue": qb.build_enqueue_query(),
    },
}))
"""


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(install: bool) -> Path:
    """The peers' virtualenv with the pinned versions; created when `install`."""
    marker = VENV / ".pinned"
    wanted = json.dumps(PINNED, sort_keys=True)
    if marker.exists() and marker.read_text() == wanted and _venv_python().exists():
        return _venv_python()
    if not install:
        raise Skipped(
            "not installed (quick mode installs nothing; `make bench` creates bench/.venv-peers)"
        )
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pkgs = [f"{p}=={v}" for p, v in PINNED.items()] + ["psycopg[binary]"]
    done = subprocess.run(
        [str(_venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pkgs],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise Skipped(f"pip install {' '.join(pkgs)} failed: {done.stderr.strip()[-300:]}")
    marker.write_text(wanted)
    return _venv_python()


def extract(python: Path) -> dict[str, Any]:
    """Each peer's schema and worker SQL, read from the installed libraries."""
    done = subprocess.run(
        [str(python), "-c", EXTRACT], capture_output=True, text=True, check=False, cwd="/"
    )
    if done.returncode != 0:
        raise Skipped(f"could not read the peers' SQL: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


# Procrastinate -----------------------------------------------------------


def procrastinate_setup(url: str, sql: dict[str, str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql["schema"])  # type: ignore[arg-type]


def procrastinate_loader(url: str, rows: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,"
                " procrastinate_workers RESTART IDENTITY CASCADE"
            )
            if rows:
                conn.execute(
                    "INSERT INTO procrastinate_jobs (queue_name, task_name, args)"
                    " SELECT 'default', 'noop', '{\"n\": 1}' FROM generate_series(1, %s)",
                    [rows],
                )
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

    return prepare


def procrastinate_worker(sql: dict[str, str]) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        worker_id = conn.execute(sql["register_worker"]).fetchone()[0]  # type: ignore[arg-type,index]
        fetch, finish = sql["fetch_job"], sql["finish_job"]

        def step(rec: Recorder) -> int | None:
            row = rec.timed(
                "fetch_job", conn.execute, fetch, {"queues": None, "worker_id": worker_id}
            ).fetchone()
            if row is None or row[0] is None:
                return None
            rec.timed(
                "finish_job",
                conn.execute,
                finish,
                {"job_id": row[0], "status": "succeeded", "delete_job": False},
            )
            return 1

        return step

    return factory


def procrastinate_defer(sql: dict[str, str]) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        info = CompositeInfo.fetch(conn, "procrastinate_job_to_defer_v1")
        assert info is not None
        register_composite(info, conn)
        job = info.python_type
        query = sql["defer_jobs"]

        def step(rec: Recorder) -> int | None:
            jobs = [job("default", "noop", 0, None, None, Jsonb({"n": 1}), None)]
            rec.timed("defer_jobs", conn.execute, query, {"jobs": jobs})
            return 1

        return step

    return factory


# PgQueuer ----------------------------------------------------------------


def pgqueuer_setup(url: str, sql: dict[str, Any]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql["install"])


def pgqueuer_loader(url: str, rows: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log RESTART IDENTITY")
            if rows:
                conn.execute(
                    "INSERT INTO pgqueuer (priority, entrypoint, status, execute_after)"
                    " SELECT 0, 'noop', 'queued', now() - interval '1 hour'"
                    " FROM generate_series(1, %s)",
                    [rows],
                )
            conn.execute("VACUUM ANALYZE pgqueuer")

    return prepare


def pgqueuer_worker(sql: dict[str, Any], batch: int) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        cur = psycopg.RawCursor(conn)  # PgQueuer's SQL uses $1-style parameters
        dequeue, log_job = sql["dequeue"][str(batch)], sql["log_job"]
        manager = uuid.uuid4()
        heartbeat = timedelta(seconds=30)

        def step(rec: Recorder) -> int | None:
            rows = rec.timed(
                "dequeue", cur.execute, dequeue, [batch, ["noop"], manager, heartbeat]
            ).fetchall()
            if not rows:
                return None
            ids = [r[0] for r in rows]
            rec.timed(
                "log_job", cur.execute, log_job, [ids, ["successful"] * len(ids), [None] * len(ids)]
            )
            return len(ids)

        return step

    return factory


def pgqueuer_enqueue(sql: dict[str, Any]) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        cur = psycopg.RawCursor(conn)
        query = sql["enqueue"]
        zero = timedelta(0)  # what PgQueuer passes for "no delay"

        def step(rec: Recorder) -> int | None:
            rec.timed(
                "enqueue", cur.execute, query, [[0], ["noop"], [None], [zero], [None], [None]]
            )
            return 1

        return step

    return factory


# PgQ ---------------------------------------------------------------------

PGQ_QUEUE = "bench"
PGQ_LOAD = """
CREATE PROCEDURE bench_pgq_load(p_ticks integer, p_per_tick integer)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. p_ticks LOOP
        PERFORM pgq.insert_event('bench', 'order.updated', json_build_object('seq', s)::text)
        FROM generate_series(1, p_per_tick) AS s;
        COMMIT;
        PERFORM pgq.ticker('bench');
        COMMIT;
    END LOOP;
END;
$$;
"""


def _pgq_available(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pgq'").fetchone()
    return row is not None


def ensure_pgq(url: str, install: bool) -> str:
    """Make the pgq extension available; returns its version."""
    if not _pgq_available(url):
        if not install:
            raise Skipped(f"{PGQ_PACKAGE} is not installed (quick mode installs nothing)")
        if os.geteuid() != 0:
            raise Skipped(f"{PGQ_PACKAGE} is not installed and apt-get needs root")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        apt = ["apt-get", "install", "-y", "-q", PGQ_PACKAGE]
        done = subprocess.run(apt, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, check=False)
            done = subprocess.run(apt, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0 or not _pgq_available(url):
            raise Skipped(f"apt-get install {PGQ_PACKAGE} failed: {done.stderr.strip()[-300:]}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgq")
        conn.execute(PGQ_LOAD)
        version = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'pgq'"
        ).fetchone()
    return str(version[0]) if version else "?"


def pgq_loader(url: str, ticks: int, per_tick: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pgq.queue WHERE queue_name = %s", [PGQ_QUEUE]
            ).fetchone()
            if exists:
                conn.execute("SELECT pgq.unregister_consumer(%s, 'c1')", [PGQ_QUEUE])
                conn.execute("SELECT pgq.drop_queue(%s)", [PGQ_QUEUE])
            conn.execute("SELECT pgq.create_queue(%s)", [PGQ_QUEUE])
            conn.execute(
                "SELECT pgq.set_queue_config(%s, 'ticker_max_count', %s)",
                [PGQ_QUEUE, str(per_tick)],
            )
            conn.execute("SELECT pgq.register_consumer(%s, 'c1')", [PGQ_QUEUE])
            conn.execute("CALL bench_pgq_load(%s, %s)", [ticks, per_tick])
            conn.execute("VACUUM ANALYZE")

    return prepare


def pgq_consumer(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    def step(rec: Recorder) -> int | None:
        row = rec.timed(
            "next_batch", conn.execute, "SELECT pgq.next_batch(%s, 'c1')", [PGQ_QUEUE]
        ).fetchone()
        if row is None or row[0] is None:
            return None
        events = rec.timed(
            "get_batch_events",
            conn.execute,
            "SELECT ev_id, ev_type, ev_data FROM pgq.get_batch_events(%s)",
            [row[0]],
        ).fetchall()
        rec.timed("finish_batch", conn.execute, "SELECT pgq.finish_batch(%s)", [row[0]])
        return len(events)

    return step


# Cases -------------------------------------------------------------------


def cases(server: Any, plan: Any, log: Callable[[str], None]) -> tuple[list[Case], dict[str, Any]]:
    """The peers' cases, and what was installed or skipped (with reasons)."""
    info: dict[str, Any] = {"skipped": {}, "versions": {}}
    out: list[Case] = []
    info["skipped"]["pgmq"] = (
        "no pgmq package for PostgreSQL 15 in the registries this machine reaches "
        "(Debian bookworm has none; PyPI's `pgmq` is only a client for the extension)"
    )
    try:
        log("peers: preparing bench/.venv-peers (procrastinate, pgqueuer)")
        sql = extract(ensure_venv(plan.install))
        info["versions"].update(sql["versions"])
    except Skipped as why:
        info["skipped"]["procrastinate"] = info["skipped"]["pgqueuer"] = str(why)
        sql = None
    if sql is not None:
        purl = server.create_database("bench_procrastinate")
        procrastinate_setup(purl, sql["procrastinate"])
        load = procrastinate_loader(purl, plan.backlog_single)
        empty = procrastinate_loader(purl, 0)
        fetch = procrastinate_worker(sql["procrastinate"])
        defer = procrastinate_defer(sql["procrastinate"])
        for w in plan.enqueue_workers:
            out.append(
                Case(
                    f"procrastinate.enqueue.w{w}", "procrastinate", "enqueue", w, purl, empty, defer
                )
            )
        for w in plan.workers:
            out.append(
                Case(f"procrastinate.single.w{w}", "procrastinate", "single", w, purl, load, fetch)
            )
        qurl = server.create_database("bench_pgqueuer")
        pgqueuer_setup(qurl, sql["pgqueuer"])
        load_many = pgqueuer_loader(qurl, plan.backlog_batch)
        load_one = pgqueuer_loader(qurl, plan.backlog_single)
        qempty = pgqueuer_loader(qurl, 0)
        for w in plan.enqueue_workers:
            out.append(
                Case(
                    f"pgqueuer.enqueue.w{w}",
                    "pgqueuer",
                    "enqueue",
                    w,
                    qurl,
                    qempty,
                    pgqueuer_enqueue(sql["pgqueuer"]),
                )
            )
        for w in plan.workers:
            out.append(
                Case(
                    f"pgqueuer.batch10.w{w}",
                    "pgqueuer",
                    "batch10",
                    w,
                    qurl,
                    load_many,
                    pgqueuer_worker(sql["pgqueuer"], 10),
                )
            )
        for w in plan.peer_single_workers:
            out.append(
                Case(
                    f"pgqueuer.single.w{w}",
                    "pgqueuer",
                    "single",
                    w,
                    qurl,
                    load_one,
                    pgqueuer_worker(sql["pgqueuer"], 1),
                )
            )
    gurl = server.create_database("bench_pgq")
    try:
        log("peers: checking PgQ (Debian postgresql-15-pgq3)")
        info["versions"]["pgq"] = ensure_pgq(gurl, plan.install)
        ticks = max(1, plan.pgq_events // 100)
        out.append(
            Case(
                "pgq.batch100.r1",
                "pgq",
                "ledger_batch100",
                1,
                gurl,
                pgq_loader(gurl, ticks, 100),
                pgq_consumer,
                "events/s",
            )
        )
    except Skipped as why:
        info["skipped"]["pgq"] = str(why)
    for case in out:
        case.optional = True
    return out, info
