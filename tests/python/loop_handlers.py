"""Handlers and sinks that `runrelay worker` / `runrelay relay` processes
load in the loop tests (tests/python must be on PYTHONPATH). Each leaves a
trace a test can read after the process is gone — one JSON line per event,
flushed at once, so a SIGKILL loses nothing already done:

* RR_TEST_RECORD   — the file `record` appends {"ev", "run_id", "attempt", "pid"} to;
* RR_TEST_SINK     — the file `slow_sink` appends faults.SinkLog records to;
* RR_TEST_SINK_DELAY — seconds `slow_sink` sleeps after taking a batch (default 0);
* RR_TEST_NAME     — the relay name written into sink records.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from runrelay.types import LedgerEvent
from runrelay.worker import Job


def _append(env: str, record: dict[str, Any]) -> None:
    with open(os.environ[env], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def record(job: Job) -> dict[str, Any]:
    """Record the start, sleep payload["sleep"] seconds on the attempts listed
    in payload["sleep_on"] (default: every attempt) without looking at
    job.cancelled, record the end."""
    base = {"run_id": job.run_id, "attempt": job.attempt.attempt, "pid": os.getpid()}
    _append("RR_TEST_RECORD", {"ev": "start", **base})
    payload = job.payload if isinstance(job.payload, dict) else {}
    sleep_on = payload.get("sleep_on")
    if sleep_on is None or job.attempt.attempt in sleep_on:
        time.sleep(float(payload.get("sleep", 0)))
    if payload.get("fail"):
        raise RuntimeError(f"asked to fail: {job.run_id}")
    _append("RR_TEST_RECORD", {"ev": "end", **base})
    return {"pid": os.getpid()}


def slow_sink(lane: str, events: Sequence[LedgerEvent]) -> None:
    """Record the batch as the consumer's receipt, then be slow about
    acknowledging it."""
    if events:
        _append("RR_TEST_SINK", {
            "relay": os.environ.get("RR_TEST_NAME", str(os.getpid())),
            "lane": lane,
            "run_id": events[0].run_id,
            "keys": [e.delivery_key for e in events],
            "seqs": [e.seq for e in events],
            "event_ids": [e.event_id for e in events],
            "w": time.time(),
        })  # fmt: skip
    time.sleep(float(os.environ.get("RR_TEST_SINK_DELAY", "0")))


async def arecord(job: Job) -> dict[str, Any]:
    """`record` for `runrelay worker --async`: awaits payload["sleep"] seconds."""
    import asyncio

    base = {"run_id": job.run_id, "attempt": job.attempt.attempt, "pid": os.getpid()}
    _append("RR_TEST_RECORD", {"ev": "start", **base})
    payload = job.payload if isinstance(job.payload, dict) else {}
    await asyncio.sleep(float(payload.get("sleep", 0)))
    _append("RR_TEST_RECORD", {"ev": "end", **base})
    return {"pid": os.getpid()}
