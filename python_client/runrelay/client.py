"""runrelay.Client and runrelay.AsyncClient: one method per SQL function.

Both take a conninfo string, a psycopg connection or a psycopg_pool pool;
constructors do no I/O. Every method issues exactly one statement (one round
trip), except `fail_waiting`, a documented helper of two calls. ``conn=`` runs
the call on the caller's connection — inside the caller's transaction if one
is open, which is how a producer enqueues a run or appends events atomically
with its own writes.

The method bodies live once, in `_Methods`; the two classes differ only in
how a statement is executed. Each body returns a `_Call[T]` naming its SQL
function, and the `_operation` descriptor turns it into a method that returns
``T`` on a `Client` and a coroutine of ``T`` on an `AsyncClient` — so a type
checker sees ``client.enqueue_run(...)`` as an `EnqueueResult` and
``await aclient.enqueue_run(...)`` likewise.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from datetime import datetime
from types import MethodType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from . import _operations
from .contract import LEASE_SECONDS_DEFAULT
from .errors import ProxyTransaction, WrongShard, translate
from .types import (
    AppendedEvent,
    BlockedHead,
    CancelOutcome,
    ClaimedAttempt,
    CompletedItem,
    CompleteOutcome,
    DeleteScheduleOutcome,
    EnqueueItem,
    EnqueueResult,
    FailOutcome,
    HeartbeatResult,
    LaneOverview,
    LedgerEvent,
    LedgerFailure,
    PausedQueue,
    PauseOutcome,
    PrepareOutcome,
    Process,
    QueueOverview,
    ReapedAttempt,
    ReleaseOutcome,
    RenewedLease,
    RequeuedLane,
    ResumeOutcome,
    RetryOutcome,
    RunAttempt,
    RunDetail,
    RunLedgerEvent,
    RunnerTerminal,
    RunnerTerminalOutcome,
    RunStep,
    RunSummary,
    Schedule,
    ScheduledRun,
    ScheduleDue,
    ScheduleInfo,
    ScheduleOutcome,
    SettleAndClaimRow,
    SignalOutcome,
    SkippedEvent,
    StepOutcome,
    SuspendOutcome,
    WaitingFailureOutcome,
)

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from .sharding import ShardMap
    from .tracing import Tracing

P = ParamSpec("P")
T = TypeVar("T")
Fetched = _operations.Fetched

# The documentation of Client.fail_waiting and AsyncClient.fail_waiting.
FAIL_WAITING_DOC = """Fail a run that waits on this attempt's suspension, unless the wait
ends first -> WaitingFailureOutcome.

The waiting-failure protocol of the SQL API as one call: it is **two round
trips**, ``prepare_waiting_failure`` then ``fail_attempt(...,
protect_waiting_suspension=True)``, because ``fail_attempt`` writes only for a
live attempt and a suspended one is not live: the prepare makes it live again
*without* ending the wait, and the protected failure applies only if that same
suspension is still in force when it holds the run's locks. Each call is its
own transaction (unless ``conn=`` is inside yours), so a signal, a timeout or a
cancellation may commit between them — and then it wins. The helper answers
what the protected failure answers, and the failure is sent whatever the
prepare answered, so repeating the whole helper after a lost reply answers
exactly what the first call did: an applied failure is the outcome the
attempt recorded, and a refusal stays ``fence_lost`` (``cancelled`` once a
cancellation pending at the first call has been applied, as every fenced
write then answers).

* ``retry_scheduled`` / ``failed`` — the failure applied: the wait is cleared
  and the run retries (``retry_at``, or backoff) or, attempts exhausted, fails;
* ``cancelled`` — a cancel marker won; the run is cancelled;
* ``fence_lost`` — refused, nothing written: this attempt's suspension is not
  (or no longer) the one in force — a signal or timeout woke the run, before
  or after the prepare (the run resumes); a newer attempt exists; a
  cancellation is pending; the token is wrong; or the attempt never suspended
  on a sleep or event wait (it is still running, or waits on a detached
  runner, whose pushed terminal is the runner's to write, see
  claim_detached_terminal).

``not_applicable`` is never answered (it stays in WaitingFailureOutcome for
code that names it): the prepare's ``not_applicable`` reads the run as it is
at each call, so it cannot tell a repeat (the run moved on after the first
call) from a first call.
"""

# The documentation of Client.declare_schedules and AsyncClient.declare_schedules.
DECLARE_SCHEDULES_DOC = """Declare a program's schedules -> {name: outcome}.

One upsert_schedule call per `Schedule` (created, updated or unchanged), so
declaring the same list at every start is cheap and changes nothing. With
``delete_others=True`` the schedules not in the list are deleted afterwards
(list_schedules, then delete_schedule for each: outcome deleted), which
makes the list the whole truth. Each call is its own transaction unless
``conn=`` is inside yours; names must be unique (ValueError otherwise,
before any call).
"""

# psycopg prepares a statement after this many executions on a connection.
# Pass prepare_threshold=None when a pooler in transaction mode cannot keep
# prepared statements (PgBouncer < 1.21, or max_prepared_statements = 0).
DEFAULT_PREPARE_THRESHOLD = 5


def _raise_typed(error: psycopg.Error, shard: int | None = None) -> None:
    typed = translate(error, shard)
    if typed is not None:
        raise typed from error
    raise error


# The producer calls a caller makes inside its own transaction (conn=), and
# the run_ids each names.
_PRODUCER_CALLS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "enqueue_run": lambda values: [values["run_id"]],
    "append_events": lambda values: [values["run_id"]],
    "signal_run": lambda values: [values["run_id"]],
    "cancel_run": lambda values: [values["run_id"]],
    "enqueue_runs": lambda values: [item.get("run_id") for item in values["items"]],
}


def _check_producer_conn(
    shards: ShardMap | None, function: str, values: dict[str, Any], conn: Any
) -> None:
    """A sharded client's check of a producer call on the caller's connection,
    before any SQL and without a round trip (conn.info is local): on the
    proxy it must not be inside a transaction (the proxy commits on the shard
    at once: the caller's rollback would not undo it, ProxyTransaction); on a
    shard, that shard must own every run (WrongShard)."""
    if shards is None or conn is None or function not in _PRODUCER_CALLS:
        return
    run_ids = [r for r in _PRODUCER_CALLS[function](values) if isinstance(r, str)]
    if not run_ids:
        return  # bad input: the server says what is wrong
    connected = next((s for s in shards.shards if shards.same_server(conn, s)), None)
    if connected is None:
        if conn.info.transaction_status == TransactionStatus.INTRANS or not conn.autocommit:
            raise ProxyTransaction(function, run_ids[0])
        return
    for run_id in run_ids:
        owner = shards.shard_for(run_id)
        if owner != connected:
            raise WrongShard(function, run_id, owner, connected)


# A statement psycopg has prepared on a connection goes out as one flight
# (Bind, Execute, Sync) without pipeline mode, which costs a call about 40 µs
# of client CPU and 50 µs of latency. Plain mode is one flight for an
# unnamed statement too, but not on the execution where psycopg prepares it
# (Parse goes first, on its own), so a call goes plain only once psycopg's
# cache holds its statement. psycopg's cache is private: _Prepared reads it
# through the key psycopg filed the statement's last execution under, and
# where either is missing (another psycopg) every call keeps pipeline mode,
# as before. The cache forgets on a ROLLBACK, DISCARD ALL or eviction, and
# the next call then goes in pipeline mode again: one flight either way.
# psycopg leaves the key unread on an execution of a statement it holds
# prepared, so a parameter shape whose first call found its statement
# prepared already (psycopg types a NULL and a list of text alike) keeps
# pipeline mode.
def _shape(value: Any) -> Any:
    """What psycopg types a parameter by: its class, an int's size, a list's
    elements."""
    if type(value) is int:
        return (int, -32768 <= value <= 32767, -(2**31) <= value < 2**31)
    if type(value) is list:
        return (list, _shape(value[0]) if value else None)
    return type(value)


class _Prepared:
    """Per connection, the key of psycopg's statement cache each of the
    client's statements (by query and parameter shapes) was last run under."""

    def __init__(self) -> None:
        self._keys: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()

    def key(self, conn: Any, query: Any, params: dict[str, Any] | None) -> Any:
        """The statement's key, or None when it needs pipeline mode to be one
        flight whatever psycopg has prepared: other statements ride with it,
        or an idle connection outside autocommit sends BEGIN first."""
        if not isinstance(query, str):
            return None  # a sql.Composed, rendered again on each execute anyway
        if not (conn.autocommit or conn.info.transaction_status == TransactionStatus.INTRANS):
            return None
        return (query, tuple(_shape(v) for v in params.values()) if params else ())

    def plain(self, conn: Any, key: Any) -> bool:
        """Whether the statement's execution now is one flight without pipeline
        mode: psycopg never prepares, or holds it prepared."""
        if conn.prepare_threshold is None:
            return True
        filed = self._keys.get(conn, {}).get(key)
        if filed is None:
            return False
        try:
            return filed in conn._prepared._names
        except AttributeError:
            return False

    @staticmethod
    def filed(cur: Any) -> Any:
        """The key psycopg files the cursor's statement under; read right
        after execute (a pipeline's exit clears it)."""
        try:
            return (cur._query.query, cur._query.types)
        except AttributeError:
            return None

    def ran(self, conn: Any, key: Any, filed: Any) -> None:
        """After a successful execution: the key psycopg filed it under."""
        if filed is None:
            return
        keys = self._keys.get(conn)
        if keys is None:
            keys = self._keys.setdefault(conn, {})
        keys[key] = filed


_PREPARED = _Prepared()


def _one_flight(
    conn: psycopg.Connection[Any],
    query: Any,
    params: dict[str, Any] | None,
    before: Sequence[_operations.Statement] = (),
    after: Sequence[_operations.Statement] = (),
) -> Fetched:
    """Execute and fetch in one network round trip. Pipeline mode sends Parse,
    Bind, Execute and Sync together, so even the call on which psycopg first
    prepares the statement (or opens the caller's transaction) is one flight;
    a statement already prepared goes without it (_Prepared). `before` and
    `after` (a tracing client's setting of the trace context) ride the same
    flight and, up to the one Sync, the same transaction."""
    cur = conn.cursor(row_factory=tuple_row)
    _operations.fast_jsonb(cur)
    key = None if before or after else _PREPARED.key(conn, query, params)
    if key is not None and _PREPARED.plain(conn, key):
        cur.execute(query, params)
        filed = _PREPARED.filed(cur)
    else:
        with conn.pipeline():
            for text, args in before:
                conn.cursor().execute(text, args)
            cur.execute(query, params)
            filed = _PREPARED.filed(cur)
            for text, args in after:
                conn.cursor().execute(text, args)
    if key is not None:
        _PREPARED.ran(conn, key, filed)
    return _columns(cur), cur.fetchall()


async def _one_flight_async(
    conn: psycopg.AsyncConnection[Any],
    query: Any,
    params: dict[str, Any] | None,
    before: Sequence[_operations.Statement] = (),
    after: Sequence[_operations.Statement] = (),
) -> Fetched:
    cur = conn.cursor(row_factory=tuple_row)
    _operations.fast_jsonb(cur)
    key = None if before or after else _PREPARED.key(conn, query, params)
    if key is not None and _PREPARED.plain(conn, key):
        await cur.execute(query, params)
        filed = _PREPARED.filed(cur)
    else:
        async with conn.pipeline():
            for text, args in before:
                await conn.cursor().execute(text, args)
            await cur.execute(query, params)
            filed = _PREPARED.filed(cur)
            for text, args in after:
                await conn.cursor().execute(text, args)
    if key is not None:
        _PREPARED.ran(conn, key, filed)
    return _columns(cur), await cur.fetchall()


def _columns(cur: Any) -> tuple[str, ...]:
    """The column names of the cursor's result, read from the result itself:
    `description` builds an object per column (10 µs a call of 11 columns,
    against 1.3 µs for this)."""
    result = cur.pgresult
    if result is None:
        return ()
    encoding = cur.connection.info.encoding
    return tuple((result.fname(i) or b"").decode(encoding) for i in range(result.nfields))


def _dicts(fetched: Fetched) -> list[dict[str, Any]]:
    """A view's rows as the client returns them: a dict per row."""
    names, rows = fetched
    return [dict(zip(names, row, strict=True)) for row in rows]


def _tracing_of(tracing: bool | TracerProvider) -> Tracing | None:
    """A client's Tracing: None for tracing=False; for True the global
    TracerProvider's, else the given one's. Imports OpenTelemetry only here."""
    if tracing is False:
        return None
    try:
        from .tracing import Tracing
    except ImportError as err:
        raise ImportError(
            f"tracing needs opentelemetry-api: pip install 'runrelay[tracing]' ({err})"
        ) from err
    return Tracing(None if tracing is True else tracing)


def _queries(schema: str, tracing: Tracing | None) -> dict[str, str]:
    """Each function's statement; a tracing client's claims read their runs'
    trace contexts in the same statement (_operations.traced_claim_query).

    Rendered to text once, here: psycopg renders a sql.Composed again on every
    execute (about 70 µs for a call's statement, a tenth of a one-job worker
    call), while a text query's conversion is cached by psycopg."""
    queries = {name: op.query(schema) for name, op in _operations.OPERATIONS.items()}
    if tracing is not None:
        for name in _operations.TRACED_CLAIMS:
            queries[name] = _operations.traced_claim_query(schema, name)
    return {name: query.as_string(None) for name, query in queries.items()}


def _names(parameter: str, names: Sequence[str] | None) -> list[str] | None:
    """A claim's list of queue or task names. A lone string is refused: it
    is a sequence of letters, and would claim from one-letter queues."""
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(
            f"{parameter} is a list of names, not a string: write {parameter}=[{names!r}]"
        )
    return list(names)


def _shard_of(shards: ShardMap | None, run_id: Any) -> int | None:
    """The shard that owns a per-run call's run, for a sharded client's
    ShardUnavailable (computed only once a call has failed)."""
    if shards is None or not isinstance(run_id, str):
        return None
    return shards.shard_for(run_id)


@contextmanager
def _autocommit(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """One call = one statement = its own transaction, whatever the pool's
    default: an idle connection switches to autocommit locally (no round trip)."""
    if conn.autocommit:
        yield
        return
    conn.autocommit = True
    try:
        yield
    finally:
        conn.autocommit = False


class _Call(Generic[T]):
    """What one API method asks for: a SQL function of `_operations.OPERATIONS`, its
    argument values and the caller's connection (or None). ``T`` is the type
    that function's `read` makes of its rows; the method body declares it."""

    __slots__ = ("conn", "function", "values")

    def __init__(self, function: str, values: dict[str, Any], conn: Any) -> None:
        self.function = function
        self.values = values
        self.conn = conn

    @classmethod
    def known(cls, answer: T) -> _Call[T]:
        """A call whose answer is known without asking the server (no round
        trip): enqueue_runs of no items is no runs."""
        return cls("", {"answer": answer}, None)


class _operation(Generic[P, T]):
    """Makes a `_Methods` body returning `_Call[T]` an API method.

    Read on a `Client`, it is a method with the body's parameters returning
    ``T``; on an `AsyncClient`, one returning a coroutine of ``T``; on either
    class, this descriptor, which can also be called with the client first.
    Both run the body, then the client's `_call` hook."""

    def __init__(self, body: Callable[Concatenate[_Methods, P], _Call[T]]) -> None:
        self._body = body
        functools.update_wrapper(self, body)
        # help() and inspect.signature show what the method returns, not the
        # _Call[...] the body hands to the client.
        signature = inspect.signature(body)
        result = signature.return_annotation
        if isinstance(result, str) and result.startswith("_Call[") and result.endswith("]"):
            signature = signature.replace(return_annotation=result[len("_Call[") : -1])
        self.__signature__ = signature

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> Self: ...
    @overload
    def __get__(self, instance: Client, owner: type[Any] | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, instance: AsyncClient, owner: type[Any] | None = None
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, instance: _Methods | None, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        return MethodType(self, instance)

    @overload
    def __call__(self, client: Client, /, *args: P.args, **kwargs: P.kwargs) -> T: ...
    @overload
    def __call__(
        self, client: AsyncClient, /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, T]: ...
    def __call__(self, client: _Methods, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        call = self._body(client, *args, **kwargs)
        if not call.function:
            return client._answered(call.values["answer"])
        return client._call(call.function, call.values, call.conn)


class _Methods:
    """Every API method, written once: a body returning `_Call[result type]`
    under `@_operation`. `_call` runs a call and returns its result (Client)
    or a coroutine of it (AsyncClient)."""

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
        raise NotImplementedError

    def _answered(self, answer: Any) -> Any:
        """A known answer, as `_call` returns one (a coroutine on AsyncClient)."""
        return answer

    # §3.1 producers --------------------------------------------------------
    @_operation
    def enqueue_run(
        self,
        run_id: str,
        queue: str = "default",
        payload: Any = None,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int = 3,
        payload_retention: str = "keep",
        concurrency_key: str | None = None,
        task: str | None = None,
        *,
        conn: Any = None,
    ) -> _Call[EnqueueResult]:
        """Create a run (or return the identical existing one) -> EnqueueResult.

        `run_at`: not before this moment (a timezone-aware datetime; None:
        now by the database clock). `priority`: higher runs first (-1 000 000
        to 1 000 000). `max_attempts`: failed attempts before the run fails
        (1 to 1 000). `payload_retention`: `keep`, or `drop_on_delivery` to
        drop the ledger payloads once delivered. `concurrency_key`: runs
        sharing it run one at a time, in enqueue order. `task` names the task
        that handles it (runrelay.Tasks; None: untyped)."""
        return _Call(
            "enqueue_run",
            {
                "run_id": run_id,
                "queue": queue,
                "payload": {} if payload is None else payload,
                "run_at": run_at,
                "priority": priority,
                "max_attempts": max_attempts,
                "payload_retention": payload_retention,
                "concurrency_key": concurrency_key,
                "task": task,
            },
            conn,
        )

    @_operation
    def enqueue_runs(
        self, items: Sequence[EnqueueItem | Mapping[str, Any]], *, conn: Any = None
    ) -> _Call[list[EnqueueResult]]:
        """Enqueue many runs in one round trip -> list[EnqueueResult], one per
        item in order. Items are `EnqueueItem`s or mappings of enqueue_run's
        keyword arguments; each is decided as enqueue_run would decide it.
        No items: no runs, and no round trip."""
        if not items:
            return _Call.known([])
        return _Call("enqueue_runs", {"items": _operations.enqueue_items(items)}, conn)

    @_operation
    def append_events(
        self, run_id: str, events: Sequence[Any], *, conn: Any = None
    ) -> _Call[list[AppendedEvent]]:
        """Append events to a run's ledger -> list[AppendedEvent]."""
        return _Call("append_events", {"run_id": run_id, "events": list(events)}, conn)

    @_operation
    def signal_run(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[SignalOutcome]:
        """Send a named event to a run -> SignalOutcome.

        ``call_id`` names this call (a fresh uuid when omitted): repeating the
        call with the same id after a lost reply answers the first outcome
        and stores nothing twice."""
        values = {
            "run_id": run_id,
            "name": name,
            "payload": {} if payload is None else payload,
            "call_id": uuid.uuid4() if call_id is None else call_id,
        }
        return _Call("signal_run", values, conn)

    @_operation
    def cancel_run(
        self,
        run_id: str,
        reason: str | None = None,
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[CancelOutcome]:
        """Cancel a run without waiting for its locks -> CancelOutcome.

        ``call_id`` names this call (a fresh uuid when omitted): repeating the
        call with the same id after a lost reply answers the first outcome."""
        values = {
            "run_id": run_id,
            "reason": reason,
            "call_id": uuid.uuid4() if call_id is None else call_id,
        }
        return _Call("cancel_run", values, conn)

    # §3.2 workers ----------------------------------------------------------
    @_operation
    def claim_attempts(
        self,
        worker: str,
        queues: Sequence[str] | None = None,
        max_runs: int = 1,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        call_id: uuid.UUID | None = None,
        tasks: Sequence[str] | None = None,
        *,
        conn: Any = None,
    ) -> _Call[list[ClaimedAttempt]]:
        """Claim up to `max_runs` runnable runs, best first (higher priority,
        then earlier run_at) -> list[ClaimedAttempt]; each lease lasts
        `lease_seconds` (clamped to 5..300) from the grant. `queues`: a list
        of queue names (None: every queue); `tasks`: only runs of those tasks
        (None: any run). After a lost reply, repeat with the same call_id."""
        values = {
            "worker": worker,
            "queues": _names("queues", queues),
            "max_runs": max_runs,
            "lease_seconds": lease_seconds,
            "call_id": call_id,
            "tasks": _names("tasks", tasks),
        }
        return _Call("claim_attempts", values, conn)

    @_operation
    def settle_and_claim(
        self,
        items: Sequence[Any],
        worker: str,
        queues: Sequence[str] | None = None,
        max_runs: int = 1,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        call_id: uuid.UUID | None = None,
        tasks: Sequence[str] | None = None,
        *,
        conn: Any = None,
    ) -> _Call[list[SettleAndClaimRow]]:
        """Settle attempts and claim the next runs in one round trip and one
        transaction -> list[SettleAndClaimRow]: a SETTLED row per item, in item
        order, then a CLAIMED row per claimed run (``row.claim`` is its
        ClaimedAttempt). Items are dicts ``{run_id, attempt, lease_token, op?,
        ...}`` (op complete, fail, suspend or release, with that function's
        fields), ClaimedAttempt objects or (ClaimedAttempt, result) pairs.
        After a lost reply, repeat the call with the same call_id."""
        values = {
            "items": _operations.settle_items(items),
            "worker": worker,
            "queues": _names("queues", queues),
            "max_runs": max_runs,
            "lease_seconds": lease_seconds,
            "call_id": call_id,
            "tasks": _names("tasks", tasks),
        }
        return _Call("settle_and_claim", values, conn)

    @_operation
    def heartbeat(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        *,
        conn: Any = None,
    ) -> _Call[HeartbeatResult]:
        """Extend a lease -> HeartbeatResult."""
        values = {
            "run_id": run_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "lease_seconds": lease_seconds,
        }
        return _Call("heartbeat", values, conn)

    @_operation
    def record_step(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        step: str,
        result: Any,
        *,
        conn: Any = None,
    ) -> _Call[StepOutcome]:
        """Store a step's JSON result on the run from its live attempt ->
        StepOutcome. Every later claim of the run returns it in ``steps``;
        a step of that name already stored keeps its result
        (ALREADY_RECORDED). Handlers use ``job.step`` instead."""
        values = {
            "run_id": run_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "step": step,
            "result": result,
        }
        return _Call("record_step", values, conn)

    @_operation
    def complete_attempt(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        result: Any = None,
        final_events: Sequence[Any] = (),
        *,
        conn: Any = None,
    ) -> _Call[CompleteOutcome]:
        """Complete a run from its live attempt -> CompleteOutcome."""
        values = {
            "run_id": run_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "result": {} if result is None else result,
            "final_events": list(final_events),
        }
        return _Call("complete_attempt", values, conn)

    @_operation
    def complete_attempts(
        self, items: Sequence[Any], *, conn: Any = None
    ) -> _Call[list[CompletedItem]]:
        """Complete a batch in one round trip -> list[CompletedItem]. Items are
        ClaimedAttempt objects, (ClaimedAttempt, result) pairs or dicts."""
        return _Call("complete_attempts", {"items": _operations.complete_items(items)}, conn)

    @_operation
    def fail_attempt(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        error: Any,
        retry_at: datetime | None = None,
        final_events: Sequence[Any] = (),
        preserve_runner_terminal: bool = False,
        protect_waiting_suspension: bool = False,
        *,
        conn: Any = None,
    ) -> _Call[FailOutcome]:
        """Fail a live attempt -> FailOutcome."""
        values = {
            "run_id": run_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "error": error,
            "retry_at": retry_at,
            "final_events": list(final_events),
            "preserve_runner_terminal": preserve_runner_terminal,
            "protect_waiting_suspension": protect_waiting_suspension,
        }
        return _Call("fail_attempt", values, conn)

    @_operation
    def suspend_attempt(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        wait: dict[str, Any],
        final_events: Sequence[Any] = (),
        *,
        conn: Any = None,
    ) -> _Call[SuspendOutcome]:
        """Suspend a live attempt on a typed wait -> SuspendOutcome."""
        values = {
            "run_id": run_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "wait": wait,
            "final_events": list(final_events),
        }
        return _Call("suspend_attempt", values, conn)

    @_operation
    def release_attempt(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        run_at: datetime | None = None,
        reason: str | None = None,
        *,
        conn: Any = None,
    ) -> _Call[ReleaseOutcome]:
        """Hand a live attempt back without consuming one of max_attempts (a
        shutdown, a snooze); the run is queued at run_at, or now -> ReleaseOutcome."""
        values = {
            "run_id": run_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "run_at": run_at,
            "reason": reason,
        }
        return _Call("release_attempt", values, conn)

    @_operation
    def prepare_waiting_failure(
        self, run_id: str, attempt: int, lease_token: uuid.UUID, *, conn: Any = None
    ) -> _Call[PrepareOutcome]:
        """Prepare a waiting run's attempt for a protected failure -> PrepareOutcome."""
        values = {"run_id": run_id, "attempt": attempt, "lease_token": lease_token}
        return _Call("prepare_waiting_failure", values, conn)

    @_operation
    def record_runner_terminal(
        self, run_id: str, attempt: int, result: Any, *, conn: Any = None
    ) -> _Call[RunnerTerminalOutcome]:
        """A detached runner pushes its terminal -> RunnerTerminalOutcome."""
        values = {"run_id": run_id, "attempt": attempt, "result": result}
        return _Call("record_runner_terminal", values, conn)

    @_operation
    def claim_detached_terminal(
        self, run_id: str, attempt: int, lease_token: uuid.UUID, *, conn: Any = None
    ) -> _Call[bool]:
        """Take a detached wait back for its terminal write -> bool."""
        values = {"run_id": run_id, "attempt": attempt, "lease_token": lease_token}
        return _Call("claim_detached_terminal", values, conn)

    @_operation
    def read_runner_terminal(
        self, run_id: str, attempt: int, *, conn: Any = None
    ) -> _Call[RunnerTerminal | None]:
        """The pushed runner terminal -> RunnerTerminal | None (no such attempt)."""
        return _Call("read_runner_terminal", {"run_id": run_id, "attempt": attempt}, conn)

    @_operation
    def reap_expired(
        self, max_attempts: int = 100, *, conn: Any = None
    ) -> _Call[list[ReapedAttempt]]:
        """End expired leases, apply stranded cancellations -> list[ReapedAttempt]."""
        return _Call("reap_expired", {"max_attempts": max_attempts}, conn)

    # §3.3 relays -----------------------------------------------------------
    @_operation
    def claim_ledger(
        self,
        relay: str,
        lane: str = "lifecycle",
        run_id: str | None = None,
        max_events: int = 1,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        wait_for_run: bool = False,
        expected_head: int | None = None,
        batch: bool = False,
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[list[LedgerEvent]]:
        """Lease the next deliverable events -> list[LedgerEvent]."""
        values = {
            "relay": relay,
            "lane": lane,
            "run_id": run_id,
            "max_events": max_events,
            "lease_seconds": lease_seconds,
            "wait_for_run": wait_for_run,
            "expected_head": expected_head,
            "batch": batch,
            "call_id": call_id,
        }
        return _Call("claim_ledger", values, conn)

    @_operation
    def ack_ledger(
        self,
        relay: str,
        run_id: str,
        event_ids: Sequence[int],
        claim_next: int = 0,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        batch: bool = False,
        *,
        conn: Any = None,
    ) -> _Call[list[LedgerEvent]]:
        """Acknowledge delivered events and claim the next prefix -> list[LedgerEvent]."""
        values = {
            "relay": relay,
            "run_id": run_id,
            "event_ids": list(event_ids),
            "claim_next": claim_next,
            "lease_seconds": lease_seconds,
            "batch": batch,
        }
        return _Call("ack_ledger", values, conn)

    @_operation
    def claim_ledger_runs(
        self,
        relay: str,
        lane: str = "lifecycle",
        max_runs: int = 10,
        max_events: int = 100,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[list[LedgerEvent]]:
        """Lease the next batches of up to max_runs runs' lanes, in run_id and
        seq order -> list[LedgerEvent]."""
        values = {
            "relay": relay,
            "lane": lane,
            "max_runs": max_runs,
            "max_events": max_events,
            "lease_seconds": lease_seconds,
            "call_id": call_id,
        }
        return _Call("claim_ledger_runs", values, conn)

    @_operation
    def ack_ledger_runs(
        self,
        relay: str,
        event_ids: Sequence[int],
        claim_runs: int = 0,
        max_events: int = 100,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        lane: str = "lifecycle",
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[list[LedgerEvent]]:
        """Acknowledge delivered events of several runs, then claim the next
        runs' batches -> list[LedgerEvent] (delivered rows without their
        payload)."""
        values = {
            "relay": relay,
            "event_ids": list(event_ids),
            "claim_runs": claim_runs,
            "max_events": max_events,
            "lease_seconds": lease_seconds,
            "lane": lane,
            "call_id": call_id,
        }
        return _Call("ack_ledger_runs", values, conn)

    @_operation
    def renew_ledger_lease(
        self,
        relay: str,
        event_ids: Sequence[int],
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        *,
        conn: Any = None,
    ) -> _Call[list[RenewedLease]]:
        """Extend held leases -> list[RenewedLease]."""
        values = {"relay": relay, "event_ids": list(event_ids), "lease_seconds": lease_seconds}
        return _Call("renew_ledger_lease", values, conn)

    @_operation
    def release_ledger(
        self, relay: str, event_ids: Sequence[int], *, conn: Any = None
    ) -> _Call[int]:
        """Hand leases back without charging an attempt -> int."""
        return _Call("release_ledger", {"relay": relay, "event_ids": list(event_ids)}, conn)

    @_operation
    def fail_ledger(
        self,
        relay: str,
        event_ids: Sequence[int],
        error: Any,
        retry_at: datetime | None = None,
        permanent: bool = False,
        *,
        conn: Any = None,
    ) -> _Call[list[LedgerFailure]]:
        """Record a failed delivery -> list[LedgerFailure]."""
        values = {
            "relay": relay,
            "event_ids": list(event_ids),
            "error": error,
            "retry_at": retry_at,
            "permanent": permanent,
        }
        return _Call("fail_ledger", values, conn)

    @_operation
    def ledger_next_due_at(
        self, lane: str | None = None, run_id: str | None = None, *, conn: Any = None
    ) -> _Call[datetime | None]:
        """The earliest moment claimable ledger work exists -> datetime | None."""
        return _Call("ledger_next_due_at", {"lane": lane, "run_id": run_id}, conn)

    @_operation
    def requeue_ledger_event(self, event_id: int, *, conn: Any = None) -> _Call[bool]:
        """Unblock a failed event -> bool."""
        return _Call("requeue_ledger_event", {"event_id": event_id}, conn)

    @_operation
    def prune(
        self, delivered_before: datetime, max_rows: int = 10000, *, conn: Any = None
    ) -> _Call[int]:
        """Delete delivered events older than the cut-off -> int."""
        values = {"delivered_before": delivered_before, "max_rows": max_rows}
        return _Call("prune", values, conn)

    # Admin: finding, inspecting and acting on runs (docs/admin.md) ---------
    @_operation
    def list_runs(
        self,
        queue: str | None = None,
        status: str | None = None,
        concurrency_key: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        finished_before: datetime | None = None,
        after_created_at: datetime | None = None,
        after_run_id: str | None = None,
        max_rows: int = 100,
        *,
        conn: Any = None,
    ) -> _Call[list[RunSummary]]:
        """One page of runs, newest first -> list[RunSummary]. The next page:
        pass the last row's created_at and run_id as after_created_at and
        after_run_id."""
        values = {
            "queue": queue,
            "status": None if status is None else str(status),
            "concurrency_key": concurrency_key,
            "created_after": created_after,
            "created_before": created_before,
            "finished_before": finished_before,
            "after_created_at": after_created_at,
            "after_run_id": after_run_id,
            "max_rows": max_rows,
        }
        return _Call("list_runs", values, conn)

    @_operation
    def get_run(self, run_id: str, *, conn: Any = None) -> _Call[RunDetail | None]:
        """One run with every column and its pending cancellation -> RunDetail | None."""
        return _Call("get_run", {"run_id": run_id}, conn)

    @_operation
    def run_attempts(
        self, run_id: str, after_attempt: int = 0, max_rows: int = 100, *, conn: Any = None
    ) -> _Call[list[RunAttempt]]:
        """A run's attempts in order, a page at a time -> list[RunAttempt]."""
        values = {"run_id": run_id, "after_attempt": after_attempt, "max_rows": max_rows}
        return _Call("run_attempts", values, conn)

    @_operation
    def run_steps(
        self, run_id: str, after_position: int = 0, max_rows: int = 100, *, conn: Any = None
    ) -> _Call[list[RunStep]]:
        """A run's recorded steps in the order they were recorded, a page at
        a time -> list[RunStep]."""
        values = {"run_id": run_id, "after_position": after_position, "max_rows": max_rows}
        return _Call("run_steps", values, conn)

    @_operation
    def run_ledger_events(
        self,
        run_id: str,
        lane: str | None = None,
        after_seq: int = 0,
        max_rows: int = 100,
        *,
        conn: Any = None,
    ) -> _Call[list[RunLedgerEvent]]:
        """A run's ledger events with their delivery state, in seq order, a page
        at a time -> list[RunLedgerEvent]."""
        values = {
            "run_id": run_id,
            "lane": None if lane is None else str(lane),
            "after_seq": after_seq,
            "max_rows": max_rows,
        }
        return _Call("run_ledger_events", values, conn)

    @_operation
    def retry_run(
        self,
        run_id: str,
        max_attempts: int | None = None,
        run_at: datetime | None = None,
        reason: str | None = None,
        requested_by: str | None = None,
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[RetryOutcome]:
        """Queue a failed or cancelled run again as a new attempt series -> RetryOutcome.

        ``call_id`` names this call (a fresh uuid when omitted): repeating the
        call with the same id after a lost reply answers the first outcome."""
        values = {
            "run_id": run_id,
            "max_attempts": max_attempts,
            "run_at": run_at,
            "reason": reason,
            "requested_by": requested_by,
            "call_id": uuid.uuid4() if call_id is None else call_id,
        }
        return _Call("retry_run", values, conn)

    @_operation
    def list_blocked_heads(
        self,
        lane: str | None = None,
        run_id: str | None = None,
        after_run_id: str | None = None,
        after_lane: str | None = None,
        max_rows: int = 100,
        *,
        conn: Any = None,
    ) -> _Call[list[BlockedHead]]:
        """Lanes blocked behind a failed head, a page at a time -> list[BlockedHead]."""
        values = {
            "lane": None if lane is None else str(lane),
            "run_id": run_id,
            "after_run_id": after_run_id,
            "after_lane": None if after_lane is None else str(after_lane),
            "max_rows": max_rows,
        }
        return _Call("list_blocked_heads", values, conn)

    @_operation
    def requeue_blocked_heads(
        self,
        run_id: str | None = None,
        lane: str | None = None,
        max_lanes: int = 100,
        *,
        conn: Any = None,
    ) -> _Call[list[RequeuedLane]]:
        """Unblock blocked lanes (one run's lane, a run's, or all) -> list[RequeuedLane]."""
        values = {
            "run_id": run_id,
            "lane": None if lane is None else str(lane),
            "max_lanes": max_lanes,
        }
        return _Call("requeue_blocked_heads", values, conn)

    @_operation
    def skip_ledger_events(
        self,
        run_id: str,
        lane: str,
        reason: str | None,
        call_id: uuid.UUID | None = None,
        *,
        conn: Any = None,
    ) -> _Call[list[SkippedEvent]]:
        """End a lane's blocked head (a failed event) as skipped, so that the
        lane delivers its successors -> [SkippedEvent] (SKIPPED, or
        NOT_BLOCKED: nothing changed).

        With ``call_id`` the answer is recorded (not_blocked too), and a
        repeat with the same id after a lost reply answers the first rows;
        without one, not_blocked writes nothing."""
        values = {"run_id": run_id, "lane": str(lane), "reason": reason, "call_id": call_id}
        return _Call("skip_ledger_events", values, conn)

    @_operation
    def list_processes(self, *, conn: Any = None) -> _Call[list[Process]]:
        """The workers and relays seen in the last hour or holding work now
        -> [Process] (workers first, then relays, by name)."""
        return _Call("list_processes", {}, conn)

    @_operation
    def pause_queue(
        self,
        queue: str,
        reason: str | None = None,
        requested_by: str | None = None,
        *,
        conn: Any = None,
    ) -> _Call[PauseOutcome]:
        """Stop claims from taking runs of a queue -> PauseOutcome."""
        values = {"queue": queue, "reason": reason, "requested_by": requested_by}
        return _Call("pause_queue", values, conn)

    @_operation
    def resume_queue(self, queue: str, *, conn: Any = None) -> _Call[ResumeOutcome]:
        """Let claims take runs of a paused queue again -> ResumeOutcome."""
        return _Call("resume_queue", {"queue": queue}, conn)

    @_operation
    def list_paused_queues(self, *, conn: Any = None) -> _Call[list[PausedQueue]]:
        """The paused queues -> list[PausedQueue]."""
        return _Call("list_paused_queues", {}, conn)

    @_operation
    def purge_runs(
        self,
        finished_before: datetime,
        max_rows: int = 1000,
        include_undelivered: bool = False,
        *,
        conn: Any = None,
    ) -> _Call[int]:
        """Delete up to max_rows runs that ended before the cut-off, with all
        their rows -> int (call again until 0)."""
        values = {
            "finished_before": finished_before,
            "max_rows": max_rows,
            "include_undelivered": include_undelivered,
        }
        return _Call("purge_runs", values, conn)

    @_operation
    def run_trace_context(self, run_id: str, *, conn: Any = None) -> _Call[dict[str, str] | None]:
        """The W3C trace context a run was enqueued with -> dict | None (none,
        or no such run). A tracing client's claims read it themselves."""
        return _Call("run_trace_context", {"run_id": run_id}, conn)

    @_operation
    def upsert_schedule(
        self,
        name: str,
        cron: str,
        time_zone: str = "UTC",
        queue: str = "default",
        payload: Any = None,
        priority: int = 0,
        max_attempts: int = 3,
        concurrency_key: str | None = None,
        missed: str = "skip",
        enabled: bool = True,
        *,
        conn: Any = None,
    ) -> _Call[ScheduleOutcome]:
        """Declare or change a schedule, one run per slot of a cron expression
        in a time zone -> ScheduleOutcome."""
        values = {
            "name": name,
            "cron": cron,
            "time_zone": time_zone,
            "queue": queue,
            "payload": {} if payload is None else payload,
            "priority": priority,
            "max_attempts": max_attempts,
            "concurrency_key": concurrency_key,
            "missed": str(missed),
            "enabled": enabled,
        }
        return _Call("upsert_schedule", values, conn)

    @_operation
    def delete_schedule(self, name: str, *, conn: Any = None) -> _Call[DeleteScheduleOutcome]:
        """Delete a schedule; the runs it enqueued stay -> DeleteScheduleOutcome."""
        return _Call("delete_schedule", {"name": name}, conn)

    @_operation
    def list_schedules(
        self, after_name: str | None = None, max_rows: int = 100, *, conn: Any = None
    ) -> _Call[list[ScheduleInfo]]:
        """The schedules by name, a page at a time -> list[ScheduleInfo]."""
        return _Call("list_schedules", {"after_name": after_name, "max_rows": max_rows}, conn)

    @_operation
    def enqueue_due_schedules(
        self, max_runs: int = 100, *, conn: Any = None
    ) -> _Call[list[ScheduledRun]]:
        """Enqueue the runs of due schedule slots, each slot once -> list[ScheduledRun]
        (the maintenance loop calls it every round)."""
        return _Call("enqueue_due_schedules", {"max_runs": max_runs}, conn)

    @_operation
    def schedules_next_due_at(self, *, conn: Any = None) -> _Call[ScheduleDue]:
        """The earliest next slot and the milliseconds until it -> ScheduleDue."""
        return _Call("schedules_next_due_at", {}, conn)

    @_operation
    def queue_overview(self, *, conn: Any = None) -> _Call[list[QueueOverview]]:
        """Each queue's backlog by state and its runs ended in the last hour,
        per minute -> list[QueueOverview] (admin role)."""
        return _Call("queue_overview", {}, conn)

    @_operation
    def ledger_overview(self, *, conn: Any = None) -> _Call[list[LaneOverview]]:
        """Per lane kind: lanes with undelivered events, leased and blocked
        ones, and the delivery lag -> list[LaneOverview] (admin role)."""
        return _Call("ledger_overview", {}, conn)

    @_operation
    def record_queue_activity(self, *, conn: Any = None) -> _Call[int]:
        """Finalize the minutes of queue activity at least 2 minutes old ->
        how many (0: none due, or another caller holds the rollup); the
        maintenance loop calls it every round."""
        return _Call("record_queue_activity", {}, conn)

    @_operation
    def get_schema_version(self, *, conn: Any = None) -> _Call[str]:
        """The Alembic revision of the installed functions -> str."""
        return _Call("get_schema_version", {}, conn)


class Client(_Methods):
    """Synchronous client (psycopg 3, autocommit connections).

    `on_call(function, seconds)`, if given, is called after every successful
    call with its latency: a hook for metrics.

    `tracing=True` (the global TracerProvider) or `tracing=provider` makes
    the client trace with OpenTelemetry (runrelay.tracing; the
    `runrelay[tracing]` extra): a span per enqueue whose trace context the
    run keeps, and claims that read it, so that the Worker and Relay on this
    client continue the run's trace. Still one round trip per call."""

    def __init__(
        self,
        source: str | psycopg.Connection[Any] | Any,
        *,
        schema: str = "runrelay",
        prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
        on_call: Callable[[str, float], None] | None = None,
        tracing: bool | TracerProvider = False,
        shards: ShardMap | None = None,
    ) -> None:
        self.schema = schema
        self.shards = shards
        self._source = source
        self._prepare_threshold = prepare_threshold
        self._on_call = on_call
        self._own: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self.tracing = _tracing_of(tracing)
        self._queries = _queries(schema, self.tracing)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one call: the pool's, the one given, or our own.
        One call at a time on a single connection (given or our own): a
        worker's threads share the client, and a call is a pipeline that
        another call on the same connection would break."""
        source = self._source
        if isinstance(source, psycopg.Connection):
            with self._lock:
                yield source
        elif isinstance(source, str):
            with self._lock:
                if self._own is None or self._own.closed:
                    self._own = psycopg.connect(
                        source, autocommit=True, prepare_threshold=self._prepare_threshold
                    )
                yield self._own
        else:  # a psycopg_pool.ConnectionPool
            with source.connection() as pooled, _autocommit(pooled):
                yield pooled

    def _execute(
        self,
        function: str,
        values: dict[str, Any],
        conn: Any,
        before: Sequence[_operations.Statement] = (),
        after: Sequence[_operations.Statement] = (),
    ) -> Fetched:
        params = _operations.OPERATIONS[function].bind(values)
        run_id = values.get("run_id")
        rows = self._fetch(self._queries[function], params, conn, before, after, run_id)
        if self.tracing is not None and function in _operations.TRACED_CLAIMS:
            rows = _operations.untraced_rows(rows)
        return rows

    def _fetch(
        self,
        query: Any,
        params: dict[str, Any] | None,
        conn: Any,
        before: Sequence[_operations.Statement] = (),
        after: Sequence[_operations.Statement] = (),
        run_id: Any = None,
    ) -> Fetched:
        try:
            if conn is not None:
                return _one_flight(conn, query, params, before, after)
            with self.connection() as c:
                return _one_flight(c, query, params, before, after)
        except psycopg.Error as error:
            _raise_typed(error, _shard_of(self.shards, run_id))
            raise  # unreachable: _raise_typed always raises

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
        _check_producer_conn(self.shards, function, values, conn)
        if self.tracing is not None and function in _operations.TRACED_ENQUEUES:
            with self.tracing.enqueue(function, values) as (span, context):
                traced, before, after = _operations.traced_enqueue(
                    function, values, context, conn is not None
                )
                result = self._run(function, traced, conn, before, after)
                self.tracing.enqueued(span, result)
                return result
        return self._run(function, values, conn)

    def _run(
        self,
        function: str,
        values: dict[str, Any],
        conn: Any,
        before: Sequence[_operations.Statement] = (),
        after: Sequence[_operations.Statement] = (),
    ) -> Any:
        started = time.perf_counter()
        rows = self._execute(function, values, conn, before, after)
        if self._on_call is not None:
            self._on_call(function, time.perf_counter() - started)
        return _operations.OPERATIONS[function].read(rows)

    @contextmanager
    def shard_transaction(self, run_id: str, **kwargs: Any) -> Iterator[psycopg.Connection[Any]]:
        """A sharded client's connection to the shard that owns run_id, inside
        a transaction that commits when the block ends (rolls back on an
        exception): pass it as ``conn=`` to producer calls for that run, with
        your own writes on that shard (ShardMap.transaction)."""
        if self.shards is None:
            raise ValueError("shard_transaction needs a client made with shards=ShardMap")
        with self.shards.transaction(run_id, **kwargs) as conn:
            yield conn

    def fail_waiting(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        error: Any,
        retry_at: datetime | None = None,
        final_events: Sequence[Any] = (),
        *,
        conn: Any = None,
    ) -> WaitingFailureOutcome:
        prepared = self.prepare_waiting_failure(run_id, attempt, lease_token, conn=conn)
        failed = self.fail_attempt(
            run_id,
            attempt,
            lease_token,
            error,
            retry_at,
            final_events,
            protect_waiting_suspension=True,
            conn=conn,
        )
        return _operations.waiting_failure(prepared, failed)

    fail_waiting.__doc__ = FAIL_WAITING_DOC

    def declare_schedules(
        self, schedules: Sequence[Schedule], *, delete_others: bool = False, conn: Any = None
    ) -> dict[str, ScheduleOutcome | DeleteScheduleOutcome]:
        names = _operations.schedule_names(schedules)
        done: dict[str, ScheduleOutcome | DeleteScheduleOutcome] = {}
        for schedule in schedules:
            done[schedule.name] = self.upsert_schedule(**schedule.arguments(), conn=conn)
        if delete_others:
            after: str | None = None
            stale: list[str] = []
            while page := self.list_schedules(after, 1000, conn=conn):
                stale += [s.name for s in page if s.name not in names]
                after = page[-1].name
            for name in stale:
                done[name] = self.delete_schedule(name, conn=conn)
        return done

    declare_schedules.__doc__ = DECLARE_SCHEDULES_DOC

    def run_stats(self, *, conn: Any = None) -> list[dict[str, Any]]:
        """Rows of the run_stats view (admin role)."""
        return self._view("run_stats", conn)

    def ledger_stats(self, *, conn: Any = None) -> list[dict[str, Any]]:
        """Rows of the ledger_stats view (admin role)."""
        return self._view("ledger_stats", conn)

    def wait_stats(self, *, conn: Any = None) -> list[dict[str, Any]]:
        """Rows of the wait_stats view (admin role): waiting runs by queue and kind."""
        return self._view("wait_stats", conn)

    def _view(self, view: str, conn: Any) -> list[dict[str, Any]]:
        return _dicts(self._fetch(_operations.view_query(self.schema, view), None, conn))

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Methods):
    """asyncio client; the same methods, awaited. `tracing` as for Client."""

    def __init__(
        self,
        source: str | psycopg.AsyncConnection[Any] | Any,
        *,
        schema: str = "runrelay",
        prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
        tracing: bool | TracerProvider = False,
        shards: ShardMap | None = None,
    ) -> None:
        import asyncio

        self.schema = schema
        self.shards = shards
        self._source = source
        self._prepare_threshold = prepare_threshold
        self._own: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self.tracing = _tracing_of(tracing)
        self._queries = _queries(schema, self.tracing)

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def _conn() -> Any:
            source = self._source
            if isinstance(source, psycopg.AsyncConnection):
                # One call at a time, as Client.connection.
                async with self._lock:
                    yield source
            elif isinstance(source, str):
                async with self._lock:
                    if self._own is None or self._own.closed:
                        self._own = await psycopg.AsyncConnection.connect(
                            source, autocommit=True, prepare_threshold=self._prepare_threshold
                        )
                    yield self._own
            else:  # a psycopg_pool.AsyncConnectionPool
                async with source.connection() as pooled:
                    if pooled.autocommit:
                        yield pooled
                        return
                    await pooled.set_autocommit(True)
                    try:
                        yield pooled
                    finally:
                        await pooled.set_autocommit(False)

        return _conn()

    async def _execute(
        self,
        function: str,
        values: dict[str, Any],
        conn: Any,
        before: Sequence[_operations.Statement] = (),
        after: Sequence[_operations.Statement] = (),
    ) -> Fetched:
        params = _operations.OPERATIONS[function].bind(values)
        run_id = values.get("run_id")
        rows = await self._fetch(self._queries[function], params, conn, before, after, run_id)
        if self.tracing is not None and function in _operations.TRACED_CLAIMS:
            rows = _operations.untraced_rows(rows)
        return rows

    async def _fetch(
        self,
        query: Any,
        params: dict[str, Any] | None,
        conn: Any,
        before: Sequence[_operations.Statement] = (),
        after: Sequence[_operations.Statement] = (),
        run_id: Any = None,
    ) -> Fetched:
        try:
            if conn is not None:
                return await _one_flight_async(conn, query, params, before, after)
            async with self.connection() as c:
                return await _one_flight_async(c, query, params, before, after)
        except psycopg.Error as error:
            _raise_typed(error, _shard_of(self.shards, run_id))
            raise

    def _answered(self, answer: Any) -> Coroutine[Any, Any, Any]:
        async def known() -> Any:
            return answer

        return known()

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Coroutine[Any, Any, Any]:
        async def run() -> Any:
            _check_producer_conn(self.shards, function, values, conn)
            read = _operations.OPERATIONS[function].read
            if self.tracing is not None and function in _operations.TRACED_ENQUEUES:
                with self.tracing.enqueue(function, values) as (span, context):
                    traced, before, after = _operations.traced_enqueue(
                        function, values, context, conn is not None
                    )
                    result = read(await self._execute(function, traced, conn, before, after))
                    self.tracing.enqueued(span, result)
                    return result
            return read(await self._execute(function, values, conn))

        return run()

    @asynccontextmanager
    async def shard_transaction(
        self, run_id: str, **kwargs: Any
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A sharded client's connection to the shard that owns run_id, inside
        a transaction that commits when the block ends (rolls back on an
        exception): pass it as ``conn=`` to producer calls for that run."""
        if self.shards is None:
            raise ValueError("shard_transaction needs a client made with shards=ShardMap")
        dsn = self.shards.dsn_for(run_id)
        async with (
            await psycopg.AsyncConnection.connect(dsn, **kwargs) as conn,
            conn.transaction(),
        ):
            yield conn

    async def fail_waiting(
        self,
        run_id: str,
        attempt: int,
        lease_token: uuid.UUID,
        error: Any,
        retry_at: datetime | None = None,
        final_events: Sequence[Any] = (),
        *,
        conn: Any = None,
    ) -> WaitingFailureOutcome:
        prepared = await self.prepare_waiting_failure(run_id, attempt, lease_token, conn=conn)
        failed = await self.fail_attempt(
            run_id,
            attempt,
            lease_token,
            error,
            retry_at,
            final_events,
            protect_waiting_suspension=True,
            conn=conn,
        )
        return _operations.waiting_failure(prepared, failed)

    fail_waiting.__doc__ = FAIL_WAITING_DOC

    async def declare_schedules(
        self, schedules: Sequence[Schedule], *, delete_others: bool = False, conn: Any = None
    ) -> dict[str, ScheduleOutcome | DeleteScheduleOutcome]:
        names = _operations.schedule_names(schedules)
        done: dict[str, ScheduleOutcome | DeleteScheduleOutcome] = {}
        for schedule in schedules:
            done[schedule.name] = await self.upsert_schedule(**schedule.arguments(), conn=conn)
        if delete_others:
            after: str | None = None
            stale: list[str] = []
            while page := await self.list_schedules(after, 1000, conn=conn):
                stale += [s.name for s in page if s.name not in names]
                after = page[-1].name
            for name in stale:
                done[name] = await self.delete_schedule(name, conn=conn)
        return done

    declare_schedules.__doc__ = DECLARE_SCHEDULES_DOC

    async def run_stats(self, *, conn: Any = None) -> list[dict[str, Any]]:
        return await self._view("run_stats", conn)

    async def ledger_stats(self, *, conn: Any = None) -> list[dict[str, Any]]:
        return await self._view("ledger_stats", conn)

    async def wait_stats(self, *, conn: Any = None) -> list[dict[str, Any]]:
        return await self._view("wait_stats", conn)

    async def _view(self, view: str, conn: Any) -> list[dict[str, Any]]:
        return _dicts(await self._fetch(_operations.view_query(self.schema, view), None, conn))

    async def close(self) -> None:
        if self._own is not None:
            await self._own.close()
            self._own = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["AsyncClient", "Client"]
