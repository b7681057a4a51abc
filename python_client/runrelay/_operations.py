"""The operation table shared by Client and AsyncClient: every SQL statement the
client runs, its parameters, and how its rows become typed results.

Each operation is exactly one statement — one network round trip — with a
constant text per schema, so psycopg can prepare it. Arguments are always all
sent (the Python defaults are the SQL defaults), typed with explicit casts so
the server resolves the function without guessing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from . import types as t

Row = dict[str, Any]


@dataclass(frozen=True)
class Operation:
    """One SQL function call: its text and how to read its rows."""

    function: str
    params: tuple[tuple[str, str], ...]  # (name, SQL type)
    read: Callable[[list[Row]], Any]
    set_returning: bool = True

    def query(self, schema: str) -> sql.Composed:
        args = sql.SQL(", ").join(
            sql.SQL("{} => {}::{}").format(
                sql.Identifier(name), sql.Placeholder(name), sql.SQL(sqltype)
            )
            for name, sqltype in self.params
        )
        target = sql.SQL("SELECT * FROM {}.{}({})")
        if not self.set_returning:
            target = sql.SQL("SELECT {}.{}({}) AS value")
        return target.format(sql.Identifier(schema), sql.Identifier(self.function), args)

    def bind(self, values: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, sqltype in self.params:
            value = values[name]
            if sqltype == "jsonb" and value is not None:
                value = Jsonb(value)
            elif sqltype == "timestamptz":
                aware(name, value)
            out[name] = value
        return out


def aware(name: str, value: Any) -> None:
    """Refuse a naive datetime: the server would read it in its own time
    zone, which is rarely the caller's, and run it hours early or late."""
    if isinstance(value, datetime) and value.tzinfo is None:
        raise ValueError(
            f"{name} must be a timezone-aware datetime, got naive {value.isoformat()}: "
            f"use datetime.now(UTC) or attach a tzinfo"
        )


def _scalar(rows: list[Row]) -> Any:
    return rows[0]["value"]


def _enum(cls: Callable[[str], Any]) -> Callable[[list[Row]], Any]:
    return lambda rows: cls(rows[0]["value"])


def _each(cls: Callable[..., Any], **convert: Callable[[Any], Any]) -> Callable[[list[Row]], Any]:
    def read(rows: list[Row]) -> list[Any]:
        out = []
        for row in rows:
            for key, fn in convert.items():
                if row.get(key) is not None:
                    row[key] = fn(row[key])
            out.append(cls(**row))
        return out

    return read


def _one(cls: Callable[..., Any], **convert: Callable[[Any], Any]) -> Callable[[list[Row]], Any]:
    many = _each(cls, **convert)
    return lambda rows: many(rows)[0] if rows else None


FENCE = (("run_id", "text"), ("attempt", "integer"), ("lease_token", "uuid"))

OPERATIONS: dict[str, Operation] = {
    op.function: op
    for op in (
        Operation("get_schema_version", (), _scalar, set_returning=False),
        Operation(
            "enqueue_run",
            (
                ("run_id", "text"),
                ("queue", "text"),
                ("payload", "jsonb"),
                ("run_at", "timestamptz"),
                ("priority", "integer"),
                ("max_attempts", "integer"),
                ("payload_retention", "text"),
                ("concurrency_key", "text"),
                ("task", "text"),
            ),
            _one(t.EnqueueResult, status=t.RunStatus),
        ),
        Operation(
            "enqueue_runs",
            (("items", "jsonb"),),
            _each(t.EnqueueResult, status=t.RunStatus),
        ),
        Operation(
            "append_events",
            (("run_id", "text"), ("events", "jsonb")),
            _each(t.AppendedEvent),
        ),
        Operation(
            "signal_run",
            (("run_id", "text"), ("name", "text"), ("payload", "jsonb"), ("call_id", "uuid")),
            _enum(t.SignalOutcome),
            set_returning=False,
        ),
        Operation(
            "cancel_run",
            (("run_id", "text"), ("reason", "text"), ("call_id", "uuid")),
            _enum(t.CancelOutcome),
            set_returning=False,
        ),
        Operation(
            "claim_attempts",
            (
                ("worker", "text"),
                ("queues", "text[]"),
                ("max_runs", "integer"),
                ("lease_seconds", "integer"),
                ("call_id", "uuid"),
                ("tasks", "text[]"),
            ),
            _each(t.ClaimedAttempt),
        ),
        Operation(
            "settle_and_claim",
            (
                ("items", "jsonb"),
                ("worker", "text"),
                ("queues", "text[]"),
                ("max_runs", "integer"),
                ("lease_seconds", "integer"),
                ("call_id", "uuid"),
                ("tasks", "text[]"),
            ),
            _each(t.SettleAndClaimRow, kind=t.SettleKind, outcome=t.SettleOutcome),
        ),
        Operation(
            "heartbeat",
            (*FENCE, ("lease_seconds", "integer")),
            _one(t.HeartbeatResult, outcome=t.HeartbeatOutcome),
        ),
        Operation(
            "record_step",
            (*FENCE, ("step", "text"), ("result", "jsonb")),
            _enum(t.StepOutcome),
            set_returning=False,
        ),
        Operation(
            "complete_attempt",
            (*FENCE, ("result", "jsonb"), ("final_events", "jsonb")),
            _enum(t.CompleteOutcome),
            set_returning=False,
        ),
        Operation(
            "complete_attempts",
            (("items", "jsonb"),),
            _each(t.CompletedItem, outcome=t.CompleteOutcome),
        ),
        Operation(
            "fail_attempt",
            (
                *FENCE,
                ("error", "jsonb"),
                ("retry_at", "timestamptz"),
                ("final_events", "jsonb"),
                ("preserve_runner_terminal", "boolean"),
                ("protect_waiting_suspension", "boolean"),
            ),
            _enum(t.FailOutcome),
            set_returning=False,
        ),
        Operation(
            "suspend_attempt",
            (*FENCE, ("wait", "jsonb"), ("final_events", "jsonb")),
            _enum(t.SuspendOutcome),
            set_returning=False,
        ),
        Operation(
            "release_attempt",
            (*FENCE, ("run_at", "timestamptz"), ("reason", "text")),
            _enum(t.ReleaseOutcome),
            set_returning=False,
        ),
        Operation("prepare_waiting_failure", FENCE, _enum(t.PrepareOutcome), set_returning=False),
        Operation(
            "record_runner_terminal",
            (("run_id", "text"), ("attempt", "integer"), ("result", "jsonb")),
            _enum(t.RunnerTerminalOutcome),
            set_returning=False,
        ),
        Operation("claim_detached_terminal", FENCE, _scalar, set_returning=False),
        Operation(
            "read_runner_terminal",
            (("run_id", "text"), ("attempt", "integer")),
            _one(t.RunnerTerminal),
        ),
        Operation(
            "reap_expired",
            (("max_attempts", "integer"),),
            _each(t.ReapedAttempt, outcome=t.ReapOutcome),
        ),
        Operation(
            "claim_ledger",
            (
                ("relay", "text"),
                ("lane", "text"),
                ("run_id", "text"),
                ("max_events", "integer"),
                ("lease_seconds", "integer"),
                ("wait_for_run", "boolean"),
                ("expected_head", "bigint"),
                ("batch", "boolean"),
                ("call_id", "uuid"),
            ),
            _each(t.LedgerEvent, kind=t.LedgerKind),
        ),
        Operation(
            "ack_ledger",
            (
                ("relay", "text"),
                ("run_id", "text"),
                ("event_ids", "bigint[]"),
                ("claim_next", "integer"),
                ("lease_seconds", "integer"),
                ("batch", "boolean"),
            ),
            _each(t.LedgerEvent, kind=t.LedgerKind),
        ),
        Operation(
            "renew_ledger_lease",
            (("relay", "text"), ("event_ids", "bigint[]"), ("lease_seconds", "integer")),
            _each(t.RenewedLease),
        ),
        Operation(
            "release_ledger",
            (("relay", "text"), ("event_ids", "bigint[]")),
            _scalar,
            set_returning=False,
        ),
        Operation(
            "fail_ledger",
            (
                ("relay", "text"),
                ("event_ids", "bigint[]"),
                ("error", "jsonb"),
                ("retry_at", "timestamptz"),
                ("permanent", "boolean"),
            ),
            _each(t.LedgerFailure, outcome=t.LedgerFailOutcome),
        ),
        Operation(
            "ledger_next_due_at",
            (("lane", "text"), ("run_id", "text")),
            _scalar,
            set_returning=False,
        ),
        Operation("requeue_ledger_event", (("event_id", "bigint"),), _scalar, set_returning=False),
        Operation(
            "prune",
            (("delivered_before", "timestamptz"), ("max_rows", "integer")),
            _scalar,
            set_returning=False,
        ),
        Operation(
            "list_runs",
            (
                ("queue", "text"),
                ("status", "text"),
                ("concurrency_key", "text"),
                ("created_after", "timestamptz"),
                ("created_before", "timestamptz"),
                ("finished_before", "timestamptz"),
                ("after_created_at", "timestamptz"),
                ("after_run_id", "text"),
                ("max_rows", "integer"),
            ),
            _each(t.RunSummary, status=t.RunStatus),
        ),
        Operation("get_run", (("run_id", "text"),), _one(t.RunDetail, status=t.RunStatus)),
        Operation(
            "run_attempts",
            (("run_id", "text"), ("after_attempt", "integer"), ("max_rows", "integer")),
            _each(t.RunAttempt, status=t.AttemptStatus),
        ),
        Operation(
            "run_steps",
            (("run_id", "text"), ("after_position", "integer"), ("max_rows", "integer")),
            _each(t.RunStep),
        ),
        Operation(
            "run_ledger_events",
            (
                ("run_id", "text"),
                ("lane", "text"),
                ("after_seq", "bigint"),
                ("max_rows", "integer"),
            ),
            _each(t.RunLedgerEvent, lane=t.Lane, state=t.EventState),
        ),
        Operation(
            "retry_run",
            (
                ("run_id", "text"),
                ("max_attempts", "integer"),
                ("run_at", "timestamptz"),
                ("reason", "text"),
                ("requested_by", "text"),
                ("call_id", "uuid"),
            ),
            _enum(t.RetryOutcome),
            set_returning=False,
        ),
        Operation(
            "list_blocked_heads",
            (
                ("lane", "text"),
                ("run_id", "text"),
                ("after_run_id", "text"),
                ("after_lane", "text"),
                ("max_rows", "integer"),
            ),
            _each(t.BlockedHead, lane=t.Lane),
        ),
        Operation(
            "requeue_blocked_heads",
            (("run_id", "text"), ("lane", "text"), ("max_lanes", "integer")),
            _each(t.RequeuedLane, lane=t.Lane),
        ),
        Operation(
            "skip_ledger_events",
            (("run_id", "text"), ("lane", "text"), ("reason", "text"), ("call_id", "uuid")),
            _each(t.SkippedEvent, outcome=t.SkipOutcome),
        ),
        Operation("list_processes", (), _each(t.Process, kind=t.ProcessKind)),
        Operation(
            "pause_queue",
            (("queue", "text"), ("reason", "text"), ("requested_by", "text")),
            _enum(t.PauseOutcome),
            set_returning=False,
        ),
        Operation(
            "resume_queue", (("queue", "text"),), _enum(t.ResumeOutcome), set_returning=False
        ),
        Operation("list_paused_queues", (), _each(t.PausedQueue)),
        Operation("run_trace_context", (("run_id", "text"),), _scalar, set_returning=False),
        Operation(
            "upsert_schedule",
            (
                ("name", "text"),
                ("cron", "text"),
                ("time_zone", "text"),
                ("queue", "text"),
                ("payload", "jsonb"),
                ("priority", "integer"),
                ("max_attempts", "integer"),
                ("concurrency_key", "text"),
                ("missed", "text"),
                ("enabled", "boolean"),
            ),
            _enum(t.ScheduleOutcome),
            set_returning=False,
        ),
        Operation(
            "delete_schedule",
            (("name", "text"),),
            _enum(t.DeleteScheduleOutcome),
            set_returning=False,
        ),
        Operation(
            "list_schedules",
            (("after_name", "text"), ("max_rows", "integer")),
            _each(t.ScheduleInfo, missed=t.MissedSlots),
        ),
        Operation("enqueue_due_schedules", (("max_runs", "integer"),), _each(t.ScheduledRun)),
        Operation("schedules_next_due_at", (), _one(t.ScheduleDue)),
        Operation("queue_overview", (), _each(t.QueueOverview)),
        Operation("ledger_overview", (), _each(t.LaneOverview, lane=t.Lane)),
        Operation("record_queue_activity", (), _scalar, set_returning=False),
        Operation(
            "purge_runs",
            (
                ("finished_before", "timestamptz"),
                ("max_rows", "integer"),
                ("include_undelivered", "boolean"),
            ),
            _scalar,
            set_returning=False,
        ),
    )
}


# -- tracing (runrelay.tracing, docs/operations.md "Tracing") ---------------

# The claims whose claimed runs a tracing client reads the trace contexts of
# in the statement of the claim: function -> the `kind` of a claimed row
# (None: every row is a claim).
TRACED_CLAIMS: dict[str, str | None] = {
    "claim_attempts": None,
    "settle_and_claim": "claimed",
    "claim_ledger": "claimed",
    "ack_ledger": "claimed",
}


def traced_claim_query(schema: str, function: str) -> sql.Composed:
    """A tracing client's statement for a claim of TRACED_CLAIMS: the same
    call, its rows in their order, each claimed row with its run's trace
    context (run_trace_context, one primary-key probe per claimed run) in a
    last column, trace_context, and the ordinality column, which the client
    drops. One statement, so still one round trip."""
    claimed = TRACED_CLAIMS[function]
    only_claims: sql.Composable = sql.SQL("")
    on_claims: sql.Composable = sql.SQL("")
    if claimed is not None:
        only_claims = sql.SQL(" WHERE c.kind = {}").format(sql.Literal(claimed))
        on_claims = sql.SQL(" AND c.kind = {}").format(sql.Literal(claimed))
    call = OPERATIONS[function].query(schema)
    return sql.SQL(
        "WITH c AS ({call} WITH ORDINALITY),"
        " t AS (SELECT d.run_id, {trace}(d.run_id) AS trace_context"
        " FROM (SELECT DISTINCT c.run_id FROM c{only_claims}) AS d)"
        " SELECT c.*, t.trace_context FROM c LEFT JOIN t ON t.run_id = c.run_id{on_claims}"
        " ORDER BY c.ordinality"
    ).format(
        call=call,
        trace=sql.Identifier(schema, "run_trace_context"),
        only_claims=only_claims,
        on_claims=on_claims,
    )


def untraced_rows(rows: list[Row]) -> list[Row]:
    """The rows of a traced claim as `read` takes them: without ordinality."""
    for row in rows:
        del row["ordinality"]
    return rows


# A statement a call sends before or after its own, in the same pipeline.
Statement = tuple[str, Sequence[Any] | None]

# The enqueues a tracing client gives its span's trace context.
TRACED_ENQUEUES = frozenset({"enqueue_run", "enqueue_runs"})
# enqueue_run takes its trace context from the transaction-local setting:
# a tracing client sets it in the same pipeline (one round trip, one implicit
# transaction with the enqueue) and, on a caller's connection (whose
# transaction may go on), clears it again after.
SET_TRACE_CONTEXT = "SELECT set_config('runrelay.trace_context', %s, true)"
CLEAR_TRACE_CONTEXT = "SELECT set_config('runrelay.trace_context', '', true)"


def traced_enqueue(
    function: str,
    values: dict[str, Any],
    trace_context: Mapping[str, str] | None,
    callers_connection: bool,
) -> tuple[dict[str, Any], tuple[Statement, ...], tuple[Statement, ...]]:
    """A tracing client's enqueue: (its values, statements before, after).
    enqueue_runs items without a trace_context of their own get
    `trace_context`; enqueue_run gets it through the setting."""
    if trace_context is None:
        return values, (), ()
    if function == "enqueue_runs":
        items = [
            item if "trace_context" in item else {**item, "trace_context": dict(trace_context)}
            for item in values["items"]
        ]
        return {**values, "items": items}, (), ()
    before: tuple[Statement, ...] = ((SET_TRACE_CONTEXT, (json.dumps(trace_context),)),)
    after: tuple[Statement, ...] = ((CLEAR_TRACE_CONTEXT, None),) if callers_connection else ()
    return values, before, after


def waiting_failure(prepared: t.PrepareOutcome, failed: t.FailOutcome) -> t.WaitingFailureOutcome:
    """The one answer of fail_waiting's two calls: the protected failure's.

    Only that answer is the same on every repeat: an applied failure is the
    outcome the attempt recorded, and a refusal is fence_lost for as long as
    the attempt is not cancelled (then cancelled, as for every fenced write).
    The prepare's answer reads the run as it is now, so it cannot tell a
    repeat from a first call: a prepare that answered `prepared` before a
    signal won answers `not_applicable` once the run is queued, or
    `fence_lost` once a newer attempt waits. It only makes the attempt live
    for the failure, and is not consulted here."""
    del prepared
    return t.WaitingFailureOutcome(str(failed))


def schedule_names(schedules: Sequence[t.Schedule]) -> set[str]:
    """The names of a list of schedules to declare; ValueError on a repeat."""
    names: set[str] = set()
    for schedule in schedules:
        if schedule.name in names:
            raise ValueError(f"schedule {schedule.name!r} is declared twice")
        names.add(schedule.name)
    return names


def view_query(schema: str, view: str) -> sql.Composed:
    return sql.SQL("SELECT * FROM {}.{} ORDER BY 1, 2").format(
        sql.Identifier(schema), sql.Identifier(view)
    )


def complete_items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """complete_attempts items from ClaimedAttempt objects, (attempt, result)
    pairs or plain dicts."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, dict):
            row = dict(item)
            if isinstance(row.get("lease_token"), uuid.UUID):
                row["lease_token"] = str(row["lease_token"])
            out.append(row)
            continue
        result: Any = None
        if isinstance(item, tuple):
            item, result = item
        row = {"run_id": item.run_id, "attempt": item.attempt, "lease_token": str(item.lease_token)}
        if result is not None:
            row["result"] = result
        out.append(row)
    return out


def settle_items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """settle_and_claim items from dicts ({run_id, attempt, lease_token, op?,
    ...}: uuids and datetimes become JSON strings), ClaimedAttempt objects or
    (ClaimedAttempt, result) pairs (completions)."""
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            out.extend(complete_items([item]))
            continue
        row = {}
        for key, value in item.items():
            if isinstance(value, uuid.UUID):
                value = str(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            row[key] = value
        out.append(row)
    return out


def _aware_iso(run_at: datetime) -> str:
    aware("run_at", run_at)
    return run_at.isoformat()


def enqueue_items(items: Sequence[t.EnqueueItem | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """enqueue_runs items from EnqueueItem objects or mappings of enqueue_run's
    keyword arguments, every argument sent as enqueue_run sends it (payload
    None is {}, run_at None is the database clock)."""
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, t.EnqueueItem):
            item = t.EnqueueItem(**item)
        out.append(
            {
                "run_id": item.run_id,
                "queue": item.queue,
                "payload": {} if item.payload is None else item.payload,
                "run_at": None if item.run_at is None else _aware_iso(item.run_at),
                "priority": item.priority,
                "max_attempts": item.max_attempts,
                "payload_retention": item.payload_retention,
                "concurrency_key": item.concurrency_key,
            }
        )
        if item.task is not None:
            out[-1]["task"] = item.task
        if item.trace_context is not None:
            out[-1]["trace_context"] = dict(item.trace_context)
    return out
