"""One logical runrelay over several PostgreSQL primaries, through PL/Proxy.

A proxy database holds functions with the same names and signatures as a
runrelay install; each call goes to the shard that owns its run, or walks the
shards when it names none (claims, reaping, stats). Every run lives on one
shard for good, so fences, per-run order and replays keep their meaning
there. See docs/scale-out.md.

This module is the client's half: the routing rule (the same as the proxy's
``run_hash``), and the map of partitions to shards that a producer needs to
open its transaction on the shard that owns a run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import conninfo, sql

from ..errors import ProxyTransaction, ShardUnavailable, WrongShard

__all__ = [
    "ProxyTransaction",
    "ShardMap",
    "ShardUnavailable",
    "WrongShard",
    "routing_key",
    "run_hash",
    "shard_listen_dsns",
]

_TAG = re.compile(r"\{([^}]*)\}")
# Each shard's ledger event ids lie in [shard << EVENT_SHIFT, (shard + 1) << EVENT_SHIFT).
EVENT_SHIFT = 48


def routing_key(run_id: str) -> str:
    """The part of a run_id that decides its shard: the text between its
    first ``{`` and the next ``}`` when not empty (a hash tag), else all of it."""
    match = _TAG.search(run_id)
    if match and match.group(1):
        return match.group(1)
    return run_id


def run_hash(run_id: str) -> int:
    """The proxy's run_hash: the first 32 bits of the MD5 of the routing key,
    as a signed integer."""
    digest = hashlib.md5(routing_key(run_id).encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def event_shard(event_id: int) -> int:
    """The shard that holds a ledger event."""
    return event_id >> EVENT_SHIFT


@dataclass(frozen=True)
class ShardMap:
    """Which shard owns each logical partition, and each shard's DSN, as the
    proxy's ``shard_map()`` says. ``credentials`` (user, password, ...) are
    merged into every shard DSN: the proxy stores none."""

    partitions: tuple[int, ...]
    dsns: Mapping[int, str]
    credentials: Mapping[str, str]

    @classmethod
    def load(cls, proxy: psycopg.Connection[Any], schema: str = "runrelay") -> ShardMap:
        """Read the map from the proxy; the credentials are the proxy
        connection's own (same roles on the proxy and the shards)."""
        rows = proxy.execute(
            sql.SQL("SELECT partition, shard, dsn FROM {}.shard_map()").format(
                sql.Identifier(schema)
            )
        ).fetchall()
        if not rows:
            raise ValueError("the proxy has no partitions configured")
        params = conninfo.conninfo_to_dict(proxy.info.dsn)
        creds = {k: str(v) for k, v in params.items() if k in _CREDENTIALS and v is not None}
        password = proxy.info.password
        if password:
            creds["password"] = password
        return cls(
            partitions=tuple(int(r[1]) for r in sorted(rows, key=lambda r: r[0])),
            dsns={int(r[1]): str(r[2]) for r in rows},
            credentials=creds,
        )

    @property
    def shards(self) -> list[int]:
        return sorted(self.dsns)

    def shard_for(self, run_id: str) -> int:
        """The shard that owns run_id (the proxy's shard_for)."""
        return self.partitions[run_hash(run_id) & (len(self.partitions) - 1)]

    def dsn(self, shard: int) -> str:
        """The shard's DSN with this client's credentials."""
        params: dict[str, Any] = dict(conninfo.conninfo_to_dict(self.dsns[shard]))
        for key in _CREDENTIALS:
            params.pop(key, None)
        params.update(self.credentials)
        return conninfo.make_conninfo("", **params)

    def dsn_for(self, run_id: str) -> str:
        return self.dsn(self.shard_for(run_id))

    def same_server(
        self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], shard: int
    ) -> bool:
        """Whether conn is connected to the shard's database."""
        want = conninfo.conninfo_to_dict(self.dsns[shard])
        info = conn.info
        return (
            str(want.get("dbname", "")) == info.dbname
            and str(want.get("port", "5432")) == str(info.port)
            and _host(str(want.get("host", ""))) == _host(info.host)
        )

    @contextmanager
    def transaction(self, run_id: str, **kwargs: Any) -> Iterator[psycopg.Connection[Any]]:
        """A connection to the shard that owns run_id, inside a transaction
        that commits when the block ends (rolls back on an exception). Pass it
        as ``conn=`` to enqueue_run / append_events for that run, with your own
        writes on the same shard: they commit together."""
        with psycopg.connect(self.dsn_for(run_id), **kwargs) as conn, conn.transaction():
            yield conn


def shard_listen_dsns(
    proxy_dsn: str, schema: str = "runrelay", *, connect_timeout: int = 10
) -> Callable[[], list[str]]:
    """The `listen_dsn` for a Worker or Relay on a sharded install: a callable
    that reads the proxy's shard map (on a short-lived connection) and returns
    every shard's DSN with the proxy DSN's credentials. A NOTIFY is sent on
    the shard that holds the run and PL/Proxy relays none, so the loops LISTEN
    on each shard; they call this again every 30 s and so follow shards added
    to or removed from the map."""

    def dsns() -> list[str]:
        with psycopg.connect(proxy_dsn, autocommit=True, connect_timeout=connect_timeout) as proxy:
            shard_map = ShardMap.load(proxy, schema)
        return [shard_map.dsn(shard) for shard in shard_map.shards]

    return dsns


_CREDENTIALS = ("user", "password", "passfile", "sslcert", "sslkey", "sslpassword")


def _host(host: str) -> str:
    return "127.0.0.1" if host in ("localhost", "::1") else host
