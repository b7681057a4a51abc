# ruff: noqa: RUF002, RUF003  (en dashes in min–max ranges are intended)
"""`make bench`: runrelay against the floor of this machine and against peer queues.

Layout (one module per family, all driven by `bench.run`):

* `_server`  — the durable PostgreSQL the whole run shares, and its databases;
* `_load`    — the worker harness: N processes, one connection each, a timed window;
* `stats`    — medians, min–max, percentiles; the results JSON;
* `floor`    — `SELECT 1` and a minimal SKIP LOCKED job table (the machine's floor);
* `runrelay` — the runrelay client on the same workloads, the ledger, round trips;
* `peers`    — Procrastinate, PgQueuer (separate venv from PyPI) and PgQ (Debian);
* `backlog`  — claim latency as the backlog grows to 1 000 000;
* `report`   — the rich table, docs/benchmarks.md and the PNG plots.

Numbers on a shared 2-core machine are noisy: compare the ratios measured in one
run, not absolute figures across runs.
"""
