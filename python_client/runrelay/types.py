"""Typed results of the runrelay SQL API: frozen dataclasses and outcome enums.

Field names are the SQL result column names; enum values are the SQL API's
outcome strings, so `outcome == "completed"` and `outcome is
CompleteOutcome.COMPLETED` both hold.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

JSON = Any


class RunStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class HeartbeatOutcome(enum.StrEnum):
    OK = "ok"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"


class StepOutcome(enum.StrEnum):
    """What record_step answered: RECORDED (stored now, or a repeat of the
    call that stored it), ALREADY_RECORDED (a step of that name is stored:
    its result stands), CANCELLED, FENCE_LOST."""

    RECORDED = "recorded"
    ALREADY_RECORDED = "already_recorded"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"


class CompleteOutcome(enum.StrEnum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"


class FailOutcome(enum.StrEnum):
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"
    SUPERSEDED = "superseded"


class SuspendOutcome(enum.StrEnum):
    WAITING = "waiting"
    RESUMED = "resumed"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"


class ReleaseOutcome(enum.StrEnum):
    RELEASED = "released"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"


class SettleKind(enum.StrEnum):
    SETTLED = "settled"
    CLAIMED = "claimed"


class SettleOutcome(enum.StrEnum):
    """A settle_and_claim item's outcome: what the function of its op answers."""

    COMPLETED = "completed"
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    WAITING = "waiting"
    RESUMED = "resumed"
    RELEASED = "released"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"


class PrepareOutcome(enum.StrEnum):
    PREPARED = "prepared"
    FENCE_LOST = "fence_lost"
    NOT_APPLICABLE = "not_applicable"


class WaitingFailureOutcome(enum.StrEnum):
    """What `Client.fail_waiting` (prepare_waiting_failure, then
    fail_attempt(..., protect_waiting_suspension=True)) answers: the protected
    failure's answer. NOT_APPLICABLE is no longer answered (a refusal is
    FENCE_LOST, on every repeat); it is kept for code that names it."""

    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    CANCELLED = "cancelled"
    FENCE_LOST = "fence_lost"
    NOT_APPLICABLE = "not_applicable"


class SignalOutcome(enum.StrEnum):
    RESUMED = "resumed"
    STORED = "stored"
    TERMINAL = "terminal"
    NOT_FOUND = "not_found"


class CancelOutcome(enum.StrEnum):
    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"
    ALREADY_TERMINAL = "already_terminal"
    NOT_FOUND = "not_found"


class RetryOutcome(enum.StrEnum):
    RETRIED = "retried"
    NOT_RETRYABLE = "not_retryable"
    NOT_FOUND = "not_found"


class ScheduleOutcome(enum.StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


class DeleteScheduleOutcome(enum.StrEnum):
    DELETED = "deleted"
    NOT_FOUND = "not_found"


class MissedSlots(enum.StrEnum):
    """What a schedule enqueues for slots that passed while no maintainer ran."""

    CATCH_UP = "catch_up"
    SKIP = "skip"


class PauseOutcome(enum.StrEnum):
    PAUSED = "paused"
    ALREADY_PAUSED = "already_paused"


class ResumeOutcome(enum.StrEnum):
    RESUMED = "resumed"
    NOT_PAUSED = "not_paused"


class RunnerTerminalOutcome(enum.StrEnum):
    RECORDED = "recorded"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    TOO_LATE = "too_late"
    NOT_FOUND = "not_found"


class ReapOutcome(enum.StrEnum):
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"


class LedgerKind(enum.StrEnum):
    CLAIMED = "claimed"
    LOCAL_ACK = "local_ack"
    DELIVERED = "delivered"


class LedgerFailOutcome(enum.StrEnum):
    RETRYING = "retrying"
    BLOCKED = "blocked"


class Lane(enum.StrEnum):
    LIFECYCLE = "lifecycle"
    OBSERVABILITY = "observability"


class AttemptStatus(enum.StrEnum):
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    RESUMED = "resumed"
    RELEASED = "released"


class EventState(enum.StrEnum):
    """A ledger event's delivery state (the `ledger` view's state)."""

    PENDING = "pending"
    LEASED = "leased"
    DELIVERED = "delivered"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class EnqueueItem:
    """One run for `Client.enqueue_runs`: enqueue_run's keyword arguments,
    with its defaults (``payload=None`` is ``{}``, ``run_at=None`` is now)."""

    run_id: str
    queue: str = "default"
    payload: Any = None
    run_at: datetime | None = None
    priority: int = 0
    max_attempts: int = 3
    payload_retention: str = "keep"
    concurrency_key: str | None = None
    # The named task that handles the run (runrelay.Tasks); None: untyped.
    task: str | None = None
    # The W3C trace context its run keeps ({"traceparent", "tracestate"?});
    # None: a tracing client's own, or none (docs/operations.md, "Tracing").
    trace_context: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    run_id: str
    status: RunStatus
    created: bool


@dataclass(frozen=True, slots=True)
class AppendedEvent:
    event_id: int
    seq: int
    delivery_key: str


@dataclass(frozen=True, slots=True)
class ClaimedAttempt:
    run_id: str
    attempt: int
    lease_token: uuid.UUID
    queue: str
    payload: JSON
    resume: JSON
    lease_expires_at: datetime
    # The run's task (None: untyped), and its recorded steps (step name ->
    # result; None when there are none).
    task: str | None = None
    steps: JSON = None
    # The run's trace context, read by a tracing client's claim; else None.
    trace_context: JSON = None

    @property
    def fence(self) -> dict[str, Any]:
        """The (run_id, attempt, lease_token) keyword arguments of a fenced write."""
        return {"run_id": self.run_id, "attempt": self.attempt, "lease_token": self.lease_token}


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    outcome: HeartbeatOutcome
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class CompletedItem:
    run_id: str
    attempt: int
    outcome: CompleteOutcome


@dataclass(frozen=True, slots=True)
class SettleAndClaimRow:
    """One row of settle_and_claim: a settled item (kind SETTLED: run_id,
    attempt, outcome) or a claimed run (kind CLAIMED: claim_attempts'
    columns, outcome None)."""

    kind: SettleKind
    run_id: str
    attempt: int
    outcome: SettleOutcome | None
    lease_token: uuid.UUID | None
    queue: str | None
    payload: JSON
    resume: JSON
    lease_expires_at: datetime | None
    task: str | None = None
    steps: JSON = None
    # A claimed run's trace context, read by a tracing client; else None.
    trace_context: JSON = None

    @property
    def claim(self) -> ClaimedAttempt | None:
        """A claimed row as claim_attempts returns it; None for a settled row."""
        if self.kind != SettleKind.CLAIMED:
            return None
        assert self.lease_token is not None and self.queue is not None
        assert self.lease_expires_at is not None
        return ClaimedAttempt(
            self.run_id,
            self.attempt,
            self.lease_token,
            self.queue,
            self.payload,
            self.resume,
            self.lease_expires_at,
            task=self.task,
            steps=self.steps,
            trace_context=self.trace_context,
        )


@dataclass(frozen=True, slots=True)
class RunnerTerminal:
    result: JSON
    received_at: datetime | None


@dataclass(frozen=True, slots=True)
class ReapedAttempt:
    run_id: str
    attempt: int
    outcome: ReapOutcome


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    """One row of claim_ledger / ack_ledger."""

    kind: LedgerKind
    event_id: int
    run_id: str
    seq: int
    type: str
    payload: JSON
    delivery_key: str
    created_at: datetime
    frozen: bool
    lease_expires_at: datetime | None
    lease_remaining_ms: int | None
    lag_ms: int | None = None
    # A claimed event's run's trace context, read by a tracing client; else None.
    trace_context: JSON = None


@dataclass(frozen=True, slots=True)
class RenewedLease:
    event_id: int
    lease_expires_at: datetime


@dataclass(frozen=True, slots=True)
class LedgerFailure:
    event_id: int
    outcome: LedgerFailOutcome


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One row of list_runs: a run without its payload, result and resume."""

    run_id: str
    queue: str
    status: RunStatus
    priority: int
    concurrency_key: str | None
    key_held: bool
    run_at: datetime
    attempt_count: int
    max_attempts: int
    wait: JSON
    error: JSON
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class RunDetail:
    """get_run: every column of a run, and its pending cancellation."""

    run_id: str
    queue: str
    status: RunStatus
    priority: int
    concurrency_key: str | None
    key_held: bool
    payload: JSON
    payload_retention: str
    run_at: datetime
    max_attempts: int
    attempt_count: int
    series_start: int
    wait: JSON
    wake_at: datetime | None
    resume: JSON
    result: JSON
    error: JSON
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    trace_context: JSON
    cancel_requested: bool
    cancel_reason: str | None
    # The named task that handles the run (None: untyped).
    task: str | None = None


@dataclass(frozen=True, slots=True)
class RunStep:
    """One row of run_steps: a recorded step, its result, the attempt that
    recorded it and when; ``position`` numbers a run's steps from 1 in the
    order they were recorded."""

    step: str
    position: int
    result: JSON
    attempt: int
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class RunAttempt:
    """One row of run_attempts (no lease token: the worker's credential)."""

    attempt: int
    worker: str
    status: AttemptStatus
    claimed_at: datetime
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    outcome: str | None
    error: JSON
    wait: JSON
    runner_result: JSON
    runner_result_received_at: datetime | None


@dataclass(frozen=True, slots=True)
class RunLedgerEvent:
    """One row of run_ledger_events: an event and its delivery state."""

    event_id: int
    lane: Lane
    seq: int
    type: str
    payload: JSON
    delivery_key: str
    transport_only: bool
    created_at: datetime
    state: EventState
    lease_owner: str | None
    lease_expires_at: datetime | None
    delivery_attempts: int
    next_attempt_at: datetime
    failed_at: datetime | None
    last_error: JSON
    delivered_at: datetime | None
    delivered_by: str | None


@dataclass(frozen=True, slots=True)
class BlockedHead:
    """One row of list_blocked_heads: a lane blocked behind its failed head."""

    run_id: str
    lane: Lane
    event_id: int
    seq: int
    type: str
    created_at: datetime
    failed_at: datetime
    delivery_attempts: int
    last_error: JSON


class SkipOutcome(enum.StrEnum):
    SKIPPED = "skipped"
    NOT_BLOCKED = "not_blocked"


@dataclass(frozen=True, slots=True)
class SkippedEvent:
    """skip_ledger_events' answer: the head it skipped (SKIPPED), or the
    lane's head that was not failed (NOT_BLOCKED; None fields for an empty
    lane)."""

    event_id: int | None
    seq: int | None
    outcome: SkipOutcome


class ProcessKind(enum.StrEnum):
    WORKER = "worker"
    RELAY = "relay"


@dataclass(frozen=True, slots=True)
class Process:
    """One row of list_processes: a worker or relay seen in the last hour or
    holding work now (``held``: its running attempts or leased lanes);
    ``presumed_dead`` when a lease it holds has expired."""

    name: str
    kind: ProcessKind
    last_seen_at: datetime
    held: int
    presumed_dead: bool


def presumed_dead_holder(
    attempts: Sequence[RunAttempt], processes: Sequence[Process]
) -> str | None:
    """The worker holding a run's running attempt (of ``attempts``, from
    run_attempts) when list_processes presumes it dead -- a lease it holds
    has expired --, else None. ``runs show`` and the dashboard's run page
    say so."""
    dead = {p.name for p in processes if p.kind == ProcessKind.WORKER and p.presumed_dead}
    for a in attempts:
        if a.status == AttemptStatus.RUNNING and a.worker in dead:
            return a.worker
    return None


@dataclass(frozen=True, slots=True)
class RequeuedLane:
    """One row of requeue_blocked_heads: a lane and how many events it requeued."""

    run_id: str
    lane: Lane
    requeued: int


@dataclass(frozen=True, slots=True)
class PausedQueue:
    """One row of list_paused_queues."""

    queue: str
    reason: str | None
    paused_by: str | None
    paused_at: datetime


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule declaration: upsert_schedule's arguments, with its defaults
    (``payload=None`` is ``{}``). `Client.declare_schedules` upserts a list of
    them; ``client.upsert_schedule(**schedule.arguments())`` one."""

    name: str
    cron: str
    time_zone: str = "UTC"
    queue: str = "default"
    payload: Any = None
    priority: int = 0
    max_attempts: int = 3
    concurrency_key: str | None = None
    missed: str = "skip"
    enabled: bool = True

    def arguments(self) -> dict[str, Any]:
        """upsert_schedule's keyword arguments."""
        return {
            "name": self.name,
            "cron": self.cron,
            "time_zone": self.time_zone,
            "queue": self.queue,
            "payload": {} if self.payload is None else self.payload,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "concurrency_key": self.concurrency_key,
            "missed": str(self.missed),
            "enabled": self.enabled,
        }


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One row of list_schedules: the declaration and its state."""

    name: str
    cron: str
    time_zone: str
    queue: str
    payload: JSON
    priority: int
    max_attempts: int
    concurrency_key: str | None
    missed: MissedSlots
    enabled: bool
    next_slot_at: datetime | None
    last_slot_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduledRun:
    """One row of enqueue_due_schedules: a slot and its run (created false:
    the slot's run already existed)."""

    schedule: str
    slot: datetime
    run_id: str
    created: bool


@dataclass(frozen=True, slots=True)
class ScheduleDue:
    """schedules_next_due_at: the earliest next slot (None: no enabled
    schedule) and the milliseconds until it by the database clock."""

    next_slot_at: datetime | None
    due_in_ms: int | None


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One row of queue_overview: a queue's backlog by state and its runs
    that ended in the last hour. queued + scheduled + held_by_key is every
    queued run; the per-minute lists have 60 entries, oldest first, the last
    one the current minute."""

    queue: str
    paused: bool
    queued: int
    scheduled: int
    held_by_key: int
    running: int
    waiting: int
    oldest_runnable_age_seconds: float | None
    completed_last_hour: int
    failed_last_hour: int
    completed_per_minute: list[int]
    failed_per_minute: list[int]


@dataclass(frozen=True, slots=True)
class LaneOverview:
    """One row of ledger_overview: a lane kind's run lanes with undelivered
    events, the leased and blocked ones, and the delivery lag (None: nothing
    undelivered)."""

    lane: Lane
    pending_lanes: int
    leased_lanes: int
    blocked_heads: int
    oldest_pending_age_seconds: float | None
