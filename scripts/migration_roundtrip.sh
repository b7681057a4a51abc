#!/usr/bin/env bash
# upgrade head -> downgrade base (nothing of ours left) -> upgrade head, then
# the same for a second install under another schema name in the same database.
set -euo pipefail
leftovers() {
    psql -X -Atq -d "$DATABASE_URL" -c "
        SELECT count(*) FROM pg_namespace WHERE nspname = '$1'
        UNION ALL
        SELECT count(*) FROM pg_roles WHERE rolname LIKE '$1\_%'"
}
for schema in runrelay rr_other; do
    alembic -x schema="$schema" upgrade head
    alembic -x schema="$schema" downgrade base
    left=$(leftovers "$schema" | awk '{s+=$1} END {print s}')
    if [ "$left" != 0 ]; then
        echo "downgrade base left objects behind for schema $schema" >&2
        exit 1
    fi
    alembic -x schema="$schema" upgrade head
    alembic -x schema="$schema" upgrade head   # idempotent: nothing to do
done
[ "$(psql -X -Atq -d "$DATABASE_URL" -c 'SELECT rr_other.get_schema_version() = runrelay.get_schema_version()')" = t ]
alembic -x schema=rr_other downgrade base
echo "migrations: round trip ok (runrelay, rr_other)"
