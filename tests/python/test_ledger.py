"""Run ledger behaviour with real sessions: commit-order seq, discovery without
contention, exact claim and ack replays, leases that run from the grant after
a lane lock wait, local acks as acknowledgements, retention, notifications,
and plans that do not grow with the backlog."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest

from conftest import capture_plans
from sqlapi import backend_pid, call, enqueue, scalar, table_checksum, wait_until_blocked

Connect = Callable[..., psycopg.Connection]


def _obs(n: int, **extra: object) -> list[dict[str, object]]:
    return [{"type": f"t{i}", "lane": "observability", **extra} for i in range(n)]


def test_seq_follows_commit_order_under_concurrent_appends(
    db: psycopg.Connection, connect: Connect
) -> None:
    """T1 appends and holds its transaction open; T2's append must queue on the
    run row, so it cannot take a seq that commits before T1's."""
    enqueue(db, "r1")
    t1 = connect(autocommit=False)
    first = call(t1, "append_events", run_id="r1", events=_obs(1))
    t2 = connect()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call, t2, "append_events", run_id="r1", events=_obs(1))
        wait_until_blocked(db, backend_pid(t2))
        t1.commit()
        second = pending.result(timeout=10)
    assert second[0]["seq"] > first[0]["seq"]
    assert second[0]["event_id"] > first[0]["event_id"]


@pytest.mark.parametrize("first", ["commits", "rolls back"])
def test_one_explicit_key_appended_by_two_sessions_at_once_is_taken_once(
    db: psycopg.Connection, connect: Connect, first: str
) -> None:
    """Neither session's check sees the other's uncommitted event, so the
    unique index of explicit keys decides: the second waits for the first,
    fails if it commits (docs/scheduler.md) and goes through if it rolls
    back; the key is held by one event either way."""
    enqueue(db, "r1")
    enqueue(db, "r2")
    keyed = [{"type": "order.paid", "delivery_key": "order-9/paid"}]
    t1 = connect(autocommit=False)
    call(t1, "append_events", run_id="r1", events=keyed)
    t2 = connect()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call, t2, "append_events", run_id="r2", events=keyed)
        wait_until_blocked(db, backend_pid(t2))
        if first == "commits":
            t1.commit()
            with pytest.raises(psycopg.errors.UniqueViolation, match="ledger_delivery_key_unique"):
                pending.result(timeout=10)
        else:
            t1.rollback()
            assert [r["delivery_key"] for r in pending.result(timeout=10)] == ["order-9/paid"]
    rows = db.execute(
        "SELECT run_id FROM runrelay.ledger WHERE delivery_key = 'order-9/paid'"
    ).fetchall()
    assert rows == [("r1",) if first == "commits" else ("r2",)]


def test_discovery_skips_a_run_another_relay_holds(
    db: psycopg.Connection, connect: Connect
) -> None:
    enqueue(db, "a")
    enqueue(db, "b")
    holder = connect(autocommit=False)
    got = call(holder, "claim_ledger", relay="r1")
    assert [r["run_id"] for r in got] == ["a"]
    # r1's transaction still holds a's lane row: r2 must not wait, and takes b.
    other = call(connect(), "claim_ledger", relay="r2")
    assert [r["run_id"] for r in other] == ["b"]
    holder.commit()
    assert call(connect(), "claim_ledger", relay="r3") == []


def test_wait_for_run_waits_for_the_lane_instead_of_skipping(
    db: psycopg.Connection, connect: Connect
) -> None:
    enqueue(db, "a")
    holder = connect(autocommit=False)
    call(holder, "claim_ledger", relay="r1", run_id="a")
    assert call(connect(), "claim_ledger", relay="r2", run_id="a") == []
    waiter = connect()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            call, waiter, "claim_ledger", relay="r1", run_id="a", wait_for_run=True
        )
        wait_until_blocked(db, backend_pid(waiter))
        holder.commit()
        again = pending.result(timeout=10)
    assert [r["kind"] for r in again] == ["claimed"]  # same relay: re-claimed


def test_claim_replay_after_a_lost_reply_is_exact(db: psycopg.Connection, connect: Connect) -> None:
    enqueue(db, "r1")
    call(
        db,
        "append_events",
        run_id="r1",
        events=[
            {"type": "hidden", "transport_only": True},
            {"type": "shown"},
        ],
    )
    # Move past run.queued so the transport-only event is the head.
    head = call(db, "claim_ledger", relay="x")
    call(db, "ack_ledger", relay="x", run_id="r1", event_ids=[head[0]["event_id"]])
    call_id = uuid.uuid4()
    first = call(db, "claim_ledger", relay="x", call_id=call_id)  # reply "lost"
    assert [r["kind"] for r in first] == ["local_ack", "claimed"]
    before = table_checksum(db)
    replay = call(db, "claim_ledger", relay="x", call_id=call_id)
    assert [(r["kind"], r["event_id"]) for r in replay] == [
        (r["kind"], r["event_id"]) for r in first
    ]
    assert table_checksum(db) == before
    assert call(db, "claim_ledger", relay="y", call_id=call_id) == []
    # A call that rolled back is done afresh under the same id.
    enqueue(db, "r2")
    fresh = uuid.uuid4()
    tx = connect(autocommit=False)
    assert call(tx, "claim_ledger", relay="x", run_id="r2", call_id=fresh)
    tx.rollback()
    redo = call(db, "claim_ledger", relay="x", run_id="r2", call_id=fresh)
    assert [r["kind"] for r in redo] == ["claimed"]


def test_drop_on_delivery_clears_payloads_and_prune_is_bounded(db: psycopg.Connection) -> None:
    enqueue(db, "secret", payload_retention="drop_on_delivery")
    enqueue(db, "kept")
    for run_id in ("secret", "kept"):
        call(db, "append_events", run_id=run_id, events=[{"type": "x", "payload": {"pii": 1}}])
        rows = call(db, "claim_ledger", relay="r", run_id=run_id, batch=True, max_events=10)
        call(db, "ack_ledger", relay="r", run_id=run_id, event_ids=[r["event_id"] for r in rows])
    payloads = dict(
        db.execute(
            "SELECT run_id, bool_and(payload IS NULL) FROM runrelay.ledger GROUP BY run_id"
        ).fetchall()
    )
    assert payloads == {"secret": True, "kept": False}
    assert scalar(db, "prune", delivered_before="2000-01-01T00:00:00Z") == 0
    assert scalar(db, "prune", delivered_before="2999-01-01T00:00:00Z", max_rows=3) == 3
    assert scalar(db, "prune", delivered_before="2999-01-01T00:00:00Z") == 1
    assert db.execute("SELECT count(*) FROM runrelay.ledger").fetchone() == (0,)


def test_notifications_on_every_channel(db: psycopg.Connection, connect: Connect) -> None:
    listener = connect()
    for channel in ("runrelay_runs", "runrelay_ledger", "runrelay_terminal", "runrelay_delivered"):
        listener.execute(f"LISTEN {channel}")
    enqueue(db, "r1", queue="mail")
    claim = call(db, "claim_attempts", worker="w")[0]
    scalar(
        db,
        "complete_attempt",
        run_id="r1",
        attempt=claim["attempt"],
        lease_token=claim["lease_token"],
    )
    rows = call(db, "claim_ledger", relay="r", run_id="r1", batch=True, max_events=10)
    call(db, "ack_ledger", relay="r", run_id="r1", event_ids=[r["event_id"] for r in rows])
    got: dict[str, list[str]] = {}
    for note in listener.notifies(timeout=1.0, stop_after=4):
        got.setdefault(note.channel, []).append(note.payload)
    assert got["runrelay_runs"] == ["mail"]
    assert got["runrelay_ledger"] == ["r1"]
    assert [json.loads(p) for p in got["runrelay_terminal"]] == [
        {"run_id": "r1", "status": "completed"}
    ]
    delivered = [json.loads(p) for p in got["runrelay_delivered"]]
    assert delivered == [{"run_id": "r1", "event_id": rows[-1]["event_id"]}]


def test_one_statement_per_batch_drains_a_hot_run(db: psycopg.Connection) -> None:
    """10 000 events on one run, drained by ack + claim-next: one statement per
    batch of 100, each claim touching O(batch) rows."""
    enqueue(db, "hot")
    for _ in range(10):  # at most 1000 events per append
        db.execute(
            "SELECT runrelay.append_events('hot', (SELECT jsonb_agg(jsonb_build_object("
            "'type', 'e')) FROM generate_series(1, 1000)))"
        )
    statements = 1
    rows = call(db, "claim_ledger", relay="r", run_id="hot", batch=True, max_events=100)
    delivered = 0
    while rows:
        ids = [r["event_id"] for r in rows if r["kind"] == "claimed"]
        out = call(
            db, "ack_ledger", relay="r", run_id="hot", event_ids=ids, claim_next=100, batch=True
        )
        statements += 1
        delivered += sum(r["kind"] == "delivered" for r in out)
        rows = [r for r in out if r["kind"] == "claimed"]
    assert delivered == 10001
    assert statements == 10001 // 100 + 2


@pytest.fixture(scope="module")
def big_backlog(db_url: str) -> Iterator[str]:
    """10 000 runs x 100 pending events = 1 000 000 pending events, plus lane
    rows, loaded in bulk (the plans, not the load, are under test)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        from conftest import reset

        reset(c)
        c.execute(
            """
            INSERT INTO runrelay.runs (run_id, queue, status, payload, run_at, max_attempts,
                                       created_at, updated_at, ledger_seq)
            SELECT 'big-' || i, 'q', 'queued', '{}', now(), 3, now(), now(), 100
            FROM generate_series(1, 10000) AS i
            """
        )
        c.execute(
            """
            INSERT INTO runrelay.ledger_events (run_id, lane, seq, type, payload, delivery_key,
                                                created_at, next_attempt_at)
            SELECT 'big-' || i, 'lifecycle', s, 'e', '{}', 'big-' || i || ':' || s,
                   now() - make_interval(secs => i), now() - make_interval(secs => i)
            FROM generate_series(1, 10000) AS i, generate_series(1, 100) AS s
            """
        )
        c.execute(
            """
            INSERT INTO runrelay.ledger_lanes (run_id, lane, head_seq, available_at)
            SELECT 'big-' || i, 'lifecycle', 1, now() - make_interval(secs => i)
            FROM generate_series(1, 10000) AS i
            """
        )
        c.execute("ANALYZE runrelay.ledger_events")
        c.execute("ANALYZE runrelay.ledger_lanes")
        c.execute("ANALYZE runrelay.runs")
    yield db_url
    with psycopg.connect(db_url, autocommit=True) as c:
        from conftest import reset

        reset(c)


def _explained(conn: psycopg.Connection) -> Callable[[], str]:
    take = capture_plans(conn, analyze=True)
    return lambda: "\n".join(take())


def _max_buffers(plans: str) -> int:
    """The most buffers any one statement inside the function touched (the
    top-level call is left out: its count includes the nested statements and,
    on a first call, loading the catalog)."""
    worst = 0
    for plan in plans.split("duration: "):
        if 'Query Text: SELECT * FROM runrelay."' in plan:
            continue
        touched = [int(x) for x in re.findall(r"(?:hit|read)=(\d+)", plan)]
        worst = max([worst, *touched])
    return worst


def test_ledger_hot_paths_are_index_seeks_at_a_million_pending(big_backlog: str) -> None:
    with psycopg.connect(big_backlog, autocommit=True) as conn:
        take = _explained(conn)
        for iteration in range(7):  # past the plpgsql generic-plan switch
            take()
            due = scalar(conn, "ledger_next_due_at")
            plans = take()
            assert due is not None
            assert "Seq Scan" not in plans, plans
            assert "ledger_lanes_available_idx" in plans
            assert _max_buffers(plans) < 50, plans

            rows = call(conn, "claim_ledger", relay="r", batch=True, max_events=50)
            plans = take()
            # Oldest head first; each iteration drains one run's 100 events.
            assert len(rows) == 50 and rows[0]["run_id"] == f"big-{10000 - iteration}"
            assert "Seq Scan" not in plans, plans
            assert "ledger_lane_seq_idx" in plans and "ledger_lanes_available_idx" in plans
            # O(batch): leasing 50 events writes one lane row and reads the
            # 50; nothing is proportional to the million pending.
            assert _max_buffers(plans) < 40 * 50, plans

            ids = [r["event_id"] for r in rows]
            out = call(
                conn,
                "ack_ledger",
                relay="r",
                run_id=rows[0]["run_id"],
                event_ids=ids,
                claim_next=50,
                batch=True,
            )
            plans = take()
            assert sum(r["kind"] == "claimed" for r in out) == 50
            assert "Seq Scan" not in plans, plans
            assert _max_buffers(plans) < 40 * 100, plans
            call(
                conn,
                "ack_ledger",
                relay="r",
                run_id=rows[0]["run_id"],
                event_ids=[r["event_id"] for r in out if r["kind"] == "claimed"],
            )
            take()

            head = call(conn, "claim_ledger", relay="h", run_id="big-5000")
            plans = take()
            assert [r["seq"] for r in head] in ([1], [])
            assert "Seq Scan" not in plans, plans
            # About 41 buffers; the session's first such claim also reads
            # catalog pages for what it plans (up to 50 with 0009's index on
            # ledger_lanes), so the bound leaves room for that.
            assert _max_buffers(plans) < 60, plans


def test_concurrent_relays_never_take_the_same_run(
    db: psycopg.Connection, connect: Connect
) -> None:
    for i in range(200):
        enqueue(db, f"r{i}")
    taken: list[str] = []
    lock = threading.Lock()

    def relay(n: int) -> None:
        conn = connect()
        while True:
            rows = call(conn, "claim_ledger", relay=f"relay{n}")
            if not rows:
                return
            with lock:
                taken.extend(r["run_id"] for r in rows)
            call(
                conn,
                "ack_ledger",
                relay=f"relay{n}",
                run_id=rows[0]["run_id"],
                event_ids=[rows[0]["event_id"]],
            )

    with ThreadPoolExecutor(6) as pool:
        for f in [pool.submit(relay, n) for n in range(6)]:
            f.result(timeout=60)
    assert sorted(taken) == sorted(f"r{i}" for i in range(200))


def test_claimed_and_acknowledged_rows_are_formatted_inline(db: psycopg.Connection) -> None:
    """Every row a claim or an acknowledgement answers is formatted by
    _ledger_row, which the planner expands into the statement (a
    set-returning SQL function whose arguments are not volatile) instead of
    calling it once per row: no function scan of it in any plan, first calls
    and generic plans alike, replays included."""
    enqueue(db, "fmt")
    db.execute(
        "SELECT runrelay.append_events('fmt', (SELECT jsonb_agg(jsonb_build_object("
        "'type', 'e', 'lane', 'observability')) FROM generate_series(1, 200)))"
    )
    take = _explained(db)
    claim = {"relay": "r", "lane": "observability", "run_id": "fmt", "batch": True}
    rows = call(db, "claim_ledger", max_events=5, call_id=str(uuid.uuid4()), **claim)
    plans = take()
    for _ in range(8):  # past the switch to generic plans
        ids = [r["event_id"] for r in rows if r["kind"] == "claimed"]
        out = call(
            db, "ack_ledger", relay="r", run_id="fmt", event_ids=ids, claim_next=5, batch=True
        )
        replay = call(
            db, "ack_ledger", relay="r", run_id="fmt", event_ids=ids, claim_next=5, batch=True
        )
        assert [r["event_id"] for r in replay] == [r["event_id"] for r in out]
        rows = [r for r in out if r["kind"] == "claimed"]
        assert len(rows) == 5 and sum(r["kind"] == "delivered" for r in out) == 5
        plans += take()
    assert "_ledger_row" in plans  # the statements that format rows were captured
    assert not re.search(r"Function Scan on (\w+\.)?_ledger_row", plans), plans


def test_acks_stay_o_batch_after_a_long_delivered_history(db: psycopg.Connection) -> None:
    """A hot run's delivered events stay at the start of its
    ledger_lane_seq_idx range (the index has no delivery predicate), and
    statistics taken before the deliveries are stale. Head lookups must start
    at the lane's recorded head and the delivered report must seek the primary
    key, so an ack costs the same after 2 900 deliveries as after none."""
    db.execute("ALTER TABLE runrelay.ledger_events SET (autovacuum_enabled = false)")
    try:
        enqueue(db, "hot")
        for _ in range(3):
            db.execute(
                "SELECT runrelay.append_events('hot', (SELECT jsonb_agg(jsonb_build_object("
                "'type', 'e')) FROM generate_series(1, 1000)))"
            )
        db.execute("ANALYZE runrelay.ledger_events")  # nothing delivered yet: stale from here on
        rows = call(db, "claim_ledger", relay="r", run_id="hot", batch=True, max_events=100)
        for _ in range(29):
            ids = [r["event_id"] for r in rows if r["kind"] == "claimed"]
            out = call(
                db, "ack_ledger", relay="r", run_id="hot", event_ids=ids, claim_next=100, batch=True
            )
            rows = [r for r in out if r["kind"] == "claimed"]
        take = _explained(db)
        ids = [r["event_id"] for r in rows]
        out = call(
            db, "ack_ledger", relay="r", run_id="hot", event_ids=ids, claim_next=100, batch=True
        )
        plans = take()
        assert sum(r["kind"] == "delivered" for r in out) == 100
        # The run and its one lane row may be read by a scan once autovacuum
        # has analyzed their one-row tables; the events' table never.
        assert "Seq Scan on ledger_events" not in plans, plans
        for plan in plans.split("duration: "):
            if "ORDER BY l.seq" in plan and "LIMIT 1" in plan:  # a head lookup
                assert _max_buffers(plan) < 30, plan
    finally:
        db.execute("ALTER TABLE runrelay.ledger_events RESET (autovacuum_enabled)")


def test_a_delivery_failure_due_at_once_wakes_relays(
    db: psycopg.Connection, connect: Connect
) -> None:
    enqueue(db, "r1")
    [head] = call(db, "claim_ledger", relay="r", run_id="r1")
    listener = connect()
    listener.execute("LISTEN runrelay_ledger")
    call(
        db,
        "fail_ledger",
        relay="r",
        event_ids=[head["event_id"]],
        error={"e": 1},
        retry_at="2000-01-01T00:00:00Z",
    )
    assert [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)] == ["r1"]
    [again] = call(db, "claim_ledger", relay="r", run_id="r1", call_id=uuid.uuid4())
    call(
        db,
        "fail_ledger",
        relay="r",
        event_ids=[again["event_id"]],
        error={"e": 2},
        retry_at="2999-01-01T00:00:00Z",
    )
    assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # not due: no wake-up


@pytest.mark.parametrize("function", ["claim_ledger", "ack_ledger"])
def test_a_lease_granted_after_a_lane_lock_wait_runs_from_the_grant(
    db: psycopg.Connection, connect: Connect, function: str
) -> None:
    """A claim (claim_ledger with wait_for_run, or ack_ledger's claim-next)
    queues behind a session holding the lane row. The lease it grants must run
    lease_seconds from the moment it got the lock, not from the start of its
    statement, and lease_remaining_ms must be measured when it answers — or a
    relay would schedule its first renewal late by the time it waited. All
    times compared are the database clock's."""
    enqueue(db, "r1")
    if function == "claim_ledger":
        kwargs: dict[str, object] = {"relay": "x", "run_id": "r1", "wait_for_run": True}
    else:
        call(db, "append_events", run_id="r1", events=[{"type": "next"}])
        [head] = call(db, "claim_ledger", relay="x", run_id="r1")
        kwargs = {"relay": "x", "run_id": "r1", "event_ids": [head["event_id"]], "claim_next": 1}
    holder = connect(autocommit=False)
    holder.execute(
        "SELECT 1 FROM runrelay.ledger_lanes WHERE run_id = 'r1' AND lane = 'lifecycle' FOR UPDATE"
    )
    waiter = connect()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call, waiter, function, lease_seconds=30, **kwargs)
        wait_until_blocked(db, backend_pid(waiter))
        # The waiter's statement began before this moment; its lock comes after.
        row = holder.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        released = row[0]
        holder.commit()
        rows = pending.result(timeout=10)
    [lease] = [r for r in rows if r["kind"] == "claimed"]
    assert lease["lease_expires_at"] >= released + timedelta(seconds=30), (lease, released)
    left_at_release = (lease["lease_expires_at"] - released) / timedelta(milliseconds=1)
    assert lease["lease_remaining_ms"] <= left_at_release, (lease, released)
    stored = db.execute(
        "SELECT lease_expires_at FROM runrelay.ledger WHERE event_id = %s", [lease["event_id"]]
    ).fetchone()
    assert stored == (lease["lease_expires_at"],)


def test_local_acks_are_acknowledgements(db: psycopg.Connection, connect: Connect) -> None:
    """A transport-only event acknowledged locally goes through the same
    acknowledgement as a delivered one: runrelay_delivered names it, a
    drop_on_delivery run loses its payload, and ack_ledger reports its lag."""
    enqueue(db, "r1", payload_retention="drop_on_delivery")
    [head] = call(db, "claim_ledger", relay="x", run_id="r1")
    call(
        db,
        "append_events",
        run_id="r1",
        events=[{"type": "hidden", "transport_only": True, "payload": {"pii": 1}}],
    )
    listener = connect()
    listener.execute("LISTEN runrelay_delivered")
    out = call(db, "ack_ledger", relay="x", run_id="r1", event_ids=[head["event_id"]], claim_next=5)
    assert [r["kind"] for r in out] == ["delivered", "local_ack"]
    local = out[1]
    assert local["payload"] is None and local["lag_ms"] is not None and local["lag_ms"] >= 0
    notes = [json.loads(n.payload) for n in listener.notifies(timeout=1.0, stop_after=2)]
    assert {"run_id": "r1", "event_id": local["event_id"]} in notes, notes
    stored = db.execute(
        "SELECT state, acked_locally, payload FROM runrelay.ledger WHERE event_id = %s",
        [local["event_id"]],
    ).fetchone()
    assert stored == ("delivered", True, None)


def test_ack_replay_after_a_lost_reply_is_exact_and_writes_nothing(db: psycopg.Connection) -> None:
    """The first ack delivered e1, acknowledged the transport-only e2 locally
    and claimed e3; its reply was lost. The repeat answers exactly that — the
    local ack included, the lease not re-extended — and changes no row."""
    enqueue(db, "r1")
    [head] = call(db, "claim_ledger", relay="x", run_id="r1")
    call(
        db,
        "append_events",
        run_id="r1",
        events=[{"type": "hidden", "transport_only": True}, {"type": "shown"}, {"type": "later"}],
    )
    args: dict[str, object] = {
        "relay": "x",
        "run_id": "r1",
        "event_ids": [head["event_id"]],
        "claim_next": 1,
    }
    first = call(db, "ack_ledger", **args)  # reply "lost"
    assert [r["kind"] for r in first] == ["delivered", "local_ack", "claimed"]
    before = table_checksum(db)
    replay = call(db, "ack_ledger", **args)
    volatile = "lease_remaining_ms"
    assert [{k: v for k, v in r.items() if k != volatile} for r in replay] == [
        {k: v for k, v in r.items() if k != volatile} for r in first
    ]
    assert table_checksum(db) == before
