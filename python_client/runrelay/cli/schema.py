"""`runrelay migrate` and `runrelay downgrade`, plain and sharded."""

from __future__ import annotations

import argparse

from .common import CommandError, _require_url


# -- commands -----------------------------------------------------------------
def cmd_migrate(args: argparse.Namespace) -> int:
    """A single install: Alembic to --revision. A sharded one (--shard, or a
    database that is already a proxy): every shard, then the proxy, to head."""
    from .. import _migrations as migrations

    url = _require_url(args)
    if args.shard or args.partitions is not None or _is_proxy(url, args.schema):
        return _migrate_sharded(args, url)
    migrations.upgrade(url, args.schema, args.revision)
    print(f"runrelay: schema {args.schema!r} is at revision {args.revision}")
    return 0


def _is_proxy(url: str, schema: str) -> bool:
    import psycopg

    from ..sharding import install

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return install.is_proxy(conn, schema)


def _migrate_sharded(args: argparse.Namespace, proxy_url: str) -> int:
    import psycopg

    from .. import _migrations as migrations
    from ..sharding import install

    if args.revision not in ("head", migrations.head()):
        raise CommandError(
            f"a sharded install migrates to head only (the proxy's functions exist for "
            f"{migrations.head()} alone), not {args.revision}; migrate a shard to another "
            "revision directly, without the proxy"
        )
    try:
        revision = install.migrate(
            proxy_url, args.shard or (), partitions=args.partitions, schema=args.schema
        )
    except install.ShardingError as exc:
        raise CommandError(f"refused, nothing was changed: {exc}") from None
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.OperationalError):
            raise  # unreachable: one line and exit 3, as for every command
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # The proxy changes in one transaction: it is as it was.
        raise CommandError(f"failed, the proxy is unchanged: {first}") from None
    with psycopg.connect(proxy_url, autocommit=True, connect_timeout=10) as proxy:
        shards = len(install.configured_shards(proxy, args.schema))
    print(f"runrelay: proxy and {shards} shards are at revision {revision}")
    return 0


def cmd_downgrade(args: argparse.Namespace) -> int:
    from .. import _migrations as migrations

    url = _require_url(args)
    if _is_proxy(url, args.schema):
        raise CommandError(
            "this database is a sharded install's proxy: downgrade each shard directly "
            "(runrelay downgrade REVISION --database-url SHARD_URL); `runrelay migrate` "
            "against the proxy brings them all back to head"
        )
    migrations.downgrade(url, args.revision, args.schema)
    print(f"runrelay: schema {args.schema!r} downgraded to {args.revision}")
    return 0
