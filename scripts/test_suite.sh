#!/usr/bin/env bash
# The steps of `make test`, in parts. The parts that need a server (migrations,
# sql, ts, pytest) run against the one in DATABASE_URL (started by
# runrelay._pgcluster when the caller had none). Any failure fails the run.
#
#   scripts/test_suite.sh PARTS [PYTEST_ARGS...]
#
# PARTS is a comma-separated list, run in this order whatever the order given:
#   static      ruff, mypy, sqlfluff, the head revision's frozen code is current
#   migrations  the migration round trip
#   sql         plpgsql_check and pgTAP
#   ts          the TypeScript client's suite (scripts/test_ts.sh)
#   pytest      pytest, with PYTEST_ARGS
#   bench       bench --quick and bench.shipped --quick, on their own cluster
#   all         every part (`make test-pg15`)
# `make test` (scripts/test_legs.sh) spreads the parts over its legs.
set -euo pipefail
parts=${1:-all}
shift || true
[ "$parts" = all ] && parts=static,migrations,sql,ts,pytest,bench
cd "$(dirname "$0")/.."

for part in ${parts//,/ }; do
    case $part in
        static | migrations | sql | ts | pytest | bench) ;;
        *) echo "test_suite.sh: unknown part '$part'" >&2; exit 2 ;;
    esac
done
has() { [[ ",$parts," == *",$1,"* ]]; }
step() { printf '\n==> %s\n' "$*"; }

if has migrations || has sql || has ts || has pytest; then
    : "${DATABASE_URL:?DATABASE_URL must be set}"
fi
base_url=${DATABASE_URL:-}
base_url=${base_url%/*}
db_url() { echo "$base_url/$1"; }
recreate_db() {
    psql -X -q -d "$DATABASE_URL" -v ON_ERROR_STOP=1 \
        -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"
}

if has static; then
    step "ruff, mypy (make lint)"
    make --no-print-directory lint
    step "sqlfluff lint"
    # Code patches (frozen/*/code.patch) are generated from plpgsql/, which is linted.
    sqlfluff lint plpgsql/ migrations/frozen/*/upgrade.sql \
        migrations/frozen/*/downgrade.sql \
        tests/pgtap/ scripts/sql/
    # The proxy's SQL is a template (install.proxy_sql fills @schema@, ...):
    # its .sqlfluff gives stand-ins for the placeholders.
    sqlfluff lint --templater placeholder python_client/runrelay/sharding/sql/
    step "frozen code of the head revision is current"
    python -m devtools.sqlsource check
fi

if has migrations; then
    step "migration round trip"
    recreate_db rr_migrate
    DATABASE_URL=$(db_url rr_migrate) bash scripts/migration_roundtrip.sh
fi

if has sql; then
    step "plpgsql_check"
    recreate_db rr_lint
    DATABASE_URL=$(db_url rr_lint) alembic upgrade head
    psql -X -q -d "$(db_url rr_lint)" -v ON_ERROR_STOP=1 -f scripts/sql/plpgsql_check.sql

    step "pgTAP"
    recreate_db rr_pgtap
    DATABASE_URL=$(db_url rr_pgtap) alembic upgrade head
    for helpers in tests/pgtap/helpers*.sql; do
        psql -X -q -d "$(db_url rr_pgtap)" -v ON_ERROR_STOP=1 -f "$helpers"
    done
    pg_prove -d "$(db_url rr_pgtap)" --failures tests/pgtap/[0-9]*.sql
fi

if has ts; then
    step "TypeScript client (node --test)"
    bash scripts/test_ts.sh
fi

if has pytest; then
    step "pytest (PostgreSQL ${RUNRELAY_PG_VERSION:-from DATABASE_URL})"
    pytest "$@"
fi

if has bench; then
    # A smoke test of `make bench` at tiny sizes on its own durable cluster: it
    # must complete and write its JSON; it asserts nothing about speed.
    step "bench --quick (smoke test, no timing assertions)"
    bench_out=$(mktemp -d)
    trap 'rm -rf "$bench_out"' EXIT
    python -m bench.run --quick --out "$bench_out"
    python -m bench.shipped --quick
    ls "$bench_out"/*.json
fi
