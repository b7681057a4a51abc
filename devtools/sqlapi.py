"""The SQL API table: every public function's parameters (name, SQL type,
default), whether it returns rows, and its result columns, read from the
catalog of a database migrated to head.

It is written to ``python_client/runrelay/sql_api.json`` and shipped in the
package. It is the one home of the signatures on the client side: the
Python client's operation table (runrelay._operations) takes each call's
parameters and their casts from it, tests/python/test_sql_api.py holds the
hand-written methods (parameter names, what they send by default) and result
types to it, and fails when it differs from what a migrated database says.
A client in another language reads the same file.

Command line (``make docs`` runs it against a throwaway cluster)::

    DATABASE_URL=postgresql://... python -m devtools.sqlapi [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

TABLE = Path(__file__).resolve().parents[1] / "python_client" / "runrelay" / "sql_api.json"
ROLES = ("producer", "worker", "relay", "admin")

_FUNCTIONS_SQL = """
SELECT
    p.oid,
    p.proname,
    p.proretset,
    t.typrelid,
    pg_catalog.format_type(p.prorettype, NULL),
    pg_catalog.pg_get_function_result(p.oid),
    coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), ''),
    ARRAY(
        SELECT DISTINCT substr(r.rolname, length(%(prefix)s) + 1)
        FROM pg_catalog.aclexplode(p.proacl) AS a
        INNER JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE a.privilege_type = 'EXECUTE' AND starts_with(r.rolname, %(prefix)s)
    )
FROM pg_catalog.pg_proc AS p
INNER JOIN pg_catalog.pg_type AS t ON t.oid = p.prorettype
WHERE p.pronamespace = %(schema)s::regnamespace AND NOT starts_with(p.proname, '_')
ORDER BY p.proname, p.oid
"""

# Every argument in order: input ones with their defaults, output ones (OUT,
# TABLE) as result columns.
_ARGUMENTS_SQL = """
SELECT
    a.name,
    a.mode,
    pg_catalog.format_type(a.type, NULL),
    CASE WHEN a.mode IN ('i', 'b', 'v')
        THEN pg_catalog.pg_get_function_arg_default(p.oid, a.position::integer)
    END
FROM pg_catalog.pg_proc AS p,
    unnest(
        coalesce(p.proallargtypes, p.proargtypes::oid[]),
        coalesce(p.proargmodes, array_fill('i'::"char", ARRAY[p.pronargs::integer])),
        p.proargnames
    ) WITH ORDINALITY AS a (type, mode, name, position)
WHERE p.oid = %(oid)s
ORDER BY a.position
"""

_COLUMNS_SQL = """
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = %(relid)s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


@dataclass(frozen=True)
class Function:
    """A public function as the catalog describes it."""

    name: str
    roles: tuple[str, ...]
    params: list[dict[str, Any]]  # {name, type, default (SQL text or None)}
    returns_set: bool
    returns: str  # the return type (format_type, schema-relative)
    result: str  # the whole RETURNS clause (pg_get_function_result)
    columns: list[dict[str, str]] | None  # {name, type}; None for a scalar
    composite: bool  # the columns are a composite type's, not OUT/TABLE arguments
    comment: str


def columns(conn: psycopg.Connection[Any], relid: int) -> list[dict[str, str]]:
    """The columns of a table, view or composite type, in order."""
    rows = conn.execute(_COLUMNS_SQL, {"relid": relid}).fetchall()
    return [{"name": name, "type": sqltype} for name, sqltype in rows]


def functions(conn: psycopg.Connection[Any], schema: str = "runrelay") -> list[Function]:
    """Every function of `schema` granted to one of its roles, by name."""
    out: list[Function] = []
    params = {"schema": schema, "prefix": f"{schema}_"}
    rows = conn.execute(_FUNCTIONS_SQL, params).fetchall()
    for oid, name, returns_set, relid, returns, result, comment, roles in rows:
        granted = tuple(role for role in ROLES if role in roles)
        if not granted:
            continue  # not part of any role's API
        inputs: list[dict[str, Any]] = []
        outputs: list[dict[str, str]] = []
        for arg_name, mode, arg_type, default in conn.execute(_ARGUMENTS_SQL, {"oid": oid}):
            if mode in ("i", "b", "v"):
                inputs.append({"name": arg_name, "type": arg_type, "default": default})
            if mode in ("o", "b", "t"):
                outputs.append({"name": arg_name, "type": arg_type})
        if relid:
            outputs = columns(conn, relid)
        prefix = f"{schema}."
        out.append(
            Function(
                name,
                granted,
                inputs,
                bool(returns_set),
                returns.removeprefix(prefix),
                result,
                outputs or None,
                bool(relid),
                comment,
            )
        )
    return out


def table(conn: psycopg.Connection[Any], schema: str = "runrelay") -> dict[str, Any]:
    """name -> {roles, params: [{name, type, default}], returns_set, returns,
    columns: [{name, type}] or null for a scalar result}, for every function
    granted to a role of the install."""
    out: dict[str, Any] = {}
    for fn in functions(conn, schema):
        if fn.name in out:
            raise ValueError(f"{fn.name} is overloaded; the API table has one signature a name")
        out[fn.name] = {
            "roles": list(fn.roles),
            "params": fn.params,
            "returns_set": fn.returns_set,
            "returns": fn.returns,
            "columns": fn.columns,
        }
    return out


def render(conn: psycopg.Connection[Any], schema: str = "runrelay") -> str:
    """The text of sql_api.json: a function a block, each of its parameters
    and columns on one line."""

    def entries(items: list[dict[str, Any]] | None) -> str:
        if items is None:
            return "null"
        if not items:
            return "[]"
        rows = ",\n".join(f"   {json.dumps(item, sort_keys=True)}" for item in items)
        return f"[\n{rows}\n  ]"

    blocks = []
    for name, fn in sorted(table(conn, schema).items()):
        fields = [
            f'  "columns": {entries(fn["columns"])}',
            f'  "params": {entries(fn["params"])}',
            f'  "returns": {json.dumps(fn["returns"])}',
            f'  "returns_set": {json.dumps(fn["returns_set"])}',
            f'  "roles": {json.dumps(fn["roles"])}',
        ]
        blocks.append(f" {json.dumps(name)}: {{\n" + ",\n".join(fields) + "\n }")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.sqlapi", description=__doc__)
    parser.add_argument("--out", type=Path, default=TABLE, help=f"default: {TABLE}")
    parser.add_argument("--check", action="store_true", help="only check the file is current")
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("set DATABASE_URL to a database migrated to head", file=sys.stderr)
        return 2
    with psycopg.connect(url, autocommit=True) as conn:
        text = render(conn)
    current = args.out.read_text(encoding="utf-8") if args.out.exists() else None
    if current == text:
        return 0
    if args.check:
        print(f"stale: {args.out} (run `make docs`)", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
