"""The command line of a sharded install, from the installed wheel: `runrelay
migrate --shard ...` installs a proxy and its shards, a later plain `runrelay
migrate` against the proxy migrates them all again, every refusal is one line
and changes nothing, and `runrelay demo --shards 2` runs end to end.

The servers are this module's own (one proxy and two shards, started as
`runrelay._pgcluster.start_sharded` starts them), so the session's
`sharded_install` keeps its state."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from installed import Installed, wheel_files
from runrelay import Client, migrations
from runrelay._pgcluster import Sharded, cluster, start_sharded
from runrelay.sharding import ShardMap, install

pytestmark = pytest.mark.sharded

HEAD = migrations.head()


@dataclass
class Servers:
    clusters: Sharded
    first_install: subprocess.CompletedProcess[str]

    @property
    def proxy_url(self) -> str:
        return self.clusters.proxy_url

    @property
    def shard_urls(self) -> list[str]:
        return self.clusters.shard_urls


def _cli(installed: Installed, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [installed.runrelay, *args],
        cwd=installed.home,
        env=installed.env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _refused(done: subprocess.CompletedProcess[str], wanted: str, code: int = 1) -> str:
    """The command exited `code` with one line on stderr that says `wanted`
    (after argparse's usage, for a usage error)."""
    assert done.returncode == code, f"{done.args}: {done.returncode}\n{done.stdout}{done.stderr}"
    lines = done.stderr.strip().splitlines()
    if code == 2 and lines[0].startswith("usage:"):
        lines = lines[-1:]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert wanted in lines[0], lines[0]
    return lines[0]


def _query(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description is not None else []


def _create_database(cluster_url: str, name: str) -> str:
    with psycopg.connect(cluster_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return re.sub(r"/[^/]*$", f"/{name}", cluster_url)


def _snapshot(servers: Servers) -> dict[str, Any]:
    """What a migration would change: each shard's revision, event-id range
    and runs; the proxy's configuration and its schemas (their oids change
    when the proxy's functions are rebuilt)."""
    state: dict[str, Any] = {}
    for i, url in enumerate(servers.shard_urls):
        state[f"shard {i}"] = _query(
            url,
            "SELECT (SELECT version_num FROM runrelay.alembic_version),"
            " (SELECT array[seqmin, seqmax] FROM pg_sequence WHERE seqrelid ="
            "   pg_get_serial_sequence('runrelay.ledger_events', 'event_id')::regclass),"
            " (SELECT array_agg(run_id ORDER BY run_id) FROM runrelay.runs)",
        )
    state["proxy"] = _query(
        servers.proxy_url,
        "SELECT (SELECT array_agg(oid ORDER BY nspname) FROM pg_namespace"
        "        WHERE nspname IN ('runrelay', 'runrelay_proxy')),"
        " (SELECT array_agg(shard || '=' || dsn ORDER BY shard) FROM runrelay_config.shards),"
        " (SELECT count(*) FROM runrelay_config.partitions),"
        " (SELECT array[config_version::text, revision] FROM runrelay_config.settings)",
    )
    return state


@pytest.fixture(scope="module")
def servers(installed: Installed) -> Iterator[Servers]:
    """One proxy and two shards, installed by `runrelay migrate --shard ...`."""
    clusters = start_sharded(2)
    try:
        s0, s1 = clusters.shard_urls
        first = _cli(
            installed, "migrate", "--shard", s0, "--shard", s1, DATABASE_URL=clusters.proxy_url
        )
        yield Servers(clusters, first)
    finally:
        clusters.destroy()


def test_the_wheel_ships_the_proxy_sql(installed: Installed) -> None:
    names = wheel_files(installed.wheel)
    shipped = {n for n in names if n.startswith("runrelay/sharding/sql/")}
    assert "runrelay/sharding/sql/00_config.sql" in shipped
    assert len(shipped) >= 5


def test_migrate_with_shards_installs_them_and_the_proxy(servers: Servers) -> None:
    out = _ok(servers.first_install)
    assert out.strip() == f"runrelay: proxy and 2 shards are at revision {HEAD}"
    for url in servers.shard_urls:
        assert _query(url, "SELECT version_num FROM runrelay.alembic_version") == [(HEAD,)]
    proxy = servers.proxy_url
    assert _query(proxy, "SELECT count(*) FROM runrelay_config.partitions") == [(16,)]
    assert _query(proxy, "SELECT revision FROM runrelay_config.settings") == [(HEAD,)]
    assert _query(proxy, "SELECT runrelay.get_schema_version()") == [(HEAD,)]
    # Each shard's event ids are its own range (shard << 48 ...).
    for i, url in enumerate(servers.shard_urls):
        assert _query(
            url,
            "SELECT seqmin, seqmax FROM pg_sequence WHERE seqrelid ="
            " pg_get_serial_sequence('runrelay.ledger_events', 'event_id')::regclass",
        ) == [((i << 48) or 1, ((i + 1) << 48) - 1)]


def test_a_plain_migrate_against_the_proxy_migrates_every_shard_again(
    installed: Installed, servers: Servers
) -> None:
    proxy = servers.proxy_url
    for n in range(8):
        _query(proxy, "SELECT runrelay.enqueue_run(%s, queue => 'q')", (f"kept-{n}",))
    before = _snapshot(servers)
    out = _ok(_cli(installed, "migrate", DATABASE_URL=proxy))
    assert out.strip() == f"runrelay: proxy and 2 shards are at revision {HEAD}"
    after = _snapshot(servers)
    # The shards and the configuration are as they were (their runs too); only
    # the proxy's functions were rebuilt.
    assert {k: v for k, v in after.items() if k != "proxy"} == {
        k: v for k, v in before.items() if k != "proxy"
    }
    assert after["proxy"][0][1:] == before["proxy"][0][1:]
    on_shards = sum(
        _query(url, "SELECT count(*) FROM runrelay.runs")[0][0] for url in servers.shard_urls
    )
    assert on_shards == 8
    assert _query(proxy, "SELECT count(*) FROM runrelay.get_run('kept-3')") == [(1,)]
    # Naming the same shards again is the same plain migrate.
    s0, s1 = servers.shard_urls
    _ok(_cli(installed, "migrate", "--shard", s0, "--shard", s1, "--database-url", proxy))
    assert _snapshot(servers)["shard 0"] == before["shard 0"]


def test_refusals_against_the_installed_proxy_change_nothing(
    installed: Installed, servers: Servers
) -> None:
    proxy = servers.proxy_url
    s0, s1 = servers.shard_urls
    before = _snapshot(servers)

    def refused(wanted: str, *args: str, code: int = 1) -> None:
        _refused(_cli(installed, *args, DATABASE_URL=proxy), wanted, code)
        assert _snapshot(servers) == before

    refused("not the proxy's configured shards", "migrate", "--shard", s1, "--shard", s0)
    refused("not the proxy's configured shards", "migrate", "--shard", s0)
    refused("the proxy has 16 partitions", "migrate", "--partitions", "32")
    refused("migrates to head only", "migrate", "--revision", "0008")
    refused("downgrade each shard directly", "downgrade", "0008")
    refused("downgrade each shard directly", "downgrade", "base")

    # A shard at a revision this package does not know (a newer package's).
    _query(s1, "UPDATE runrelay.alembic_version SET version_num = '9999'")
    try:
        _refused(
            _cli(installed, "migrate", DATABASE_URL=proxy),
            "shard 1 is at revision 9999, which this package does not know",
        )
        assert _query(s0, "SELECT version_num FROM runrelay.alembic_version") == [(HEAD,)]
    finally:
        _query(s1, f"UPDATE runrelay.alembic_version SET version_num = '{HEAD}'")
    assert _snapshot(servers) == before

    # A failure while the proxy is rebuilt (here an event trigger that refuses
    # the views, created last): its configuration and functions change in one
    # transaction, so the proxy is exactly as it was, and answers.
    _query(
        proxy,
        "CREATE FUNCTION public.no_views() RETURNS event_trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'no views today'; END $$;"
        " CREATE EVENT TRIGGER no_views ON ddl_command_end WHEN TAG IN ('CREATE VIEW')"
        " EXECUTE FUNCTION public.no_views()",
    )
    try:
        _refused(_cli(installed, "migrate", DATABASE_URL=proxy), "no views today")
    finally:
        _query(proxy, "DROP EVENT TRIGGER no_views; DROP FUNCTION public.no_views()")
    assert _snapshot(servers) == before
    assert _query(proxy, "SELECT runrelay.get_schema_version()") == [(HEAD,)]

    # A shard that is down: nothing is migrated, not even the shard that is up.
    servers.clusters.shards[1].stop()
    try:
        line = _refused(_cli(installed, "migrate", DATABASE_URL=proxy), "shard 1")
        assert "unreachable" in line
    finally:
        servers.clusters.shards[1].start()
    assert _snapshot(servers) == before


def test_refusals_of_a_first_install_change_nothing(installed: Installed, servers: Servers) -> None:
    """A fresh proxy database and shard databases on the same servers."""
    proxy = _create_database(servers.proxy_url, "proxy_two")
    alone = _create_database(servers.shard_urls[0], "alone")
    fresh = _create_database(servers.shard_urls[1], "fresh")
    # `alone` is a single install with runs and ledger events: one run the new
    # install routes to shard 0, one (hash-tagged) it routes to shard 1.
    routes = ShardMap(tuple(p % 2 for p in range(16)), {}, {})
    mine = next(f"solo-{n}" for n in range(100) if routes.shard_for(f"solo-{n}") == 0)
    other = next(f"x{{{n}}}" for n in range(100) if routes.shard_for(f"x{{{n}}}") == 1)
    _ok(_cli(installed, "migrate", DATABASE_URL=alone))
    with Client(alone) as client:
        for run_id in (mine, other):
            client.enqueue_run(run_id, queue="q")
            client.append_events(run_id, [{"type": "demo.x", "lane": "observability"}])
    alone_before = _query(alone, "SELECT event_id FROM runrelay.ledger_events ORDER BY 1")

    def nothing_changed() -> None:
        assert (
            _query(
                proxy,
                "SELECT nspname FROM pg_namespace"
                " WHERE nspname LIKE 'runrelay%' OR nspname = 'plproxy'"
                " UNION ALL SELECT extname FROM pg_extension WHERE extname = 'plproxy'",
            )
            == []
        )
        assert _query(fresh, "SELECT to_regnamespace('runrelay')") == [(None,)]
        assert _query(alone, "SELECT version_num FROM runrelay.alembic_version") == [(HEAD,)]
        assert (
            _query(alone, "SELECT event_id FROM runrelay.ledger_events ORDER BY 1") == alone_before
        )
        seq = _query(
            alone,
            "SELECT seqmin FROM pg_sequence WHERE seqrelid ="
            " pg_get_serial_sequence('runrelay.ledger_events', 'event_id')::regclass",
        )
        assert seq == [(1,)]

    def refused(wanted: str, *args: str, code: int = 1, url: str = proxy) -> None:
        _refused(_cli(installed, "migrate", *args, DATABASE_URL=url), wanted, code)
        nothing_changed()

    refused("shard 1 already holds ledger events", "--shard", fresh, "--shard", alone)
    refused("the same shard is given twice", "--shard", fresh, "--shard", fresh)
    refused("partitions must be a power of two", "--shard", fresh, "--partitions", "12")
    refused("2 shards need at least as many partitions", "--shard", alone, "--shard", fresh,
            "--partitions", "1")  # fmt: skip
    refused("must be at least 1", "--shard", fresh, "--partitions", "0", code=2)
    refused("no shards", "--partitions", "16")
    refused("same database as the proxy", "--shard", alone, "--shard", proxy)
    # The proxy's database may not be an install of its own: rebuilding the
    # proxy would drop it.
    refused("holds a runrelay install of its own", "--shard", fresh, url=alone)
    # A run of a former single install that the proxy would look for on
    # shard 1 would be lost to it.
    wanted = f"shard 0 already holds 1 runs that the new install routes to other shards ({other!r}"
    refused(wanted, "--shard", alone, "--shard", fresh)
    # Without it, the install is welcome as shard 0, its runs and events kept.
    _query(alone, "DELETE FROM runrelay.runs WHERE run_id = %s", (other,))
    alone_before = _query(alone, "SELECT event_id FROM runrelay.ledger_events ORDER BY 1")
    out = _ok(_cli(installed, "migrate", "--shard", alone, "--shard", fresh, DATABASE_URL=proxy))
    assert out.strip() == f"runrelay: proxy and 2 shards are at revision {HEAD}"
    assert _query(proxy, "SELECT status FROM runrelay.get_run(%s)", (mine,)) == [("queued",)]
    assert _query(alone, "SELECT event_id FROM runrelay.ledger_events ORDER BY 1") == alone_before


def test_the_sharded_demo_from_the_wheel(installed: Installed) -> None:
    """`runrelay demo --shards 2` starts a proxy and two shards of its own,
    runs the demo through the proxy and reports the runs of each shard."""
    out = _ok(
        _cli(installed, "demo", "--shards", "2", "--runs", "60", "--workers", "1", "--relays", "1")
    )
    assert f"runrelay: proxy and 2 shards are at revision {HEAD}" in out
    assert "dashboard: not started in a sharded demo" in out
    per_shard = dict(re.findall(r"^shard (\d+): (\d+) runs", out, re.MULTILINE))
    assert set(per_shard) == {"0", "1"}, out
    assert all(int(n) > 0 for n in per_shard.values()), out
    assert sum(int(n) for n in per_shard.values()) == 60
    assert "every run ended as expected; 0 ordering violations, 0 lost events" in out


def test_the_sharded_demo_refuses_a_database_url(installed: Installed, servers: Servers) -> None:
    done = _cli(installed, "demo", "--shards", "2", DATABASE_URL=servers.proxy_url)
    _refused(done, "a sharded demo starts its own proxy and shard servers", code=2)


def test_a_proxy_server_without_plproxy_is_refused(installed: Installed, servers: Servers) -> None:
    """The embedded PostgreSQL has no PL/Proxy: the refusal names the package
    to install, and the shard is left as it was."""
    fresh = _create_database(servers.shard_urls[1], "fresh_for_no_plproxy")
    with cluster("embedded") as bare:
        done = _cli(installed, "migrate", "--shard", fresh, DATABASE_URL=bare.url())
        _refused(done, f"install the Debian package postgresql-{bare.version}-plproxy")
        assert _query(bare.url(), "SELECT to_regnamespace('runrelay_config')") == [(None,)]
    assert _query(fresh, "SELECT to_regnamespace('runrelay')") == [(None,)]


def test_a_first_install_finds_the_runs_routed_elsewhere_as_the_proxy_routes_them(
    servers: Servers,
) -> None:
    """The first install's check of a shard's existing runs (SQL on the
    shard) routes each run_id exactly as the proxy and ShardMap do: hash tags,
    empty tags, several tags, non-ASCII text."""
    url = _create_database(servers.shard_urls[0], "routing_check")
    migrations.upgrade(url)
    ids = ["plain", "ünïcode-ß", "{}empty", "a{tag}b", "x{one}y{two}", "{tag}", "}{", "{open"]
    ids += [f"r-{n}" for n in range(40)]
    with psycopg.connect(servers.proxy_url, autocommit=True) as proxy:
        proxy_map = ShardMap.load(proxy)
    with Client(url) as client:
        for run_id in ids:
            client.enqueue_run(run_id, queue="q")
    with psycopg.connect(url, autocommit=True) as conn:
        for shard in (0, 1):
            elsewhere = sorted(r for r in ids if proxy_map.shard_for(r) != shard)
            found = install._misrouted(conn, "runrelay", shard, 2, 16)
            assert found is not None and f"holds {len(elsewhere)} runs" in found
            assert repr(elsewhere[0]) in found
    proxy_says = _query(
        servers.proxy_url, "SELECT r, runrelay.shard_for(r) FROM unnest(%s::text[]) AS r", (ids,)
    )
    assert dict(proxy_says) == {r: proxy_map.shard_for(r) for r in ids}
