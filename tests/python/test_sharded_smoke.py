"""The sharded install answers like a single one: a first smoke test."""

from __future__ import annotations

import pytest

from sharded_harness import ShardedInstall, run_ids_on

pytestmark = pytest.mark.sharded


def test_runs_land_on_their_shard_and_claims_reach_both(sharded: ShardedInstall) -> None:
    client = sharded.client()
    ids = run_ids_on(sharded, 0, 3, "a") + run_ids_on(sharded, 1, 3, "b")
    for run_id in ids:
        client.enqueue_run(run_id, queue="q")
    homes = {r[0] for r in sharded.shard(0).execute("SELECT run_id FROM runrelay.runs")}
    assert homes == set(ids[:3])
    claimed = client.claim_attempts("w", ["q"], max_runs=10)
    assert sorted(c.run_id for c in claimed) == sorted(ids)
