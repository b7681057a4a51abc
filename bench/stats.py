# ruff: noqa: RUF002, RUF003  (en dashes in min–max ranges are intended)
"""Medians of repetitions, percentiles, and the results document.

Every figure is the median of ≥ 3 repetitions, reported with the min and
max across repetitions: a throughput is one number per repetition; a latency
percentile (p50, p99) is computed within each repetition, then summarised the
same way.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._load import Window


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100), linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """{median, min, max, reps} of one figure over repetitions."""
    vals = [float(v) for v in values]
    return {
        "median": statistics.median(vals) if vals else 0.0,
        "min": min(vals) if vals else 0.0,
        "max": max(vals) if vals else 0.0,
        "reps": vals,
    }


def summarize(windows: Sequence[Window], unit: str = "jobs/s") -> dict[str, Any]:
    """One measured configuration: throughput and per-operation p50/p99."""
    ops = sorted({op for w in windows for op in w.latencies_ms})
    # A repetition without a sample of an operation (a relay that never had
    # to rediscover work) contributes nothing to that operation's figures.
    sampled = {op: [w.latencies_ms[op] for w in windows if w.latencies_ms.get(op)] for op in ops}
    latency = {
        op: {
            "p50": spread([percentile(v, 50) for v in sampled[op]]),
            "p99": spread([percentile(v, 99) for v in sampled[op]]),
            "samples": sum(len(v) for v in sampled[op]),
        }
        for op in ops
    }
    out = {
        "unit": unit,
        "throughput": spread([w.rate for w in windows]),
        "jobs": [w.jobs for w in windows],
        "seconds": [round(w.seconds, 3) for w in windows],
        "latency_ms": latency,
    }
    # CPU milliseconds per unit of throughput (job, event or call), where
    # every repetition knows it and did some work.
    for side in ("server", "client"):
        used = [getattr(w, f"{side}_cpu_s") for w in windows]
        if windows and None not in used and all(w.jobs for w in windows):
            out[f"{side}_cpu_ms"] = spread(
                [u * 1000 / w.jobs for u, w in zip(used, windows, strict=True)]
            )
    return out


def write(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
