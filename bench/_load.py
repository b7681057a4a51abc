"""The worker harness: N processes, one autocommit connection each, a timed window.

A workload is a *factory*: given a worker's connection and its index it
returns a *step*, one iteration of that worker's loop. A step records the
latency of each operation it issues in a `Recorder` and returns how many jobs
(or events, or calls) it finished, or None when there is nothing left to do.

Processes, not threads: the client-side Python of eight workers would
otherwise serialise on the GIL and the benchmark would measure that. The
machine has 2 cores, so with 4 or 8 workers the clients and the server
backends compete for the same CPUs — as they would on a small production box
running workers beside its database; the doc says so.

Each worker connects, runs `warmup` steps (so psycopg has prepared its
statements and PL/pgSQL has cached its plans), then waits at a barrier; the
window starts for all at once and lasts `seconds`, or until a worker finds
nothing left. Throughput is total jobs / (last stop - first start).

Each worker also reads the CPU time its own server backend and its own
process used across the window (/proc/<pid>/schedstat for the backend, the
process clock for the client), so every case reports the server's and the
client's CPU per job beside its throughput. The backend's CPU covers what
the session does, its commits' WAL flushes included, not the server's
background processes; it is None when the server is not a process of this
machine (`--dsn` naming another host).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg


class Recorder:
    """Per-operation latencies of one worker, in nanoseconds."""

    def __init__(self) -> None:
        self.samples: dict[str, list[int]] = {}

    def add(self, op: str, nanoseconds: int) -> None:
        self.samples.setdefault(op, []).append(nanoseconds)

    def timed(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        self.add(op, time.perf_counter_ns() - started)
        return out


Step = Callable[[Recorder], "int | None"]
Factory = Callable[[psycopg.Connection[Any], int], Step]


@dataclass
class Window:
    """One repetition: what all workers did together, and the CPU seconds
    their server backends and their own processes used (None: unknown)."""

    jobs: int
    seconds: float
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


class WorkerError(RuntimeError):
    """A worker process failed; the message carries its traceback."""


def backend_cpu_ns(conn: psycopg.Connection[Any]) -> int | None:
    """The CPU time the server process behind `conn` has used, in
    nanoseconds; None when that process is not one of this machine's
    PostgreSQL processes (a server elsewhere, or in another pid namespace)."""
    pid = conn.info.backend_pid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if not fh.read().startswith(b"postgres"):
                return None
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _used(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def warm_up(step: Step, steps: int) -> None:
    """Runs `steps` unrecorded steps, so statements are prepared and plans
    cached before anything is measured."""
    scratch = Recorder()
    for _ in range(steps):
        step(scratch)


def timed_steps(
    step: Step, seconds: float = math.inf, steps: int | None = None
) -> tuple[int, float, float, Recorder]:
    """Steps until `seconds` have passed, `steps` were taken or a step finds
    nothing left: the jobs done, the window's start and stop (perf_counter)
    and the latencies."""
    rec = Recorder()
    jobs = 0
    started = time.perf_counter()
    deadline = started + seconds
    for _ in itertools.repeat(None) if steps is None else range(steps):
        done = step(rec)
        if done is None:
            break
        jobs += done
        if time.perf_counter() >= deadline:
            break
    return jobs, started, time.perf_counter(), rec


def metered_steps(
    conn: psycopg.Connection[Any], step: Step, seconds: float = math.inf, steps: int | None = None
) -> tuple[int, float, float, Recorder, int | None, int]:
    """timed_steps on `conn`, with the CPU used across them: by the server
    process behind `conn` (None when it cannot be read, see backend_cpu_ns)
    and by this process, in nanoseconds."""
    server, client = backend_cpu_ns(conn), time.process_time_ns()
    jobs, started, stopped, rec = timed_steps(step, seconds, steps)
    server = _used(server, backend_cpu_ns(conn))
    return jobs, started, stopped, rec, server, time.process_time_ns() - client


def _worker(
    url: str,
    factory: Factory,
    index: int,
    seconds: float,
    warmup: int,
    barrier: Any,
    out: Any,
) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            step = factory(conn, index)
            warm_up(step, warmup)
            barrier.wait(timeout=120)
            jobs, started, stopped, rec, server, client = metered_steps(conn, step, seconds)
        out.put((index, jobs, started, stopped, rec.samples, None, server, client))
    except BaseException:
        with contextlib.suppress(Exception):
            barrier.abort()
        out.put((index, 0, 0.0, 0.0, {}, traceback.format_exc(), None, None))


def run_window(url: str, factory: Factory, workers: int, seconds: float, warmup: int = 8) -> Window:
    """Run `workers` processes of `factory` for one window and gather the result."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, factory, i, seconds, warmup, barrier, out))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [r[5] for r in results if r[5]]
    if errors:
        raise WorkerError(errors[0])
    started = min(r[2] for r in results)
    stopped = max(r[3] for r in results)
    latencies: dict[str, list[float]] = {}
    for r in results:
        for op, samples in r[4].items():
            latencies.setdefault(op, []).extend(s / 1e6 for s in samples)
    servers = [r[6] for r in results]
    return Window(
        jobs=sum(r[1] for r in results),
        seconds=stopped - started,
        latencies_ms=latencies,
        server_cpu_s=None if None in servers else sum(servers) / 1e9,
        client_cpu_s=sum(r[7] for r in results) / 1e9,
    )


def run_serial(url: str, factory: Factory, samples: int, warmup: int = 8) -> Window:
    """`samples` steps on one connection in this process (latency probes)."""
    with psycopg.connect(url, autocommit=True) as conn:
        step = factory(conn, 0)
        warm_up(step, warmup)
        jobs, started, stopped, rec, server, client = metered_steps(conn, step, steps=samples)
    latencies = {op: [s / 1e6 for s in v] for op, v in rec.samples.items()}
    return Window(
        jobs=jobs,
        seconds=stopped - started,
        latencies_ms=latencies,
        server_cpu_s=None if server is None else server / 1e9,
        client_cpu_s=client / 1e9,
    )


@dataclass
class Case:
    """One measured configuration of one system, repeated by `bench.run`.

    `prepare` runs in the parent before every repetition (reload the backlog,
    ANALYZE), so each window starts from the same state; `bench.run` then
    takes a CHECKPOINT, so no window inherits the previous one's dirty pages
    or pays for a checkpoint that its predecessor's writes triggered."""

    key: str
    system: str
    workload: str
    workers: int
    url: str
    prepare: Callable[[], None]
    factory: Factory
    unit: str = "jobs/s"
    optional: bool = False  # a peer: a failure is reported, not fatal
