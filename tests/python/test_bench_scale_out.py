"""`python -m bench.scale_out --quick`: the sharded bench at tiny sizes, a smoke test.

It starts its own durable proxy and shard clusters (as `make bench` does), so
it is not part of `bench.run --quick`; this test runs it instead. It checks
that every case did work, that enqueues spread over both shards, and that
the results document and the table are written; it asserts nothing about
speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sharded

REPO = Path(__file__).resolve().parents[2]


def test_quick_scale_out_bench_measures_every_case(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.scale_out", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    [path] = tmp_path.glob("*-scale-out-quick.json")
    doc = json.loads(path.read_text())

    # Every single call was timed both ways.
    for route in ("direct", "proxy"):
        assert set(doc["probes"][route]) >= {
            "enqueue_run",
            "claim_attempts",
            "heartbeat",
            "complete_attempt",
            "claim_ledger",
            "ack_ledger",
        }
    # Every case did work. Follow-up calls (complete, ack) route by run_id,
    # so work done means each loaded run sat on the shard its run_id routes
    # to; enqueues through two shards reach both (dozens of hashed run_ids).
    assert {c["shards"] for c in doc["cases"].values()} == {1, 2}
    for key, case in doc["cases"].items():
        for jobs in case["cpu"]["jobs_by_shard"]:
            assert sum(jobs) > 0, (key, jobs)
        assert case["cpu"]["shards_ms_per_job"] > 0, key
    for jobs in doc["cases"]["two.proxy.enqueue.w2"]["cpu"]["jobs_by_shard"]:
        assert len(jobs) == 2 and all(n > 0 for n in jobs), jobs
    # An empty claim through two shards visits both.
    assert {e["shards"] for e in doc["discovery"].values()} == {1, 2}
    assert doc["model"]["by_workload"]
    assert "| call | direct p50 |" in out.stdout
