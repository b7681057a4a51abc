"""Alembic environment for runrelay.

The target schema comes from ``-x schema=NAME`` (default ``runrelay``); the
database from ``-x url=...`` or ``DATABASE_URL``. Everything a revision
creates lands in that schema, including Alembic's version table, so two
installs in one database are independent. Migrations serialise on an advisory
lock, so two deploys racing to upgrade do not interleave.
"""

from __future__ import annotations

import os
import re

from alembic import context
from sqlalchemy import create_engine, pool, text

SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")


def _settings() -> tuple[str, str]:
    xargs = context.get_x_argument(as_dictionary=True)
    schema = xargs.get("schema", "runrelay")
    if not SCHEMA_RE.match(schema):
        raise SystemExit(f"invalid schema name {schema!r}: use 1-40 lowercase letters, digits, _")
    url = xargs.get("url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("set DATABASE_URL or pass -x url=postgresql://...")
    url = re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)
    return schema, url


def run_migrations_online() -> None:
    schema, url = _settings()
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        conn.execute(
            text("SELECT pg_advisory_lock(hashtext('runrelay.migrate.' || :s))"), {"s": schema}
        )
        try:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            conn.exec_driver_sql(f'SET search_path TO "{schema}", pg_temp')
            conn.commit()
            context.configure(
                connection=conn,
                version_table_schema=schema,
                transaction_per_migration=False,
            )
            with context.begin_transaction():
                context.run_migrations()
            conn.commit()
            if context.get_context().get_current_revision() is None:
                # Downgraded to base: nothing of ours may remain.
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{schema}".alembic_version')
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}"')
                conn.commit()
        finally:
            conn.execute(
                text("SELECT pg_advisory_unlock(hashtext('runrelay.migrate.' || :s))"),
                {"s": schema},
            )
            conn.commit()


if context.is_offline_mode():
    raise SystemExit("runrelay migrations run online only (they execute frozen SQL files)")
run_migrations_online()
