"""Helpers shared by every revision. Keep them small and stable: changing one
changes how every past revision replays.

Code (functions, views, composite types, grants) evolves by whole replacement:
a revision drops all code in the schema and installs its own, assembled from
the ``frozen/<rev>/code.patch`` chain (see ``codetree``), so the database holds
exactly that revision's functions whichever revision it came from. Tables
evolve by the revision's hand-written ``upgrade.sql`` / ``downgrade.sql``.
A function that a table constraint calls (a table's rules function, such as
``_runs_rules``) belongs to the table, not to the code: ``drop_code`` keeps it,
and it changes with the table, in ``upgrade.sql`` / ``downgrade.sql``.
"""

from __future__ import annotations

from collections.abc import Callable

from alembic import op

from runrelay._migrations.codetree import FROZEN, install_sql

ROLE_SUFFIXES = ("producer", "worker", "relay", "admin")

_DROP_CODE = """
DO $drop$
DECLARE
    v_obj record;
    v_dropped integer;
BEGIN
    FOR v_obj IN
        SELECT c.oid::regclass AS name
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'v'
        -- A view that another view reads (the _clock view) goes last.
        ORDER BY EXISTS (
            SELECT 1
            FROM pg_catalog.pg_depend AS d
            INNER JOIN pg_catalog.pg_rewrite AS w ON w.oid = d.objid
            WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass
              AND d.refobjid = c.oid AND w.ev_class <> c.oid
        )
    LOOP
        EXECUTE format('DROP VIEW %s', v_obj.name);
    END LOOP;
    -- A function with a SQL-standard body depends on the functions it calls
    -- (_enqueue_valid on _id_valid): each round drops the functions no
    -- remaining function depends on, until a round drops none. Without the
    -- rounds the drop order was the catalog's, which differs between
    -- servers.
    LOOP
        v_dropped := 0;
        FOR v_obj IN
            SELECT p.oid::regprocedure AS name
            FROM pg_catalog.pg_proc AS p
            WHERE p.pronamespace = current_schema()::regnamespace
              -- A function a table constraint or trigger calls is the
              -- table's (state).
              AND NOT EXISTS (
                  SELECT 1
                  FROM pg_catalog.pg_depend AS d
                  WHERE d.classid IN (
                      'pg_catalog.pg_constraint'::regclass, 'pg_catalog.pg_trigger'::regclass
                  )
                    AND d.refclassid = 'pg_catalog.pg_proc'::regclass
                    AND d.refobjid = p.oid
              )
              AND NOT EXISTS (
                  SELECT 1
                  FROM pg_catalog.pg_depend AS d
                  WHERE d.classid = 'pg_catalog.pg_proc'::regclass
                    AND d.refclassid = 'pg_catalog.pg_proc'::regclass
                    AND d.refobjid = p.oid
                    AND d.objid <> p.oid
              )
        LOOP
            EXECUTE format('DROP FUNCTION %s', v_obj.name);
            v_dropped := v_dropped + 1;
        END LOOP;
        EXIT WHEN v_dropped = 0;
    END LOOP;
    FOR v_obj IN
        SELECT t.oid::regtype AS name
        FROM pg_catalog.pg_type AS t
        WHERE t.typnamespace = current_schema()::regnamespace
          AND t.typtype = 'c'
          AND NOT EXISTS (
              SELECT 1 FROM pg_catalog.pg_class AS c
              WHERE c.oid = t.typrelid AND c.relkind <> 'c'
          )
    LOOP
        EXECUTE format('DROP TYPE %s', v_obj.name);
    END LOOP;
END
$drop$;
"""


def run_sql(sql: str) -> None:
    """Execute SQL text on the raw psycopg connection (no bind-parameter parsing)."""
    op.get_bind().connection.driver_connection.execute(sql)  # type: ignore[union-attr]


def schema() -> str:
    return str(op.get_bind().exec_driver_sql("SELECT current_schema()").scalar())


def run_frozen(revision: str, name: str) -> None:
    path = FROZEN / revision / name
    if path.exists():
        run_sql(path.read_text(encoding="utf-8"))


def drop_code() -> None:
    run_sql(_DROP_CODE)


def code_revision(
    revision: str, down_revision: str | None, *, creates_roles: bool = False
) -> tuple[Callable[[], None], Callable[[], None]]:
    """The ``(upgrade, downgrade)`` of a revision that ships code and a table delta.

    upgrade: ``frozen/<rev>/upgrade.sql``, then ``revision``'s code.
    downgrade: drop the code, ``downgrade.sql``, then ``down_revision``'s code.
    Both assemble the code they install before executing anything, so a
    damaged patch chain fails the migration with nothing changed. The first
    revision (``creates_roles``) also creates the install's roles after its
    tables, and drops them after dropping its tables.
    """

    def upgrade() -> None:
        code = install_sql(revision)
        run_frozen(revision, "upgrade.sql")
        if creates_roles:
            create_roles()
        drop_code()
        run_sql(code)

    def downgrade() -> None:
        code = None if down_revision is None else install_sql(down_revision)
        drop_code()
        run_frozen(revision, "downgrade.sql")
        if creates_roles:
            drop_roles()
        if code is not None:
            run_sql(code)

    return upgrade, downgrade


def create_roles() -> None:
    name = schema()
    for suffix in ROLE_SUFFIXES:
        role = f"{name}_{suffix}"
        run_sql(
            f"""DO $r$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                    CREATE ROLE "{role}" NOLOGIN;
                END IF;
            END $r$;
            GRANT USAGE ON SCHEMA "{name}" TO "{role}";"""
        )


def drop_roles() -> None:
    name = schema()
    for suffix in ROLE_SUFFIXES:
        role = f"{name}_{suffix}"
        # Roles are cluster-wide: one still used by another database stays.
        run_sql(
            f"""DO $r$ BEGIN
                IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                    REVOKE ALL ON SCHEMA "{name}" FROM "{role}";
                    DROP ROLE "{role}";
                END IF;
            EXCEPTION WHEN dependent_objects_still_exist THEN
                RAISE NOTICE 'role % is still used elsewhere and was kept', '{role}';
            END $r$;"""
        )
