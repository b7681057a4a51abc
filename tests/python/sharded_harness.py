"""A sharded runrelay for tests (a pytest plugin: ``pytest_plugins``).

One proxy server and two shard servers, each a real PostgreSQL cluster of its
own started for the session (Debian's PostgreSQL 15, which PL/Proxy is
packaged for), installed with ``runrelay.sharding.install.migrate`` exactly
as ``runrelay migrate --shard ...`` does. Each test starts from empty tables
on every shard. The servers can be stopped and started again
(``Sharded.shards[i].crash()`` / ``.start()``) for fault tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from conftest import reset
from runrelay import Client
from runrelay._pgcluster import Sharded, start_sharded
from runrelay.sharding import ShardMap
from runrelay.sharding.install import migrate

PARTITIONS = 16


@dataclass
class ShardedInstall:
    clusters: Sharded
    opened: list[psycopg.Connection[Any]] = field(default_factory=list)

    @property
    def proxy_url(self) -> str:
        return self.clusters.proxy_url

    @property
    def shard_urls(self) -> list[str]:
        return self.clusters.shard_urls

    def connect(self, url: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit connection (the proxy's unless `url`), closed after the test."""
        kwargs.setdefault("autocommit", True)
        conn = psycopg.connect(url or self.proxy_url, **kwargs)
        self.opened.append(conn)
        return conn

    def client(self, **kwargs: Any) -> Client:
        """A Client on its own connection to the proxy."""
        return Client(self.connect(), **kwargs)

    def shard(self, i: int) -> psycopg.Connection[Any]:
        """A superuser connection to shard i."""
        return self.connect(self.shard_urls[i])

    def shard_map(self) -> ShardMap:
        return ShardMap.load(self.connect())

    def everywhere(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """The rows of a query run on every shard, concatenated."""
        rows: list[tuple[Any, ...]] = []
        for i in range(len(self.shard_urls)):
            rows += self.shard(i).execute(query, params).fetchall()
        return rows

    def ensure_up(self) -> None:
        """Start any shard server a test stopped."""
        for c in self.clusters.shards:
            if c.pg_ctl("status", check=False).returncode != 0:
                c.start()

    def close(self) -> None:
        for conn in self.opened:
            conn.close()
        self.opened.clear()


@pytest.fixture(scope="session")
def sharded_install() -> Iterator[ShardedInstall]:
    clusters = start_sharded(2)
    try:
        migrate(clusters.proxy_url, clusters.shard_urls, partitions=PARTITIONS)
        for url in clusters.shard_urls:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("UPDATE runrelay.settings SET allow_clock_override = true")
        yield ShardedInstall(clusters)
    finally:
        clusters.destroy()


@pytest.fixture
def sharded(sharded_install: ShardedInstall) -> Iterator[ShardedInstall]:
    """The sharded install with empty tables on every shard."""
    sharded_install.ensure_up()
    for url in sharded_install.shard_urls:
        with psycopg.connect(url, autocommit=True) as c:
            reset(c)
    yield sharded_install
    sharded_install.close()


def run_ids_on(install: ShardedInstall, shard: int, count: int, prefix: str = "r") -> list[str]:
    """`count` run_ids that the shard map routes to `shard`."""
    shard_map = install.shard_map()
    out: list[str] = []
    i = 0
    while len(out) < count:
        run_id = f"{prefix}-{i}"
        if shard_map.shard_for(run_id) == shard:
            out.append(run_id)
        i += 1
    return out


Connect = Callable[..., psycopg.Connection[Any]]
