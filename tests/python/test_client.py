"""The Python client (SPEC §8): every method through both `Client` and
`AsyncClient`, typed results, `conn=` joining the caller's transaction, the
three kinds of source, constructors without I/O, typed errors, and exactly one
protocol round trip per call (SPEC §7), counted in a libpq trace.

Each scenario is written once as a coroutine over `Api`, which puts either
client behind one awaitable face; the `flavor` fixture runs it with both.
pytest-asyncio is not a dependency: every test drives its own event loop with
`asyncio.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import types
import typing
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from devtools.round_trips import CALLS_PER_METHOD, frontend_round_trips, traced
from devtools.round_trips import calls as round_trip_calls
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from runrelay import (
    AppendedEvent,
    AsyncClient,
    CancelOutcome,
    ClaimedAttempt,
    Client,
    CompletedItem,
    CompleteOutcome,
    EnqueueItem,
    EnqueueResult,
    FailOutcome,
    HeartbeatOutcome,
    HeartbeatResult,
    InvalidArgument,
    Lane,
    LedgerEvent,
    LedgerFailOutcome,
    LedgerFailure,
    LedgerKind,
    LockTimeout,
    PayloadTooLarge,
    PermissionDenied,
    PrepareOutcome,
    ReapedAttempt,
    ReapOutcome,
    ReleaseOutcome,
    RenewedLease,
    RunnerTerminal,
    RunnerTerminalOutcome,
    RunrelayError,
    RunStatus,
    SchemaMissing,
    SettleAndClaimRow,
    SettleKind,
    SettleOutcome,
    SignalOutcome,
    StatementTimeout,
    SuspendOutcome,
    WrongIsolation,
    _operations,
)
from sqlapi import events, run_row, table_checksum

REPO = Path(__file__).resolve().parents[2]
FLAVORS = ("sync", "async")
SOURCES = ("conninfo", "connection", "pool")
VIEW_METHODS = ("run_stats", "ledger_stats", "wait_stats")
# A session-level clock two hours ahead (runrelay._now() honours it because
# the test database sets settings.allow_clock_override).
SHIFTED_CLOCK = "-c runrelay.clock_offset=7200s"
# A W3C traceparent, for runs enqueued with a trace context.
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def _aw(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Api:
    """Either client behind one face: ``await api.enqueue_run(...)``.

    The sync client's methods run inline (blocking the loop, which is fine in
    a test); the async client's are awaited. `connect` opens caller
    connections of the kind the client accepts for ``conn=``.
    """

    def __init__(self, flavor: str, client: Client | AsyncClient, url: str) -> None:
        self.flavor = flavor
        self.client = client
        self.url = url
        self._opened: list[Any] = []

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await _aw(method(*args, **kwargs))

        return call

    async def connect(self, autocommit: bool = True, **kwargs: Any) -> Any:
        conn: Any
        if self.flavor == "sync":
            conn = psycopg.connect(self.url, autocommit=autocommit, **kwargs)
        else:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=autocommit, **kwargs)
        self._opened.append(conn)
        return conn

    @staticmethod
    async def sql(conn: Any, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = await _aw(conn.execute(query, params))
        return list(await _aw(cur.fetchall())) if cur.description else []

    @staticmethod
    async def commit(conn: Any) -> None:
        await _aw(conn.commit())

    @staticmethod
    async def rollback(conn: Any) -> None:
        await _aw(conn.rollback())

    async def close_all(self) -> None:
        for conn in self._opened:
            await _aw(conn.close())


@contextlib.asynccontextmanager
async def open_api(flavor: str, url: str, source: str = "conninfo") -> AsyncIterator[Api]:
    """A client of `flavor` built on `source`; everything it opened is closed after."""
    async with contextlib.AsyncExitStack() as stack:
        client: Client | AsyncClient
        if flavor == "sync":
            if source == "conninfo":
                client = Client(url)
                stack.callback(client.close)
            elif source == "connection":
                conn = psycopg.connect(url, autocommit=True)
                stack.callback(conn.close)
                client = Client(conn)
            else:
                pool = ConnectionPool(
                    url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
                )
                pool.open(wait=True)
                stack.callback(pool.close)
                client = Client(pool)
        else:
            if source == "conninfo":
                client = AsyncClient(url)
                stack.push_async_callback(client.close)
            elif source == "connection":
                aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
                stack.push_async_callback(aconn.close)
                client = AsyncClient(aconn)
            else:
                apool = AsyncConnectionPool(
                    url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
                )
                await apool.open(wait=True)
                stack.push_async_callback(apool.close)
                client = AsyncClient(apool)
        api = Api(flavor, client, url)
        stack.push_async_callback(api.close_all)
        yield api


Scenario = Callable[[Api], Awaitable[None]]


@pytest.fixture(params=FLAVORS)
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def drive(flavor: str, db: psycopg.Connection, db_url: str) -> Callable[..., None]:
    """Run a scenario against empty tables with a client of the test's flavor."""

    def _drive(scenario: Scenario, source: str = "conninfo") -> None:
        async def main() -> None:
            async with open_api(flavor, db_url, source) as api:
                await scenario(api)

        asyncio.run(main())

    return _drive


def db_now(db: psycopg.Connection) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def attempt_status(db: psycopg.Connection, run_id: str, attempt: int) -> str:
    row = db.execute(
        "SELECT status FROM runrelay.attempts WHERE run_id = %s AND attempt = %s",
        [run_id, attempt],
    ).fetchone()
    assert row is not None
    return str(row[0])


# Every option of enqueue_run but run_at, each away from its default.
EVERY_OPTION: dict[str, Any] = {
    "queue": "mail",
    "payload": {"to": "a@example.com"},
    "priority": 7,
    "max_attempts": 4,
    "payload_retention": "drop_on_delivery",
    "concurrency_key": "customer-1",
}


def assert_enqueued_with_every_option(
    db: psycopg.Connection, run_id: str, run_at: datetime
) -> None:
    row = run_row(db, run_id)
    assert {k: row[k] for k in EVERY_OPTION} == EVERY_OPTION
    assert row["run_at"] == run_at


def assert_enqueued_with_the_defaults(db: psycopg.Connection, run_id: str) -> None:
    row = run_row(db, run_id)
    assert (row["queue"], row["payload"], row["priority"]) == ("default", {}, 0)
    assert (row["max_attempts"], row["payload_retention"]) == (3, "keep")
    assert row["run_at"] <= db_now(db)


def ledger_rows(db: psycopg.Connection, run_id: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT type, lane, delivered_at IS NOT NULL FROM runrelay.ledger"
        " WHERE run_id = %s ORDER BY seq",
        [run_id],
    ).fetchall()


# --------------------------------------------------------------------------
# The surface: one method per SQL function, with the SQL parameter names.
# --------------------------------------------------------------------------


def public_functions(db: psycopg.Connection) -> dict[str, list[str]]:
    """Every function of schema runrelay granted to a runrelay_* role -> its
    input parameter names in order."""
    rows = db.execute(
        """
        SELECT p.proname,
               coalesce(p.proargnames[1:p.pronargs], '{}'::text[])
        FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = 'runrelay'::regnamespace
          AND EXISTS (
              SELECT FROM aclexplode(p.proacl) AS a
              JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
              WHERE r.rolname LIKE 'runrelay\\_%%' AND a.privilege_type = 'EXECUTE'
          )
        """
    ).fetchall()
    return {name: list(args) for name, args in rows}


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_every_public_sql_function_is_a_method_with_the_same_parameter_names(
    db: psycopg.Connection, cls: type[Any]
) -> None:
    functions = public_functions(db)
    assert set(functions) == set(_operations.OPERATIONS), "the operation table and SQL API differ"
    for name, sql_args in functions.items():
        params = inspect.signature(getattr(cls, name)).parameters
        positional = [p for p in params if p not in ("self", "conn")]
        assert positional == sql_args, name
        assert params["conn"].kind is inspect.Parameter.KEYWORD_ONLY, name
    for view in VIEW_METHODS:
        assert "conn" in inspect.signature(getattr(cls, view)).parameters


# --------------------------------------------------------------------------
# §3.1 producers
# --------------------------------------------------------------------------


def test_enqueue_run_creates_then_returns_the_existing_run(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    run_at = db_now(db) + timedelta(hours=1)

    async def scenario(api: Api) -> None:
        first = await api.enqueue_run("r1", run_at=run_at, **EVERY_OPTION)
        assert type(first) is EnqueueResult
        assert first == EnqueueResult(run_id="r1", status=RunStatus.QUEUED, created=True)
        assert first.status is RunStatus.QUEUED
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.created = False  # type: ignore[misc]

        again = await api.enqueue_run("r1", queue="mail", payload={"to": "a@example.com"})
        assert again == EnqueueResult(run_id="r1", status=RunStatus.QUEUED, created=False)

        default = await api.enqueue_run("r2")
        assert default.created is True

    drive(scenario)
    assert_enqueued_with_every_option(db, "r1", run_at)
    assert_enqueued_with_the_defaults(db, "r2")
    assert events(db, "r1") == ["run.queued"]


def test_enqueue_runs_answers_each_item_as_enqueue_run_in_one_round_trip(
    drive: Callable[..., None], db: psycopg.Connection, db_url: str
) -> None:
    run_at = db_now(db) + timedelta(hours=1)

    async def scenario(api: Api) -> None:
        await api.enqueue_run("old", queue="mail", payload={"n": 0})
        rows = await api.enqueue_runs(
            [
                EnqueueItem("b1", run_at=run_at, **EVERY_OPTION),
                {"run_id": "b2", "concurrency_key": "customer-1"},
                EnqueueItem("old", queue="mail", payload={"n": 0}),
                EnqueueItem("b3"),
                EnqueueItem("b1", queue="mail", payload={"to": "a@example.com"}),
            ]
        )
        assert [type(r) for r in rows] == [EnqueueResult] * 5
        assert rows == [
            EnqueueResult("b1", RunStatus.QUEUED, True),
            EnqueueResult("b2", RunStatus.QUEUED, True),
            EnqueueResult("old", RunStatus.QUEUED, False),
            EnqueueResult("b3", RunStatus.QUEUED, True),
            EnqueueResult("b1", RunStatus.QUEUED, False),
        ]
        with pytest.raises(InvalidArgument) as bad:
            await api.enqueue_runs([EnqueueItem("b4"), EnqueueItem("b5", max_attempts=0)])
        assert bad.value.parameter == "items[1].max_attempts"

    drive(scenario)
    assert_enqueued_with_every_option(db, "b1", run_at)
    assert run_row(db, "b2")["key_held"] is True
    assert_enqueued_with_the_defaults(db, "b3")
    assert events(db, "b1") == ["run.queued"]
    assert db.execute(
        "SELECT count(*) FROM runrelay.runs WHERE run_id IN ('b4', 'b5')"
    ).fetchone() == (0,)
    with psycopg.connect(db_url, autocommit=True) as conn, traced(conn) as out:
        Client(conn).enqueue_runs([EnqueueItem(f"rt-{i}") for i in range(100)])
    assert frontend_round_trips(out[0]) == 1


def test_signal_run_and_cancel_run_outcomes(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1")
        stored = await api.signal_run("r1", "approve", {"by": "ann"})
        assert stored is SignalOutcome.STORED
        assert await api.signal_run("nope", "approve") is SignalOutcome.NOT_FOUND

        cancelled = await api.cancel_run("r1", reason="customer asked")
        assert cancelled is CancelOutcome.CANCELLED
        assert await api.cancel_run("r1") is CancelOutcome.ALREADY_TERMINAL
        assert await api.cancel_run("nope") is CancelOutcome.NOT_FOUND
        assert await api.signal_run("r1", "approve") is SignalOutcome.TERMINAL

    drive(scenario)
    assert run_row(db, "r1")["status"] == "cancelled"
    assert events(db, "r1") == ["run.queued", "run.cancelled"]


def test_cancel_requested_while_a_writer_holds_the_locks(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    """A heartbeat inside an open caller transaction holds the custody locks:
    cancel_run cannot take them and answers cancel_requested; the worker
    learns it at its next heartbeat and write."""

    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1")
        (claim,) = await api.claim_attempts("w1")
        holder = await api.connect(autocommit=False)
        beat = await api.heartbeat(**claim.fence, conn=holder)
        assert beat.outcome is HeartbeatOutcome.OK
        assert await api.cancel_run("r1") is CancelOutcome.CANCEL_REQUESTED
        await api.commit(holder)

        after = await api.heartbeat(**claim.fence)
        assert type(after) is HeartbeatResult
        assert after.outcome is HeartbeatOutcome.CANCELLED
        done = await api.complete_attempt(**claim.fence)
        assert done is CompleteOutcome.CANCELLED

    drive(scenario)
    assert run_row(db, "r1")["status"] == "cancelled"


def test_append_events_returns_typed_rows_in_seq_order(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1")
        appended = await api.append_events(
            "r1",
            [
                {"type": "order.paid", "payload": {"amount": 5}},
                {"type": "log", "lane": "observability", "delivery_key": "custom-key"},
            ],
        )
        assert [type(a) for a in appended] == [AppendedEvent, AppendedEvent]
        paid, log = appended
        assert paid.seq < log.seq
        assert paid.delivery_key == f"r1:{paid.seq}"
        assert log.delivery_key == "custom-key"
        assert isinstance(paid.event_id, int)

    drive(scenario)
    assert ledger_rows(db, "r1") == [
        ("run.queued", "lifecycle", False),
        ("order.paid", "lifecycle", False),
        ("log", "observability", False),
    ]


# JSON values at the edges of what a reader could get wrong: non-ASCII text
# (two- and four-byte UTF-8), escapes, integers beyond 64 bits, exponents,
# nesting, empty containers, and every scalar at the top of an event's payload.
AWKWARD_JSON: list[Any] = [
    {
        "text": 'é 😀 \u2028 "quoted" back\\slash\nnew\ttab \u0001',
        "big": 123456789012345678901234567890,
        "negative": -(2**63),
        "float": 1.5,
        "exponent": 1e300,
        "tiny": -2.5e-300,
        "nested": {"list": [1, [2, {"deep": None}], True, False], "empty": {}},
        "empty_list": [],
    },
    [1, "two", 3.0, None],
    "a bare string",
    42,
    0.1,
    True,
    None,
]


def test_payloads_read_back_as_json_loads_reads_them(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    """The client reads jsonb with its own loader (psycopg's, minus the
    encoding guess); every value comes back equal, and of the same types,
    as json.loads reads the server's text of it."""
    as_text = [
        json.loads(text)
        for (text,) in db.execute(
            "SELECT v::jsonb::text FROM jsonb_array_elements(%s::jsonb) AS v",
            [json.dumps(AWKWARD_JSON)],
        ).fetchall()
    ]

    async def scenario(api: Api) -> None:
        await api.enqueue_run("j1", payload=AWKWARD_JSON[0])
        await api.append_events(
            "j1", [{"type": "value", "payload": value} for value in AWKWARD_JSON]
        )
        (claimed,) = await api.claim_attempts("worker-1")
        assert_same_json(claimed.payload, as_text[0])
        ledger = await api.claim_ledger("relay-1", max_events=100, batch=True)
        assert [e.type for e in ledger] == ["run.queued", *["value"] * 7, "run.started"]
        assert_same_json([e.payload for e in ledger[1:-1]], as_text)
        acked = await api.ack_ledger("relay-1", "j1", [e.event_id for e in ledger])
        assert [e.kind for e in acked] == [LedgerKind.DELIVERED] * 9
        assert_same_json([e.payload for e in acked[1:-1]], as_text)

    drive(scenario)


def assert_same_json(got: Any, expected: Any) -> None:
    """Equal, and every value of the same type (1.5 == Decimal("1.5"),
    1 == 1.0 and True == 1 would pass a plain comparison)."""
    assert got == expected
    assert type(got) is type(expected)
    if isinstance(got, dict):
        for key in got:
            assert_same_json(got[key], expected[key])
    elif isinstance(got, list):
        for mine, theirs in zip(got, expected, strict=True):
            assert_same_json(mine, theirs)


def test_a_callers_json_reading_is_kept(db_url: str) -> None:
    """A caller who chose how psycopg reads JSON (here Decimal for floats,
    as money needs) gets payloads read that way, whether the choice is
    global or the connection's; and the client leaves the adapters of a
    connection it is given as they were."""
    money = functools.partial(json.loads, parse_float=Decimal)
    with psycopg.connect(db_url, autocommit=True) as conn:
        client = Client(conn)
        client.enqueue_run("m1", payload={"amount": 10.25})
        client.append_events("m1", [{"type": "paid", "payload": {"amount": 10.25}}])
        jsonb = psycopg.postgres.types["jsonb"].oid
        loader = conn.adapters.get_loader(jsonb, psycopg.pq.Format.TEXT)
        (claimed,) = client.claim_attempts("worker-1")
        assert claimed.payload == {"amount": 10.25}
        assert type(claimed.payload["amount"]) is float
        assert conn.adapters.get_loader(jsonb, psycopg.pq.Format.TEXT) is loader

        set_json_loads(money, context=conn)
        paid = client.claim_ledger("relay-1", max_events=10, batch=True)[1]
        assert paid.type == "paid"
        assert paid.payload == {"amount": Decimal("10.25")}
        assert type(paid.payload["amount"]) is Decimal

    set_json_loads(money)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            paid = Client(conn).claim_ledger("relay-1", run_id="m1", max_events=10, batch=True)[1]
            assert type(paid.payload["amount"]) is Decimal
    finally:
        set_json_loads(json.loads)


# --------------------------------------------------------------------------
# §3.2 workers
# --------------------------------------------------------------------------


def test_claim_heartbeat_complete(drive: Callable[..., None], db: psycopg.Connection) -> None:
    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1", queue="q", payload={"n": 1})
        call_id = uuid.uuid4()
        claims = await api.claim_attempts(
            "w1", queues=["q"], max_runs=5, lease_seconds=60, call_id=call_id
        )
        assert [type(c) for c in claims] == [ClaimedAttempt]
        (claim,) = claims
        assert (claim.run_id, claim.attempt, claim.queue) == ("r1", 1, "q")
        assert (claim.payload, claim.resume) == ({"n": 1}, None)
        assert isinstance(claim.lease_token, uuid.UUID)
        assert claim.lease_expires_at.tzinfo is not None
        lease = claim.lease_expires_at - db_now(db)
        assert timedelta(seconds=50) < lease <= timedelta(seconds=60)
        # A repeated claim with the same call_id returns what the first took.
        assert await api.claim_attempts("w1", queues=["q"], call_id=call_id) == claims
        assert await api.claim_attempts("w1", queues=["q"]) == []

        beat = await api.heartbeat(**claim.fence, lease_seconds=120)
        assert type(beat) is HeartbeatResult
        assert beat.outcome is HeartbeatOutcome.OK
        assert beat.lease_expires_at is not None
        assert beat.lease_expires_at > claim.lease_expires_at
        lost = await api.heartbeat("r1", 1, uuid.uuid4())
        assert lost.outcome is HeartbeatOutcome.FENCE_LOST

        wrong = await api.complete_attempt("r1", 1, uuid.uuid4())
        assert wrong is CompleteOutcome.FENCE_LOST
        done = await api.complete_attempt(
            **claim.fence, result={"sent": True}, final_events=[{"type": "mail.sent"}]
        )
        assert done is CompleteOutcome.COMPLETED
        # A replay after a lost reply returns the recorded outcome.
        assert await api.complete_attempt(**claim.fence) is CompleteOutcome.COMPLETED

    drive(scenario)
    row = run_row(db, "r1")
    assert (row["status"], row["result"]) == ("completed", {"sent": True})
    assert events(db, "r1") == ["run.queued", "run.started", "mail.sent", "run.completed"]


def test_complete_attempts_accepts_claims_pairs_and_dicts(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    async def scenario(api: Api) -> None:
        for run_id in ("b1", "b2", "b3", "b4"):
            await api.enqueue_run(run_id)
        c1, c2, c3, c4 = await api.claim_attempts("w1", max_runs=4)
        items = [
            c1,
            (c2, {"r": 2}),
            {"run_id": c3.run_id, "attempt": c3.attempt, "lease_token": c3.lease_token},
            {"run_id": c4.run_id, "attempt": c4.attempt, "lease_token": uuid.uuid4()},
        ]
        done = await api.complete_attempts(items)
        assert all(type(d) is CompletedItem for d in done)
        outcomes = {(d.run_id, d.attempt): d.outcome for d in done}
        assert outcomes == {
            (c1.run_id, 1): CompleteOutcome.COMPLETED,
            (c2.run_id, 1): CompleteOutcome.COMPLETED,
            (c3.run_id, 1): CompleteOutcome.COMPLETED,
            (c4.run_id, 1): CompleteOutcome.FENCE_LOST,
        }
        assert all(isinstance(d.outcome, CompleteOutcome) for d in done)
        results = {c1.run_id: {}, c2.run_id: {"r": 2}, c3.run_id: {}}
        for run_id, result in results.items():
            assert run_row(db, run_id)["result"] == result
        assert run_row(db, c4.run_id)["status"] == "running"

    drive(scenario)


def test_settle_and_claim_settles_every_op_then_claims_in_one_call(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    later = db_now(db) + timedelta(hours=1)

    async def scenario(api: Api) -> None:
        for run_id in ("s1", "s2", "s3", "s4", "s5"):
            await api.enqueue_run(run_id, queue="sq", payload={"id": run_id})
        c1, c2, c3, c4, c5 = await api.claim_attempts("w1", queues=["sq"], max_runs=5)
        await api.enqueue_run("s6", queue="sq", payload={"id": "s6"})
        items = [
            (c1, {"r": 1}),
            {**c2.fence, "op": "fail", "error": {"e": 2}, "retry_at": later},
            {**c3.fence, "op": "suspend", "wait": {"kind": "event", "name": "go"}},
            {**c4.fence, "op": "release", "run_at": later, "reason": "snooze"},
            {**c5.fence, "lease_token": uuid.uuid4()},
        ]
        call_id = uuid.uuid4()
        rows = await api.settle_and_claim(items, "w1", queues=["sq"], max_runs=2, call_id=call_id)
        assert all(type(r) is SettleAndClaimRow for r in rows)
        assert [(r.kind, r.run_id, r.attempt, r.outcome) for r in rows] == [
            (SettleKind.SETTLED, "s1", 1, SettleOutcome.COMPLETED),
            (SettleKind.SETTLED, "s2", 1, SettleOutcome.RETRY_SCHEDULED),
            (SettleKind.SETTLED, "s3", 1, SettleOutcome.WAITING),
            (SettleKind.SETTLED, "s4", 1, SettleOutcome.RELEASED),
            (SettleKind.SETTLED, "s5", 1, SettleOutcome.FENCE_LOST),
            (SettleKind.CLAIMED, "s6", 1, None),
        ]
        assert all(r.claim is None for r in rows[:5])
        claim = rows[5].claim
        assert type(claim) is ClaimedAttempt
        assert (claim.queue, claim.payload) == ("sq", {"id": "s6"})
        # The call committed; its reply is lost: the same call with the same
        # call_id answers exactly the same and writes nothing.
        before = table_checksum(db)
        again = await api.settle_and_claim(items, "w1", queues=["sq"], max_runs=2, call_id=call_id)
        assert again == rows
        assert table_checksum(db) == before
        # A settle-only call with the claimed run.
        (done,) = await api.settle_and_claim([claim], "w1", max_runs=0)
        assert (done.run_id, done.outcome) == ("s6", SettleOutcome.COMPLETED)

    drive(scenario)
    assert run_row(db, "s1")["result"] == {"r": 1}
    assert run_row(db, "s2")["run_at"] == later
    assert run_row(db, "s3")["status"] == "waiting"
    assert (run_row(db, "s4")["status"], run_row(db, "s4")["run_at"]) == ("queued", later)
    assert run_row(db, "s5")["status"] == "running"
    assert events(db, "s6") == ["run.queued", "run.started", "run.completed"]


def test_fail_attempt_retries_then_fails(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    retry_at = db_now(db) + timedelta(hours=1)

    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1", max_attempts=2)
        (first,) = await api.claim_attempts("w1")
        outcome = await api.fail_attempt(**first.fence, error={"e": 1}, retry_at=retry_at)
        assert outcome is FailOutcome.RETRY_SCHEDULED
        assert run_row(db, "r1")["run_at"] == retry_at
        assert await api.claim_attempts("w1") == []  # not due yet

        ahead = await api.connect(options=SHIFTED_CLOCK)
        (second,) = await api.claim_attempts("w1", conn=ahead)
        assert second.attempt == 2
        wrong = await api.fail_attempt("r1", 2, uuid.uuid4(), error={"e": 2})
        assert wrong is FailOutcome.FENCE_LOST
        final = await api.fail_attempt(
            **second.fence, error={"e": 2}, final_events=[{"type": "gave.up"}]
        )
        assert final is FailOutcome.FAILED

    drive(scenario)
    row = run_row(db, "r1")
    assert (row["status"], row["error"]) == ("failed", {"e": 2})
    assert events(db, "r1")[-2:] == ["gave.up", "run.failed"]


def test_release_attempt_hands_the_run_back_without_spending_an_attempt(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    """A release queues the run again and keeps max_attempts whole; a replay
    answers released again, a wrong token fence_lost, a marker cancelled."""
    run_at = db_now(db) + timedelta(hours=1)

    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1", max_attempts=1)
        (first,) = await api.claim_attempts("w1")
        released = await api.release_attempt(**first.fence, run_at=run_at, reason="shutdown")
        assert released is ReleaseOutcome.RELEASED
        again = await api.release_attempt(**first.fence, run_at=run_at, reason="shutdown")
        assert again is ReleaseOutcome.RELEASED  # an exact replay
        assert run_row(db, "r1")["run_at"] == run_at
        assert await api.claim_attempts("w1") == []  # not due yet

        ahead = await api.connect(options=SHIFTED_CLOCK)
        (second,) = await api.claim_attempts("w1", conn=ahead)
        assert second.attempt == 2
        wrong = await api.release_attempt("r1", 2, uuid.uuid4())
        assert wrong is ReleaseOutcome.FENCE_LOST
        # released without run_at: runnable at once, still within the budget
        assert await api.release_attempt(**second.fence) is ReleaseOutcome.RELEASED
        (third,) = await api.claim_attempts("w1")
        final = await api.fail_attempt(**third.fence, error={"e": 1})
        assert final is FailOutcome.FAILED  # the one allowed failure

        await api.enqueue_run("r2")
        (claim,) = await api.claim_attempts("w1")
        # The marker cancel_run leaves when a writer holds the locks.
        db.execute(
            "INSERT INTO runrelay.cancellations (run_id, reason, requested_at)"
            " VALUES ('r2', 'stop', now())"
        )
        cancelled = await api.release_attempt(**claim.fence)
        assert cancelled is ReleaseOutcome.CANCELLED
        assert run_row(db, "r2")["status"] == "cancelled"

    drive(scenario)
    assert [attempt_status(db, "r1", n) for n in (1, 2, 3)] == ["released", "released", "failed"]
    assert events(db, "r1") == [
        "run.queued",
        "run.started",
        "run.retry_scheduled",
        "run.started",
        "run.retry_scheduled",
        "run.started",
        "run.failed",
    ]
    payload = db.execute(
        "SELECT payload FROM runrelay.ledger WHERE run_id = 'r1' AND type = 'run.retry_scheduled'"
        " ORDER BY seq LIMIT 1"
    ).fetchone()
    assert payload is not None
    assert payload[0]["released"] is True and payload[0]["reason"] == "shutdown"


def test_reap_expired_ends_lost_leases(drive: Callable[..., None], db: psycopg.Connection) -> None:
    async def scenario(api: Api) -> None:
        await api.enqueue_run("retry", max_attempts=2)
        await api.enqueue_run("final", max_attempts=1)
        await api.claim_attempts("w1", max_runs=2, lease_seconds=30)
        assert await api.reap_expired() == []  # leases still live

        ahead = await api.connect(options=SHIFTED_CLOCK)
        reaped = await api.reap_expired(max_attempts=10, conn=ahead)
        assert all(type(r) is ReapedAttempt for r in reaped)
        assert sorted((r.run_id, r.attempt, r.outcome) for r in reaped) == [
            ("final", 1, ReapOutcome.FAILED),
            ("retry", 1, ReapOutcome.RETRY_SCHEDULED),
        ]
        assert all(isinstance(r.outcome, ReapOutcome) for r in reaped)

    drive(scenario)
    assert attempt_status(db, "retry", 1) == "lost"
    assert attempt_status(db, "final", 1) == "lost"
    assert run_row(db, "final")["status"] == "failed"


def test_suspend_signal_and_waiting_failure(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    wait = {"kind": "event", "name": "approve"}

    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1")
        (claim,) = await api.claim_attempts("w1")
        not_yet = await api.prepare_waiting_failure(**claim.fence)
        assert not_yet is PrepareOutcome.NOT_APPLICABLE  # running, not waiting
        suspended = await api.suspend_attempt(**claim.fence, wait=wait)
        assert suspended is SuspendOutcome.WAITING
        lost = await api.prepare_waiting_failure("r1", 1, uuid.uuid4())
        assert lost is PrepareOutcome.FENCE_LOST
        assert await api.prepare_waiting_failure(**claim.fence) is PrepareOutcome.PREPARED
        # The signal after preparing wins; the protected failure is fenced.
        assert await api.signal_run("r1", "approve", {"ok": True}) is SignalOutcome.RESUMED
        fenced = await api.fail_attempt(
            **claim.fence, error={"e": 1}, protect_waiting_suspension=True
        )
        assert fenced is FailOutcome.FENCE_LOST

        (resumed,) = await api.claim_attempts("w1")
        assert (resumed.attempt, resumed.resume) == (
            2,
            {"name": "approve", "payload": {"ok": True}},
        )

        # A signal stored before the wait resumes the suspension at once.
        await api.enqueue_run("r2")
        assert await api.signal_run("r2", "approve") is SignalOutcome.STORED
        (other,) = await api.claim_attempts("w1")
        assert await api.suspend_attempt(**other.fence, wait=wait) is SuspendOutcome.RESUMED
        wrong = await api.suspend_attempt("r2", 1, uuid.uuid4(), wait=wait)
        assert wrong is SuspendOutcome.FENCE_LOST

    drive(scenario)
    assert run_row(db, "r1")["status"] == "running"
    assert run_row(db, "r2")["status"] == "queued"


def test_detached_runner_terminal(drive: Callable[..., None], db: psycopg.Connection) -> None:
    detached = {"kind": "detached_runner", "runner": "gpu-7"}

    async def scenario(api: Api) -> None:
        await api.enqueue_run("d1")
        (claim,) = await api.claim_attempts("w1")
        assert await api.suspend_attempt(**claim.fence, wait=detached) is SuspendOutcome.WAITING

        nothing = await api.read_runner_terminal("d1", 1)
        assert nothing == RunnerTerminal(result=None, received_at=None)
        assert await api.read_runner_terminal("d1", 2) is None
        assert await api.claim_detached_terminal(**claim.fence) is False

        result = {"status": "ok", "out": 1}
        recorded = await api.record_runner_terminal("d1", 1, result)
        assert recorded is RunnerTerminalOutcome.RECORDED
        duplicate = await api.record_runner_terminal("d1", 1, result)
        assert duplicate is RunnerTerminalOutcome.DUPLICATE
        conflict = await api.record_runner_terminal("d1", 1, {"status": "error"})
        assert conflict is RunnerTerminalOutcome.CONFLICT
        missing = await api.record_runner_terminal("nope", 1, result)
        assert missing is RunnerTerminalOutcome.NOT_FOUND

        pushed = await api.read_runner_terminal("d1", 1)
        assert type(pushed) is RunnerTerminal
        assert pushed.result == result
        assert isinstance(pushed.received_at, datetime)

        assert await api.claim_detached_terminal("d1", 1, uuid.uuid4()) is False
        assert await api.claim_detached_terminal(**claim.fence) is True
        superseded = await api.fail_attempt(
            **claim.fence, error={"e": "gave up"}, preserve_runner_terminal=True
        )
        assert superseded is FailOutcome.SUPERSEDED
        assert await api.complete_attempt(**claim.fence, result=pushed.result) is (
            CompleteOutcome.COMPLETED
        )

        # A push for a wait that was cancelled meanwhile is too late.
        await api.enqueue_run("d2")
        (late,) = await api.claim_attempts("w1")
        assert await api.suspend_attempt(**late.fence, wait=detached) is SuspendOutcome.WAITING
        assert await api.cancel_run("d2") is CancelOutcome.CANCELLED
        too_late = await api.record_runner_terminal("d2", 1, result)
        assert too_late is RunnerTerminalOutcome.TOO_LATE

    drive(scenario)
    row = run_row(db, "d1")
    assert (row["status"], row["result"]) == ("completed", {"status": "ok", "out": 1})


# --------------------------------------------------------------------------
# §3.3 relays and admin
# --------------------------------------------------------------------------


def test_relay_claim_renew_ack_release(drive: Callable[..., None], db: psycopg.Connection) -> None:
    async def scenario(api: Api) -> None:
        assert await api.ledger_next_due_at() is None  # nothing pending at all
        await api.enqueue_run("L1")
        await api.append_events("L1", [{"type": "a"}, {"type": "b"}])
        due = await api.ledger_next_due_at("lifecycle", "L1")
        assert isinstance(due, datetime)
        assert due <= db_now(db)

        (head,) = await api.claim_ledger("relay-1", lease_seconds=60)
        assert type(head) is LedgerEvent
        assert (head.kind, head.run_id, head.type) == (LedgerKind.CLAIMED, "L1", "run.queued")
        assert head.kind is LedgerKind.CLAIMED
        assert head.delivery_key == f"L1:{head.seq}"
        assert head.lag_ms is None
        assert head.lease_remaining_ms is not None
        assert 50_000 < head.lease_remaining_ms <= 60_000
        # The head is leased to relay-1: nothing for anybody else.
        assert await api.claim_ledger("relay-2", run_id="L1") == []

        renewed = await api.renew_ledger_lease("relay-1", [head.event_id], lease_seconds=120)
        assert [type(r) for r in renewed] == [RenewedLease]
        assert renewed[0].event_id == head.event_id
        assert head.lease_expires_at is not None
        assert renewed[0].lease_expires_at > head.lease_expires_at
        assert await api.renew_ledger_lease("relay-2", [head.event_id]) == []

        acked = await api.ack_ledger("relay-1", "L1", [head.event_id], claim_next=5, batch=True)
        assert [(e.kind, e.type) for e in acked] == [
            (LedgerKind.DELIVERED, "run.queued"),
            (LedgerKind.CLAIMED, "a"),
            (LedgerKind.CLAIMED, "b"),
        ]
        assert isinstance(acked[0].lag_ms, int)
        assert acked[0].lag_ms >= 0
        assert all(e.frozen for e in acked[1:])

        released = await api.release_ledger("relay-1", [e.event_id for e in acked[1:]])
        assert released == 2
        again = await api.claim_ledger("relay-2", run_id="L1", max_events=5, batch=True)
        assert [e.type for e in again] == ["a", "b"]

    drive(scenario)
    assert ledger_rows(db, "L1") == [
        ("run.queued", "lifecycle", True),
        ("a", "lifecycle", False),
        ("b", "lifecycle", False),
    ]


def test_event_id_lists_reach_the_server_as_given(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    """A list of plain ints goes as one bigint[] literal; anything else (a
    null among them) as psycopg sends a list. Either way the server answers
    what the ids ask, at bigint's edges too."""

    async def scenario(api: Api) -> None:
        await api.enqueue_run("E1")
        (head,) = await api.claim_ledger("relay-1", lease_seconds=60)
        assert await api.renew_ledger_lease("relay-1", []) == []
        edges = [-(2**63), head.event_id, 2**63 - 1, 0]
        renewed = await api.renew_ledger_lease("relay-1", edges, lease_seconds=90)
        assert [r.event_id for r in renewed] == [head.event_id]
        before = table_checksum(db)
        with pytest.raises(InvalidArgument) as caught:
            await api.ack_ledger("relay-1", "E1", [head.event_id, None])  # type: ignore[list-item]
        assert caught.value.parameter == "event_ids"
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            await api.release_ledger("relay-1", [head.event_id, 2**63])
        assert table_checksum(db) == before
        # The same statement many times over (psycopg prepares it on the way).
        for _ in range(8):
            assert await api.renew_ledger_lease("relay-1", [head.event_id, 5]) != []
        acked = await api.ack_ledger("relay-1", "E1", [head.event_id])
        assert [(e.kind, e.event_id) for e in acked] == [(LedgerKind.DELIVERED, head.event_id)]

    drive(scenario)


def test_relay_fail_requeue_local_ack_and_prune(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    async def scenario(api: Api) -> None:
        await api.enqueue_run("L1")
        (head,) = await api.claim_ledger("relay-1", run_id="L1")
        failed = await api.fail_ledger("relay-1", [head.event_id], {"http": 503})
        assert [type(f) for f in failed] == [LedgerFailure]
        assert failed[0] == LedgerFailure(
            event_id=head.event_id, outcome=LedgerFailOutcome.RETRYING
        )
        assert await api.claim_ledger("relay-1", run_id="L1") == []  # backing off
        due = await api.ledger_next_due_at(run_id="L1")
        assert isinstance(due, datetime)
        assert due > db_now(db)

        ahead = await api.connect(options=SHIFTED_CLOCK)
        (retry,) = await api.claim_ledger("relay-1", run_id="L1", conn=ahead)
        assert retry.event_id == head.event_id
        blocked = await api.fail_ledger(
            "relay-1", [head.event_id], {"http": 410}, permanent=True, conn=ahead
        )
        assert blocked[0].outcome is LedgerFailOutcome.BLOCKED
        assert await api.claim_ledger("relay-1", run_id="L1", conn=ahead) == []
        assert await api.requeue_ledger_event(head.event_id) is True
        assert await api.requeue_ledger_event(head.event_id) is False

        (back,) = await api.claim_ledger("relay-1", run_id="L1")
        assert back.event_id == head.event_id
        delivered = await api.ack_ledger("relay-1", "L1", [back.event_id])
        assert [e.kind for e in delivered] == [LedgerKind.DELIVERED]

        # A transport-only head whose successor is claimable is acked locally.
        await api.append_events(
            "L1",
            [
                {"type": "t", "lane": "observability", "transport_only": True},
                {"type": "u", "lane": "observability"},
            ],
        )
        obs = await api.claim_ledger("relay-1", lane="observability", run_id="L1")
        assert [(e.kind, e.type) for e in obs] == [
            (LedgerKind.LOCAL_ACK, "t"),
            (LedgerKind.CLAIMED, "u"),
        ]
        await api.ack_ledger("relay-1", "L1", [obs[1].event_id])

        cut_off = db_now(db) + timedelta(hours=1)
        pruned = await api.prune(cut_off, max_rows=1)
        assert pruned == 1
        assert await api.prune(cut_off) == 2
        assert await api.prune(cut_off) == 0

    drive(scenario)
    assert ledger_rows(db, "L1") == []


def test_schema_version_and_stats_views(drive: Callable[..., None], db: psycopg.Connection) -> None:
    head = ScriptDirectory.from_config(Config(str(REPO / "alembic.ini"))).get_current_head()

    async def scenario(api: Api) -> None:
        assert await api.get_schema_version() == head
        await api.enqueue_run("r1", queue="mail")
        await api.enqueue_run("r2", queue="mail")
        await api.enqueue_run("r3", queue="sms")
        await api.claim_attempts("w1", queues=["sms"])

        runs = await api.run_stats()
        assert [(r["queue"], r["status"], r["runs"]) for r in runs] == [
            ("mail", "queued", 2),
            ("sms", "running", 1),
        ]
        ledger = await api.ledger_stats()
        counts = {(r["lane"], r["state"]): r["events"] for r in ledger}
        assert counts == {("lifecycle", "pending"): 4}

    drive(scenario)


# --------------------------------------------------------------------------
# Sources, constructors, conn=
# --------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_runs_a_whole_run(
    drive: Callable[..., None], db: psycopg.Connection, source: str
) -> None:
    """A conninfo string, a psycopg connection and a pool all carry calls,
    and what they write is committed (visible to another session)."""

    async def scenario(api: Api) -> None:
        assert (await api.enqueue_run("r1")).created
        (claim,) = await api.claim_attempts("w1")
        assert await api.complete_attempt(**claim.fence) is CompleteOutcome.COMPLETED
        assert run_row(db, "r1")["status"] == "completed"

    drive(scenario, source=source)


def test_a_given_connection_is_the_one_used(db: psycopg.Connection, db_url: str) -> None:
    """A client built on a connection calls through it: in the caller's open
    transaction, visible only once the caller commits."""
    sync_conn = psycopg.connect(db_url)  # not autocommit: the caller's transaction
    try:
        Client(sync_conn).enqueue_run("s1")
        assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)
        sync_conn.commit()
        assert run_row(db, "s1")["status"] == "queued"
    finally:
        sync_conn.close()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            await AsyncClient(aconn).enqueue_run("a1")
            assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (1,)
            await aconn.commit()
        assert run_row(db, "a1")["status"] == "queued"

    asyncio.run(main())


def test_pools_serve_each_call_with_one_checkout(db: psycopg.Connection, db_url: str) -> None:
    with ConnectionPool(
        db_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
    ) as pool:
        client = Client(pool)
        client.enqueue_run("p1")
        client.get_schema_version()
        assert pool.get_stats()["requests_num"] == 2

    async def main() -> None:
        async with AsyncConnectionPool(
            db_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
        ) as apool:
            aclient = AsyncClient(apool)
            await aclient.enqueue_run("p2")
            await aclient.get_schema_version()
            assert apool.get_stats()["requests_num"] == 2

    asyncio.run(main())
    assert run_row(db, "p1")["status"] == run_row(db, "p2")["status"] == "queued"


UNREACHABLE = "postgresql://127.0.0.1:1/x?connect_timeout=3"


def test_constructors_do_no_io() -> None:
    """Nothing listens on port 1: building clients (and using the methods'
    argument handling) succeeds; only the first call touches the network."""
    client = Client(UNREACHABLE)
    with pytest.raises(psycopg.OperationalError):
        client.get_schema_version()
    client.close()

    unopened = ConnectionPool(UNREACHABLE, open=False)
    Client(unopened)
    assert unopened.closed

    aclient = AsyncClient(UNREACHABLE)  # outside any event loop, too

    async def main() -> None:
        with pytest.raises(psycopg.OperationalError):
            await aclient.get_schema_version()
        await aclient.close()

    asyncio.run(main())


@pytest.fixture
def orders(db: psycopg.Connection) -> Iterator[str]:
    """The caller's own table, next to runrelay's."""
    db.execute("DROP TABLE IF EXISTS public.client_orders")
    db.execute("CREATE TABLE public.client_orders (order_id text PRIMARY KEY)")
    yield "public.client_orders"
    db.execute("DROP TABLE IF EXISTS public.client_orders")


@pytest.mark.parametrize("finish", ["commit", "rollback"])
def test_conn_joins_the_callers_transaction(
    drive: Callable[..., None], db: psycopg.Connection, orders: str, finish: str
) -> None:
    """enqueue_run and append_events with conn= commit or roll back together
    with the caller's own write."""

    async def scenario(api: Api) -> None:
        caller = await api.connect(autocommit=False)
        await api.sql(caller, f"INSERT INTO {orders} VALUES ('o-1')")
        enqueued = await api.enqueue_run("o-1", payload={"order": "o-1"}, conn=caller)
        assert enqueued.created
        appended = await api.append_events("o-1", [{"type": "order.placed"}], conn=caller)
        assert len(appended) == 1
        # Another session sees none of it before the caller finishes.
        assert db.execute(f"SELECT count(*) FROM {orders}").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)
        if finish == "commit":
            await api.commit(caller)
        else:
            await api.rollback(caller)

    drive(scenario)
    kept = finish == "commit"
    assert db.execute(f"SELECT count(*) FROM {orders}").fetchone() == (int(kept),)
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (int(kept),)
    expected = ["run.queued", "order.placed"] if kept else []
    assert events(db, "o-1") == expected


# --------------------------------------------------------------------------
# Errors (SPEC §6): typed, with the parameter and hint, changing nothing.
# --------------------------------------------------------------------------


def test_invalid_argument_names_the_parameter(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    async def scenario(api: Api) -> None:
        await api.enqueue_run("r1", payload={"v": 1})
        before = table_checksum(db)
        cases = [
            (api.enqueue_run(""), "run_id"),
            (api.enqueue_run("r1", payload={"v": 2}), "run_id"),  # same id, other payload
            (api.enqueue_run("r2", max_attempts=0), "max_attempts"),
            (api.claim_ledger("relay-1", lane="sideways"), "lane"),
            (api.claim_attempts("w1", queues=[]), "queues"),
        ]
        for pending, parameter in cases:
            with pytest.raises(InvalidArgument) as caught:
                await pending
            error = caught.value
            assert isinstance(error, RunrelayError)
            assert (error.sqlstate, error.parameter) == ("22023", parameter)
            assert isinstance(error.hint, str)
            assert error.hint
            assert parameter in error.message
            assert isinstance(error.__cause__, psycopg.Error)
            assert error.__cause__.sqlstate == "22023"
        assert table_checksum(db) == before

    drive(scenario)


def test_payload_too_large(drive: Callable[..., None], db: psycopg.Connection) -> None:
    db.execute("UPDATE runrelay.settings SET max_payload_bytes = 1024")

    async def scenario(api: Api) -> None:
        with pytest.raises(PayloadTooLarge) as caught:
            await api.enqueue_run("big", payload={"blob": "x" * 2000})
        assert (caught.value.sqlstate, caught.value.parameter) == ("54000", "payload")
        assert caught.value.hint
        await api.enqueue_run("small", payload={"blob": "x" * 100})
        with pytest.raises(PayloadTooLarge):
            await api.append_events("small", [{"type": "t", "payload": {"blob": "y" * 2000}}])

    drive(scenario)
    assert db.execute("SELECT run_id FROM runrelay.runs").fetchall() == [("small",)]
    assert events(db, "small") == ["run.queued"]


def test_wrong_isolation(drive: Callable[..., None], db: psycopg.Connection) -> None:
    async def scenario(api: Api) -> None:
        caller = await api.connect(autocommit=False)
        if api.flavor == "sync":
            caller.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        else:
            await caller.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        with pytest.raises(WrongIsolation) as caught:
            await api.enqueue_run("r1", conn=caller)
        assert caught.value.sqlstate == "25000"
        await api.rollback(caller)

    drive(scenario)
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)


def test_permission_denied(drive: Callable[..., None], db: psycopg.Connection) -> None:
    async def scenario(api: Api) -> None:
        relay = await api.connect()
        await api.sql(relay, "SET ROLE runrelay_relay")
        with pytest.raises(PermissionDenied) as caught:
            await api.enqueue_run("r1", conn=relay)
        assert caught.value.sqlstate == "42501"
        # The relay role may call its own functions.
        assert await api.claim_ledger("relay-1", conn=relay) == []

    drive(scenario)
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (0,)


def test_schema_missing(db_url: str) -> None:
    client = Client(db_url, schema="nowhere")
    with pytest.raises(SchemaMissing):
        client.get_schema_version()
    client.close()

    async def main() -> None:
        async with AsyncClient(db_url, schema="nowhere") as aclient:
            with pytest.raises(SchemaMissing):
                await aclient.get_schema_version()

    asyncio.run(main())


def test_lock_and_statement_timeouts(
    db: psycopg.Connection, db_url: str, connect: Callable[..., psycopg.Connection]
) -> None:
    """A relay holds run a's lane in an open transaction. claim_ledger with
    wait_for_run waits for it: the caller's lock_timeout (500 ms) lapses as
    LockTimeout, a shorter statement_timeout as StatementTimeout. Sync and
    async clients wait side by side."""
    Client(db).enqueue_run("a")
    holder = connect(autocommit=False)
    Client(holder).claim_ledger("relay-1", run_id="a")

    def sync_wait(options: str) -> RunrelayError:
        conn = connect(options=options)
        with pytest.raises(RunrelayError) as caught:
            Client(conn).claim_ledger("relay-2", run_id="a", wait_for_run=True)
        return caught.value

    def async_wait(options: str) -> RunrelayError:
        async def main() -> RunrelayError:
            async with await psycopg.AsyncConnection.connect(
                db_url, autocommit=True, options=options
            ) as aconn:
                with pytest.raises(RunrelayError) as caught:
                    await AsyncClient(aconn).claim_ledger("relay-2", run_id="a", wait_for_run=True)
                return caught.value

        return asyncio.run(main())

    short = "-c statement_timeout=300"
    with ThreadPoolExecutor(4) as pool:
        futures = {
            ("sync", "lock"): pool.submit(sync_wait, "-c lock_timeout=500"),
            ("async", "lock"): pool.submit(async_wait, "-c lock_timeout=500"),
            ("sync", "statement"): pool.submit(sync_wait, short),
            ("async", "statement"): pool.submit(async_wait, short),
        }
        results = {key: f.result(timeout=30) for key, f in futures.items()}
    for (_, kind), error in results.items():
        expected = LockTimeout if kind == "lock" else StatementTimeout
        assert type(error) is expected, (kind, error)
        assert error.sqlstate == expected.sqlstate
    holder.commit()
    (head,) = Client(db).claim_ledger("relay-1", run_id="a")
    assert head.kind is LedgerKind.CLAIMED  # the holder's lease, still ours


# --------------------------------------------------------------------------
# One protocol round trip per call (SPEC §7), counted in a libpq trace.
# --------------------------------------------------------------------------

ROUND_TRIP_CALLS = CALLS_PER_METHOD


def test_trace_counter_sees_round_trips(db: psycopg.Connection, db_url: str) -> None:
    """The counter itself: a plain statement is one round trip, a
    transaction around it three (BEGIN, the statement, COMMIT)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        with traced(conn) as out:
            conn.execute("SELECT %s::int", [1])
        assert frontend_round_trips(out[0]) == 1
        with traced(conn) as out, conn.transaction():
            conn.execute("SELECT 1")
        assert frontend_round_trips(out[0]) == 3


def _assert_one_round_trip_each(counts: dict[str, list[int]]) -> None:
    assert set(counts) == set(_operations.OPERATIONS) | set(VIEW_METHODS), (
        "a method is not measured"
    )
    bad = {name: c for name, c in counts.items() if c != [1] * ROUND_TRIP_CALLS}
    assert bad == {}, f"round trips per call, by method: {bad}"


def _prepare_round_trip_data(db: psycopg.Connection) -> datetime:
    Client(db).enqueue_run("rt", payload={"k": 1})
    return db_now(db)


def test_every_sync_method_is_one_round_trip(db: psycopg.Connection, db_url: str) -> None:
    now = _prepare_round_trip_data(db)
    counts: dict[str, list[int]] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        client = Client(conn)
        for name, (args, kwargs) in round_trip_calls(now).items():
            for _ in range(ROUND_TRIP_CALLS):
                with traced(conn) as out:
                    getattr(client, name)(*args, **kwargs)
                counts.setdefault(name, []).append(frontend_round_trips(out[0]))
    _assert_one_round_trip_each(counts)


def test_every_async_method_is_one_round_trip(db: psycopg.Connection, db_url: str) -> None:
    now = _prepare_round_trip_data(db)
    counts: dict[str, list[int]] = {}

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            client = AsyncClient(conn)
            for name, (args, kwargs) in round_trip_calls(now).items():
                for _ in range(ROUND_TRIP_CALLS):
                    with traced(conn) as out:
                        await getattr(client, name)(*args, **kwargs)
                    counts.setdefault(name, []).append(frontend_round_trips(out[0]))

    asyncio.run(main())
    _assert_one_round_trip_each(counts)


def test_conn_calls_add_no_round_trip_inside_a_transaction(
    db: psycopg.Connection, db_url: str
) -> None:
    """Inside the caller's transaction the call is one round trip too (psycopg
    sends BEGIN once, for the caller's first statement)."""
    with psycopg.connect(db_url) as caller:
        caller.execute("SELECT 1")  # the caller's own work opens the transaction
        client = Client(db_url)
        try:
            with traced(caller) as out:
                client.enqueue_run("t1", conn=caller)
                client.append_events("t1", [{"type": "x"}], conn=caller)
            assert frontend_round_trips(out[0]) == 2
        finally:
            client.close()
        caller.commit()
    assert events(db, "t1") == ["run.queued", "x"]


def test_default_pool_calls_are_one_round_trip(db: psycopg.Connection, db_url: str) -> None:
    """A pool as psycopg_pool builds it by default (connections not in
    autocommit) still costs one round trip per call."""
    with ConnectionPool(db_url, min_size=1, max_size=1, open=False) as pool:
        with pool.connection() as conn:
            pooled = conn
        client = Client(pool)
        counts = []
        for run_id in ("p1", "p2"):
            with traced(pooled) as out:
                client.enqueue_run(run_id)
            counts.append(frontend_round_trips(out[0]))
    assert counts == [1, 1]
    assert run_row(db, "p2")["status"] == "queued"


class _Pipelines(psycopg.Connection[Any]):
    """A real connection that counts the pipelines opened on it."""

    pipelines = 0

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[psycopg.Pipeline]:
        self.pipelines += 1
        with super().pipeline() as p:
            yield p


def _prepared_call(conn: psycopg.Connection[Any]) -> str:
    """What a call of a statement psycopg holds prepared shows: "1", one
    flight without a pipeline, where this psycopg has the statement cache the
    client reads; else "1p", the pipeline every call then keeps (the
    client's fallback, still one flight)."""
    cur = conn.cursor()
    cur.execute("SELECT 1")
    readable = hasattr(getattr(conn, "_prepared", None), "_names") and hasattr(cur, "_query")
    return "1" if readable else "1p"


def _flights_and_pipelines(conn: _Pipelines, call: Callable[[], Any], times: int) -> list[str]:
    """Each call's round trips and whether it opened a pipeline: "1p" or "1"."""
    seen = []
    for _ in range(times):
        before = conn.pipelines
        with traced(conn) as out:
            call()
        piped = "p" if conn.pipelines > before else ""
        seen.append(f"{frontend_round_trips(out[0])}{piped}")
    return seen


def test_a_prepared_statement_goes_without_pipeline_mode_in_one_round_trip(
    db: psycopg.Connection, db_url: str
) -> None:
    """psycopg runs a statement unnamed five times and prepares it on the
    sixth, each in pipeline mode (one flight, Parse included); from the
    seventh on the prepared statement goes without a pipeline, still one
    flight. The client reads psycopg's own cache, which files a statement
    by its query and its parameters' types."""
    with _Pipelines.connect(db_url, autocommit=True) as conn:
        client = Client(conn)
        prepared = _prepared_call(conn)
        claim = functools.partial(client.claim_attempts, "w1", queues=["empty"])
        assert _flights_and_pipelines(conn, claim, 8) == ["1p"] * 6 + [prepared] * 2
        # A call_id is typed uuid where a NULL was not: a statement of its own.
        replayed = functools.partial(client.claim_attempts, "w1", call_id=uuid.uuid4())
        assert _flights_and_pipelines(conn, replayed, 7) == ["1p"] * 6 + [prepared]
        # A refused call is counted by neither psycopg nor the client: the
        # prepared claim stays prepared.
        with pytest.raises(InvalidArgument):
            client.claim_attempts("w1", queues=["empty"], max_runs=0)
        assert _flights_and_pipelines(conn, claim, 1) == [prepared]


def test_inside_the_callers_transaction_a_prepared_call_is_one_round_trip(
    db: psycopg.Connection, db_url: str
) -> None:
    """Inside the caller's open transaction no BEGIN is due, so a prepared
    call goes without a pipeline; on an idle connection outside autocommit
    it keeps one (psycopg sends BEGIN first)."""
    with _Pipelines.connect(db_url) as caller:
        client = Client(db_url)
        try:
            caller.execute("SELECT 1")  # the caller's own work opens the transaction
            prepared = _prepared_call(caller)
            enqueue = functools.partial(client.enqueue_run, "t1", conn=caller)
            assert _flights_and_pipelines(caller, enqueue, 8) == ["1p"] * 6 + [prepared] * 2
            caller.commit()
            # Idle outside autocommit: the call that opens the transaction
            # keeps its pipeline (psycopg's BEGIN goes with it), the next
            # goes without.
            opening, next_call = _flights_and_pipelines(caller, enqueue, 2)
            assert opening.endswith("p") and next_call == prepared
            caller.commit()
        finally:
            client.close()
    assert run_row(db, "t1")["status"] == "queued"


def test_without_prepared_statements_every_call_goes_without_a_pipeline(
    db: psycopg.Connection, db_url: str
) -> None:
    """prepare_threshold=None (a pooler that cannot keep prepared
    statements): each call is an unnamed statement, one flight without a
    pipeline, and nothing is prepared on the server."""
    with _Pipelines.connect(db_url, autocommit=True, prepare_threshold=None) as conn:
        client = Client(conn)
        call = functools.partial(client.get_run, "nothing-here")
        assert _flights_and_pipelines(conn, call, 8) == ["1"] * 8
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        assert prepared == (0,)


def test_after_a_rollback_drops_psycopgs_statements_calls_keep_one_round_trip(
    db: psycopg.Connection, db_url: str
) -> None:
    """A ROLLBACK makes psycopg forget its prepared statements; the client
    reads psycopg's cache, so the calls after it go in pipeline mode again
    until psycopg has prepared the statement anew: one flight each."""
    with _Pipelines.connect(db_url) as caller:
        client = Client(db_url)
        try:
            caller.execute("SELECT 1")
            prepared = _prepared_call(caller)
            run = functools.partial(client.get_run, "nothing-here", conn=caller)
            assert _flights_and_pipelines(caller, run, 8) == ["1p"] * 6 + [prepared] * 2
            caller.rollback()
            caller.execute("SELECT 1")
            assert _flights_and_pipelines(caller, run, 8) == ["1p"] * 6 + [prepared] * 2
            assert run() is None
            caller.rollback()
        finally:
            client.close()


def declared_result(name: str) -> Any:
    """The result type a client method declares (its body's ``_Call[...]``),
    which is what a user's type checker sees (tests/python/test_typing.py)."""
    body = getattr(Client, name).__wrapped__
    return typing.get_args(typing.get_type_hints(body)["return"])[0]


def conforms(value: Any, declared: Any) -> bool:
    """`value` is of the declared type: list[X], dict[K, V], X | None, or exactly class X
    (so an int is not a bool and a plain str is not an outcome enum)."""
    if typing.get_origin(declared) is list:
        (item,) = typing.get_args(declared)
        return type(value) is list and all(conforms(v, item) for v in value)
    if typing.get_origin(declared) is dict:
        key, item = typing.get_args(declared)
        return type(value) is dict and all(
            conforms(k, key) and conforms(v, item) for k, v in value.items()
        )
    if typing.get_origin(declared) in (types.UnionType, typing.Union):
        return any(conforms(value, option) for option in typing.get_args(declared))
    if declared is type(None):
        return value is None
    return type(value) is declared


def test_conforms_rejects_what_a_type_checker_would() -> None:
    assert conforms([], list[ClaimedAttempt])
    assert not conforms([1], list[ClaimedAttempt])
    assert not conforms(True, int)
    assert not conforms("completed", CompleteOutcome)
    assert conforms(None, datetime | None)
    assert not conforms(None, datetime)
    assert conforms({"a": "b"}, dict[str, str] | None)
    assert not conforms({"a": 1}, dict[str, str])
    assert declared_result("claim_attempts") == list[ClaimedAttempt]


def test_every_method_returns_its_declared_type(
    drive: Callable[..., None], db: psycopg.Connection
) -> None:
    """Each method's values at run time are of the type its signature gives a
    type checker, including non-empty lists and the non-None side of every
    optional result, so a declaration cannot drift from the operation table's row readers."""
    seen: dict[str, list[Any]] = {}
    # A recorded step's event would join the observability lane the
    # scenario's relay calls walk through.
    db.execute("UPDATE runrelay.settings SET step_events = false")

    async def scenario(api: Api) -> None:
        async def call(name: str, *args: Any, **kwargs: Any) -> Any:
            value = await getattr(api, name)(*args, **kwargs)
            assert conforms(value, declared_result(name)), (name, value)
            seen.setdefault(name, []).append(value)
            return value

        ahead = await api.connect(options=SHIFTED_CLOCK)
        detached = {"kind": "detached_runner", "runner": "gpu-7"}
        await call("get_schema_version")
        await call("enqueue_run", "a", payload={"k": 1})
        await call("enqueue_run", "b")
        await call("enqueue_run", "c", max_attempts=1)
        await call("enqueue_run", "d")
        await call("enqueue_run", "e")
        await call("enqueue_runs", [EnqueueItem("e"), EnqueueItem("f", queue="other")])
        await call("append_events", "a", [{"type": "note", "lane": "observability"}])
        await call("signal_run", "a", "early")
        await call("cancel_run", "missing")
        claimed = {c.run_id: c for c in await call("claim_attempts", "w1", max_runs=5)}
        a, b, c, d, e = (claimed[run_id] for run_id in "abcde")
        await call("release_attempt", **e.fence, reason="Shutdown: w1 stopping")
        await call("heartbeat", **a.fence)
        await call("prepare_waiting_failure", **a.fence)
        await call("complete_attempts", [b])
        await call("settle_and_claim", [b], "w1", max_runs=0)  # b's recorded outcome
        await call("record_step", **c.fence, step="s1", result={"r": 1})
        await call("fail_attempt", **c.fence, error={"e": 1})

        await call("suspend_attempt", **d.fence, wait=detached)
        await call("read_runner_terminal", "d", 2)  # no such attempt: None
        await call("record_runner_terminal", "d", 1, {"out": 1})
        await call("read_runner_terminal", "d", 1)
        await call("claim_detached_terminal", **d.fence)
        await call("complete_attempt", **d.fence, result={"out": 1})

        (note,) = await call("claim_ledger", "relay-1", lane="observability", run_id="a")
        await call("renew_ledger_lease", "relay-1", [note.event_id])
        await call("fail_ledger", "relay-1", [note.event_id], {"e": 1}, permanent=True)
        await call("list_blocked_heads", lane="observability")
        await call("requeue_blocked_heads", run_id="a")
        await call("skip_ledger_events", "a", "observability", "not blocked any more")
        await call("list_processes")
        (note,) = await call("claim_ledger", "relay-1", lane="observability", run_id="a")
        await call("fail_ledger", "relay-1", [note.event_id], {"e": 1})
        await call("ledger_next_due_at", lane="observability")
        await call("requeue_ledger_event", note.event_id)
        (again,) = await call("claim_ledger", "relay-1", lane="observability", conn=ahead)
        await call("release_ledger", "relay-1", [again.event_id])
        (again,) = await call("claim_ledger", "relay-1", lane="observability", conn=ahead)
        await call("ack_ledger", "relay-1", "a", [again.event_id])
        batches = await call("claim_ledger_runs", "relay-2", max_runs=2)
        await call("ack_ledger_runs", "relay-2", [e.event_id for e in batches], claim_runs=1)
        await call("ledger_next_due_at", lane="observability", run_id="a")

        await call("reap_expired", conn=ahead)  # a's lease lapses two hours ahead
        await call("prune", db_now(db) + timedelta(hours=3))
        await call("purge_runs", db_now(db) - timedelta(days=1))
        page = await call("list_runs", max_rows=2)
        await call("list_runs", after_created_at=page[-1].created_at, after_run_id=page[-1].run_id)
        await call("get_run", "missing")  # no such run: None
        await call("get_run", "c")
        await call("run_attempts", "c")
        await call("run_steps", "c")
        await call("run_ledger_events", "a")
        await call("retry_run", "c", reason="fixed", requested_by="ops")
        await call("pause_queue", "frozen", reason="maintenance", requested_by="ops")
        await call("list_paused_queues")
        await call("resume_queue", "frozen")
        await call("run_trace_context", "a")  # enqueued untraced: None
        await call("enqueue_runs", [EnqueueItem("traced", trace_context={"traceparent": TP})])
        await call("run_trace_context", "traced")

        await call("upsert_schedule", "tick", "@hourly", payload={"k": 1}, missed="catch_up")
        await call("list_schedules")
        await call("schedules_next_due_at")
        await call("enqueue_due_schedules", conn=ahead)  # two hours ahead: two slots
        await call("delete_schedule", "tick")
        await call("schedules_next_due_at")  # no schedule: its fields are None

        await call("record_queue_activity")  # the last hour's minutes
        # Field by field too: lists of ints, a float age where one is due.
        queues = await call("queue_overview")
        lanes = await call("ledger_overview")
        assert [lane.lane for lane in lanes] == [Lane.LIFECYCLE, Lane.OBSERVABILITY]
        for row in [*queues, *lanes]:
            for name, declared in typing.get_type_hints(type(row)).items():
                assert conforms(getattr(row, name), declared), (row, name)
        assert any(q.oldest_runnable_age_seconds is not None for q in queues), queues

    drive(scenario)
    assert set(seen) == set(_operations.OPERATIONS), "a method is not checked"
    empty = {
        name
        for name, values in seen.items()
        if typing.get_origin(declared_result(name)) is list and not any(values)
    }
    assert empty == set(), "a list result was only ever checked empty"
    for optional in ("read_runner_terminal", "ledger_next_due_at", "get_run", "run_trace_context"):
        assert None in seen[optional] and any(v is not None for v in seen[optional]), optional


def test_calls_sharing_one_given_connection_take_turns(db: psycopg.Connection, db_url: str) -> None:
    """A client made on one connection is shared by a worker's threads or
    tasks; each call is a pipeline, and two interleaved on one connection
    broke it (PIPELINE_SYNC, or a hang). Calls on a given connection take
    turns."""

    async def tasks() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            client = AsyncClient(conn)
            calls = (client.enqueue_run(f"a{i}", payload={"i": i}) for i in range(40))
            return await asyncio.wait_for(asyncio.gather(*calls), 60)

    assert len(asyncio.run(tasks())) == 40
    conn = psycopg.connect(db_url, autocommit=True)
    pool = ThreadPoolExecutor(8)
    try:
        client = Client(conn)
        futures = [pool.submit(client.enqueue_run, f"s{i}", payload={"i": i}) for i in range(40)]
        assert len([f.result(timeout=60) for f in futures]) == 40
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        conn.close()
    assert db.execute("SELECT count(*) FROM runrelay.runs").fetchone() == (80,)
