"""Installing and migrating a sharded runrelay: the shards, then the proxy.

The proxy's functions are built from a migrated shard's own catalog, so their
names, parameters, defaults, result types and grants are the shard's by
construction:

* per-run functions become PL/Proxy functions, ``RUN ON`` the run's hash;
* calls that name no run (claims, reaping, stats), batches and event-id
  calls are the PL/pgSQL of ``sql/*.sql``, over ``on_<function>`` PL/Proxy
  functions that call one shard by partition;
* the few admin calls that have no meaning across shards raise
  feature_not_supported with a hint.

``runrelay migrate`` against a proxy migrates every shard and then rebuilds
the proxy's functions, all at this package's head revision. It checks
everything first and changes nothing when a shard is unreachable, ahead of
this package, given twice, not the shard it is configured as, or holding
event ids or runs that are not its own; when the proxy's server has no
PL/Proxy or its database is an install of its own; or when the shards or the
partition count given differ from the configured ones. The proxy's
configuration and functions then change in one transaction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import conninfo, sql

from . import EVENT_SHIFT

# Per-run calls: RUN ON the hash of this argument.
ROUTED = (
    "ack_ledger",
    "append_events",
    "cancel_run",
    "claim_detached_terminal",
    "complete_attempt",
    "enqueue_run",
    "fail_attempt",
    "get_run",
    "heartbeat",
    "prepare_waiting_failure",
    "read_runner_terminal",
    "record_runner_terminal",
    "record_step",
    "release_attempt",
    "retry_run",
    "run_attempts",
    "run_ledger_events",
    "run_steps",
    "run_trace_context",
    "signal_run",
    "skip_ledger_events",
    "suspend_attempt",
)
# Written in sql/*.sql (their signatures are filled in from the shard).
WRITTEN = (
    "ack_ledger_runs",
    "claim_attempts",
    "claim_ledger",
    "claim_ledger_runs",
    "complete_attempts",
    "enqueue_due_schedules",
    "enqueue_runs",
    "fail_ledger",
    "get_schema_version",
    "ledger_next_due_at",
    "pause_queue",
    "prune",
    "purge_runs",
    "reap_expired",
    "record_queue_activity",
    "release_ledger",
    "renew_ledger_lease",
    "requeue_ledger_event",
    "resume_queue",
    "schedules_next_due_at",
    "settle_and_claim",
)
# The one-shard callees of WRITTEN.
ON_SHARD = tuple(f for f in WRITTEN if f not in ("enqueue_due_schedules", "schedules_next_due_at"))
# Views summed over the shards (sql/40_every_shard.sql).
VIEWS = ("run_stats", "ledger_stats")
# Listing and overview calls: keyset pages and per-install rollups do not
# merge across shards; call them on each shard.
UNSUPPORTED = (
    "delete_schedule",
    "ledger_overview",
    "list_blocked_heads",
    "list_paused_queues",
    "list_processes",
    "list_runs",
    "list_schedules",
    "queue_overview",
    "requeue_blocked_heads",
    "upsert_schedule",
)
ROLE_SUFFIXES = ("producer", "worker", "relay", "admin")


class ShardingError(RuntimeError):
    """A sharded install or migration was refused; nothing was changed."""


@dataclass(frozen=True)
class Function:
    name: str
    arguments: str  # with defaults
    identity: str  # without
    names: tuple[str, ...]
    result: str
    returns_set: bool
    roles: tuple[str, ...]


def _catalog(shard: psycopg.Connection[Any], schema: str) -> dict[str, Function]:
    shard.execute("SET search_path TO pg_catalog")
    rows = shard.execute(
        """
        SELECT p.proname, pg_get_function_arguments(p.oid),
               pg_get_function_identity_arguments(p.oid),
               coalesce(p.proargnames[1:p.pronargs], '{}'),
               pg_get_function_result(p.oid), p.proretset,
               array(SELECT r.rolname FROM pg_roles AS r
                     WHERE r.rolname = ANY (%(roles)s)
                       AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
                     ORDER BY r.rolname)
        FROM pg_proc AS p
        WHERE p.pronamespace = %(schema)s::regnamespace AND p.proname !~ '^_'
        """,
        {"schema": schema, "roles": [f"{schema}_{s}" for s in ROLE_SUFFIXES]},
    ).fetchall()
    return {
        r[0]: Function(r[0], r[1], r[2], tuple(r[3]), r[4], bool(r[5]), tuple(r[6])) for r in rows
    }


def _composites(shard: psycopg.Connection[Any], schema: str, relkind: str) -> dict[str, str]:
    rows = shard.execute(
        """
        SELECT c.relname,
               string_agg(quote_ident(a.attname) || ' '
                          || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
        FROM pg_class AS c
        JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind = %(kind)s
        GROUP BY c.relname
        """,
        {"schema": schema, "kind": relkind},
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _view_roles(shard: psycopg.Connection[Any], schema: str, view: str) -> list[str]:
    rows = shard.execute(
        """
        SELECT r.rolname FROM pg_roles AS r
        WHERE r.rolname = ANY (%(roles)s)
          AND has_table_privilege(
                r.oid, format('%%I.%%I', %(schema)s::text, %(view)s::text), 'SELECT')
        ORDER BY 1
        """,
        {"schema": schema, "view": view, "roles": [f"{schema}_{s}" for s in ROLE_SUFFIXES]},
    ).fetchall()
    return [r[0] for r in rows]


def proxy_sql(shard: psycopg.Connection[Any], schema: str) -> str:
    """The SQL that (re)creates the proxy's functions for shards like `shard`."""
    functions = _catalog(shard, schema)
    missing = [f for f in (*ROUTED, *WRITTEN, *UNSUPPORTED) if f not in functions]
    unknown = sorted(set(functions) - {*ROUTED, *WRITTEN, *UNSUPPORTED})
    if missing or unknown:
        raise ShardingError(
            f"the shard's functions do not match this package's proxy "
            f"(missing {missing}, unplaced {unknown})"
        )
    q_schema = _ident(schema)
    config = _ident(f"{schema}_config")
    proxy = _ident(f"{schema}_proxy")
    cluster = schema
    out: list[str] = []

    for name, columns in sorted(_composites(shard, schema, "c").items()):
        out.append(f"CREATE TYPE {q_schema}.{_ident(name)} AS ({columns});")
    views = _composites(shard, schema, "v")
    for view in VIEWS:
        out.append(f"CREATE TYPE {proxy}.{_ident(view + '_row')} AS ({views[view]});")

    for name in ROUTED:
        fn = functions[name]
        key = "run_id"
        if key not in fn.names:
            raise ShardingError(f"{name} has no run_id to route by")
        route = (
            f"{proxy}.keyed_hash(run_id, concurrency_key)"
            if name == "enqueue_run"
            else f"{proxy}.run_hash(run_id)"
        )
        out.append(
            f"CREATE FUNCTION {q_schema}.{_ident(name)}({fn.arguments}) RETURNS {fn.result}\n"
            f"LANGUAGE plproxy VOLATILE AS $$\n"
            f"    CLUSTER '{cluster}';\n    RUN ON {route};\n$$;"
        )

    for name in ON_SHARD:
        fn = functions[name]
        args = ", ".join(fn.names)
        call = f"{q_schema}.{_ident(name)}({args})"
        select = f"SELECT * FROM {call};" if fn.returns_set else f"SELECT {call} AS {name};"
        identity = f"p_partition integer, {fn.identity}" if fn.identity else "p_partition integer"
        out.append(
            f"CREATE FUNCTION {proxy}.{_ident('on_' + name)}({identity}) RETURNS {fn.result}\n"
            f"LANGUAGE plproxy VOLATILE AS $$\n"
            f"    CLUSTER '{cluster}';\n    RUN ON p_partition;\n    {select}\n$$;"
        )
    for view in VIEWS:
        out.append(
            f"CREATE FUNCTION {proxy}.{_ident('on_' + view)}(p_partition integer)\n"
            f"RETURNS SETOF {proxy}.{_ident(view + '_row')}\n"
            f"LANGUAGE plproxy VOLATILE AS $$\n"
            f"    CLUSTER '{cluster}';\n    RUN ON p_partition;\n"
            f"    SELECT * FROM {q_schema}.{_ident(view)};\n$$;"
        )

    for name in UNSUPPORTED:
        fn = functions[name]
        out.append(
            f"CREATE FUNCTION {q_schema}.{_ident(name)}({fn.arguments}) RETURNS {fn.result}\n"
            f"LANGUAGE plpgsql VOLATILE AS $$\n"
            # The parameters are the shard's signature; none is read here.
            f"-- @plpgsql_check_options: extra_warnings = off\nBEGIN\n"
            f"    RAISE EXCEPTION 'runrelay: {name} is not available through the proxy'\n"
            f"        USING ERRCODE = 'feature_not_supported',\n"
            f"        HINT = 'Call it on each shard: {schema}.shard_map() lists them.';\n"
            f"END;\n$$;"
        )

    def fill(text: str) -> str:
        def signature(match: re.Match[str]) -> str:
            kind, name = match.group(1), match.group(2)
            fn = functions[name]
            return fn.arguments if kind == "args" else fn.result

        text = re.sub(r"@(args|result):([a-z_]+)@", signature, text)
        text = _SHARD_DOWN.sub(_shard_down_handler, text)
        return (
            text.replace("@schema@", q_schema).replace("@proxy@", proxy).replace("@config@", config)
        )

    written = [fill(text) for name, text in _sql_files() if name != "00_config.sql"]
    gathers = [fill(_GATHER.replace("@view@", view)) for view in VIEWS]
    # The routing helpers come before the functions that use them, and the
    # views' gather_ functions before the views.
    body = [written[0], *out, *gathers, *written[1:]]

    # Callers reach the shards only through the public functions: those run
    # as their owner on the proxy (so no runrelay role needs, or has, the
    # one-shard on_* calls, the routing helpers, the configuration or
    # PL/Proxy's plproxy schema), while PL/Proxy connects to the shards as
    # the session's login (plproxy.get_cluster_partitions, 00_config.sql),
    # so each shard still checks the caller's own grants. The views call
    # their gather_* function with the caller's rights: those run as their
    # owner too.
    definer = [
        "DO $d$ DECLARE v_fn regprocedure; BEGIN\n"
        "    FOR v_fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p\n"
        f"        WHERE p.pronamespace = '{q_schema}'::regnamespace\n"
        f"           OR (p.pronamespace = '{proxy}'::regnamespace\n"
        "               AND p.proname LIKE 'gather\\_%')\n"
        "    LOOP\n"
        "        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER"
        " SET search_path = pg_catalog, pg_temp', v_fn);\n"
        "    END LOOP;\nEND $d$;"
    ]
    grants = [
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {q_schema} FROM PUBLIC;",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {proxy} FROM PUBLIC;",
    ]
    for suffix in ROLE_SUFFIXES:
        role = _ident(f"{schema}_{suffix}")
        grants += [
            # An install of an older package granted these; no role needs them.
            f"REVOKE ALL ON ALL TABLES IN SCHEMA {config} FROM {role};",
            f"REVOKE ALL ON SCHEMA {config} FROM {role};",
            f"GRANT USAGE ON SCHEMA {q_schema} TO {role};",
            f"GRANT EXECUTE ON FUNCTION {q_schema}.shard_for(text), {q_schema}.shard_map() "
            f"TO {role};",
        ]
    for fn in functions.values():
        for role in fn.roles:
            grants.append(
                f"GRANT EXECUTE ON FUNCTION {q_schema}.{_ident(fn.name)}({fn.identity}) "
                f"TO {_ident(role)};"
            )
    for view in VIEWS:
        for role in _view_roles(shard, schema, view):
            grants.append(f"GRANT SELECT ON {q_schema}.{_ident(view)} TO {_ident(role)};")
            grants.append(
                f"GRANT EXECUTE ON FUNCTION {proxy}.{_ident('gather_' + view)}() TO {_ident(role)};"
            )
    return "\n\n".join([*body, *definer, *grants]) + "\n"


# A stats view's rows from every shard that answers: what the proxy's view
# of that name sums (sql/40_every_shard.sql). Filled like sql/*.sql.
_GATHER = """\
CREATE FUNCTION @proxy@.gather_@view@()
RETURNS SETOF @proxy@.@view@_row
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_part integer;
    v_rows @proxy@.@view@_row [];
BEGIN
    FOR v_part IN SELECT w.head FROM @proxy@.walk(NULL) AS w (head) LOOP
        BEGIN
            SELECT coalesce(array_agg(r), '{}') INTO v_rows FROM @proxy@.on_@view@(v_part) AS r;
        @skip_if_down(v_part)@
        END;
        RETURN QUERY SELECT * FROM unnest(v_rows);
    END LOOP;
END;
$$;"""


# The handler of every call that reaches one shard from sql/*.sql, written
# there as one line at the handler's indentation:
#
#     @if_shard_down@                     the shared part: a shard's own error
#                                         (not "shard down") is raised as it is
#     @skip_if_down(v_part)@              ... then skip the shard and go on
#     @skip_if_down(v_part, v_error)@     ... keeping the error for the end
#     @unavailable_if_down(v_group.head)@ ... or fail the call naming the shard
#
# so that what a walker does with a shard that does not answer is written once.
_SHARD_DOWN = re.compile(
    r"^( *)@(if_shard_down|skip_if_down|unavailable_if_down)(?:\(([^)]*)\))?@$", re.MULTILINE
)


def _shard_down_handler(match: re.Match[str]) -> str:
    indent, kind, args = match.group(1), match.group(2), match.group(3)
    lines = [
        "EXCEPTION WHEN internal_error THEN",
        "    IF NOT @proxy@.is_shard_down(SQLSTATE, SQLERRM) THEN RAISE; END IF;",
    ]
    given = [a.strip() for a in (args or "").split(",") if a.strip()]
    if kind == "skip_if_down":
        lines.append(f"    PERFORM @proxy@.skip_shard({given[0]}, SQLERRM);")
        lines += [f"    {error} := SQLERRM;" for error in given[1:]]
        lines.append("    CONTINUE;")
    elif kind == "unavailable_if_down":
        lines.append(f"    PERFORM @proxy@.shard_unavailable({given[0]}, SQLERRM);")
    return "\n".join(indent + line for line in lines)


def _sql_files() -> list[tuple[str, str]]:
    """(name, text) of the proxy's SQL files (sql/*.sql, shipped in the
    package), in name order."""
    folder = resources.files(__package__).joinpath("sql")
    files = sorted((f.name, f) for f in folder.iterdir() if f.name.endswith(".sql"))
    found = [(name, f.read_text(encoding="utf-8")) for name, f in files]
    if not any(name == "00_config.sql" for name, _ in found):
        raise ShardingError(f"this package's proxy SQL is missing from {folder}")
    return found


def config_sql(schema: str) -> str:
    (text,) = (text for name, text in _sql_files() if name == "00_config.sql")
    return text.replace("@config@", _ident(f"{schema}_config"))


def _ident(name: str) -> str:
    # Plain when it can be: PL/Proxy's parser takes no quoted identifiers, and
    # the schema name is [a-z_][a-z0-9_]* (migrations/env.py) anyway.
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return sql.Identifier(name).as_string(None)


def _stored_dsn(url: str) -> str:
    """A shard DSN as the proxy stores it: key=value form, without
    credentials (the proxy connects as the calling role)."""
    params = conninfo.conninfo_to_dict(url)
    for key in ("user", "password", "passfile"):
        params.pop(key, None)
    return conninfo.make_conninfo("", **params)


def _with_credentials(dsn: str, proxy_url: str) -> str:
    params = dict(conninfo.conninfo_to_dict(dsn))
    mine = conninfo.conninfo_to_dict(proxy_url)
    for key in ("user", "password", "passfile"):
        if mine.get(key) is not None:
            params[key] = mine[key]
    return conninfo.make_conninfo("", **params)


def _as_url(dsn: str) -> str:
    """A key=value DSN as the postgresql:// URL Alembic's engine needs."""
    from urllib.parse import quote, urlencode

    params = dict(conninfo.conninfo_to_dict(dsn))
    user = params.pop("user", None)
    password = params.pop("password", None)
    host = params.pop("host", None) or ""
    port = params.pop("port", None)
    dbname = params.pop("dbname", None) or ""
    auth = ""
    if user:
        auth = quote(str(user), safe="")
        if password:
            auth += ":" + quote(str(password), safe="")
        auth += "@"
    where = quote(str(host), safe="") if "/" not in str(host) else ""
    if "/" in str(host):
        params["host"] = host
    if port:
        where += f":{port}"
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}{where}/{quote(str(dbname), safe='')}{query}"


def _revision(conn: psycopg.Connection[Any], schema: str) -> str | None:
    exists = conn.execute(
        "SELECT to_regclass(format('%%I.alembic_version', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(
        sql.SQL("SELECT version_num FROM {}.alembic_version").format(sql.Identifier(schema))
    ).fetchone()
    return None if row is None else str(row[0])


def _event_range(shard: int) -> tuple[int, int]:
    return (shard << EVENT_SHIFT) or 1, ((shard + 1) << EVENT_SHIFT) - 1


def _events_table(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """The table holding the ledger's event ids: ledger_events (0008 on),
    ledger before; None before the ledger exists."""
    row = conn.execute(
        """
        SELECT c.relname FROM pg_class AS c
        JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'event_id'
        WHERE c.relnamespace = to_regnamespace(%s) AND c.relkind = 'r'
          AND c.relname IN ('ledger_events', 'ledger')
        ORDER BY c.relname DESC LIMIT 1
        """,
        (schema,),
    ).fetchone()
    return None if row is None else str(row[0])


def _range_problem(conn: psycopg.Connection[Any], schema: str, shard: int) -> str | None:
    """Why the shard's existing ledger events rule it out as shard `shard`
    (ids outside its range), or None. Changes nothing."""
    table = _events_table(conn, schema)
    if table is None:
        return None
    low, high = _event_range(shard)
    bounds = conn.execute(
        sql.SQL("SELECT min(event_id), max(event_id) FROM {}").format(sql.Identifier(schema, table))
    ).fetchone()
    assert bounds is not None
    lo, hi = bounds
    if lo is not None and (lo < low or hi > high):
        return (
            f"shard {shard} already holds ledger events {lo}..{hi}, outside its range "
            f"{low}..{high}: it was installed as another shard, or alone (only shard 0 may be)"
        )
    return None


def _misrouted(
    conn: psycopg.Connection[Any], schema: str, shard: int, shards: int, partitions: int
) -> str | None:
    """Why the runs a database already holds rule it out as shard `shard` of a
    new install (some route to another shard, where the proxy would never
    find them: a run never moves), or None. The routing is run_hash's."""
    table = conn.execute(
        "SELECT to_regclass(format('%%I.runs', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not table or not table[0]:
        return None
    row = conn.execute(
        sql.SQL(
            r"""
            SELECT count(*), min(run_id) FROM (
                SELECT r.run_id,
                       ('x' || left(md5(coalesce(
                           nullif(substring(r.run_id FROM '\{{([^}}]*)\}}'), ''), r.run_id
                       )), 8))::bit(32)::integer AS hash
                FROM {}.runs AS r
            ) AS h
            WHERE (h.hash & %s) %% %s <> %s
            """
        ).format(sql.Identifier(schema)),
        (partitions - 1, shards, shard),
    ).fetchone()
    assert row is not None
    if not row[0]:
        return None
    return (
        f"shard {shard} already holds {row[0]} runs that the new install routes to other "
        f"shards ({row[1]!r}, ...); a run never moves, so a shard must start without "
        "runs that are not its own"
    )


def _claim_event_range(conn: psycopg.Connection[Any], schema: str, shard: int) -> None:
    """Confine the shard's ledger event ids to its range (once; checked after)."""
    low, high = _event_range(shard)
    table = sql.Identifier(schema, "ledger_events")
    row = conn.execute(
        """
        SELECT s.seqmin, s.seqmax, coalesce(q.last_value, 0)
        FROM pg_sequence AS s
        JOIN pg_sequences AS q
          ON format('%%I.%%I', q.schemaname, q.sequencename)::regclass = s.seqrelid
        WHERE s.seqrelid = pg_get_serial_sequence(%s, 'event_id')::regclass
        """,
        (f"{schema}.ledger_events",),
    ).fetchone()
    assert row is not None
    seqmin, seqmax, last = (int(v) for v in row)
    if (seqmin, seqmax) == (low, high):
        return
    problem = _range_problem(conn, schema, shard)
    if problem is not None:
        raise ShardingError(problem)
    restart = max(low, last + 1)
    conn.execute(
        sql.SQL(
            "ALTER TABLE {} ALTER COLUMN event_id SET MINVALUE {} SET MAXVALUE {}"
            " SET START WITH {} RESTART WITH {}"
        ).format(table, sql.Literal(low), sql.Literal(high), sql.Literal(low), sql.Literal(restart))
    )


def _claim_partitions(
    conn: psycopg.Connection[Any], schema: str, shard: int, owners: Sequence[int]
) -> None:
    """Tell the shard which partitions are its own (owners[p] is partition
    p's shard), so that it refuses to create a run the proxy routes
    elsewhere (the shard's _check_run_owner). Rewritten on every migrate: a
    moved partition is one `runrelay migrate` away from being enforced."""
    mine = [p for p, owner in enumerate(owners) if owner == shard]
    table = sql.Identifier(schema, "shard_ownership")
    conn.execute(sql.SQL("DELETE FROM {}").format(table))
    # A shard without partitions gets its row too: it creates no runs.
    conn.execute(
        sql.SQL("INSERT INTO {} (shard, partition_count, partitions) VALUES (%s, %s, %s)").format(
            table
        ),
        (shard, len(owners), mine),
    )


def configured_map(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    """The configured shard of each partition, in partition order."""
    rows = conn.execute(
        sql.SQL("SELECT shard FROM {}.partitions ORDER BY partition").format(
            sql.Identifier(f"{schema}_config")
        )
    ).fetchall()
    return [int(r[0]) for r in rows]


def _check_event_range(conn: psycopg.Connection[Any], schema: str, shard: int) -> bool:
    row = conn.execute(
        "SELECT s.seqmin, s.seqmax FROM pg_sequence AS s "
        "WHERE s.seqrelid = pg_get_serial_sequence(%s, 'event_id')::regclass",
        (f"{schema}.ledger_events",),
    ).fetchone()
    return row is not None and (int(row[0]), int(row[1])) == _event_range(shard)


def _connect(url: str, what: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise ShardingError(f"{what} is unreachable: {str(exc).strip().splitlines()[0]}") from None


def is_proxy(conn: psycopg.Connection[Any], schema: str = "runrelay") -> bool:
    row = conn.execute(
        "SELECT to_regclass(format('%%I.shards', %s::text)) IS NOT NULL", (f"{schema}_config",)
    ).fetchone()
    return bool(row and row[0])


def configured_shards(conn: psycopg.Connection[Any], schema: str) -> dict[int, str]:
    rows = conn.execute(
        sql.SQL("SELECT shard, dsn FROM {}.shards ORDER BY shard").format(
            sql.Identifier(f"{schema}_config")
        )
    ).fetchall()
    return {int(r[0]): str(r[1]) for r in rows}


MAX_PARTITIONS = 1 << 15  # no more shards than event-id ranges (shard << 48 in a bigint)


def configured_partitions(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}.partitions").format(sql.Identifier(f"{schema}_config"))
    ).fetchone()
    return int(row[0]) if row else 0


def _where(conn: psycopg.Connection[Any]) -> tuple[str, str, str]:
    """The server and database a connection reached, to tell two apart
    whatever their URLs say: the cluster's identifier when this login may read
    it, else the server's address and port."""
    row = conn.execute(
        "SELECT current_database(), has_function_privilege('pg_control_system()', 'EXECUTE'),"
        " coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')"
    ).fetchone()
    assert row is not None
    dbname, may_read, address = str(row[0]), bool(row[1]), str(row[2])
    if may_read:  # one cluster, whichever address reached it
        ident = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
        assert ident is not None
        return ("cluster", str(ident[0]), dbname)
    return ("address", address, dbname)


def _preflight_proxy(proxy: psycopg.Connection[Any], schema: str) -> None:
    """Refuse a proxy database that cannot hold the proxy: no PL/Proxy on its
    server, or a runrelay install of its own (rebuilding the proxy drops the
    schema)."""
    if not is_proxy(proxy, schema) and _revision(proxy, schema) is not None:
        raise ShardingError(
            f"the proxy's database holds a runrelay install of its own (schema {schema!r}); "
            "the proxy needs a database of its own (a former single install can be shard 0)"
        )
    row = proxy.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'plproxy'),"
        " current_setting('server_version_num')::integer / 10000"
    ).fetchone()
    assert row is not None
    if not row[0]:
        raise ShardingError(
            "PL/Proxy is not installed on the proxy's PostgreSQL server: install the "
            f"Debian package postgresql-{row[1]}-plproxy (or build plproxy for it)"
        )


def migrate(
    proxy_url: str,
    shard_urls: Sequence[str] = (),
    *,
    partitions: int | None = None,
    schema: str = "runrelay",
) -> str:
    """Migrate every shard to this package's head, then (re)build the proxy.

    First install: pass the shards' URLs (shard 0, 1, ... in that order) and
    the partition count (a power of two, at least the number of shards,
    default 16; it never changes afterwards). Later: the shards come from the
    proxy's configuration; passing them (or a partition count) again must
    name the same ones. Everything is checked before anything changes: every
    shard reachable, at a revision this package knows, distinct, and holding
    only its own event ids; the proxy's server has PL/Proxy. Returns the
    revision every shard and the proxy are at."""
    from .. import _migrations as migrations

    if partitions is not None and not (
        1 <= partitions <= MAX_PARTITIONS and partitions & (partitions - 1) == 0
    ):
        raise ShardingError(
            f"partitions must be a power of two from 1 to {MAX_PARTITIONS} (got {partitions})"
        )
    head = migrations.head()
    known = set(_revisions())
    _sql_files()  # the proxy's own SQL is here before any shard is touched
    with _connect(proxy_url, "the proxy") as proxy:
        _preflight_proxy(proxy, schema)
        configured = configured_shards(proxy, schema) if is_proxy(proxy, schema) else {}
        wanted = {i: _stored_dsn(u) for i, u in enumerate(shard_urls)}
        if configured and wanted and wanted != configured:
            raise ShardingError(
                "the shards given are not the proxy's configured shards "
                f"({sorted(configured.items())}); change them in {schema}_config.shards"
            )
        if configured:
            count = configured_partitions(proxy, schema)
            if partitions is not None and partitions != count:
                raise ShardingError(
                    f"the proxy has {count} partitions; the count never changes once set "
                    f"(got {partitions})"
                )
            partitions = count
        partitions = 16 if partitions is None else partitions
        shards = configured or wanted
        if not shards:
            raise ShardingError("no shards: pass --shard URL for each shard on the first install")
        if len(set(shards.values())) < len(shards):
            raise ShardingError("the same shard is given twice: each shard is its own database")
        if len(shards) > partitions:
            raise ShardingError(
                f"{len(shards)} shards need at least as many partitions (got {partitions})"
            )
        urls = {i: _with_credentials(dsn, proxy_url) for i, dsn in shards.items()}
        # Preflight: every shard reachable, at a revision this package knows,
        # a database of its own, and holding only its own event ids (when
        # already configured: the shard it is configured as).
        conns: dict[int, psycopg.Connection[Any]] = {}
        try:
            for i, url in sorted(urls.items()):
                conns[i] = _connect(url, f"shard {i} ({shards[i]})")
            places = {"the proxy": _where(proxy)}
            for i, conn in sorted(conns.items()):
                place = _where(conn)
                for other, seen in places.items():
                    if seen == place:
                        raise ShardingError(
                            f"shard {i} ({shards[i]}) is the same database as {other}: "
                            "each shard and the proxy need a database of their own"
                        )
                places[f"shard {i}"] = place
            for i, conn in sorted(conns.items()):
                rev = _revision(conn, schema)
                if rev is not None and rev not in known:
                    raise ShardingError(
                        f"shard {i} is at revision {rev}, which this package does not know (newer?)"
                    )
                if configured and rev is not None and not _check_event_range(conn, schema, i):
                    raise ShardingError(
                        f"shard {i} ({shards[i]}) does not hold shard {i}'s event ids: "
                        "is the configuration pointing at the wrong database?"
                    )
                problem = _range_problem(conn, schema, i)
                if problem is None and not configured:
                    problem = _misrouted(conn, schema, i, len(shards), partitions)
                if problem is not None:
                    raise ShardingError(problem)
            owners = (
                configured_map(proxy, schema)
                if configured
                else [p % len(shards) for p in range(partitions)]
            )
            for i, url in sorted(urls.items()):
                migrations.upgrade(_as_url(url), schema)
                with conns[i].transaction():
                    _claim_event_range(conns[i], schema, i)
                    _claim_partitions(conns[i], schema, i, owners)
            install = proxy_sql(conns[min(conns)], schema)
        finally:
            for conn in conns.values():
                conn.close()
        # The proxy's configuration and functions change in one transaction:
        # a failure leaves the proxy as it was.
        with proxy.transaction():
            proxy.execute("CREATE EXTENSION IF NOT EXISTS plproxy")
            proxy.execute(config_sql(schema))
            cfg = sql.Identifier(f"{schema}_config")
            if not configured:
                for i, dsn in sorted(shards.items()):
                    proxy.execute(
                        sql.SQL("INSERT INTO {}.shards (shard, dsn) VALUES (%s, %s)").format(cfg),
                        (i, dsn),
                    )
                proxy.execute(
                    sql.SQL(
                        "INSERT INTO {}.partitions (partition, shard) "
                        "SELECT p, p %% %s FROM generate_series(0, %s - 1) AS p"
                    ).format(cfg),
                    (len(shards), partitions),
                )
            for suffix in ROLE_SUFFIXES:
                role = f"{schema}_{suffix}"
                proxy.execute(
                    sql.SQL(
                        "DO $r$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {}) "
                        "THEN CREATE ROLE {} NOLOGIN; END IF; END $r$"
                    ).format(sql.Literal(role), sql.Identifier(role))
                )
            for name in (schema, f"{schema}_proxy"):
                proxy.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )
                proxy.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            proxy.execute(install)
            proxy.execute(sql.SQL("UPDATE {}.settings SET revision = %s").format(cfg), (head,))
    return head


def _revisions() -> list[str]:
    from alembic.script import ScriptDirectory

    from .. import _migrations as migrations

    script = ScriptDirectory.from_config(migrations.config("postgresql://unused"))
    return [r.revision for r in script.walk_revisions()]
