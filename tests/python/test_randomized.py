"""Many connections, every scheduler and ledger operation, random
interleavings: zero deadlocks (40P01), and every run ends in a state the state
machine allows, with its lifecycle events in a legal order; every ledger lane
leads to its pending events, and a relay can deliver all of them.

Calls span several runs wherever the API allows it — batch claims and
completions, relays holding leases on several runs at once and renewing,
failing, releasing or acknowledging with event ids of several runs — since
it is calls that lock several rows of one table that can deadlock."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import errors

from lifecycle import check_database, check_drained, check_lanes, drain_ledger
from sqlapi import call

Connect = Callable[..., psycopg.Connection]
DURATION = float(os.environ.get("RUNRELAY_RANDOMIZED_SECONDS", "20"))
RUNS = int(os.environ.get("RUNRELAY_RANDOMIZED_RUNS", "40"))
WAITS = [
    {"kind": "sleep", "until": "2000-01-01T00:00:00Z"},
    {"kind": "event", "name": "go"},
    {"kind": "event", "name": "go", "timeout_at": "2000-01-01T00:00:00Z"},
    {"kind": "detached_runner", "runner": "ext"},
]


def test_random_concurrent_operations_never_deadlock(
    db: psycopg.Connection, connect: Connect
) -> None:
    run_ids = [f"r{i}" for i in range(RUNS)]
    keys = [None, None, "k1", "k2", "k3"]
    stop = time.monotonic() + DURATION
    counts: Counter[str] = Counter()
    failures: list[BaseException] = []
    lock = threading.Lock()
    blocked: list[int] = []

    def relay(conn: psycopg.Connection, rng: random.Random, name: str) -> None:
        """Lease events of several runs, then one call over all of them (and
        acknowledgements per run, each also given the other runs' ids)."""
        lane = rng.choice(["lifecycle", "observability"])
        held: list[dict[str, Any]] = []
        for _ in range(rng.choice([1, 2, 4, 8])):
            rows = call(
                conn,
                "claim_ledger",
                relay=name,
                lane=lane,
                max_events=rng.choice([1, 3]),
                batch=rng.random() < 0.5,
                lease_seconds=5,
            )
            held += [r for r in rows if r["kind"] == "claimed"]
        ids = [r["event_id"] for r in held]
        if not ids:
            return
        what = rng.choice(["ack", "ack", "ack", "renew", "fail", "release"])
        if what == "renew":
            call(conn, "renew_ledger_lease", relay=name, event_ids=ids, lease_seconds=5)
        elif what == "release":
            call(conn, "release_ledger", relay=name, event_ids=ids)
            return
        elif what == "fail":
            failed = call(
                conn,
                "fail_ledger",
                relay=name,
                event_ids=ids,
                error={"by": name},
                retry_at=rng.choice([None, "2000-01-01T00:00:00Z"]),
                permanent=rng.random() < 0.2,
            )
            with lock:
                blocked.extend(f["event_id"] for f in failed if f["outcome"] == "blocked")
            return
        for run_id in dict.fromkeys(r["run_id"] for r in held):
            call(
                conn,
                "ack_ledger",
                relay=name,
                run_id=run_id,
                event_ids=ids,
                claim_next=rng.choice([0, 0, 2]),
                lease_seconds=5,
                batch=lane == "observability",
            )

    def worker(n: int) -> None:
        conn = connect()
        conn.execute("SET lock_timeout = '20s'")
        rng = random.Random(n)
        mine: list[dict[str, Any]] = []
        waiting: list[dict[str, Any]] = []
        local: Counter[str] = Counter()
        try:
            while time.monotonic() < stop:
                op = rng.choice(
                    [
                        "enqueue",
                        "enqueue",
                        "claim",
                        "claim",
                        "write",
                        "write",
                        "write",
                        "signal",
                        "cancel",
                        "reap",
                        "detached",
                        "prepare",
                        "append",
                        "relay",
                        "relay",
                        "relay",
                        "requeue",
                    ]
                )
                local[op] += 1
                if op == "enqueue":
                    rid = rng.choice(run_ids)
                    key = keys[hash(rid) % len(keys)]
                    call(
                        conn,
                        "enqueue_run",
                        run_id=rid,
                        concurrency_key=key,
                        max_attempts=rng.choice([1, 2, 3]),
                        priority=rng.choice([0, 0, 10]),
                    )
                elif op == "claim":
                    mine.extend(
                        call(
                            conn,
                            "claim_attempts",
                            worker=f"w{n}",
                            max_runs=rng.choice([1, 2, 5, 10]),
                            lease_seconds=5,
                            call_id=uuid.uuid4(),
                        )
                    )
                elif op == "write" and mine:
                    c = mine.pop(rng.randrange(len(mine)))
                    f = {k: c[k] for k in ("run_id", "attempt", "lease_token")}
                    what = rng.choice(["hb", "complete", "fail", "suspend", "batch", "release"])
                    if what == "hb":
                        call(conn, "heartbeat", **f)
                        mine.append(c)
                    elif what == "complete":
                        call(conn, "complete_attempt", **f, result={"n": n})
                    elif what == "fail":
                        call(
                            conn,
                            "fail_attempt",
                            **f,
                            error={"n": n},
                            retry_at="2000-01-01T00:00:00Z",
                        )
                    elif what == "release":
                        run_at = rng.choice([None, "2000-01-01T00:00:00Z"])
                        call(conn, "release_attempt", **f, run_at=run_at, reason="random")
                    elif what == "suspend":
                        out = call(conn, "suspend_attempt", **f, wait=rng.choice(WAITS))
                        if out and next(iter(out[0].values())) == "waiting":
                            waiting.append(c)
                    else:
                        batch = [c] + [mine.pop() for _ in range(min(len(mine), 3))]
                        items = [
                            {
                                "run_id": b["run_id"],
                                "attempt": b["attempt"],
                                "lease_token": str(b["lease_token"]),
                            }
                            for b in batch
                        ]
                        call(conn, "complete_attempts", items=items)
                elif op == "append":
                    # a run not enqueued yet raises 22023
                    with contextlib.suppress(errors.InvalidParameterValue):
                        call(
                            conn,
                            "append_events",
                            run_id=rng.choice(run_ids),
                            events=[
                                {
                                    "type": "fact",
                                    "lane": rng.choice(["lifecycle", "observability"]),
                                    "transport_only": rng.random() < 0.1,
                                }
                                for _ in range(rng.randint(1, 3))
                            ],
                        )
                elif op == "relay":
                    relay(conn, rng, f"relay{n % 3}")
                elif op == "requeue":
                    with lock:
                        event_id = blocked.pop() if blocked else None
                    if event_id is not None:
                        call(conn, "requeue_ledger_event", event_id=event_id)
                elif op == "signal":
                    call(conn, "signal_run", run_id=rng.choice(run_ids), name="go")
                elif op == "cancel":
                    call(conn, "cancel_run", run_id=rng.choice(run_ids))
                elif op == "reap":
                    call(conn, "reap_expired", max_attempts=20)
                elif op == "detached" and waiting:
                    c = waiting[rng.randrange(len(waiting))]
                    call(
                        conn,
                        "record_runner_terminal",
                        run_id=c["run_id"],
                        attempt=c["attempt"],
                        result={"done": True},
                    )
                    f = {k: c[k] for k in ("run_id", "attempt", "lease_token")}
                    if call(conn, "claim_detached_terminal", **f)[0]["claim_detached_terminal"]:
                        call(
                            conn,
                            "fail_attempt",
                            **f,
                            error={"x": 1},
                            preserve_runner_terminal=rng.random() < 0.5,
                        )
                elif op == "prepare" and waiting:
                    c = waiting.pop(rng.randrange(len(waiting)))
                    f = {k: c[k] for k in ("run_id", "attempt", "lease_token")}
                    if (
                        call(conn, "prepare_waiting_failure", **f)[0]["prepare_waiting_failure"]
                        == "prepared"
                    ):
                        call(
                            conn,
                            "fail_attempt",
                            **f,
                            error={"p": 1},
                            protect_waiting_suspension=True,
                        )
        except errors.DeadlockDetected as exc:
            with lock:
                failures.append(exc)
        except BaseException as exc:
            with lock:
                failures.append(exc)
        finally:
            with lock:
                counts.update(local)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DURATION + 120)
    assert not failures, failures[:3]
    assert sum(counts.values()) > 1000, counts
    # Let every lease lapse and reap, then the database must be consistent.
    with db.transaction():
        db.execute("SET LOCAL runrelay.clock_offset = '10 minutes'")
        while call(db, "reap_expired", max_attempts=1000):
            pass
    statuses = check_database(db)
    assert statuses.get("completed", 0) > 0 and statuses.get("cancelled", 0) > 0, statuses
    check_lanes(db)
    assert drain_ledger(db) > 0
    check_drained(db)
