"""The SQL API table (python_client/runrelay/sql_api.json) is what a migrated
database says, and the client's hand-written parts agree with it: the
operation table covers exactly its functions, each method (whose parameter
names and order test_client.py holds to the catalog) sends by default what the
SQL default is, and reads each result row into a type with the function's
result columns. (Parameter types need no check: every call casts its
arguments to the table's types, taken from the table.)"""

from __future__ import annotations

import dataclasses
import inspect
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from devtools import sqlapi
from psycopg import sql

from runrelay import _operations, types
from runrelay.client import Client, _Methods

TABLE = _operations.SQL_API

# Placeholder values of each SQL type, for the arguments a method requires.
PLACEHOLDER: dict[str, Any] = {
    "text": "x",
    "integer": 1,
    "bigint": 1,
    "uuid": uuid.UUID(int=1),
    "jsonb": {},
    "bigint[]": [1],
    "text[]": ["x"],
    "timestamp with time zone": datetime(2030, 1, 1, tzinfo=UTC),
}

# Where the client sends something other than the SQL default when the
# caller says nothing, and why that is the same call.
SENDS_OTHER_THAN_THE_SQL_DEFAULT: dict[tuple[str, str], str] = {
    ("cancel_run", "call_id"): "a fresh call id, so a lost reply can be replayed (SQL: none)",
    ("retry_run", "call_id"): "a fresh call id, so a lost reply can be replayed (SQL: none)",
    ("signal_run", "call_id"): "a fresh call id, so a lost reply can be replayed (SQL: none)",
    ("enqueue_run", "run_at"): "NULL, which enqueue_run reads as now by the database clock "
    "(the test clock shift included), where now() is the transaction's start",
}

# Fields a row type has beyond a function's columns, and why.
OTHER_FIELDS: dict[str, dict[str, str]] = {
    "LedgerEvent": {
        "lag_ms": "ack_ledger's column: claim_ledger and ack_ledger share the row type",
        "trace_context": "the tracing client's, read with the claim",
    },
    "ClaimedAttempt": {"trace_context": "the tracing client's, read with the claim"},
    "SettleAndClaimRow": {"trace_context": "the tracing client's, read with the claim"},
}


class _Sent(_Methods):
    """A client whose calls are not made: each answers the values it would send."""

    def _call(self, function: str, values: dict[str, Any], conn: Any) -> Any:
        return values


def _required_args(name: str) -> dict[str, Any]:
    params = inspect.signature(getattr(Client, name)).parameters
    types_by_name = {p["name"]: p["type"] for p in TABLE[name]["params"]}
    return {
        p: PLACEHOLDER[types_by_name[p]]
        for p, spec in params.items()
        if p not in ("self", "conn") and spec.default is inspect.Parameter.empty
    }


def test_the_table_is_what_the_migrated_schema_says(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        current = sqlapi.render(conn)
    assert sqlapi.TABLE.read_text(encoding="utf-8") == current, (
        "python_client/runrelay/sql_api.json is stale: run `make docs` and commit it"
    )


def test_the_operation_table_covers_exactly_the_sql_api() -> None:
    assert set(_operations.OPERATIONS) == set(TABLE)


def test_what_a_method_sends_by_default_is_the_sql_default(db: psycopg.Connection) -> None:
    sent_by = _Sent()
    checked = 0
    for name, fn in sorted(TABLE.items()):
        defaulted = [p for p in fn["params"] if p["default"] is not None]
        if not defaulted:
            continue
        values = getattr(sent_by, name)(**_required_args(name))
        bound = _operations.OPERATIONS[name].bind(values)
        for p in defaulted:
            if (name, p["name"]) in SENDS_OTHER_THAN_THE_SQL_DEFAULT:
                continue
            same = db.execute(
                sql.SQL("SELECT ({})::{} IS NOT DISTINCT FROM %s::{}").format(
                    sql.SQL(p["default"]), sql.SQL(p["type"]), sql.SQL(p["type"])
                ),
                [bound[p["name"]]],
            ).fetchone()
            assert same == (True,), (
                f"{name}({p['name']}): the client sends {values[p['name']]!r} by default, "
                f"the SQL default is {p['default']}"
            )
            checked += 1
    assert checked > 50, "the defaults were not checked"


def _result_type(name: str) -> Any:
    annotation = inspect.signature(getattr(Client, name)).return_annotation
    found = [
        getattr(types, word)
        for word in re.findall(r"\w+", str(annotation))
        if dataclasses.is_dataclass(getattr(types, word, None))
    ]
    assert len(found) == 1, f"{name} returns {annotation}"
    return found[0]


def test_every_row_type_has_the_functions_result_columns() -> None:
    checked = 0
    for name, fn in sorted(TABLE.items()):
        if fn["columns"] is None:
            continue
        cls = _result_type(name)
        fields = [f.name for f in dataclasses.fields(cls)]
        columns = [c["name"] for c in fn["columns"]]
        others = OTHER_FIELDS.get(cls.__name__, {})
        assert [f for f in fields if f in columns] == columns, f"{name} -> {cls.__name__}"
        assert set(fields) - set(columns) <= set(others), f"{name} -> {cls.__name__}"
        checked += 1
    assert checked > 20, "the row types were not checked"
