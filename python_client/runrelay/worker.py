"""The Worker loop: claim runs, run a handler per run, heartbeat, write the outcome.

    worker = Worker(client, handler, queues=["email"], concurrency=8)
    worker.run()          # until SIGINT/SIGTERM (install_signal_handlers) or stop()

The handler receives a `Job`. What it does decides the write:

* returns a value           -> complete_attempt(result=value)   (None -> {})
* raises Suspend(wait=...)  -> suspend_attempt(wait)
* raises Retry(after=s)     -> fail_attempt(retry_at=now + s)
* raises anything else      -> fail_attempt(error={type, message}); the run
                               retries with backoff until max_attempts.

A heartbeat thread extends every in-flight lease every `heartbeat_every`
seconds; when one answers `cancelled` (or `fence_lost`) the job's `cancelled`
event is set, and a cooperative handler checks `job.cancelled.is_set()` and
returns early — its write will answer `cancelled` and change nothing. With
`batch_size > 1` the worker claims several runs per round trip and completes
the successful ones with one complete_attempts call.

Delivery guarantee: at-least-once execution of handlers (a worker that dies
after its handler's side effect but before the write sees the run retried),
exactly-once state transitions.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from .client import Client
from .types import ClaimedAttempt, HeartbeatOutcome

log = logging.getLogger("runrelay.worker")
# "Retry at once", independent of any clock skew between this host and the server.
RETRY_NOW = datetime(1970, 1, 1, tzinfo=UTC)


class Suspend(Exception):
    """Raise from a handler to suspend the run on a typed wait."""

    def __init__(self, wait: dict[str, Any], final_events: Sequence[Any] = ()) -> None:
        super().__init__(wait.get("kind", "wait"))
        self.wait = wait
        self.final_events = list(final_events)

    @classmethod
    def sleep(cls, seconds: float) -> Suspend:
        until = datetime.now(UTC) + timedelta(seconds=seconds)
        return cls({"kind": "sleep", "until": until.isoformat()})

    @classmethod
    def event(cls, name: str, timeout: float | None = None) -> Suspend:
        wait: dict[str, Any] = {"kind": "event", "name": name}
        if timeout is not None:
            wait["timeout_at"] = (datetime.now(UTC) + timedelta(seconds=timeout)).isoformat()
        return cls(wait)

    @classmethod
    def detached(cls, runner: str, timeout: float | None = None) -> Suspend:
        wait: dict[str, Any] = {"kind": "detached_runner", "runner": runner}
        if timeout is not None:
            wait["timeout_at"] = (datetime.now(UTC) + timedelta(seconds=timeout)).isoformat()
        return cls(wait)


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry after `after` seconds."""

    def __init__(self, message: str = "retry", after: float = 0.0) -> None:
        super().__init__(message)
        self.after = after


@dataclass
class Job:
    """What a handler gets: the claimed attempt and a cancellation flag."""

    attempt: ClaimedAttempt
    cancelled: threading.Event = field(default_factory=threading.Event)
    lost: bool = False

    @property
    def run_id(self) -> str:
        return self.attempt.run_id

    @property
    def payload(self) -> Any:
        return self.attempt.payload

    @property
    def resume(self) -> Any:
        return self.attempt.resume


Handler = Callable[[Job], Any]


def write_for(job: Job, outcome: Any) -> tuple[str, dict[str, Any]]:
    """The one write a handler's outcome calls for: (client method, kwargs).
    `outcome` is what the handler returned, or the exception it raised. Shared
    by Worker and AsyncWorker so both map outcomes identically."""
    fence = job.attempt.fence
    if isinstance(outcome, Suspend):
        return "suspend_attempt", {
            **fence,
            "wait": outcome.wait,
            "final_events": outcome.final_events,
        }
    if isinstance(outcome, Retry):
        retry_at = datetime.now(UTC) + timedelta(seconds=outcome.after)
        error = {"type": "Retry", "message": str(outcome)}
        return "fail_attempt", {**fence, "error": error, "retry_at": retry_at}
    if isinstance(outcome, Exception):
        error = {"type": type(outcome).__name__, "message": str(outcome)[:2000]}
        return "fail_attempt", {**fence, "error": error}
    return "complete_attempt", {**fence, "result": {} if outcome is None else outcome}


def heartbeat_seen(job: Job, outcome: HeartbeatOutcome) -> bool:
    """Apply a heartbeat's answer to the job; True if the job must stop."""
    if outcome is HeartbeatOutcome.OK:
        return False
    job.lost = outcome is HeartbeatOutcome.FENCE_LOST
    job.cancelled.set()
    return True


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs `handler` for claimed runs with `concurrency` threads."""

    def __init__(
        self,
        client: Client,
        handler: Handler,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 4,
        name: str | None = None,
        lease_seconds: int = 30,
        heartbeat_every: float | None = None,
        batch_size: int = 1,
        poll_interval: float = 1.0,
        listen_dsn: str | None = None,
        shutdown_grace: float = 10.0,
    ) -> None:
        self.client = client
        self.handler = handler
        self.queues = list(queues) if queues is not None else None
        self.concurrency = max(1, concurrency)
        self.name = name or _default_name()
        self.lease_seconds = lease_seconds
        self.heartbeat_every = heartbeat_every or max(1.0, lease_seconds / 3)
        self.batch_size = max(1, batch_size)
        self.poll_interval = poll_interval
        self.listen_dsn = listen_dsn
        self.shutdown_grace = shutdown_grace
        self._stop = threading.Event()
        self._beats_done = threading.Event()
        self._inflight: dict[tuple[str, int], Job] = {}
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(self.concurrency)
        self.stats: dict[str, int] = {}

    # -- control -----------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM stop claiming; in-flight work finishes or is released."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop())

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + n

    # -- main loop ---------------------------------------------------------
    def run(self, *, until_idle: float | None = None) -> None:
        """Claim and run work until stop() (or, with until_idle, until nothing
        was claimable for that many seconds)."""
        listener = self._listen()
        beat = threading.Thread(target=self._heartbeats, name=f"{self.name}-hb", daemon=True)
        beat.start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=self.name)
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                free = self._free_slots()
                if free == 0:
                    continue
                claimed = self._claim(min(free, self.batch_size))
                if claimed:
                    idle_since = time.monotonic()
                    self._dispatch(pool, claimed)
                    continue
                idle_for = time.monotonic() - idle_since
                if until_idle is not None and idle_for > until_idle and not self._inflight:
                    break
                self._sleep(listener)
        finally:
            self._shutdown(pool)
            self._stop.set()
            self._beats_done.set()
            beat.join(timeout=5)
            if listener is not None:
                listener.close()

    def _free_slots(self) -> int:
        """Reserve handler slots: wait briefly for one, then take up to
        batch_size without waiting. Returns how many were reserved."""
        if not self._slots.acquire(timeout=0.05):
            return 0
        taken = 1
        while taken < self.batch_size and self._slots.acquire(blocking=False):
            taken += 1
        return taken

    def _release_slots(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    def _claim(self, n: int) -> list[ClaimedAttempt]:
        call_id = uuid.uuid4()
        for attempt in range(5):
            try:
                claimed: list[ClaimedAttempt] = self.client.claim_attempts(
                    self.name,
                    self.queues,
                    max_runs=n,
                    lease_seconds=self.lease_seconds,
                    call_id=call_id,
                )
                self._release_slots(n - len(claimed))
                self._count("claimed", len(claimed))
                return claimed
            except psycopg.OperationalError:
                # Ambiguous: the claim may have committed. Repeat with the same
                # call_id: an exact replay if it did, a fresh claim if not.
                log.warning("claim failed; replaying call %s", call_id, exc_info=True)
                time.sleep(min(2.0, 0.1 * 2**attempt))
        self._release_slots(n)
        return []

    def _sleep(self, listener: psycopg.Connection[Any] | None) -> None:
        timeout = self.poll_interval * (0.5 + random.random())
        if listener is None:
            self._stop.wait(timeout)
            return
        try:
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                pass
        except psycopg.Error:
            self._stop.wait(timeout)

    def _listen(self) -> psycopg.Connection[Any] | None:
        if not self.listen_dsn:
            return None
        try:
            conn = psycopg.connect(self.listen_dsn, autocommit=True)
            conn.execute("LISTEN runrelay_runs")
            return conn
        except psycopg.Error:
            log.warning("LISTEN unavailable; polling", exc_info=True)
            return None

    # -- running handlers --------------------------------------------------
    def _dispatch(self, pool: ThreadPoolExecutor, claimed: list[ClaimedAttempt]) -> None:
        jobs = [Job(a) for a in claimed]
        with self._lock:
            for job in jobs:
                self._inflight[(job.run_id, job.attempt.attempt)] = job
        if self.batch_size > 1 and len(jobs) > 1:
            pool.submit(self._run_batch, jobs)
        else:
            for job in jobs:
                pool.submit(self._run_one, job)

    def _finish(self, job: Job) -> None:
        with self._lock:
            self._inflight.pop((job.run_id, job.attempt.attempt), None)
        self._slots.release()

    def _run_one(self, job: Job) -> None:
        try:
            outcome = self._execute(job)
            if outcome is not None:
                self._write_completion(job, outcome)
        except Exception:
            log.exception("writing the outcome of %s failed", job.run_id)
            self._count("write_errors")
        finally:
            self._finish(job)

    def _run_batch(self, jobs: list[Job]) -> None:
        done: list[tuple[Job, Any]] = []
        try:
            for job in jobs:
                outcome = self._execute(job)
                if outcome is not None:
                    done.append((job, outcome[1]))
            if done:
                results = self.client.complete_attempts([(j.attempt, r) for j, r in done])
                for item in results:
                    self._count(f"complete:{item.outcome}")
        except Exception:
            log.exception("batch completion failed")
            self._count("write_errors")
        finally:
            for job in jobs:
                self._finish(job)

    def _execute(self, job: Job) -> tuple[str, Any] | None:
        """Run the handler and write a suspend or failure here; return
        ("complete", result) for the caller to write (alone or batched)."""
        try:
            outcome: Any = self.handler(job)
        except Exception as exc:
            outcome = exc
        method, kwargs = write_for(job, outcome)
        if method == "complete_attempt":
            return ("complete", kwargs["result"])
        written = getattr(self.client, method)(**kwargs)
        self._count(f"{method.split('_')[0]}:{written}")
        return None

    def _write_completion(self, job: Job, outcome: tuple[str, Any]) -> None:
        result = self.client.complete_attempt(**job.attempt.fence, result=outcome[1])
        self._count(f"complete:{result}")

    # -- heartbeats --------------------------------------------------------
    def _heartbeats(self) -> None:
        # Runs until shutdown is over: in-flight handlers keep their leases
        # during the grace period too.
        while not self._beats_done.wait(self.heartbeat_every):
            with self._lock:
                jobs = list(self._inflight.values())
            for job in jobs:
                if job.cancelled.is_set():
                    continue
                try:
                    beat = self.client.heartbeat(
                        **job.attempt.fence, lease_seconds=self.lease_seconds
                    )
                except Exception:
                    log.warning("heartbeat for %s failed", job.run_id, exc_info=True)
                    continue
                if heartbeat_seen(job, beat.outcome):
                    self._count(f"heartbeat:{beat.outcome}")

    def _shutdown(self, pool: ThreadPoolExecutor) -> None:
        """Let in-flight handlers finish within the grace period; release the
        rest so another worker retries them at once."""
        deadline = time.monotonic() + self.shutdown_grace
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            leftovers = list(self._inflight.values())
        for job in leftovers:
            job.cancelled.set()
            try:
                self.client.fail_attempt(
                    **job.attempt.fence,
                    error={"type": "WorkerShutdown", "message": f"{self.name} stopped"},
                    retry_at=RETRY_NOW,
                )
                self._count("released_on_shutdown")
            except Exception:
                log.warning("could not release %s", job.run_id, exc_info=True)
        pool.shutdown(wait=False, cancel_futures=True)


def run_in_thread(worker: Worker, **kwargs: Any) -> tuple[threading.Thread, Future[None]]:
    """Start `worker.run(**kwargs)` in a thread; the future carries its exception."""
    future: Future[None] = Future()

    def target() -> None:
        try:
            worker.run(**kwargs)
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)

    thread = threading.Thread(target=target, name=f"worker-{worker.name}", daemon=True)
    thread.start()
    return thread, future


class AsyncWorker:
    """The asyncio Worker: `concurrency` tasks on an AsyncClient; the handler
    is a coroutine function taking a Job. Same outcome mapping, heartbeats and
    cancellation as Worker."""

    def __init__(
        self,
        client: Any,
        handler: Callable[[Job], Any],
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 4,
        name: str | None = None,
        lease_seconds: int = 30,
        heartbeat_every: float | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        import asyncio

        self.client = client
        self.handler = handler
        self.queues = list(queues) if queues is not None else None
        self.concurrency = max(1, concurrency)
        self.name = name or _default_name()
        self.lease_seconds = lease_seconds
        self.heartbeat_every = heartbeat_every or max(1.0, lease_seconds / 3)
        self.poll_interval = poll_interval
        self._stop = asyncio.Event()
        self._inflight: dict[tuple[str, int], Job] = {}
        self.stats: dict[str, int] = {}

    def stop(self) -> None:
        self._stop.set()

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    async def run(self, *, until_idle: float | None = None) -> None:
        import asyncio

        tasks: set[asyncio.Task[None]] = set()
        beat = asyncio.create_task(self._heartbeats())
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                free = self.concurrency - len(tasks)
                if free <= 0:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                claimed = await self.client.claim_attempts(
                    self.name,
                    self.queues,
                    max_runs=free,
                    lease_seconds=self.lease_seconds,
                    call_id=uuid.uuid4(),
                )
                for attempt in claimed:
                    job = Job(attempt)
                    self._inflight[(job.run_id, attempt.attempt)] = job
                    task = asyncio.create_task(self._run_one(job))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if claimed:
                    idle_since = time.monotonic()
                    continue
                idle_for = time.monotonic() - idle_since
                if until_idle is not None and idle_for > until_idle and not tasks:
                    break
                try:
                    delay = self.poll_interval * (0.5 + random.random())
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
            if tasks:
                await asyncio.wait(tasks)
        finally:
            self._stop.set()
            beat.cancel()

    async def _run_one(self, job: Job) -> None:
        try:
            try:
                outcome: Any = await self.handler(job)
            except Exception as exc:
                outcome = exc
            method, kwargs = write_for(job, outcome)
            written = await getattr(self.client, method)(**kwargs)
            self._count(f"{method.split('_')[0]}:{written}")
        except Exception:
            log.exception("writing the outcome of %s failed", job.run_id)
            self._count("write_errors")
        finally:
            self._inflight.pop((job.run_id, job.attempt.attempt), None)

    async def _heartbeats(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(self.heartbeat_every)
            for job in list(self._inflight.values()):
                if job.cancelled.is_set():
                    continue
                try:
                    beat = await self.client.heartbeat(
                        **job.attempt.fence, lease_seconds=self.lease_seconds
                    )
                except Exception:
                    log.warning("heartbeat for %s failed", job.run_id, exc_info=True)
                    continue
                if heartbeat_seen(job, beat.outcome):
                    self._count(f"heartbeat:{beat.outcome}")
