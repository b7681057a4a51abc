"""Per-job cost of the worker's continuation: complete_attempt then
claim_attempts (two autocommit calls) against settle_and_claim (one call,
one item, max_runs 1), on a durable server (bench._server's settings).

    python -m bench.settle_vs_split [--jobs 2000] [--rounds 3] [--dsn URL]

One connection, prepared statements, the two loops alternating round by
round on fresh runs. Server time is pg_stat_statements' total_exec_time of
the top-level calls (tracking `top` for this session only); wall time is the
client's, so it includes the round trips and the commits (WAL flushes).
Prints one line per loop and round, then the medians."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

import psycopg

from bench._server import DURABLE_SETTINGS, REPO
from runrelay import _pgcluster

SPLIT = (
    "SELECT runrelay.complete_attempt(%s, %s, %s)",
    "SELECT * FROM runrelay.claim_attempts('w', ARRAY['q'], 1)",
)
FUSED = (
    "SELECT * FROM runrelay.settle_and_claim("
    "jsonb_build_array(jsonb_build_object('run_id', %s::text, 'attempt', %s::integer,"
    " 'lease_token', %s::uuid)), 'w', ARRAY['q'], 1)"
)


def _stats(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, float]]:
    rows = conn.execute(
        "SELECT query, calls, total_exec_time FROM pg_stat_statements"
        " WHERE query LIKE 'SELECT%runrelay.%'"
    ).fetchall()
    return {q: (c, t) for q, c, t in rows}


def _server_ms(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]) -> float:
    return sum(t - before.get(q, (0, 0.0))[1] for q, (_, t) in after.items())


def _enqueue(conn: psycopg.Connection[Any], prefix: str, n: int) -> None:
    conn.execute(
        "SELECT count(*) FROM generate_series(1, %s) AS i,"
        " runrelay.enqueue_run(run_id => %s || i, queue => 'q') AS e",
        [n, prefix],
    )


def _split(conn: psycopg.Connection[Any], jobs: int) -> None:
    (claim,) = conn.execute(SPLIT[1], prepare=True).fetchall()
    for _ in range(jobs - 1):
        conn.execute(SPLIT[0], [claim[0], claim[1], claim[2]], prepare=True)
        (claim,) = conn.execute(SPLIT[1], prepare=True).fetchall()
    conn.execute(SPLIT[0], [claim[0], claim[1], claim[2]], prepare=True)


def _fused(conn: psycopg.Connection[Any], jobs: int) -> None:
    (claim,) = conn.execute(SPLIT[1], prepare=True).fetchall()
    token = (claim[0], claim[1], claim[2])
    for _ in range(jobs - 1):
        rows = conn.execute(FUSED, list(token), prepare=True).fetchall()
        assert rows[0][3] == "completed", rows
        token = (rows[1][1], rows[1][2], rows[1][4])
    rows = conn.execute(FUSED.replace(", 1)", ", 0)"), list(token), prepare=True).fetchall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", help="an existing server (default: start a durable one)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        if args.dsn:
            base = args.dsn
        else:
            cluster = stack.enter_context(_pgcluster.cluster("system", DURABLE_SETTINGS))
            base = cluster.url()
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS settle_bench WITH (FORCE)")
            admin.execute("CREATE DATABASE settle_bench")
        url = base.rsplit("/", 1)[0] + "/settle_bench"
        subprocess.run(
            [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", "head"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        results: dict[str, list[tuple[float, float]]] = {"split": [], "fused": []}
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SET pg_stat_statements.track = 'top'")
            for round_ in range(args.rounds + 1):  # round 0 warms up
                for name, loop in (("split", _split), ("fused", _fused)):
                    _enqueue(conn, f"{name}-{round_}-", args.jobs)
                    conn.execute("CHECKPOINT")
                    before = _stats(conn)
                    started = time.perf_counter()
                    loop(conn, args.jobs)
                    wall = (time.perf_counter() - started) * 1e6 / args.jobs
                    server = _server_ms(before, _stats(conn)) * 1e3 / args.jobs
                    if round_:
                        results[name].append((server, wall))
                    line = f"round {round_} {name}: server {server:.0f} us/job"
                    print(f"{line}, wall {wall:.0f} us/job", flush=True)
        for name, runs in results.items():
            print(
                f"median {name}: server {statistics.median(s for s, _ in runs):.0f} us/job,"
                f" wall {statistics.median(w for _, w in runs):.0f} us/job"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
