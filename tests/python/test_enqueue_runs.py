"""enqueue_runs under concurrency, with real sessions: bulk enqueues with
overlapping concurrency keys and run_ids from several connections never
deadlock and keep every key serial in enqueue order; a bulk enqueue waits
for a key's holder and queues behind what it committed; an insert that meets
a concurrent insert of the same run_id becomes a repeat of it (or 22023),
and the key keeps exactly one head; runrelay_runs is notified once per queue
with a runnable new run. Outcomes item by item are pgTAP's
(tests/pgtap/026_enqueue_runs.sql)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from sqlapi import backend_pid, call, wait_until_blocked

KEYS = [f"k{i}" for i in range(5)]


def live_keys(db: psycopg.Connection) -> dict[str, list[tuple[str, int, bool, str]]]:
    rows = db.execute(
        "SELECT concurrency_key, run_id, key_position, key_held, status FROM runrelay.runs"
        " WHERE concurrency_key IS NOT NULL AND status IN ('queued', 'running', 'waiting')"
        " ORDER BY concurrency_key, key_position"
    ).fetchall()
    out: dict[str, list[tuple[str, int, bool, str]]] = {}
    for key, run_id, position, held, status in rows:
        out.setdefault(key, []).append((run_id, position, held, status))
    return out


def assert_one_head_per_key(db: psycopg.Connection) -> None:
    for key, runs in live_keys(db).items():
        assert [held for _, _, held, _ in runs] == [False] + [True] * (len(runs) - 1), (key, runs)


def test_concurrent_bulk_enqueues_with_overlapping_keys_stay_serial_without_deadlock(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection]
) -> None:
    sessions, rounds = 4, 6
    barrier = threading.Barrier(sessions)
    answers: list[list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]] = [
        [] for _ in range(sessions)
    ]

    def producer(n: int) -> None:
        conn = connect()
        rng = random.Random(n)
        for r in range(rounds):
            # Each session's own runs and runs every session enqueues (the
            # same payload, so the losers' items are repeats), on shared
            # keys, in a different order in every session.
            items: list[dict[str, Any]] = [
                {"run_id": f"own-{n}-{r}-{i}", "queue": "bulk", "concurrency_key": rng.choice(KEYS)}
                for i in range(30)
            ]
            items += [
                {"run_id": f"shared-{r}-{i}", "queue": "bulk", "concurrency_key": KEYS[i % 5]}
                for i in range(20)
            ]
            rng.shuffle(items)
            barrier.wait()
            answers[n].append((items, call(conn, "enqueue_runs", items=items)))

    with ThreadPoolExecutor(sessions) as pool:
        for future in [pool.submit(producer, n) for n in range(sessions)]:
            future.result()  # a deadlock (40P01) or lock timeout would raise here

    positions = {
        run_id: position
        for run_id, position in db.execute(
            "SELECT run_id, key_position FROM runrelay.runs WHERE concurrency_key IS NOT NULL"
        ).fetchall()
    }
    created_by: dict[str, int] = {}
    for session in answers:
        for items, rows in session:
            assert [row["run_id"] for row in rows] == [item["run_id"] for item in items]
            last: dict[str, int] = {}
            for item, row in zip(items, rows, strict=True):
                if row["created"]:
                    created_by[row["run_id"]] = created_by.get(row["run_id"], 0) + 1
                    key = item["concurrency_key"]
                    # One call's new runs of a key take positions in item order.
                    assert positions[row["run_id"]] > last.get(key, 0), (key, item)
                    last[key] = positions[row["run_id"]]
    assert len(positions) == sessions * rounds * 30 + rounds * 20
    assert set(created_by) == set(positions) and set(created_by.values()) == {1}
    assert_one_head_per_key(db)

    # Drain: every claim round starts at most one run per key, and each key's
    # runs start in key_position order (enqueue order).
    started: dict[str, list[int]] = {}
    while True:
        claimed = call(db, "claim_attempts", worker="w", queues=["bulk"], max_runs=100)
        if not claimed:
            break
        keys = db.execute(
            "SELECT concurrency_key FROM runrelay.runs WHERE run_id = ANY(%s)",
            [[c["run_id"] for c in claimed]],
        ).fetchall()
        assert len({k for (k,) in keys}) == len(claimed), "two runs of one key at once"
        for c in claimed:
            key = db.execute(
                "SELECT concurrency_key FROM runrelay.runs WHERE run_id = %s", [c["run_id"]]
            ).fetchone()
            assert key is not None
            started.setdefault(key[0], []).append(positions[c["run_id"]])
        items = [
            {"run_id": c["run_id"], "attempt": c["attempt"], "lease_token": str(c["lease_token"])}
            for c in claimed
        ]
        call(db, "complete_attempts", items=items)
    assert sum(len(v) for v in started.values()) == len(positions)
    for key, order in started.items():
        assert order == sorted(order), key


@pytest.mark.parametrize("holder_ends", ["commit", "rollback"])
def test_a_bulk_enqueue_waits_for_the_keys_holder_and_queues_behind_what_it_committed(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection], holder_ends: str
) -> None:
    holder = connect(autocommit=False)
    call(holder, "enqueue_run", run_id="h1", queue="q", concurrency_key="k")  # holds k's lock
    bulk = connect()
    items = [
        {"run_id": "x1", "queue": "q", "concurrency_key": "other"},
        {"run_id": "x2", "queue": "q", "concurrency_key": "k"},
        {"run_id": "x3", "queue": "q", "concurrency_key": "k"},
    ]
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(call, bulk, "enqueue_runs", items=items)
        wait_until_blocked(db, backend_pid(bulk))
        assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)
        getattr(holder, holder_ends)()
        rows = future.result()
    assert [(r["run_id"], r["created"]) for r in rows] == [("x1", True), ("x2", True), ("x3", True)]
    runs = live_keys(db)
    if holder_ends == "commit":
        assert [(run_id, held) for run_id, _, held, _ in runs["k"]] == [
            ("h1", False),
            ("x2", True),
            ("x3", True),
        ]
    else:
        assert [(run_id, held) for run_id, _, held, _ in runs["k"]] == [("x2", False), ("x3", True)]
    assert_one_head_per_key(db)


@pytest.mark.parametrize("payload", [{}, {"other": 1}])
def test_an_insert_that_meets_a_concurrent_insert_of_its_run_id_is_its_repeat(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection], payload: dict[str, Any]
) -> None:
    """The other insert is in flight when enqueue_runs looks the run_id up, so
    the key's head is decided on the assumption that this call creates it;
    when the other commits first, the item is a repeat of that run (or 22023
    for another payload) and the key's first run of this call is its head."""
    other = connect(autocommit=False)
    call(other, "enqueue_run", run_id="a1", queue="q", payload=payload)  # no key
    bulk = connect()
    items = [
        {"run_id": "a1", "queue": "q", "concurrency_key": "k"},
        {"run_id": "a2", "queue": "q", "concurrency_key": "k"},
        {"run_id": "a3", "queue": "q", "concurrency_key": "k"},
    ]
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(call, bulk, "enqueue_runs", items=items)
        wait_until_blocked(db, backend_pid(bulk))
        other.commit()
        if payload:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"items\[0\]\.run_id"):
                future.result()
            assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (1,)
            return
        rows = future.result()
    assert [(r["run_id"], r["created"]) for r in rows] == [
        ("a1", False),
        ("a2", True),
        ("a3", True),
    ]
    assert [(run_id, held) for run_id, _, held, _ in live_keys(db)["k"]] == [
        ("a2", False),
        ("a3", True),
    ]
    claimed = call(db, "claim_attempts", worker="w", queues=["q"], max_runs=10)
    assert sorted(c["run_id"] for c in claimed) == ["a1", "a2"]


def test_runrelay_runs_is_notified_once_per_queue_with_a_runnable_new_run(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection]
) -> None:
    call(db, "enqueue_run", run_id="live", queue="qd", concurrency_key="busy")
    listener = connect()
    listener.execute("LISTEN runrelay_runs")
    later = "2100-01-01T00:00:00Z"
    items = [
        {"run_id": "a1", "queue": "qa"},
        {"run_id": "a2", "queue": "qa"},
        {"run_id": "b1", "queue": "qb"},
        {"run_id": "b2", "queue": "qb", "run_at": later},
        {"run_id": "c1", "queue": "qc", "run_at": later},
        {"run_id": "d1", "queue": "qd", "concurrency_key": "busy"},
        {"run_id": "live", "queue": "qd", "concurrency_key": "busy"},
    ]
    call(db, "enqueue_runs", items=items)
    db.execute("SELECT 1")  # a round trip after the call's commit
    got = [n.payload for n in listener.notifies(timeout=1.0)]
    assert sorted(got) == ["qa", "qb"]
