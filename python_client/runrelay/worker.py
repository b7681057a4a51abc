"""The Worker loops: claim runs, run a handler per run, heartbeat, write the outcome.

    worker = Worker(client, handler, queues=["email"], concurrency=8)
    worker.install_signal_handlers()
    worker.run()          # until SIGINT/SIGTERM or stop()

The handler receives a `Job`. What it does decides the write:

* returns a value             -> complete_attempt(result=value)   (None -> {})
* raises Suspend(wait=...)    -> suspend_attempt(wait)
* raises Suspend(wait=..., on_waiting=step)
                              -> suspend_attempt(wait); once the run waits,
                                 step() runs; if it raises, the waiting run is
                                 failed with fail_waiting unless its wait
                                 ended first (see Suspend)
* raises Retry(after=s)       -> fail_attempt(retry_at=now + s)
* raises Snooze(after=s)      -> the run is handed back to run again in s
                                 seconds (see release_write)
* raises anything else        -> fail_attempt(error={type, message, traceback});
                                 the run retries with backoff until max_attempts.

The handler is a function of a Job, or a `runrelay.Tasks` registry
(runrelay.tasks): `Worker(client, tasks)` claims only runs of its tasks, on
its tasks' queues (unless `queues` says otherwise), and calls each run's
task as `fn(job, **payload)`. A worker given one plain handler claims every
run of `queues` (every queue when None).

A heartbeat thread extends every in-flight lease every `heartbeat_every`
seconds; when one answers `cancelled` (or `fence_lost`) the job's `cancelled`
event is set, and a cooperative handler checks `job.cancelled.is_set()` and
returns early — its write will answer `cancelled` and change nothing. With
`batch_size > 1` the worker claims several runs per round trip and completes
the successful ones with one complete_attempts call.

Cancellation: cancel_run on a run a handler is running notifies the worker
that holds it (channel <schema>_cancel, JSON {run_id, attempt, worker}) when
the worker has `listen_dsn`: the job's `cancelled` event is set at once (for
a sync handler to notice), and an async handler's task is cancelled (its
attempt's write then answers `cancelled`). Without `listen_dsn`, or if the
notification is lost, the next heartbeat brings the same news.

Timeouts: a task's `timeout`, else the worker's `timeout` (seconds; None:
none), bounds each attempt of a handler. An async handler is cancelled at
the deadline and its attempt fails with the error {"type": "timeout", ...};
the run retries by its policy. A thread cannot be stopped: at a sync
handler's deadline (within half a second of it) the worker fails the
attempt with the same error and sets `job.cancelled`; the thread runs on
until the handler returns, keeping its slot, and whatever it returns is
written with the attempt's old fence, which answers fence_lost and changes
nothing. A handler that never returns holds its slot (and its thread) for
the life of the process: make long handlers check `job.cancelled`.

Round trips (fused=True, the default): a job's write and the claim of the
run that takes its slot are one settle_and_claim call — one round trip and
one commit per job (per batch with batch_size > 1) while there is work; the
thread or task that ran the job runs what the call claimed. claim_attempts
is only the loop's own: it fills free slots at the start and polls (or waits
for a NOTIFY) once a call claimed nothing. Handlers that finish together
share a call: at most SETTLE_CALLS calls are in flight, and outcomes that
finish meanwhile go out together in the next (see _shared_settle_steps).
Jobs claimed together are settled together: a call waits, at most
GATHER_SECONDS, for the handlers of runs claimed less than that ago that
are still running, so short jobs that started at once share one commit
(see Gather); a handler that runs longer is not waited for.
A stopping worker settles with max_runs 0; runs a call claimed as the
worker stopped are handed back at once. A Suspend with on_waiting is
written on its own (see fusable). With fused=False every write and every
claim is its own call, as above.

Maintenance (on by default): each worker also calls reap_expired every
lease_seconds/2 (at least 1 s, at most 30 s; override with
`maintenance_interval`), jittered ±50%, so the runs of a peer that was
SIGKILLed go back to the queue about half a lease after its lease expired,
with no other process running. The same rounds enqueue the due slots of
the declared schedules (enqueue_due_schedules), waking early for the next
slot; each slot is enqueued once however many workers run. They also
finalize the minutes of queue activity the overview reads
(record_queue_activity), each minute once however many workers run.
`maintenance=False` turns it off (then run `runrelay maintain` somewhere).

Shutdown: the first SIGINT/SIGTERM (install_signal_handlers) or stop() ends
claiming; in-flight handlers get `shutdown_grace` seconds to finish, then the
rest are handed back (release_write) and their `cancelled` events set. A
second signal ends the grace period at once. One log line for each.

Logging: one line per finished job on logger ``runrelay.worker`` — message
"run finished" with run_id, attempt, queue, outcome (what the write answered)
and duration_ms as extras; WARNING with the traceback when the handler raised
an unexpected exception, INFO otherwise.

Database outages: claims and settle_and_claim calls are replayed with the
same call_id (and the same items) after a connection error (an exact replay
if the lost call committed), writes are repeated (fenced writes are
replay-safe), the LISTEN connection reconnects —
all with full-jitter backoff (runrelay._backoff); the loop never exits or
busy-loops because the database is away.

Wake-ups: with `listen_dsn` the loop LISTENs on <schema>_runs and claims as
soon as a NOTIFY says a run is ready, polling every poll_interval otherwise.
It is one DSN, a sequence of DSNs, or a callable returning the current ones
(read again every 30 s): on a sharded install a NOTIFY is sent on the shard
that holds the run and the proxy relays none, so pass
`runrelay.sharding.shard_listen_dsns(proxy_dsn)` — one LISTEN session per
shard, each reconnecting on its own (runrelay._listen.MultiListener).

Time: every deadline a handler gives in seconds — Suspend.sleep, the
timeout of Suspend.event / Suspend.detached, Retry(after=), Snooze(after=) —
counts from the database clock, not this host's: the worker reads that clock
off the leases the server grants (Job.db_now), so a host whose clock is off
neither ends waits early nor holds them late.

Tracing: on a tracing client (`Client(..., tracing=...)`, runrelay.tracing)
each handler attempt runs in a span "runrelay run <queue>" whose parent is
the trace context the run was enqueued with (read in the claim's statement),
current while the handler runs and ended once the outcome is written, with
the write's answer as runrelay.outcome and the handler's exception recorded.

Metrics: given a prometheus_client registry (`metrics=registry`), a worker
also counts runs claimed, the outcomes written, handler time, heartbeats and
replayed calls as runrelay_worker_* metrics (runrelay.metrics; the
`runrelay[metrics]` extra). Without one nothing of prometheus_client is
imported. `stats` counts the same events either way.

Delivery guarantee: at-least-once execution of handlers (a worker that dies
after its handler's side effect but before the write sees the run retried),
exactly-once state transitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._backoff import CONNECTION_ERRORS, Backoff, first_line, jittered, wait_event
from ._listen import (
    AsyncListener,
    AsyncMultiListener,
    ListenDsn,
    Listener,
    MultiListener,
    check_listen_dsn,
    make_async_listener,
    make_listener,
)
from ._steps import Call, Pause, Steps, drive, drive_async
from .contract import LEASE_SECONDS_DEFAULT, MESSAGE_CHARS, REASON_CHARS, channel
from .durable import DurableSteps
from .maintenance import AsyncMaintenance, Maintenance
from .tasks import Tasks
from .types import (
    ClaimedAttempt,
    CompletedItem,
    HeartbeatOutcome,
    HeartbeatResult,
    SettleAndClaimRow,
    SuspendOutcome,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .metrics import WorkerMetrics
    from .tracing import RunSpan, Tracing

log = logging.getLogger("runrelay.worker")
# A handler's traceback is stored in the attempt's error; the end of it (the
# frames nearest the raise) is what matters, and a row should stay small.
TRACEBACK_CHARS = 8000
# A settle_and_claim call is replayed after connection errors until it
# resolves; once the worker stops, at most this many times, and shutdown
# waits at most SETTLE_WAIT seconds for calls in flight.
SETTLE_TRIES = 6
SETTLE_WAIT = 20.0
# Shared settlements: at most this many settle_and_claim calls of one worker
# in flight at once. The outcomes of jobs that finish while they are all busy
# queue and go out together in the next call (group commit), at most
# SETTLE_BATCH items a call. Two, not one: a call that waits (for a run's lock,
# up to the lock bound) then holds back only the outcomes queued behind it in
# its turn, while the other keeps the rest moving.
SETTLE_CALLS = 2
SETTLE_BATCH = 100
# Gathering: before a shared call goes out, it waits at most this long for
# the handlers of runs claimed less than this long ago that still run. The
# runs one call claimed start at once; when their handlers are short, the
# first to finish would otherwise make a call of its own and the rest would
# queue behind it, so a worker's calls alternated between one outcome and
# the rest. Waiting for them puts all in one call (one commit, one claim of
# as many runs): with no-op handlers and concurrency 10, ten outcomes a call
# instead of six. A handler that runs longer than this is not waited for,
# so it delays no one's outcome by more. Two of the interpreter's thread
# switch intervals (5 ms each): on a busy host a sibling thread may wait
# one interval for its turn to return. With 2 ms, four worker processes on
# two cores often sent a call before the siblings got theirs, and did 0.8x
# the jobs per second of 10 ms.
GATHER_SECONDS = 0.010


class Suspend(Exception):
    """Raise from a handler to suspend the run on a typed wait.

    `on_waiting`, if given, is the handler's last step: a callable (a
    coroutine function on AsyncWorker) the worker runs once suspend_attempt
    answered `waiting` — work that must start only after the wait is
    recorded, e.g. asking a human for the approval the run waits for. This is
    the one place a worker decides a *waiting* run's failure: if the step
    raises, the worker fails the run with `Client.fail_waiting` (the
    waiting-failure protocol: prepare_waiting_failure, then a protected
    fail_attempt), so a signal or timeout that ended the wait first still
    wins — the failure answers `fence_lost` and the run resumes — while a
    failure that applied first is final: a late signal finds the run failed
    (or queued for retry, the signal stored). The step is not run when the
    suspension answered anything else (`resumed`: the awaited signal was
    already there). It runs at most once: the run is durably waiting while it
    runs, the worker neither heartbeats nor hands back a waiting run, and if
    the worker dies during the step the run simply keeps waiting. A detached
    runner's wait cannot be failed this way (fail_waiting answers
    `fence_lost`): its outcome is the runner's to push.

    `wait` is written as given: an `until` / `timeout_at` in it is an absolute
    time the server compares with its own clock. The `sleep`, `event` and
    `detached` constructors take seconds instead and leave that key out of
    `wait`; the worker adds it when it writes the suspension, counting from
    the database clock (see `Job.db_now`)."""

    def __init__(
        self,
        wait: dict[str, Any],
        final_events: Sequence[Any] = (),
        on_waiting: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(wait.get("kind", "wait"))
        self.wait = wait
        self.final_events = list(final_events)
        self.on_waiting = on_waiting
        # (key, seconds): the wait's deadline, `seconds` from the database
        # clock when the suspension is written (see wait_from).
        self._deadline: tuple[str, float] | None = None

    def _due(self, key: str, seconds: float | None) -> Suspend:
        if seconds is not None:
            self._deadline = (key, seconds)
        return self

    @classmethod
    def sleep(cls, seconds: float, on_waiting: Callable[[], Any] | None = None) -> Suspend:
        """Sleep `seconds` by the database clock."""
        return cls({"kind": "sleep"}, on_waiting=on_waiting)._due("until", seconds)

    @classmethod
    def event(
        cls, name: str, timeout: float | None = None, on_waiting: Callable[[], Any] | None = None
    ) -> Suspend:
        """Wait for signal `name`, at most `timeout` seconds by the database clock."""
        wait = {"kind": "event", "name": name}
        return cls(wait, on_waiting=on_waiting)._due("timeout_at", timeout)

    @classmethod
    def detached(
        cls, runner: str, timeout: float | None = None, on_waiting: Callable[[], Any] | None = None
    ) -> Suspend:
        """Wait for detached runner `runner`, at most `timeout` seconds by the
        database clock."""
        wait = {"kind": "detached_runner", "runner": runner}
        return cls(wait, on_waiting=on_waiting)._due("timeout_at", timeout)

    def wait_from(self, now: datetime) -> dict[str, Any]:
        """The wait to write when the database clock reads `now`."""
        if self._deadline is None:
            return self.wait
        key, seconds = self._deadline
        return {**self.wait, key: (now + timedelta(seconds=seconds)).isoformat()}


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry after `after` seconds."""

    def __init__(self, message: str = "retry", after: float = 0.0) -> None:
        super().__init__(message)
        self.after = after


class Snooze(Exception):
    """Raise from a handler to hand the run back, to run again in `after`
    seconds (a rate limit, a resource not ready yet). Goes through
    release_write, like a shutdown's hand-back."""

    def __init__(self, after: float, reason: str | None = None) -> None:
        if not after >= 0:
            raise ValueError(f"Snooze(after=...) must be a number of seconds >= 0, got {after!r}")
        super().__init__(reason or f"snoozed for {after}s")
        self.after = after
        self.reason = reason


class HandlerTimeout(Exception):
    """A handler's outcome when it ran past its timeout: the attempt fails
    with a `timeout` error and retries by the run's policy."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the handler ran past its timeout of {seconds:g}s")
        self.seconds = seconds


class RunCancelled(Exception):
    """An async handler's outcome when its run was cancelled while it ran
    (the worker cancelled the handler's task); the write answers cancelled."""


@dataclass
class Job(DurableSteps):
    """What a handler gets: the claimed attempt, a cancellation flag, and
    durable steps (job.step, job.sleep, job.wait_for_event: runrelay.durable)."""

    attempt: ClaimedAttempt
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    # Set once the run waits while the handler's on_waiting step runs: there
    # is no lease to heartbeat and nothing to hand back.
    suspended: bool = False
    # The best reading of the database clock so far: (what it read, this
    # host's monotonic time when the reading arrived). See db_now.
    clock: tuple[datetime, float] | None = None
    # The attempt's span, from its handler's start until its outcome is
    # written, when the worker's client traces (runrelay.tracing).
    span: RunSpan | None = field(default=None, repr=False, compare=False)
    # A sync handler's deadline (this host's monotonic clock), and whether
    # the worker failed the attempt at it: the handler runs on, its write
    # is fenced off.
    deadline: float | None = None
    timed_out: bool = False
    # Cancels an async handler's task (set while it runs).
    interrupt: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    # The worker's client, for job.step's record_step; is_async: an
    # AsyncClient (job.step and the waits are then awaited).
    client: Any = field(default=None, repr=False, compare=False)
    is_async: bool = False
    # The run's steps (from the claim, then recorded), the step names this
    # attempt used, and whether a wait took the wake's resume.
    _steps: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _names: set[str] = field(default_factory=set, repr=False, compare=False)
    _resume_taken: bool = False

    def _suspend_sleep(self, seconds: float) -> Exception:
        return Suspend.sleep(seconds)

    def _suspend_event(self, event: str, timeout: float | None) -> Exception:
        return Suspend.event(event, timeout=timeout)

    def _lost(self, outcome: Any) -> None:
        self.cancelled.set()

    def saw_lease(self, expires_at: datetime, lease_seconds: int, at: float) -> None:
        """Take a reading of the database clock from a lease the server just
        granted: it expires `lease_seconds` (as the server clamps them) after
        the server's clock read. The reply took time to arrive, so a reading
        is only ever behind; the one that puts the clock furthest ahead wins."""
        read = expires_at - timedelta(seconds=server_lease_seconds(lease_seconds))
        if self.clock is None or read - self.clock[0] > timedelta(seconds=at - self.clock[1]):
            self.clock = (read, at)

    def db_now(self) -> datetime:
        """The database clock now, without asking it: the best reading (the
        claim's, then each heartbeat's) advanced by this host's monotonic
        clock. It is behind by at most the time that reading's reply took —
        milliseconds; after a claim replayed across an outage, until the next
        heartbeat, by up to the outage. A Job with no reading (not built by a
        worker) uses this host's clock."""
        if self.clock is None:
            return datetime.now(UTC)
        read, at = self.clock
        return read + timedelta(seconds=time.monotonic() - at)

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


def claimed_job(attempt: ClaimedAttempt, lease_seconds: int) -> Job:
    """The Job for an attempt just claimed for `lease_seconds`, its database
    clock read off the lease."""
    job = Job(attempt)
    job.saw_lease(attempt.lease_expires_at, lease_seconds, job.started)
    return job


def server_lease_seconds(lease_seconds: int) -> int:
    """The lease the server grants for `lease_seconds`: clamped to 5..300
    (docs/configuration.md)."""
    return min(300, max(5, lease_seconds))


def error_of(exc: BaseException) -> dict[str, str]:
    """The attempt error for a handler's exception: type, message and the
    end of its traceback."""
    text = "".join(traceback.format_exception(exc))
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:MESSAGE_CHARS],
        "traceback": text[-TRACEBACK_CHARS:],
    }


def release_write(
    job: Job, run_at: datetime | None, reason: str | None, kind: str = "WorkerShutdown"
) -> tuple[str, dict[str, Any]]:
    """The one write that hands a run back: (client method, kwargs). Used by
    both workers' shutdown (kind "WorkerShutdown") and by Snooze (kind
    "Snooze"); `run_at` None means at once.

    It is release_attempt: the run is queued again (at run_at, or at once by
    the server's clock) and the attempt does not count against max_attempts;
    the reason is recorded in the run.retry_scheduled event."""
    text = kind if not reason or reason == kind else f"{kind}: {reason}"
    return "release_attempt", {**job.attempt.fence, "run_at": run_at, "reason": text[:REASON_CHARS]}


def timeout_error(seconds: float) -> dict[str, Any]:
    """The attempt error of a handler that ran past its timeout."""
    return {
        "type": "timeout",
        "message": f"the handler ran past its timeout of {seconds:g}s",
        "timeout_seconds": seconds,
    }


def write_for(job: Job, outcome: Any) -> tuple[str, dict[str, Any]]:
    """The one write a handler's outcome calls for: (client method, kwargs).
    `outcome` is what the handler returned, or the exception it raised. Shared
    by Worker and AsyncWorker so both map outcomes identically."""
    fence = job.attempt.fence
    if isinstance(outcome, HandlerTimeout):
        return "fail_attempt", {**fence, "error": timeout_error(outcome.seconds)}
    if isinstance(outcome, RunCancelled):
        error = {"type": "cancelled", "message": "the run was cancelled while its handler ran"}
        return "fail_attempt", {**fence, "error": error}
    if isinstance(outcome, Suspend):
        return "suspend_attempt", {
            **fence,
            "wait": outcome.wait_from(job.db_now()),
            "final_events": outcome.final_events,
        }
    if isinstance(outcome, Retry):
        retry_at = job.db_now() + timedelta(seconds=outcome.after)
        error = {"type": "Retry", "message": str(outcome)}
        return "fail_attempt", {**fence, "error": error, "retry_at": retry_at}
    if isinstance(outcome, Snooze):
        run_at = job.db_now() + timedelta(seconds=outcome.after)
        return release_write(job, run_at, str(outcome), "Snooze")
    if isinstance(outcome, Exception):
        return "fail_attempt", {**fence, "error": error_of(outcome)}
    return "complete_attempt", {**fence, "result": {} if outcome is None else outcome}


# The settle_and_claim item op of each write write_for and release_write name.
SETTLE_OPS = {
    "complete_attempt": "complete",
    "fail_attempt": "fail",
    "suspend_attempt": "suspend",
    "release_attempt": "release",
}


def settle_item(method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settle_and_claim item for one write of write_for or release_write:
    the same fence and arguments, as JSON (an absent key is the SQL default)."""
    item: dict[str, Any] = {"op": SETTLE_OPS[method]}
    for key, value in kwargs.items():
        if value is None or (key == "final_events" and not value):
            continue
        if isinstance(value, uuid.UUID):
            value = str(value)
        elif isinstance(value, datetime):
            value = value.isoformat()
        item[key] = value
    return item


def fusable(outcome: Any) -> bool:
    """Whether the write of a handler's outcome goes into the fused
    settle_and_claim call: every outcome but a Suspend with an on_waiting
    step. That step must run once suspend_attempt answered `waiting`, and
    if it raises, the run is failed through the waiting-failure protocol
    (two calls, the second a *protected* fail_attempt that settle_and_claim's
    `fail` item is not) - so the suspension is written on its own, the step
    runs, and the slot is given back to the claim loop afterwards."""
    return not (isinstance(outcome, Suspend) and outcome.on_waiting is not None)


def settled_and_claimed(
    reply: Sequence[SettleAndClaimRow],
) -> tuple[dict[tuple[str, int], str], list[ClaimedAttempt]]:
    """A settle_and_claim reply as (each settled item's outcome by (run_id,
    attempt), the attempts claimed)."""
    settled: dict[tuple[str, int], str] = {}
    claimed: list[ClaimedAttempt] = []
    for row in reply:
        claim = row.claim
        if claim is not None:
            claimed.append(claim)
        else:
            settled[(row.run_id, row.attempt)] = str(row.outcome)
    return settled, claimed


def waits_for_step(outcome: Any, written: Any) -> Suspend | None:
    """The Suspend whose on_waiting step must run now: the handler asked for
    one and suspend_attempt answered waiting."""
    if (
        isinstance(outcome, Suspend)
        and outcome.on_waiting is not None
        and written == SuspendOutcome.WAITING
    ):
        return outcome
    return None


def waiting_failure_write(job: Job, exc: BaseException) -> tuple[str, dict[str, Any]]:
    """The write for an on_waiting step that raised: fail the waiting run
    through the waiting-failure protocol (Client.fail_waiting), which a signal
    or timeout that ended the wait first still wins."""
    return "fail_waiting", {**job.attempt.fence, "error": error_of(exc)}


def unexpected(outcome: Any) -> BaseException | None:
    """The handler's exception when it is a failure (not one of the control
    exceptions Suspend, Retry, Snooze), else None."""
    if isinstance(outcome, Exception) and not isinstance(
        outcome, Suspend | Retry | Snooze | RunCancelled
    ):
        return outcome
    return None


def log_finished(job: Job, written: Any, failure: BaseException | None = None) -> None:
    """The per-job log line: INFO, or WARNING with the traceback when the
    handler raised."""
    extra = {
        "run_id": job.run_id,
        "attempt": job.attempt.attempt,
        "queue": job.attempt.queue,
        "outcome": str(written),
        "duration_ms": round((time.monotonic() - job.started) * 1000),
    }
    if failure is not None:
        log.warning("run finished", exc_info=failure, extra=extra)
    else:
        log.info("run finished", extra=extra)
    if job.span is not None:
        job.span.end(written, failure)


def left(jobs: Sequence[Job]) -> None:
    """Jobs leave the worker: the span of one whose outcome no write
    answered (the write failed; log_finished ended every other) ends as an
    error."""
    for job in jobs:
        if job.span is not None:
            job.span.end(None)


def heartbeat_seen(job: Job, beat: HeartbeatResult, lease_seconds: int) -> bool:
    """Apply a heartbeat's answer to the job; True if the job must stop."""
    if beat.outcome is HeartbeatOutcome.OK:
        if beat.lease_expires_at is not None:
            job.saw_lease(beat.lease_expires_at, lease_seconds, time.monotonic())
        return False
    job.cancelled.set()
    return True


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def default_maintenance_interval(lease_seconds: int) -> float:
    """A worker's default reap interval: half a lease, between 1 s and 30 s
    (jittered ±50% by the Maintenance loop)."""
    return min(30.0, max(1.0, lease_seconds / 2))


class _Signals:
    """The two-step signal protocol both workers share: the first signal
    stops claiming, the second ends the grace period."""

    name: str
    shutdown_grace: float

    def __init__(self) -> None:
        self._signals = 0

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "%s: no new claims; in-flight runs get %.1fs to finish "
                "(signal again to hand them back now)",
                sig.name,
                self.shutdown_grace,
            )
            self.stop()
        else:
            log.warning("%s again: handing in-flight runs back now", sig.name)
            self._abort_grace()

    def stop(self) -> None:
        raise NotImplementedError

    def _abort_grace(self) -> None:
        raise NotImplementedError


def worker_metrics(registry: CollectorRegistry | None) -> WorkerMetrics | None:
    """The metrics a worker given `registry` records into; None (and no
    import of prometheus_client) without one."""
    if registry is None:
        return None
    from .metrics import WorkerMetrics

    return WorkerMetrics.of(registry)


class _Recorder:
    """What both workers record, in one place so that `stats` and the
    metrics cannot disagree: `stats` always, the metrics when a registry
    was given. Each worker supplies _count (the sync one under its lock)."""

    _metrics: WorkerMetrics | None
    _tracing: Tracing | None
    name: str

    def _count(self, key: str, n: int = 1) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _handler_span(self, job: Job) -> Iterator[None]:
        """Run the handler inside its attempt's span (a tracing client's
        worker only): log_finished ends it once the outcome is written."""
        if self._tracing is None:
            yield
            return
        job.span = self._tracing.run(job.attempt, self.name)
        with job.span.current():
            yield

    def _claimed(self, claimed: Sequence[ClaimedAttempt]) -> None:
        self._count("claimed", len(claimed))
        if self._metrics is not None:
            for attempt in claimed:
                self._metrics.claimed.labels(attempt.queue).inc()

    def _wrote(self, queue: str | None, write: str, outcome: Any) -> None:
        """A write answered `outcome`; `write` names it as stats do
        (complete, fail, suspend, release, fail_waiting)."""
        self._count(f"{write}:{outcome}")
        self._observe(queue, write, outcome)

    def _observe(self, queue: str | None, write: str, outcome: Any) -> None:
        if self._metrics is not None and queue is not None:
            self._metrics.outcomes.labels(queue, write, str(outcome)).inc()

    def _handed_back(self, job: Job, outcome: Any) -> None:
        """A stopping worker released `job`'s run (release_attempt answered
        `outcome`)."""
        self._count("released_on_shutdown")
        self._observe(job.attempt.queue, "hand_back", outcome)

    def _handled(self, job: Job, started: float) -> None:
        """The handler of `job`, called at perf_counter `started`, is done."""
        if self._metrics is not None:
            seconds = time.perf_counter() - started
            self._metrics.handler_seconds.labels(job.attempt.queue).observe(seconds)

    def _beat(self, outcome: HeartbeatOutcome | None) -> None:
        """A heartbeat answered `outcome` (None: the call failed)."""
        if self._metrics is not None:
            self._metrics.heartbeats.labels("error" if outcome is None else str(outcome)).inc()

    def _retried(self, call: str) -> None:
        """A `call` (claim or settle) met a connection error; it is replayed
        unless the worker is stopping."""
        self._count(f"{call}_errors")
        if self._metrics is not None:
            self._metrics.call_retries.labels(call).inc()

    def _write_failed(self) -> None:
        """An outcome write failed for good (it was logged)."""
        self._count("write_errors")
        if self._metrics is not None:
            self._metrics.write_errors.inc()


# -- the steps a worker's body yields, besides Call and Pause -------------------
@dataclass(frozen=True, slots=True)
class Handle:
    """Run the handlers of `jobs`; the result is their outcomes, in order
    (what each returned, or the exception it raised). Worker runs them one
    after the other in the current thread, AsyncWorker concurrently."""

    jobs: Sequence[Job]


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call `fn()` (a Suspend's on_waiting step); AsyncWorker awaits what it
    returns when that is awaitable."""

    fn: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Spawn:
    """Run the body `work` beside the current one (a thread, or a task)."""

    work: Steps[None]


@dataclass(frozen=True, slots=True)
class WaitForSlot:
    """Wait until a handler slot may have come free, stop(), or `seconds`."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Watch:
    """Wait `seconds` between heartbeat rounds, taking cancel notifications
    (and, in Worker, waking early when a handler with a deadline starts)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Listen:
    """Wait for a NOTIFY that runs are ready, stop(), or `seconds`."""

    seconds: float


# With run(until_idle=...), how often an idle worker whose handlers still
# run looks whether they are done.
UNTIL_IDLE_STEP = 0.05


@dataclass(eq=False)
class _Settlement:
    """One body's outcomes to write (settle_and_claim items) and how many runs
    it claims in their place, queued to go out in a call shared with other
    bodies' (_Loop._shared_settle_steps). `turn` is the shell's event, set
    when the request is answered or when its body is to make the next call."""

    items: list[dict[str, Any]]
    want: int
    turn: Any
    state: str = "queued"  # queued -> (leading ->) answered
    settled: dict[tuple[str, int], str] = field(default_factory=dict)
    claimed: list[ClaimedAttempt] = field(default_factory=list)
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Gather:
    """A leading call's wait, at most `seconds`, for the outcomes of the runs
    claimed less than `seconds` ago that are still being handled (see
    GATHER_SECONDS)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class AwaitTurn:
    """Wait until `settlement` is answered or its body is to make the next
    shared call."""

    settlement: _Settlement


class _Loop(_Signals, _Recorder):
    """A worker's state and decisions, written once for Worker and AsyncWorker.

    Slots: `concurrency` of them, each held by a job in flight (_inflight)
    or reserved by a claim in flight (_reserved); a claim asks for at most
    the slots it reserved, and what it claims takes their place. The bodies
    below (generators of steps, runrelay._steps) decide every call, retry,
    write and hand-back; a shell only performs their steps and owns what is
    its own: threads or tasks, how it waits, and its shutdown's waiting."""

    _stop: Any  # threading.Event or asyncio.Event: only is_set() is used here
    _listener: Any

    def __init__(
        self,
        client: Any,
        handler: Callable[[Job], Any],
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        name: str | None = None,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        heartbeat_every: float | None = None,
        batch_size: int = 1,
        poll_interval: float = 1.0,
        listen_dsn: ListenDsn | None = None,
        shutdown_grace: float = 10.0,
        maintenance: bool = True,
        maintenance_interval: float | None = None,
        fused: bool = True,
        metrics: CollectorRegistry | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        if isinstance(queues, str):
            raise TypeError(
                f"queues is a list of queue names, not a string: write queues=[{queues!r}]"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.tasks = handler if isinstance(handler, Tasks) else None
        if self.tasks is not None:
            if not len(self.tasks):
                raise ValueError("the Tasks registry has no task to run")
            self._check_tasks(self.tasks)
            if queues is None:
                queues = self.tasks.queues
        self.timeout = timeout
        self._events()
        self._listener = None
        self.client = client
        self.handler = handler
        self.queues = list(queues) if queues is not None else None
        self.concurrency = max(1, concurrency)
        self.name = name or _default_name()
        self.lease_seconds = lease_seconds
        self.heartbeat_every = heartbeat_every or max(1.0, lease_seconds / 3)
        self.batch_size = max(1, batch_size)
        self.poll_interval = poll_interval
        check_listen_dsn(listen_dsn)
        self.listen_dsn = listen_dsn
        self.shutdown_grace = shutdown_grace
        self.fused = fused
        interval = maintenance_interval or default_maintenance_interval(lease_seconds)
        self.maintenance = self._maintenance(client, interval) if maintenance else None
        # A reentrant lock: a signal handler (stop()) may run in the main
        # thread while it holds the lock.
        self._lock = threading.RLock()
        # Notified when a slot comes free or stop(): what the claim loop and
        # shutdown wait for. A job swapped for the next one it claimed frees
        # none, and wakes nobody.
        self._changed = threading.Condition(self._lock)
        # Notified when no settlement is in flight any more (shutdown waits).
        self._settled = threading.Condition(self._lock)
        # Runs claimed by this worker whose outcome is not queued yet, with
        # when they were claimed (time.monotonic()): what a leading call
        # gathers (Gather); notified when one is queued or leaves.
        self._fresh: dict[tuple[str, int], float] = {}
        self._gather = threading.Condition(self._lock)
        self.gather_seconds = GATHER_SECONDS
        self._inflight: dict[tuple[str, int], Job] = {}
        self._reserved = 0
        # Jobs whose outcome a settle_and_claim call in flight is writing:
        # shutdown does not hand them back, and waits for their calls.
        self._settling: set[tuple[str, int]] = set()
        # Shared settlements queued for the next call, and the calls in flight.
        self._queued: list[_Settlement] = []
        self._settle_calls = 0
        self.settle_calls_in_flight = SETTLE_CALLS
        self.stats: dict[str, int] = {}
        self._metrics = worker_metrics(metrics)
        self._tracing = getattr(client, "tracing", None)

    def _events(self) -> None:
        """Create the shell's stop and abort events (and what else it waits on)."""
        raise NotImplementedError

    def _maintenance(self, client: Any, interval: float) -> Any:
        raise NotImplementedError

    def _event(self) -> Any:
        """A new event of the shell's kind (set once, waited on by AwaitTurn)."""
        raise NotImplementedError

    def _check_tasks(self, tasks: Tasks) -> None:
        """Refuse tasks this shell cannot run."""
        raise NotImplementedError

    def _timeout_of(self, job: Job) -> float | None:
        """The seconds `job`'s handler may run: its task's timeout, else the
        worker's (None: no limit)."""
        task = job.attempt.task
        if self.tasks is not None and task is not None and task in self.tasks:
            limit = self.tasks[task].timeout
            if limit is not None:
                return limit
        return self.timeout

    def _claim_filter(self) -> dict[str, Any]:
        """The claim's queues, and its tasks when the worker runs a registry."""
        if self.tasks is None:
            return {"queues": self.queues}
        return {"queues": self.queues, "tasks": self.tasks.names}

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + n

    # -- slots -------------------------------------------------------------
    def _free(self) -> int:
        with self._lock:
            return self.concurrency - len(self._inflight) - self._reserved

    def _reserve(self, most: int) -> int:
        """Reserve up to `most` free slots for a claim; how many it got."""
        with self._lock:
            n = max(0, min(most, self.concurrency - len(self._inflight) - self._reserved))
            self._reserved += n
            return n

    def _swap(self, done: Sequence[Job], nxt: Sequence[Job], reserved: int = 0) -> None:
        """`nxt` enter _inflight as `done` leave it, in one step (shutdown
        never sees it empty in between), and `reserved` reserved slots are
        given up: the claimed jobs took the place of as many."""
        with self._changed:
            held = len(self._inflight) + self._reserved
            for job in nxt:
                self._inflight[(job.run_id, job.attempt.attempt)] = job
            for job in done:
                self._inflight.pop((job.run_id, job.attempt.attempt), None)
            self._unfresh([(job.run_id, job.attempt.attempt) for job in done])
            self._reserved -= reserved
            if len(self._inflight) + self._reserved < held:
                self._changed.notify_all()
        left(done)

    def _claimed_fresh(self, claimed: Sequence[ClaimedAttempt]) -> None:
        """These runs were just claimed: a leading call gathers their
        outcomes while they are young (Gather)."""
        if claimed and self.gather_seconds > 0:
            now = time.monotonic()
            with self._lock:
                for a in claimed:
                    self._fresh[(a.run_id, a.attempt)] = now

    def _unfresh(self, keys: Sequence[tuple[str, int]]) -> None:
        """The outcomes of `keys` are queued, or their jobs left: nothing
        to gather of them. The caller holds the lock."""
        if self._fresh and any(self._fresh.pop(k, None) is not None for k in list(keys)):
            self._gathered()

    def _gathered(self) -> None:
        """Wake a leading call that gathers (the caller holds the lock)."""
        self._gather.notify_all()

    def _gathering(self, seconds: float) -> float:
        """How much longer a leading call gathers: until no run claimed less
        than `seconds` ago still has its outcome to queue (0: go now)."""
        now = time.monotonic()
        for key in [k for k, t in self._fresh.items() if now - t >= seconds]:
            del self._fresh[key]  # too old to wait for; it never will be
        return max(self._fresh.values()) + seconds - now if self._fresh else 0.0

    def _settling_ended(self, keys: Sequence[tuple[str, int]]) -> None:
        with self._lock:
            self._settling.difference_update(keys)
            if not self._settling:
                self._settled.notify_all()

    def _leftovers(self) -> list[Job]:
        """What a stopping worker hands back: every job in flight but a
        suspended one (its run waits durably) and a settling one (its
        outcome is being written)."""
        with self._lock:
            return [
                j
                for key, j in self._inflight.items()
                if not j.suspended and not j.timed_out and key not in self._settling
            ]

    # -- the main loop -----------------------------------------------------
    def _loop_steps(self, until_idle: float | None) -> Steps[None]:
        """Claim into free slots and start work on what was claimed until
        stop() (or, with until_idle, until nothing was claimable for that
        many seconds and nothing runs)."""
        log.info(
            "worker started",
            extra={
                "worker": self.name,
                "queues": ",".join(self.queues) if self.queues is not None else "(all)",
                "concurrency": self.concurrency,
            },
        )
        idle_since = time.monotonic()
        while not self._stop.is_set():
            n = self._reserve(self.batch_size)
            if n == 0:
                yield WaitForSlot(self.poll_interval)
                continue
            claimed = yield from self._claim_steps(n)
            if claimed:
                idle_since = time.monotonic()
                for work in self._dispatch(claimed):
                    yield Spawn(work)
                continue
            idle_for = time.monotonic() - idle_since
            if until_idle is not None and idle_for > until_idle and not self._inflight:
                return
            wait = jittered(self.poll_interval)
            if until_idle is not None:
                # Look again when the idle time is up, not a poll interval
                # later (then every UNTIL_IDLE_STEP while runs still run).
                wait = min(wait, max(until_idle - idle_for, UNTIL_IDLE_STEP))
            yield Listen(wait)

    def _claim_steps(self, n: int) -> Steps[list[Job]]:
        """Claim up to n runs into n reserved slots. After a connection error
        the claim is ambiguous (it may have committed): it is repeated with
        the same call_id — an exact replay if it did, a fresh claim if not —
        with backoff, until it resolves or the worker stops."""
        call_id = uuid.uuid4()
        backoff = Backoff(base=0.1, cap=10.0)
        while True:
            try:
                claimed: list[ClaimedAttempt] = yield Call(
                    "claim_attempts",
                    {
                        "worker": self.name,
                        **self._claim_filter(),
                        "max_runs": n,
                        "lease_seconds": self.lease_seconds,
                        "call_id": call_id,
                    },
                )
            except CONNECTION_ERRORS as exc:
                self._retried("claim")
                if self._stop.is_set():
                    self._swap([], [], reserved=n)
                    return []
                delay = backoff.next()
                log.warning(
                    "claim failed (%s); replaying call %s in %.1fs", first_line(exc), call_id, delay
                )
                yield Pause(delay)
                continue
            jobs = [claimed_job(a, self.lease_seconds) for a in claimed]
            self._claimed(claimed)
            self._swap([], jobs, reserved=n)
            self._claimed_fresh(claimed)
            return jobs

    def _dispatch(self, jobs: list[Job]) -> list[Steps[None]]:
        """The bodies that run claimed jobs, each beside the others: one per
        job, or one per batch with batch_size > 1."""
        if self.fused:
            groups = [jobs] if self.batch_size > 1 else [[job] for job in jobs]
            return [self._work_steps(group) for group in groups]
        if self.batch_size > 1 and len(jobs) > 1:
            return [self._batch_steps(jobs)]
        return [self._one_steps(job) for job in jobs]

    # -- the fused path: settle and claim the next in one call ---------------
    def _work_steps(self, jobs: list[Job]) -> Steps[None]:
        """Run handlers, then write their outcomes and claim the runs for
        the slots they free in one settle_and_claim call; go on with what it
        claimed, in this body, until a call claims nothing."""
        try:
            while jobs:
                outcomes = yield Handle(jobs)
                jobs = yield from self._settle_steps(jobs, outcomes)
        finally:
            self._swap(jobs, [])  # cancelled at shutdown: the jobs leave

    def _settle_steps(self, jobs: list[Job], outcomes: list[Any]) -> Steps[list[Job]]:
        """Write the jobs' outcomes and claim as many runs as they hold slots
        (with batch_size > 1, free slots too; none once the worker stops) in
        one call; returns the claimed jobs this body runs next, and starts
        the others beside it. The jobs leave _inflight as the claimed enter."""
        fused: list[tuple[Job, Any, str, dict[str, Any]]] = []
        for job, outcome in zip(jobs, outcomes, strict=True):
            if not fusable(outcome):
                try:
                    yield from self._outcome_steps(job, outcome)
                except Exception:
                    log.exception("writing the outcome of run %s failed", job.run_id)
                    self._write_failed()
                continue
            method, kwargs = write_for(job, outcome)
            fused.append((job, outcome, method, settle_item(method, kwargs)))
        if not fused:
            self._swap(jobs, [])
            return []
        extra = want = 0
        if not self._stop.is_set():
            if self.batch_size > 1:
                extra = self._reserve(self.batch_size - len(jobs))
            want = len(jobs) + extra
        keys = [(j.run_id, j.attempt.attempt) for j in jobs]
        with self._lock:
            self._settling.update(keys)
            self._unfresh(keys)
        try:
            try:
                settled, claimed = yield from self._shared_settle_steps(
                    [item for *_, item in fused], want
                )
            finally:
                self._settling_ended(keys)
        except Exception:
            log.exception("settling %d runs failed", len(fused))
            self._write_failed()
            self._swap(jobs, [], reserved=extra)
            return []
        for job, outcome, method, _item in fused:
            written = settled.get((job.run_id, job.attempt.attempt), "missing")
            self._wrote(job.attempt.queue, method.split("_")[0], written)
            log_finished(job, written, unexpected(outcome))
        nxt = [claimed_job(a, self.lease_seconds) for a in claimed]
        self._claimed(claimed)
        self._swap(jobs, nxt, reserved=extra)
        if nxt and self._stop.is_set():
            # Claimed as the worker stopped: a stopping worker starts nothing.
            yield from self._hand_back_steps(nxt)
            self._swap(nxt, [])
            return []
        if self.batch_size > 1 or len(nxt) <= 1:
            return nxt
        for job in nxt[1:]:
            yield Spawn(self._work_steps([job]))
        return nxt[:1]

    def _shared_settle_steps(
        self, items: list[dict[str, Any]], want: int
    ) -> Steps[tuple[dict[tuple[str, int], str], list[ClaimedAttempt]]]:
        """Write `items` and claim up to `want` runs, in a settle_and_claim
        call shared with the other bodies that settle at the same time: a
        body that finds fewer than settle_calls_in_flight calls going makes
        the call itself, with every settlement queued by then; otherwise its
        settlement waits for the next call, which the body at the head of the
        queue makes as soon as a call ends. No body waits for another's
        handler: a call carries what finished while the calls before it were
        in flight. Each settlement gets its own items' outcomes and claims of
        its own, up to its want."""
        mine = _Settlement(items, want, self._event())
        with self._lock:
            # A call slot is free and no leader is about to go (one that
            # gathers takes this settlement along): this body leads.
            lead = self._settle_calls < self.settle_calls_in_flight and self._leader() is None
            self._queued.append(mine)
            if lead:
                self._settle_calls += 1
                mine.state = "leading"
        if mine.state == "queued":
            try:
                yield AwaitTurn(mine)
            except BaseException:
                self._leave_queue(mine)  # cancelled while waiting (shutdown)
                raise
        if mine.state == "leading":
            try:
                yield Gather(self.gather_seconds)
            except BaseException:
                self._leave_queue(mine)  # cancelled while gathering (shutdown)
                raise
            yield from self._settle_round_steps(mine)
        if mine.error is not None:
            raise mine.error
        return mine.settled, mine.claimed

    def _leader(self) -> _Settlement | None:
        """The queued settlement that leads a call not sent yet (there is at
        most one), if any. The caller holds the lock."""
        return next((s for s in self._queued if s.state == "leading"), None)

    def _pass_turn(self) -> _Settlement | None:
        """A call slot came free: the settlement at the head of the queue
        leads the next call, unless a leader not sent yet will carry it
        (then the slot is given up, as when nothing is queued). Returns the
        new leader, whose turn the caller sets once it let go of the lock."""
        after = self._queued[0] if self._queued and self._leader() is None else None
        if after is None:
            self._settle_calls -= 1
        else:
            after.state = "leading"
        return after

    def _settle_round_steps(self, mine: _Settlement) -> Steps[None]:
        """One shared call, made by the body of `mine`, the leading
        settlement: it and the other queued settlements in their order (up to
        SETTLE_BATCH items), answered whatever happens; then the call's turn
        passes on (_pass_turn)."""
        with self._lock:
            self._queued.remove(mine)
            batch: list[_Settlement] = [mine]
            size = len(mine.items)
            while self._queued and size + len(self._queued[0].items) <= SETTLE_BATCH:
                size += len(self._queued[0].items)
                batch.append(self._queued.pop(0))
        try:
            yield from self._settle_batch_steps(batch)
        finally:
            with self._lock:
                for s in batch:
                    if s.state != "answered" and s.error is None:
                        s.error = RuntimeError("the shared settle_and_claim call was abandoned")
                    s.state = "answered"
                after = self._pass_turn()
            for s in batch:
                s.turn.set()
            if after is not None:
                after.turn.set()

    def _leave_queue(self, mine: _Settlement) -> None:
        """A waiting settlement's body is gone: it leaves the queue, and if
        the next call was its to make, that turn passes on."""
        with self._lock:
            if mine not in self._queued:
                return  # in a call already; its answer goes unread
            self._queued.remove(mine)
            if mine.state != "leading":
                return
            after = self._pass_turn()
        if after is not None:
            after.turn.set()

    def _settle_batch_steps(self, batch: list[_Settlement]) -> Steps[None]:
        """The call of a batch of settlements. If it fails with anything but
        a lost connection, one settlement's item may be what the server
        refused (a result over the payload cap): each is then written by a
        call of its own, so only that one fails."""
        try:
            settled, claimed = yield from self._settle_call_steps(
                [item for s in batch for item in s.items], sum(s.want for s in batch)
            )
        except CONNECTION_ERRORS as exc:
            for s in batch:
                s.error = exc
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            for s in batch:
                try:
                    s.settled, s.claimed = yield from self._settle_call_steps(s.items, s.want)
                except Exception as alone:
                    s.error = alone
                s.state = "answered"
            return
        # Young from now, before any body wakes to run them: a leading call
        # made as they start gathers them all.
        self._claimed_fresh(claimed)
        for s in batch:
            s.settled = settled
            s.claimed, claimed = claimed[: s.want], claimed[s.want :]
            s.state = "answered"

    def _settle_call_steps(
        self, items: list[dict[str, Any]], max_runs: int
    ) -> Steps[tuple[dict[tuple[str, int], str], list[ClaimedAttempt]]]:
        """One settle_and_claim call, replayed with the same call_id after a
        connection error (the settlements are fenced writes, the claim is
        named by the call_id: a replay answers what the lost call did), with
        backoff, until it resolves; once the worker stops, at most
        SETTLE_TRIES times."""
        call_id = uuid.uuid4()
        backoff = Backoff(base=0.1, cap=2.0)
        failures = 0
        while True:
            try:
                reply = yield Call(
                    "settle_and_claim",
                    {
                        "items": items,
                        "worker": self.name,
                        **self._claim_filter(),
                        "max_runs": max_runs,
                        "lease_seconds": self.lease_seconds,
                        "call_id": call_id,
                    },
                )
            except CONNECTION_ERRORS as exc:
                failures += 1
                self._retried("settle")
                if failures >= SETTLE_TRIES and self._stop.is_set():
                    raise
                delay = backoff.next()
                log.warning(
                    "settle-and-claim failed (%s); replaying call %s in %.1fs",
                    first_line(exc),
                    call_id,
                    delay,
                )
                yield Pause(delay, interruptible=False)
                continue
            return settled_and_claimed(reply)

    # -- the two-call path ---------------------------------------------------
    def _one_steps(self, job: Job) -> Steps[None]:
        try:
            [outcome] = yield Handle([job])
            yield from self._outcome_steps(job, outcome)
        except Exception:
            log.exception("writing the outcome of run %s failed", job.run_id)
            self._write_failed()
        finally:
            self._swap([job], [])

    def _batch_steps(self, jobs: list[Job]) -> Steps[None]:
        """The handlers of one claim run; the successful ones are completed
        with one complete_attempts call, the others written one by one."""
        try:
            outcomes = yield Handle(jobs)
            done: list[tuple[Job, Any]] = []
            for job, outcome in zip(jobs, outcomes, strict=True):
                method, kwargs = write_for(job, outcome)
                if method == "complete_attempt":
                    done.append((job, kwargs["result"]))
                    continue
                yield from self._outcome_steps(job, outcome)
            if done:
                items = [(j.attempt, r) for j, r in done]
                results = yield from self._write_steps("complete_attempts", {"items": items})
                _log_batch([j for j, _ in done], results, self._wrote)
        except Exception:
            log.exception("batch completion failed")
            self._write_failed()
        finally:
            self._swap(jobs, [])

    def _outcome_steps(self, job: Job, outcome: Any) -> Steps[None]:
        """Write what the handler's outcome calls for; then, for a suspension
        with an on_waiting step that now waits, run the step and, if it
        raises, fail the waiting run (Suspend explains the protocol)."""
        method, kwargs = write_for(job, outcome)
        written = yield from self._write_steps(method, kwargs)
        self._wrote(job.attempt.queue, method.split("_")[0], written)
        failure = unexpected(outcome)
        suspend = waits_for_step(outcome, written)
        if suspend is not None and suspend.on_waiting is not None:
            job.suspended = True
            try:
                yield Invoke(suspend.on_waiting)
            except Exception as exc:
                method, kwargs = waiting_failure_write(job, exc)
                written = yield from self._write_steps(method, kwargs)
                self._wrote(job.attempt.queue, "fail_waiting", written)
                failure = exc
        log_finished(job, written, failure)

    def _write_steps(self, method: str, kwargs: dict[str, Any], tries: int = 6) -> Steps[Any]:
        """A fenced write, repeated after a connection error: a repeated
        write returns the outcome the first one recorded if it committed."""
        backoff = Backoff(base=0.1, cap=2.0)
        for n in range(tries):
            try:
                return (yield Call(method, kwargs))
            except CONNECTION_ERRORS as exc:
                if n == tries - 1:
                    raise
                delay = backoff.next()
                log.warning("write failed (%s); repeating in %.1fs", first_line(exc), delay)
                yield Pause(delay, interruptible=False)
        raise AssertionError("unreachable")

    def _hand_back_steps(self, jobs: list[Job]) -> Steps[None]:
        """Release runs this stopping worker will not run."""
        for job in jobs:
            job.cancelled.set()
            method, kwargs = release_write(job, None, f"{self.name} stopped")
            try:
                written = yield from self._write_steps(method, kwargs, tries=3)
            except Exception:
                log.warning("could not hand back run %s", job.run_id, exc_info=True)
                continue
            self._handed_back(job, written)
            log_finished(job, written)

    # -- heartbeats, deadlines and cancel notifications ---------------------
    def _watch_steps(self) -> Steps[None]:
        """Heartbeat every heartbeat_every seconds until the shell ends the
        watch; between rounds, fail the attempts of sync handlers past their
        deadline. Cancel notifications arrive while it waits (Watch)."""
        next_beat = time.monotonic() + self.heartbeat_every
        while not self._watch_over():
            with self._lock:
                deadlines = [
                    j.deadline
                    for j in self._inflight.values()
                    if j.deadline is not None and not j.timed_out
                ]
            wake = min([next_beat, *deadlines])
            yield Watch(max(0.0, wake - time.monotonic()))
            yield from self._expire_steps()
            if time.monotonic() >= next_beat and not self._watch_over():
                yield from self._beat_steps()
                next_beat = time.monotonic() + self.heartbeat_every

    def _watch_over(self) -> bool:
        raise NotImplementedError

    def _expire_steps(self) -> Steps[None]:
        """Fail the attempt of each sync handler past its deadline with a
        timeout error (the run retries by its policy). The handler cannot be
        stopped: its `cancelled` event is set, and its late write answers
        fence_lost and changes nothing."""
        now = time.monotonic()
        with self._lock:
            overdue = [
                j
                for j in self._inflight.values()
                if j.deadline is not None and j.deadline <= now and not j.timed_out
            ]
        for job in overdue:
            job.timed_out = True
            job.cancelled.set()
            limit = self._timeout_of(job) or 0.0
            kwargs = {**job.attempt.fence, "error": timeout_error(limit)}
            try:
                written = yield from self._write_steps("fail_attempt", kwargs, tries=3)
            except Exception:
                log.warning("could not fail timed-out run %s", job.run_id, exc_info=True)
                continue
            self._wrote(job.attempt.queue, "timeout", written)
            log.warning(
                "run %s: handler ran past its timeout of %gs; attempt failed (%s)",
                job.run_id,
                limit,
                written,
                extra={"run_id": job.run_id, "attempt": job.attempt.attempt},
            )

    def _cancel_notified(self, payload: str) -> None:
        """A <schema>_cancel notification: if it names an attempt this worker
        runs, set its job's `cancelled` and interrupt its handler."""
        try:
            note = json.loads(payload)
            key = (str(note["run_id"]), int(note["attempt"]))
            worker = note.get("worker")
        except (ValueError, KeyError, TypeError):
            return
        if worker != self.name:
            return
        with self._lock:
            job = self._inflight.get(key)
        if job is None or job.cancelled.is_set():
            return
        job.cancelled.set()
        self._count("cancel_notified")
        if job.interrupt is not None:
            job.interrupt()

    def _beat_steps(self) -> Steps[None]:
        """One heartbeat round: extend the lease of every job in flight that
        still runs its handler."""
        with self._lock:
            jobs = list(self._inflight.values())
        for job in jobs:
            if job.cancelled.is_set() or job.suspended or job.timed_out:
                continue
            try:
                beat = yield Call(
                    "heartbeat", {**job.attempt.fence, "lease_seconds": self.lease_seconds}
                )
            except Exception as exc:
                log.warning("heartbeat for %s failed (%s)", job.run_id, first_line(exc))
                self._beat(None)
                continue
            self._beat(beat.outcome)
            if heartbeat_seen(job, beat, self.lease_seconds):
                self._count(f"heartbeat:{beat.outcome}")

    def _grace_note(self) -> None:
        with self._lock:
            inflight = len(self._inflight)
        if inflight:
            log.info("waiting up to %.1fs for %d in-flight runs", self.shutdown_grace, inflight)


class Worker(_Loop):
    """Runs `handler` (a function of a Job, or a runrelay.Tasks registry)
    for claimed runs on up to `concurrency` threads: the shell of _Loop that
    performs its steps by blocking.

    Units: `lease_seconds` (5..300, the server clamps), `heartbeat_every`
    (default a third of the lease), `poll_interval` (between idle polls,
    jittered), `shutdown_grace`, `maintenance_interval` and `timeout` are
    seconds. `queues` is a list of queue names (None: every queue; a Tasks
    registry: its tasks' queues); `batch_size` runs are claimed per call."""

    _listener: Listener | MultiListener | None

    def _events(self) -> None:
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._beats_done = threading.Event()
        # Set when a handler with a deadline starts, or the watch must end:
        # the watch recomputes when it next wakes.
        self._rewatch = threading.Event()
        self._cancels: Listener | MultiListener | None = None

    def _check_tasks(self, tasks: Tasks) -> None:
        for task in tasks:
            if task.is_async:
                raise TypeError(
                    f"task {task.name!r} is a coroutine function: run it with AsyncWorker"
                )

    def _watch_over(self) -> bool:
        return self._beats_done.is_set()

    def _maintenance(self, client: Any, interval: float) -> Maintenance:
        return Maintenance(client, interval=interval, prune_after=None)

    def _event(self) -> threading.Event:
        return threading.Event()

    # -- control -----------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; run() returns after the shutdown grace period."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()

    def _abort_grace(self) -> None:
        self._abort.set()
        self.stop()

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM: the first stops claiming (in-flight work gets
        shutdown_grace), a second hands in-flight runs back at once. Call
        from the main thread."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self._on_signal(signal.Signals(signum)))

    def run(self, *, until_idle: float | None = None) -> None:
        """Claim and run work until stop() (or, with until_idle, until nothing
        was claimable for that many seconds)."""
        self._listener = make_listener(self.listen_dsn, channel(self.client.schema, "runs"))
        beat = threading.Thread(target=self._watch, name=f"{self.name}-hb", daemon=True)
        beat.start()
        upkeep: threading.Thread | None = None
        if self.maintenance is not None:
            upkeep = threading.Thread(
                target=self.maintenance.run, name=f"{self.name}-maint", daemon=True
            )
            upkeep.start()
        try:
            drive(self._loop_steps(until_idle), self._perform)
        finally:
            self._stop.set()
            if self.maintenance is not None:
                self.maintenance.stop()
            self._shutdown()
            self._beats_done.set()
            self._rewatch.set()
            beat.join(timeout=5)
            if upkeep is not None:
                upkeep.join(timeout=5)
            if self._listener is not None:
                self._listener.close()

    # -- performing steps --------------------------------------------------
    def _perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            return getattr(self.client, step.method)(**step.kwargs)
        if isinstance(step, Handle):
            return [self._call_handler(job) for job in step.jobs]
        if isinstance(step, Spawn):
            # A daemon thread: a handler that never returns cannot keep the
            # process alive after shutdown handed its run back.
            threading.Thread(
                target=drive, args=(step.work, self._perform), name=f"{self.name}-run", daemon=True
            ).start()
            return None
        if isinstance(step, WaitForSlot):
            self._wait_for_slot(step.seconds)
            return None
        if isinstance(step, Listen):
            if self._listener is None:
                self._stop.wait(step.seconds)
            else:
                self._listener.wait(step.seconds, self._stop)
            return None
        if isinstance(step, Watch):
            if self._cancels is None:
                self._rewatch.wait(step.seconds)
            else:
                self._cancels.wait(step.seconds, self._rewatch)
            self._rewatch.clear()
            return None
        if isinstance(step, Pause):
            if step.interruptible:
                self._stop.wait(step.seconds)
            else:
                time.sleep(step.seconds)
            return None
        if isinstance(step, AwaitTurn):
            step.settlement.turn.wait()
            return None
        if isinstance(step, Gather):
            with self._gather:
                while (left := self._gathering(step.seconds)) > 0:
                    self._gather.wait(left)
            return None
        if isinstance(step, Invoke):
            return step.fn()
        raise TypeError(f"not a worker step: {step!r}")

    def _wait_for_slot(self, seconds: float) -> None:
        with self._changed:
            if self._free() <= 0 and not self._stop.is_set():
                self._changed.wait(seconds)

    def _call_handler(self, job: Job) -> Any:
        started = time.perf_counter()
        limit = self._timeout_of(job)
        if limit is not None:
            job.deadline = time.monotonic() + limit
            self._rewatch.set()
        job.client = self.client
        with self._handler_span(job):
            try:
                return self.handler(job)
            except Exception as exc:
                return exc
            finally:
                self._handled(job, started)

    def _watch(self) -> None:
        # Runs until shutdown is over: in-flight handlers keep their leases
        # during the grace period too.
        self._cancels = make_listener(
            self.listen_dsn, channel(self.client.schema, "cancel"), self._cancel_notified
        )
        try:
            drive(self._watch_steps(), self._perform)
        finally:
            if self._cancels is not None:
                self._cancels.close()

    def _shutdown(self) -> None:
        """Let in-flight handlers finish within the grace period (a second
        signal ends it); hand the rest back so another worker runs them."""
        deadline = time.monotonic() + self.shutdown_grace
        if not self._abort.is_set():
            self._grace_note()
        with self._changed:
            while self._inflight and not self._abort.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        drive(self._hand_back_steps(self._leftovers()), self._perform)
        # A settle_and_claim call in flight hands back what it claims; wait
        # for it (a stopping worker's call gives up after SETTLE_TRIES).
        with self._settled:
            self._settled.wait_for(lambda: not self._settling, timeout=SETTLE_WAIT)


def _log_batch(
    jobs: list[Job],
    results: list[CompletedItem],
    wrote: Callable[[str | None, str, Any], None],
) -> None:
    """Record and log each answer of one complete_attempts call."""
    by_key = {(j.run_id, j.attempt.attempt): j for j in jobs}
    for item in results:
        job = by_key.get((item.run_id, item.attempt))
        wrote(None if job is None else job.attempt.queue, "complete", item.outcome)
        if job is not None:
            log_finished(job, item.outcome)


class AsyncWorker(_Loop):
    """The asyncio Worker: up to `concurrency` handler tasks on an
    AsyncClient; the handler is a coroutine function taking a Job. The
    shell of _Loop that performs its steps by awaiting: the same outcome
    mapping, heartbeats, cancellation, batching, LISTEN wake-ups, claim
    replay, maintenance, signals and shutdown hand-back as Worker."""

    _listener: AsyncListener | AsyncMultiListener | None

    def _events(self) -> None:
        self._stop = asyncio.Event()
        self._abort = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch_done = asyncio.Event()
        self._cancels: AsyncListener | AsyncMultiListener | None = None
        self._gather_changed = asyncio.Event()

    def _gathered(self) -> None:
        self._gather_changed.set()

    def _check_tasks(self, tasks: Tasks) -> None:
        for task in tasks:
            if not task.is_async:
                raise TypeError(
                    f"task {task.name!r} is not a coroutine function: run it with Worker"
                )

    def _watch_over(self) -> bool:
        return self._watch_done.is_set()

    def _maintenance(self, client: Any, interval: float) -> AsyncMaintenance:
        return AsyncMaintenance(client, interval=interval, prune_after=None)

    def _event(self) -> asyncio.Event:
        return asyncio.Event()

    def stop(self) -> None:
        """Stop claiming; run() returns after the shutdown grace period."""
        self._stop.set()

    def _abort_grace(self) -> None:
        self._stop.set()
        self._abort.set()

    def install_signal_handlers(self) -> None:
        """As Worker.install_signal_handlers, on the running event loop."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    async def run(self, *, until_idle: float | None = None) -> None:
        """Claim and run work until stop() (or, with until_idle, until nothing
        was claimable for that many seconds)."""
        self._listener = make_async_listener(self.listen_dsn, channel(self.client.schema, "runs"))
        beat = asyncio.create_task(self._watch())
        upkeep = asyncio.create_task(self.maintenance.run()) if self.maintenance else None
        try:
            await drive_async(self._loop_steps(until_idle), self._perform)
        finally:
            self._stop.set()
            if self.maintenance is not None:
                self.maintenance.stop()
            await self._shutdown()
            self._watch_done.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(beat), 5)
            beat.cancel()
            others = [t for t in (beat, upkeep) if t is not None]
            await asyncio.gather(*others, return_exceptions=True)
            if self._listener is not None:
                await self._listener.close()

    async def _perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            return await getattr(self.client, step.method)(**step.kwargs)
        if isinstance(step, Handle):
            if len(step.jobs) == 1:
                return [await self._call_handler(step.jobs[0])]
            return list(await asyncio.gather(*(self._call_handler(j) for j in step.jobs)))
        if isinstance(step, Spawn):
            task = asyncio.create_task(drive_async(step.work, self._perform))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return None
        if isinstance(step, WaitForSlot):
            await self._wait_any(step.seconds)
            return None
        if isinstance(step, Listen):
            if self._listener is None:
                await wait_event(self._stop, step.seconds)
            else:
                await self._listener.wait(step.seconds, self._stop)
            return None
        if isinstance(step, Watch):
            if self._cancels is None:
                await wait_event(self._watch_done, step.seconds)
            else:
                await self._cancels.wait(step.seconds, self._watch_done)
            return None
        if isinstance(step, Pause):
            if step.interruptible:
                await wait_event(self._stop, step.seconds)
            else:
                await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, AwaitTurn):
            await step.settlement.turn.wait()
            return None
        if isinstance(step, Gather):
            while (left := self._gathering(step.seconds)) > 0:
                self._gather_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._gather_changed.wait(), left)
            return None
        if isinstance(step, Invoke):
            result = step.fn()
            return await result if inspect.isawaitable(result) else result
        raise TypeError(f"not a worker step: {step!r}")

    async def _wait_any(self, timeout: float) -> None:
        """Until a handler task ends, stop() is called, or `timeout`."""
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait(
                {*self._tasks, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopped.cancel()

    async def _call_handler(self, job: Job) -> Any:
        """The handler's outcome. It runs as a task of its own, so that a
        cancel notification cancels it alone (RunCancelled) and a timeout
        cancels it at the deadline (HandlerTimeout)."""
        started = time.perf_counter()
        limit = self._timeout_of(job)
        job.client, job.is_async = self.client, True
        with self._handler_span(job):
            try:
                handler = asyncio.ensure_future(self.handler(job))
            except Exception as exc:
                self._handled(job, started)
                return exc
            job.interrupt = handler.cancel
            try:
                done, _ = await asyncio.wait({handler}, timeout=limit)
                if not done:
                    handler.cancel()
                    await asyncio.gather(handler, return_exceptions=True)
                    return HandlerTimeout(limit or 0.0)
                if handler.cancelled():
                    return RunCancelled()
                return handler.result()
            except asyncio.CancelledError:
                handler.cancel()  # the worker's own task: shutdown
                raise
            except Exception as exc:
                return exc
            finally:
                job.interrupt = None
                self._handled(job, started)

    async def _watch(self) -> None:
        self._cancels = make_async_listener(
            self.listen_dsn, channel(self.client.schema, "cancel"), self._cancel_notified
        )
        try:
            await drive_async(self._watch_steps(), self._perform)
        finally:
            if self._cancels is not None:
                await self._cancels.close()

    async def _shutdown(self) -> None:
        """Let handler tasks finish within the grace period (a second signal
        ends it); hand the rest back, then cancel their tasks."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
        if not self._abort.is_set():
            self._grace_note()
        aborted = asyncio.ensure_future(self._abort.wait())
        try:
            while self._tasks and not self._abort.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await asyncio.wait(
                    {*self._tasks, aborted}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            aborted.cancel()
        await drive_async(self._hand_back_steps(self._leftovers()), self._perform)
        # A settle_and_claim call in flight hands back what it claims; wait
        # for it before cancelling the tasks still running handlers.
        settled_by = loop.time() + SETTLE_WAIT
        while self._settling and loop.time() < settled_by:
            await asyncio.sleep(0.02)
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
