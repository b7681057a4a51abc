"""runrelay on the floor's workloads, through the real client (`runrelay.Client`).

* `enqueue` — `enqueue_run` (a run row + its run.queued event);
* `enqueue100` — `enqueue_runs` of 100 runs in one call;
* `enqueue_keyed` — `enqueue_run` with a concurrency key, 100 keys per
  producer in turn (the key's lock: its row; the first run of a key creates
  it, so most calls lock an existing row and the run joins its key held);
* `single`  — `claim_attempts(max_runs => 1)` + `complete_attempt`: a no-op
  handler; per job it also writes the attempt row and two lifecycle events
  (run.started, run.completed) with their ledger lane;
* `single_keyed` — `single` over a backlog of runs that each have a key of
  their own (the completion takes the key's lock and promotes the key);
* `batch10` — `claim_attempts(max_runs => 10)` + `complete_attempts` of 10;
* `fused` / `fused_batch10` — the Worker's default path: one `claim_attempts`
  to start, then per step one `settle_and_claim` that completes the runs held
  and claims the next 1 (or 10) in the same round trip;
* ledger delivery — relays running the steady-state loop: `claim_ledger`
  discovers a run, then `ack_ledger(claim_next => n)` acknowledges and claims
  the successor prefix in the same round trip, head-only (n = 1) or frozen
  batches (`batch => true`, n = 100); and a single hot run of 10 000 events;
* `round_trips` — every client method, traced at the protocol level.

Backlogs are loaded with INSERT … SELECT generate_series straight into the
tables (the column lists of tests/python/test_claims.py and test_ledger.py),
then ANALYZEd; each repetition starts from a fresh load.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from devtools.round_trips import CALLS_PER_METHOD, calls, frontend_round_trips, traced

from bench._load import Case, Factory, Recorder
from runrelay import Client, _operations
from runrelay.types import EnqueueItem, LedgerKind
from runrelay.worker import settled_and_claimed

TABLES = ", ".join(
    f"runrelay.{t}"
    for t in ("ledger_lanes", "ledger_events", "signals", "cancellations", "attempts", "runs")
)

# Queued runs as enqueue_run leaves them: the run at ledger_seq 1, its
# run.queued event, and its lifecycle lane with that event at the head. (The
# events and lanes are read from the loaded runs, so a sharded load routes
# only LOAD_RUNS.) Without them every claim would create the run's lane and
# notify the relays, which no enqueued run makes its claim do.
LOAD_RUNS = """
INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                           created_at, updated_at, ledger_seq)
SELECT 'r-' || i, 'default', 'queued', '{"n": 1}', now() - interval '1 hour', 3, now(), now(), 1
FROM generate_series(1, %(runs)s) AS i
"""
LOAD_RUN_EVENTS = [
    """
    INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                        created_at, next_attempt_at)
    SELECT r.run_id, 'lifecycle', 1, 'run.queued',
           jsonb_build_object('queue', r.queue, 'run_at', r.run_at, 'priority', r.priority,
                              'concurrency_key', r.concurrency_key),
           r.run_id || ':1', r.created_at, r.created_at
    FROM runrelay.runs AS r
    """,
    """
    INSERT INTO runrelay.ledger_lanes (run_id, lane, head_seq, available_at)
    SELECT r.run_id, 'lifecycle', 1, r.created_at FROM runrelay.runs AS r
    """,
]

# Runs with `events` pending lifecycle events each (oldest run first).
LOAD_LEDGER = [
    """
    INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                               created_at, updated_at, ledger_seq)
    SELECT 'l-' || i, 'ledger', 'queued', '{}', now(), 3, now(), now(), %(events)s
    FROM generate_series(1, %(runs)s) AS i
    """,
    """
    INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                 created_at, next_attempt_at)
    SELECT 'l-' || i, 'lifecycle', s, 'order.updated', jsonb_build_object('seq', s),
           'l-' || i || ':' || s,
           now() - make_interval(secs => i), now() - make_interval(secs => i)
    FROM generate_series(1, %(runs)s) AS i, generate_series(1, %(events)s) AS s
    """,
    """
    INSERT INTO runrelay.ledger_lanes (run_id, lane, head_seq, available_at)
    SELECT 'l-' || i, 'lifecycle', 1, now() - make_interval(secs => i)
    FROM generate_series(1, %(runs)s) AS i
    """,
]

# The same backlog, each run the head of a key of its own, with its key's
# row (the second statement only where the install has the table).
LOAD_KEYED_RUNS = """
INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                           concurrency_key, key_position, key_held, created_at, updated_at,
                           ledger_seq)
SELECT 'r-' || i, 'default', 'queued', '{"n": 1}', now() - interval '1 hour', 3,
       'k-' || i, nextval('runrelay.runs_key_position_seq'), false, now(), now(), 1
FROM generate_series(1, %(runs)s) AS i
"""
LOAD_KEY_ROWS = """
INSERT INTO runrelay.concurrency_keys (key) SELECT 'k-' || i FROM generate_series(1, %(runs)s) AS i
"""

# The events delivered so far, counted from the tables: a relay's
# acknowledgement is one ledger_deliveries row for its prefix, and an event
# acknowledged on its own (locally) carries its delivery. Counting through
# the ledger view would format every event, and take long enough to blur a
# measurement window's end.
DELIVERED_EVENTS = (
    "SELECT (SELECT coalesce(sum(d.last_seq - d.first_seq + 1), 0)"
    " FROM runrelay.ledger_deliveries AS d)"
    " + (SELECT count(*) FROM runrelay.ledger_events AS e WHERE e.delivered_at IS NOT NULL)"
)

ANALYZE = "ANALYZE runrelay.runs, runrelay.attempts, runrelay.ledger_events, runrelay.ledger_lanes"


def has_key_rows(conn: psycopg.Connection[Any]) -> bool:
    """Whether keys lock rows of runrelay.concurrency_keys (an install from
    before that locked advisory lock ids; bench/notes.md compares the two)."""
    row = conn.execute("SELECT to_regclass('runrelay.concurrency_keys') IS NOT NULL").fetchone()
    return bool(row and row[0])


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute(f"TRUNCATE {TABLES} CASCADE")
    if has_key_rows(conn):
        conn.execute("TRUNCATE runrelay.concurrency_keys")


def load_runs(conn: psycopg.Connection[Any], runs: int) -> None:
    if runs:
        conn.execute(LOAD_RUNS, {"runs": runs})
        for statement in LOAD_RUN_EVENTS:
            conn.execute(statement)


def load_ledger(conn: psycopg.Connection[Any], runs: int, events: int) -> None:
    for statement in LOAD_LEDGER:
        conn.execute(statement, {"runs": runs, "events": events})


def runs_loader(url: str, runs: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            reset(conn)
            load_runs(conn, runs)
            conn.execute(ANALYZE)

    return prepare


def keyed_runs_loader(url: str, runs: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            reset(conn)
            conn.execute(LOAD_KEYED_RUNS, {"runs": runs})
            for statement in LOAD_RUN_EVENTS:
                conn.execute(statement)
            if has_key_rows(conn):
                conn.execute(LOAD_KEY_ROWS, {"runs": runs})
                conn.execute("ANALYZE runrelay.concurrency_keys")
            conn.execute(ANALYZE)

    return prepare


def ledger_loader(url: str, runs: int, events: int) -> Callable[[], None]:
    def prepare() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            reset(conn)
            load_ledger(conn, runs, events)
            conn.execute(ANALYZE)

    return prepare


# Workloads ---------------------------------------------------------------


def enqueue(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    client = Client(conn)
    tag = uuid.uuid4().hex[:8]
    counter = itertools.count()

    def step(rec: Recorder) -> int | None:
        rec.timed("enqueue_run", client.enqueue_run, f"e-{tag}-{next(counter)}", payload={"n": 1})
        return 1

    return step


def enqueue_keyed(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    client = Client(conn)
    tag = uuid.uuid4().hex[:8]
    counter = itertools.count()

    def step(rec: Recorder) -> int | None:
        n = next(counter)
        rec.timed(
            "enqueue_run",
            client.enqueue_run,
            f"ek-{tag}-{n}",
            payload={"n": 1},
            concurrency_key=f"k-{tag}-{n % 100}",
        )
        return 1

    return step


def enqueue_bulk(size: int) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        client = Client(conn)
        tag = uuid.uuid4().hex[:8]
        counter = itertools.count()

        def step(rec: Recorder) -> int | None:
            n = next(counter)
            items = [EnqueueItem(f"b-{tag}-{n}-{i}", payload={"n": 1}) for i in range(size)]
            rec.timed("enqueue_runs", client.enqueue_runs, items)
            return size

        return step

    return factory


def single(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
    client = Client(conn)
    worker = f"w{index}"

    def step(rec: Recorder) -> int | None:
        claimed = rec.timed("claim_attempts", client.claim_attempts, worker)
        if not claimed:
            return None
        a = claimed[0]
        rec.timed("complete_attempt", client.complete_attempt, a.run_id, a.attempt, a.lease_token)
        return 1

    return step


def batched(size: int) -> Factory:
    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        client = Client(conn)
        worker = f"w{index}"

        def step(rec: Recorder) -> int | None:
            claimed = rec.timed("claim_attempts", client.claim_attempts, worker, max_runs=size)
            if not claimed:
                return None
            rec.timed("complete_attempts", client.complete_attempts, claimed)
            return len(claimed)

        return step

    return factory


def fused(size: int) -> Factory:
    """The Worker's fused loop, minus the handler: settle the held runs and
    claim the next `size` in one settle_and_claim call."""

    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        client = Client(conn)
        worker = f"w{index}"
        held: list[Any] = []

        def step(rec: Recorder) -> int | None:
            nonlocal held
            if not held:
                held = rec.timed("claim_attempts", client.claim_attempts, worker, max_runs=size)
                return 0 if held else None
            items = [
                {"run_id": a.run_id, "attempt": a.attempt, "lease_token": str(a.lease_token)}
                for a in held
            ]
            reply = rec.timed(
                "settle_and_claim", client.settle_and_claim, items, worker, max_runs=size
            )
            settled, held = settled_and_claimed(reply)
            return len(settled)

        return step

    return factory


def relay(batch: int) -> Factory:
    """The Relay loop's steady state, minus the sink: discover, then ack + claim-next."""
    as_batch = batch > 1

    def factory(conn: psycopg.Connection[Any], index: int) -> Callable[[Recorder], int | None]:
        client = Client(conn)
        name = f"relay-{index}"
        held: list[Any] = []

        def step(rec: Recorder) -> int | None:
            nonlocal held
            if not held:
                held = rec.timed(
                    "claim_ledger", client.claim_ledger, name, max_events=batch, batch=as_batch
                )
                held = [e for e in held if e.kind is LedgerKind.CLAIMED]
                return 0 if held else None
            out = rec.timed(
                "ack_ledger",
                client.ack_ledger,
                name,
                held[0].run_id,
                [e.event_id for e in held],
                claim_next=batch,
                batch=as_batch,
            )
            held = [e for e in out if e.kind is LedgerKind.CLAIMED]
            return sum(1 for e in out if e.kind is LedgerKind.DELIVERED)

        return step

    return factory


def cases(url: str, plan: Any) -> list[Case]:
    single_load = runs_loader(url, plan.backlog_single)
    keyed_load = keyed_runs_loader(url, plan.backlog_single)
    batch_load = runs_loader(url, plan.backlog_batch)
    empty = runs_loader(url, 0)
    head_load = ledger_loader(url, plan.ledger_runs_head, 100)
    batch_ledger = ledger_loader(url, plan.ledger_runs_batch, 100)
    hot = ledger_loader(url, 1, plan.hot_events)
    out: list[Case] = []
    for w in plan.enqueue_workers:
        out.append(Case(f"runrelay.enqueue.w{w}", "runrelay", "enqueue", w, url, empty, enqueue))
        out.append(
            Case(
                f"runrelay.enqueue100.w{w}",
                "runrelay",
                "enqueue100",
                w,
                url,
                empty,
                enqueue_bulk(100),
            )
        )
        out.append(
            Case(
                f"runrelay.enqueue_keyed.w{w}",
                "runrelay",
                "enqueue_keyed",
                w,
                url,
                empty,
                enqueue_keyed,
            )
        )
    for w in plan.workers:
        out.append(Case(f"runrelay.single.w{w}", "runrelay", "single", w, url, single_load, single))
        out.append(
            Case(
                f"runrelay.single_keyed.w{w}",
                "runrelay",
                "single_keyed",
                w,
                url,
                keyed_load,
                single,
            )
        )
        out.append(
            Case(f"runrelay.batch10.w{w}", "runrelay", "batch10", w, url, batch_load, batched(10))
        )
        out.append(Case(f"runrelay.fused.w{w}", "runrelay", "fused", w, url, single_load, fused(1)))
        out.append(
            Case(
                f"runrelay.fused_batch10.w{w}",
                "runrelay",
                "fused_batch10",
                w,
                url,
                batch_load,
                fused(10),
            )
        )
    for w in plan.relays:
        out.append(
            Case(
                f"ledger.head.r{w}",
                "runrelay",
                "ledger_head",
                w,
                url,
                head_load,
                relay(1),
                "events/s",
            )
        )
        out.append(
            Case(
                f"ledger.batch100.r{w}",
                "runrelay",
                "ledger_batch100",
                w,
                url,
                batch_ledger,
                relay(100),
                "events/s",
            )
        )
    out.append(
        Case(
            "ledger.hot_batch100.r1",
            "runrelay",
            "hot_batch100",
            1,
            url,
            hot,
            relay(100),
            "events/s",
        )
    )
    out.append(
        Case("ledger.hot_head.r1", "runrelay", "hot_head", 1, url, hot, relay(1), "events/s")
    )
    return out


# Round trips -------------------------------------------------------------


def round_trips(url: str) -> dict[str, Any]:
    """Protocol round trips of every client method, each called CALLS_PER_METHOD times."""
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        client = Client(conn)
        client.enqueue_run("rt", payload={"k": 1})
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        counts: dict[str, list[int]] = {}
        for name, (args, kwargs) in calls(now).items():
            for _ in range(CALLS_PER_METHOD):
                with traced(conn) as out:
                    getattr(client, name)(*args, **kwargs)
                counts.setdefault(name, []).append(frontend_round_trips(out[0]))
        reset(conn)
    methods = set(_operations.OPERATIONS) | {"run_stats", "ledger_stats", "wait_stats"}
    return {
        "calls_per_method": CALLS_PER_METHOD,
        "max_by_method": {name: max(c) for name, c in sorted(counts.items())},
        "not_measured": sorted(methods - set(counts)),
        "all_one": all(c == [1] * CALLS_PER_METHOD for c in counts.values())
        and methods <= set(counts),
    }
