"""The floor of this machine: what any job queue on this PostgreSQL must pay.

* `select1`   — a bare `SELECT 1` round trip (1, 4, 16 connections);
* `insert`    — one `INSERT` of a job row (the floor under any enqueue);
* `insert100` — one plain `INSERT … SELECT` of 100 job rows (the floor under
  a bulk enqueue of 100);
* `claim_ack` — a minimal job table claimed with one
  `UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED) RETURNING` and acked
  with a second `UPDATE` (two round trips, two commits per job);
* `fused`     — the same claim and ack in one tiny PL/pgSQL function (one
  round trip, one commit: the floor for "one call per job");
* `batch10` / `batch100` — the claim takes 10 / 100 rows, the ack marks them
  all done with `= ANY(ids)`.

No fencing, no attempts, no events: nothing a durable scheduler needs beyond
"one worker gets the row, then marks it done".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from bench._load import Case, Factory, Recorder

SCHEMA = """
CREATE TABLE jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}',
    locked_at timestamptz
);
CREATE INDEX jobs_queued_idx ON jobs (id) WHERE status = 'queued';

CREATE FUNCTION claim_ack() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    UPDATE jobs SET status = 'running', locked_at = now()
    WHERE id = (
        SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
    )
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        UPDATE jobs SET status = 'done' WHERE id = v_id;
    END IF;
    RETURN v_id;
END;
$$;
"""

CLAIM_ONE = """
UPDATE jobs SET status = 'running', locked_at = now()
WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
CLAIM_MANY = """
UPDATE jobs SET status = 'running', locked_at = now()
WHERE id = ANY(ARRAY(
    SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
))
RETURNING id, payload
"""
ACK_ONE = "UPDATE jobs SET status = 'done' WHERE id = %s"
ACK_MANY = "UPDATE jobs SET status = 'done' WHERE id = ANY(%s)"


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)


def loader(url: str, rows: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE jobs RESTART IDENTITY")
            if rows:
                conn.execute(
                    "INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, %s)", [rows]
                )
            conn.execute("VACUUM ANALYZE jobs")

    return prepare


def select1(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    def step(rec: Recorder) -> int | None:
        rec.timed("select1", conn.execute, "SELECT 1")
        return 1

    return step


def insert(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    def step(rec: Recorder) -> int | None:
        rec.timed("insert", conn.execute, "INSERT INTO jobs (payload) VALUES ('{}')")
        return 1

    return step


def insert_many(size: int) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        query = "INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, %s)"

        def step(rec: Recorder) -> int | None:
            rec.timed(f"insert{size}", conn.execute, query, [size])
            return size

        return step

    return factory


def claim_ack(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    def step(rec: Recorder) -> int | None:
        row = rec.timed("claim", conn.execute, CLAIM_ONE).fetchone()
        if row is None:
            return None
        rec.timed("ack", conn.execute, ACK_ONE, [row[0]])
        return 1

    return step


def fused(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    def step(rec: Recorder) -> int | None:
        row = rec.timed("claim_ack", conn.execute, "SELECT claim_ack()").fetchone()
        return None if row is None or row[0] is None else 1

    return step


def batch(size: int) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        def step(rec: Recorder) -> int | None:
            rows = rec.timed("claim", conn.execute, CLAIM_MANY, [size]).fetchall()
            if not rows:
                return None
            rec.timed("ack", conn.execute, ACK_MANY, [[r[0] for r in rows]])
            return len(rows)

        return step

    return factory


def cases(url: str, plan: Any) -> list[Case]:
    single = loader(url, plan.backlog_single)
    many = loader(url, plan.backlog_batch)
    empty = loader(url, 0)
    out: list[Case] = []
    for w in plan.connections:
        out.append(Case(f"floor.select1.c{w}", "floor", "select1", w, url, empty, select1, "ops/s"))
    for w in plan.enqueue_workers:
        out.append(Case(f"floor.insert.w{w}", "floor", "enqueue", w, url, empty, insert))
        out.append(
            Case(f"floor.insert100.w{w}", "floor", "enqueue100", w, url, empty, insert_many(100))
        )
    for w in plan.workers:
        out.append(Case(f"floor.claim_ack.w{w}", "floor", "single", w, url, single, claim_ack))
        out.append(Case(f"floor.fused.w{w}", "floor", "fused", w, url, single, fused))
        out.append(Case(f"floor.batch10.w{w}", "floor", "batch10", w, url, many, batch(10)))
    for w in plan.batch100_workers:
        out.append(Case(f"floor.batch100.w{w}", "floor", "batch100", w, url, many, batch(100)))
    return out
