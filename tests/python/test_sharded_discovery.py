"""Discovery across shards: the calls that name no run find all the work.

For random sets of runs spread over both shards (some due, some not yet due,
some in another queue), claim_attempts through the proxy returns
min(max_runs, due) runs per call and, repeated, exactly the due set; the same
holds for claim_ledger without a run_id (every lane head, until none is
left) and reap_expired (expired leases on both shards), and
ledger_next_due_at is the minimum over the shards. Calls with a call_id
replay exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from conftest import reset
from runrelay.types import LedgerEvent
from sharded_harness import ShardedInstall, run_ids_on

pytestmark = pytest.mark.sharded

PROPERTY = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Each run: (shard, kind). kind: due in queue q, not yet due in q, due in another queue.
RUNS = st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from(["due", "due", "later", "other"])),
    max_size=16,
)


def _fresh(sharded: ShardedInstall) -> None:
    sharded.close()
    for url in sharded.shard_urls:
        with psycopg.connect(url, autocommit=True) as c:
            reset(c)


@contextmanager
def shard_clock(sharded: ShardedInstall, offset: str) -> Iterator[None]:
    """Move the database clock of every shard by `offset`, for every session
    that starts from now on: the proxy's connections to the shards are
    sessions of their own, so the offset is a database setting there
    (runrelay.clock_offset; the harness allows the override) and the caller
    opens a new proxy connection to see it."""

    def set_all(value: str | None) -> None:
        for url in sharded.shard_urls:
            with psycopg.connect(url, autocommit=True) as c:
                db = sql.Identifier(c.info.dbname)
                if value is None:
                    c.execute(sql.SQL("ALTER DATABASE {} RESET runrelay.clock_offset").format(db))
                else:
                    c.execute(
                        sql.SQL("ALTER DATABASE {} SET runrelay.clock_offset = {}").format(
                            db, sql.Literal(value)
                        )
                    )

    set_all(offset)
    try:
        yield
    finally:
        set_all(None)
        sharded.close()


def _enqueue(sharded: ShardedInstall, runs: list[tuple[int, str]]) -> set[str]:
    """Enqueue the runs through the proxy; the set of due run_ids in queue q."""
    pools = {s: run_ids_on(sharded, s, 16, f"d{s}") for s in (0, 1)}
    client = sharded.client()
    later = datetime.now(UTC) + timedelta(hours=1)
    due: set[str] = set()
    for i, (shard, kind) in enumerate(runs):
        run_id = pools[shard][i]
        client.enqueue_run(
            run_id,
            queue="other" if kind == "other" else "q",
            run_at=later if kind == "later" else None,
        )
        if kind == "due":
            due.add(run_id)
    return due


@PROPERTY
@given(runs=RUNS, k=st.integers(1, 5))
def test_claims_find_every_due_run_across_shards(
    sharded: ShardedInstall, runs: list[tuple[int, str]], k: int
) -> None:
    _fresh(sharded)
    due = _enqueue(sharded, runs)
    client = sharded.client()
    claimed: list[str] = []
    while True:
        left = len(due) - len(claimed)
        got = client.claim_attempts("w", ["q"], max_runs=k)
        assert len(got) == min(k, left), (len(got), k, left)
        if not got:
            break
        claimed += [c.run_id for c in got]
    assert len(claimed) == len(set(claimed))
    assert set(claimed) == due


@PROPERTY
@given(runs=RUNS, k=st.integers(1, 4))
def test_reaping_finds_expired_leases_on_both_shards(
    sharded: ShardedInstall, runs: list[tuple[int, str]], k: int
) -> None:
    _fresh(sharded)
    due = _enqueue(sharded, runs)
    client = sharded.client()
    claimed = {(c.run_id, c.attempt) for c in client.claim_attempts("w", ["q"], max_runs=100)}
    assert {c[0] for c in claimed} == due
    # Nothing has expired yet: reaping finds nothing.
    assert client.reap_expired(max_attempts=k) == []
    with shard_clock(sharded, "1 hour"):
        client = sharded.client()
        reaped: list[tuple[str, int]] = []
        while True:
            left = len(claimed) - len(reaped)
            got = client.reap_expired(max_attempts=k)
            assert len(got) == min(k, left)
            if not got:
                break
            reaped += [(r.run_id, r.attempt) for r in got]
        assert len(reaped) == len(set(reaped))
        assert set(reaped) == claimed


# Each run: (shard, events on lane "observability").
LEDGER = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4)), max_size=10)


@PROPERTY
@given(runs=LEDGER, m=st.integers(1, 3))
def test_ledger_claims_find_every_lane_head_across_shards(
    sharded: ShardedInstall, runs: list[tuple[int, int]], m: int
) -> None:
    _fresh(sharded)
    pools = {s: run_ids_on(sharded, s, 10, f"l{s}") for s in (0, 1)}
    client = sharded.client()
    appended: dict[str, list[int]] = {}
    for i, (shard, n) in enumerate(runs):
        run_id = pools[shard][i]
        client.enqueue_run(run_id, queue="q")
        if n:
            rows = client.append_events(
                run_id, [{"type": f"e{j}", "lane": "observability"} for j in range(n)]
            )
            appended[run_id] = [r.event_id for r in rows]
    # The earliest due moment is the minimum over the shards.
    proxy = sharded.connect()
    for lane in ("observability", None):
        mine = proxy.execute("SELECT runrelay.ledger_next_due_at(%s)", [lane]).fetchone()
        theirs = [
            sharded.shard(i).execute("SELECT runrelay.ledger_next_due_at(%s)", [lane]).fetchone()
            for i in (0, 1)
        ]
        values = [t[0] for t in theirs if t is not None and t[0] is not None]
        assert mine is not None and mine[0] == (min(values) if values else None)
    delivered: dict[str, list[int]] = {}
    while True:
        got = client.claim_ledger("relay", lane="observability", max_events=m, batch=True)
        if not got:
            break
        assert len({e.run_id for e in got}) == 1, "one run's prefix per claim"
        run_id = got[0].run_id
        assert len(got) == min(m, len(appended[run_id]) - len(delivered.get(run_id, [])))
        delivered.setdefault(run_id, []).extend(e.event_id for e in got)
        client.ack_ledger("relay", run_id, [e.event_id for e in got])
    assert delivered == appended
    assert client.ledger_next_due_at("observability") is None


def _stable(events: list[LedgerEvent]) -> list[LedgerEvent]:
    """The rows without the lease columns a faithful replay may answer
    differently (re-extended for the same holder, measured at statement time)."""
    return [replace(e, lease_expires_at=None, lease_remaining_ms=None) for e in events]


def test_calls_with_a_call_id_replay_exactly(sharded: ShardedInstall) -> None:
    ids = run_ids_on(sharded, 0, 4, "rp") + run_ids_on(sharded, 1, 4, "rp")
    client = sharded.client()
    for run_id in ids:
        client.enqueue_run(run_id, queue="q")
        client.append_events(
            run_id, [{"type": "a", "lane": "observability"}, {"type": "b", "lane": "observability"}]
        )

    call = uuid.uuid4()
    first = client.claim_attempts("w", ["q"], max_runs=5, call_id=call)
    assert len(first) == 5
    again = sharded.client().claim_attempts("w", ["q"], max_runs=5, call_id=call)
    assert again == first

    # settle_and_claim: complete the claimed attempts (both shards) and claim the rest.
    items = [{"op": "complete", **c.fence, "lease_token": str(c.lease_token)} for c in first]
    call = uuid.uuid4()
    settled = client.settle_and_claim(items, "w", ["q"], max_runs=5, call_id=call)
    assert [r.outcome for r in settled if r.kind == "settled"] == ["completed"] * 5
    assert len([r for r in settled if r.kind == "claimed"]) == 3
    assert sharded.client().settle_and_claim(items, "w", ["q"], max_runs=5, call_id=call) == settled
    assert {r[0] for r in sharded.everywhere("SELECT count(*) FROM runrelay.attempts")} <= {4}

    call = uuid.uuid4()
    events = client.claim_ledger(
        "relay", lane="observability", max_events=2, batch=True, call_id=call
    )
    assert len(events) == 2
    replayed = sharded.client().claim_ledger(
        "relay", lane="observability", max_events=2, batch=True, call_id=call
    )
    assert _stable(replayed) == _stable(events)
