"""Least-privilege logins on a sharded install, over real login sessions.

Each runrelay role's login (the same login, with the same role membership, on
the proxy and on every shard, as an operator creates them) makes exactly the
calls of its SPEC section through the proxy and is refused the others
(42501); a login with no runrelay role is refused everything. No login
reaches a shard but through the routed public functions: the proxy's
one-shard on_* calls, its routing helpers, its configuration and PL/Proxy's
own schema are refused. And a shard refuses to create a run that the shard
map gives to another shard (22023, nothing written), whoever connects to it
directly, while the owning shard accepts it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from runrelay import Client, InvalidArgument, PermissionDenied
from runrelay.sharding import ShardMap
from runrelay.sharding.install import UNSUPPORTED
from sharded_harness import ShardedInstall, run_ids_on
from sqlapi import table_checksum
from test_security import ALLOWED_CALLS, GRANTS, call_in, null_args_call

pytestmark = pytest.mark.sharded

LOGINS = {suffix: f"shard_login_{suffix}" for suffix in GRANTS} | {"none": "shard_login_none"}
PASSWORD = "s3cret-shard-login"


def _login_url(url: str, login: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params.update(user=login, password=PASSWORD)
    return psycopg.conninfo.make_conninfo(**params)


@pytest.fixture(scope="module")
def logins(sharded_install: ShardedInstall) -> Iterator[dict[str, str]]:
    """One login per runrelay role (and one with none), created alike on the
    proxy and on every shard, as docs/scale-out.md tells operators to."""
    sharded_install.ensure_up()
    urls = [sharded_install.proxy_url, *sharded_install.shard_urls]
    for url in urls:
        with psycopg.connect(url, autocommit=True) as c:
            for suffix, login in LOGINS.items():
                c.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(login), sql.Literal(PASSWORD)
                    )
                )
                if suffix != "none":
                    c.execute(
                        sql.SQL("GRANT {} TO {}").format(
                            sql.Identifier(f"runrelay_{suffix}"), sql.Identifier(login)
                        )
                    )
    try:
        yield LOGINS
    finally:
        sharded_install.ensure_up()
        for url in urls:
            with psycopg.connect(url, autocommit=True) as c:
                for login in LOGINS.values():
                    c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


def as_login(sharded: ShardedInstall, login: str, url: str | None = None) -> psycopg.Connection:
    conn = sharded.connect(_login_url(url or sharded.proxy_url, login))
    assert conn.execute("SELECT session_user, current_user").fetchone() == (login, login)
    return conn


def proxy_functions(sharded: ShardedInstall) -> list[tuple[int, str]]:
    """(oid, name) of every function of the proxy's public schema."""
    rows = sharded.connect().execute(
        "SELECT p.oid, p.proname FROM pg_proc AS p"
        " WHERE p.pronamespace = 'runrelay'::regnamespace ORDER BY p.proname"
    )
    return [(int(r[0]), str(r[1])) for r in rows.fetchall()]


def seed(sharded: ShardedInstall) -> None:
    """The run ALLOWED_CALLS expects (`sec-seed`), enqueued through the proxy."""
    call_in(sharded.connect(), "runrelay", "enqueue_run", run_id="sec-seed", queue="sec-q")


@pytest.mark.parametrize("role", sorted(GRANTS))
def test_each_role_makes_exactly_its_calls_through_the_proxy(
    sharded: ShardedInstall, logins: dict[str, str], role: str
) -> None:
    """Every function of the role's section answers (or, for the listings,
    raises 0A000 as for a superuser); every other function raises 42501."""
    seed(sharded)
    superuser = sharded.connect()
    own = as_login(sharded, logins[role])
    assert GRANTS[role] <= {name for _, name in proxy_functions(sharded)}
    for oid, name in proxy_functions(sharded):
        if name in ("shard_for", "shard_map"):
            continue  # every role's: below
        if name not in GRANTS[role]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                own.execute(null_args_call(superuser, "runrelay", oid, name))
            continue
        args, answer = ALLOWED_CALLS[name]
        if name in UNSUPPORTED:  # granted, but not available through the proxy
            with pytest.raises(psycopg.errors.FeatureNotSupported):
                call_in(own, "runrelay", name, **args)
            continue
        rows = call_in(own, "runrelay", name, **args)
        if name not in ("enqueue_due_schedules", "schedules_next_due_at"):
            assert answer(rows), (name, rows)  # the shard ran it as this login
    assert own.execute("SELECT runrelay.shard_for('sec-seed')").fetchone() in ((0,), (1,))
    assert len(own.execute("SELECT * FROM runrelay.shard_map()").fetchall()) == 16
    for view in ("run_stats", "ledger_stats"):
        query = sql.SQL("SELECT * FROM {}").format(sql.Identifier("runrelay", view))
        if role == "admin":
            own.execute(query).fetchall()
        else:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                own.execute(query)


def test_each_shard_checks_the_calling_logins_own_grants(
    sharded: ShardedInstall, logins: dict[str, str]
) -> None:
    """PL/Proxy connects to a shard as the session's login, not as the proxy
    functions' owner: take the producer role from the login on shard 1 only,
    and its calls for shard 1's runs are refused there, shard 0's still run."""
    (on0,), (on1,) = run_ids_on(sharded, 0, 1, "who"), run_ids_on(sharded, 1, 1, "who")
    revoke = sql.SQL("REVOKE runrelay_producer FROM {}").format(sql.Identifier(logins["producer"]))
    sharded.shard(1).execute(revoke)
    try:
        producer = Client(as_login(sharded, logins["producer"]))
        with pytest.raises(PermissionDenied, match="permission denied"):
            producer.enqueue_run(on1)
        assert producer.enqueue_run(on0).created
    finally:
        sharded.shard(1).execute(
            sql.SQL("GRANT runrelay_producer TO {}").format(sql.Identifier(logins["producer"]))
        )
    assert sharded.everywhere("SELECT run_id FROM runrelay.runs") == [(on0,)]


def test_a_login_with_no_runrelay_role_is_refused_everything(
    sharded: ShardedInstall, logins: dict[str, str]
) -> None:
    seed(sharded)
    before = [table_checksum(sharded.shard(i)) for i in range(len(sharded.shard_urls))]
    superuser = sharded.connect()
    own = as_login(sharded, logins["none"])
    for oid, name in proxy_functions(sharded):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            own.execute(null_args_call(superuser, "runrelay", oid, name))
        if name in ALLOWED_CALLS:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                call_in(own, "runrelay", name, **ALLOWED_CALLS[name][0])
    for view in ("run_stats", "ledger_stats"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            own.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier("runrelay", view)))
    after = [table_checksum(sharded.shard(i)) for i in range(len(sharded.shard_urls))]
    assert after == before


@pytest.mark.parametrize("role", [*sorted(GRANTS), "none"])
def test_no_role_reaches_the_one_shard_calls_or_the_routing(
    sharded: ShardedInstall, logins: dict[str, str], role: str
) -> None:
    """The on_* calls take a partition from the caller: granted, they would
    let any role send a run to any shard. Refused, with the routing helpers,
    the configuration and PL/Proxy's configuration functions."""
    superuser = sharded.connect()
    internal = superuser.execute(
        "SELECT p.oid, n.nspname, p.proname FROM pg_proc AS p"
        " JOIN pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE n.nspname IN ('runrelay_proxy', 'runrelay_config', 'plproxy')"
        " ORDER BY 2, 3"
    ).fetchall()
    names = {str(r[2]) for r in internal}
    assert {"on_enqueue_runs", "on_claim_attempts", "run_hash", "keyed_hash"} <= names
    assert "get_cluster_partitions" in names
    own = as_login(sharded, logins[role])
    for oid, schema, name in internal:
        if name.startswith("gather_") and role == "admin":
            continue  # the admin's stats views run them
        if name == "bump_config_version":
            continue  # a trigger function: nobody may call it
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            own.execute(null_args_call(superuser, str(schema), int(oid), str(name)))
    (wrong,) = run_ids_on(sharded, 1, 1, "forged")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        own.execute(
            "SELECT * FROM runrelay_proxy.on_enqueue_runs(0, %s)", [Jsonb([{"run_id": wrong}])]
        )
    for table in ("shards", "partitions", "settings"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            own.execute(
                sql.SQL("SELECT * FROM {}").format(sql.Identifier("runrelay_config", table))
            )
    assert sharded.everywhere("SELECT run_id FROM runrelay.runs") == []


def _enqueue_refused(conn: psycopg.Connection, query: str, params: Any, column: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute(query, params)
    assert refused.value.diag.column_name == column
    assert "another shard" in str(refused.value)
    assert refused.value.diag.message_hint


def test_a_shard_refuses_a_run_it_does_not_own_and_accepts_its_own(
    sharded: ShardedInstall, logins: dict[str, str]
) -> None:
    (mine,), (theirs,) = run_ids_on(sharded, 0, 1, "own"), run_ids_on(sharded, 1, 1, "own")
    tagged = f"other{{{theirs}}}"  # routed by its tag: shard 1's
    before = [table_checksum(sharded.shard(i)) for i in range(len(sharded.shard_urls))]
    shard0 = as_login(sharded, logins["producer"], sharded.shard_urls[0])
    for run_id in (theirs, tagged):
        _enqueue_refused(shard0, "SELECT * FROM runrelay.enqueue_run(%s)", [run_id], "run_id")
    _enqueue_refused(
        shard0,
        "SELECT * FROM runrelay.enqueue_runs(%s)",
        [Jsonb([{"run_id": mine}, {"run_id": theirs}])],
        "items[1].run_id",
    )
    after = [table_checksum(sharded.shard(i)) for i in range(len(sharded.shard_urls))]
    assert after == before  # nothing written anywhere

    # The owning shard accepts, directly and through the client's shard_transaction.
    shard1 = as_login(sharded, logins["producer"], sharded.shard_urls[1])
    assert shard1.execute("SELECT * FROM runrelay.enqueue_run(%s)", [theirs]).fetchall() == [
        (theirs, "queued", True)
    ]
    client = Client(
        as_login(sharded, logins["producer"]),
        shards=ShardMap.load(as_login(sharded, logins["producer"])),
    )
    with client.shard_transaction(mine) as conn:
        assert client.enqueue_runs(
            [{"run_id": mine}, {"run_id": mine + "{" + mine + "}"}], conn=conn
        )
    assert sorted(sharded.everywhere("SELECT run_id FROM runrelay.runs")) == sorted(
        [(theirs,), (mine,), (mine + "{" + mine + "}",)]
    )
    # A replay of an owned run on its shard answers as before.
    assert not client.enqueue_run(theirs).created
    with pytest.raises(InvalidArgument):
        Client(as_login(sharded, logins["producer"], sharded.shard_urls[0])).enqueue_run(theirs)


def test_a_shards_schedules_create_only_the_runs_it_owns(
    sharded: ShardedInstall, logins: dict[str, str]
) -> None:
    """A schedule's run_ids are schedule:<name>:<slot>: on a shard,
    upsert_schedule refuses (22023 naming `name`, nothing written) a name
    without a {tag}, whose slots would route to every shard, and a name whose
    {tag} another shard owns; a tag this shard owns is declared, and its slot
    creates its run here."""
    (tag0,), (tag1,) = run_ids_on(sharded, 0, 1, "tag"), run_ids_on(sharded, 1, 1, "tag")
    admin = as_login(sharded, logins["admin"], sharded.shard_urls[0])
    worker = as_login(sharded, logins["worker"], sharded.shard_urls[0])

    def due() -> list[tuple[Any, ...]]:
        with worker.transaction():
            worker.execute("SET LOCAL runrelay.clock_offset = '3 minutes'")
            return worker.execute(
                "SELECT run_id, created FROM runrelay.enqueue_due_schedules()"
            ).fetchall()

    before = table_checksum(sharded.shard(0))
    for name, says in (
        (f"elsewhere{{{tag1}}}", "another shard"),
        ("untagged", "needs a \\{tag\\}"),
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=says) as refused:
            admin.execute("SELECT runrelay.upsert_schedule(%s, '* * * * *')", [name])
        assert refused.value.diag.column_name == "name"
    assert table_checksum(sharded.shard(0)) == before

    admin.execute("SELECT runrelay.upsert_schedule(%s, '* * * * *')", [f"here{{{tag0}}}"])
    ((run_id, created),) = due()
    assert created and run_id.startswith(f"schedule:here{{{tag0}}}:")
    assert sharded.everywhere("SELECT run_id FROM runrelay.runs") == [(run_id,)]


def test_migrate_gives_each_shard_its_partitions_and_an_unsharded_install_none(
    sharded: ShardedInstall, db: psycopg.Connection
) -> None:
    """Each shard holds the proxy's map of its own partitions; a single
    install holds no row, so its enqueue paths check nothing."""
    shard_map = sharded.shard_map()
    for i in range(len(sharded.shard_urls)):
        row = (
            sharded.shard(i)
            .execute("SELECT shard, partition_count, partitions FROM runrelay.shard_ownership")
            .fetchall()
        )
        mine = [p for p, owner in enumerate(shard_map.partitions) if owner == i]
        assert row == [(i, len(shard_map.partitions), mine)]
    assert db.execute("SELECT count(*) FROM runrelay.shard_ownership").fetchone() == (0,)
    for run_id in ("any-run", "other{tag}"):
        assert call_in(db, "runrelay", "enqueue_run", run_id=run_id) == [(run_id, "queued", True)]


@pytest.fixture
def password_shards(sharded: ShardedInstall, logins: dict[str, str]) -> Iterator[Path]:
    """The shards ask the runrelay logins for their password (scram-sha-256,
    ahead of the harness's trust lines); the proxy's DSNs name a passfile
    on the proxy server, owned by the server's OS user, which the test
    writes. Undone after the test."""
    root = sharded.clusters.proxy.root
    passfile = root / "pgpass"
    passfile.write_text("")
    passfile.chmod(0o600)
    os.chown(passfile, root.stat().st_uid, root.stat().st_gid)
    group = "shard_password_logins"
    hba_line = f"host all +{group} 127.0.0.1/32 scram-sha-256\n"
    proxy = sharded.connect()
    for i, cluster in enumerate(sharded.clusters.shards):
        shard = sharded.shard(i)
        shard.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(group)))
        for login in logins.values():
            shard.execute(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login))
            )
        hba = cluster.datadir / "pg_hba.conf"
        hba.write_text(hba_line + hba.read_text())
        shard.execute("SELECT pg_reload_conf()")
    proxy.execute(
        "UPDATE runrelay_config.shards SET dsn = dsn || ' passfile=' || %s", [str(passfile)]
    )
    try:
        yield passfile
    finally:
        proxy.execute(
            "UPDATE runrelay_config.shards SET dsn = replace(dsn, ' passfile=' || %s, '')",
            [str(passfile)],
        )
        passfile.unlink()
        for i, cluster in enumerate(sharded.clusters.shards):
            hba = cluster.datadir / "pg_hba.conf"
            hba.write_text(hba.read_text().replace(hba_line, "", 1))
            shard = sharded.shard(i)
            shard.execute("SELECT pg_reload_conf()")
            shard.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(group)))


def test_logins_reach_password_protected_shards_with_the_proxys_passfile(
    sharded: ShardedInstall, logins: dict[str, str], password_shards: Path
) -> None:
    """With password authentication on the shards, a login's calls through
    the proxy work once the proxy server holds its password (a passfile
    line per shard), and fail without it: no credential is stored in the
    proxy's tables, and none is shared between logins."""
    (on0,), (on1,) = run_ids_on(sharded, 0, 1, "pw"), run_ids_on(sharded, 1, 1, "pw")
    # The shards do ask: a login without the password is turned away.
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(sharded.clusters.shards[0].url(user=logins["producer"]))
    producer = as_login(sharded, logins["producer"])
    enqueue = "SELECT * FROM runrelay.enqueue_run(%s)"
    with pytest.raises(psycopg.Error, match="password"):
        producer.execute(enqueue, [on1])

    lines = []
    for cluster in sharded.clusters.shards:
        lines.append(f"127.0.0.1:{cluster.port}:postgres:{logins['producer']}:{PASSWORD}\n")
    password_shards.write_text("".join(lines))
    producer = as_login(sharded, logins["producer"])
    for run_id in (on0, on1):
        assert producer.execute(enqueue, [run_id]).fetchall() == [(run_id, "queued", True)]
    # Another login has no line: its calls are still refused.
    with pytest.raises(psycopg.Error, match="password"):
        as_login(sharded, logins["admin"]).execute("SELECT * FROM runrelay.get_run(%s)", [on0])
    assert sorted(sharded.everywhere("SELECT run_id FROM runrelay.runs")) == sorted(
        [(on0,), (on1,)]
    )
    dsns = sharded.connect().execute("SELECT dsn FROM runrelay_config.shards").fetchall()
    assert not any("password" in str(d) for (d,) in dsns)
