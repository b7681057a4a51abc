#!/usr/bin/env bash
# The TypeScript client's suite (clients/typescript), against the server in
# DATABASE_URL: installs the npm packages of its lock file into
# clients/typescript/node_modules (nothing global), migrates a template
# database that each test file copies, then runs Node's test runner.
set -euo pipefail
: "${DATABASE_URL:?DATABASE_URL must be set}"
cd "$(dirname "$0")/.."

bash scripts/ts_install.sh

base_url=${DATABASE_URL%/*}
template=rr_ts_template
psql -X -q -d "$DATABASE_URL" -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS $template WITH (FORCE)" -c "CREATE DATABASE $template"
DATABASE_URL=$base_url/$template alembic upgrade head
psql -X -q -d "$base_url/$template" -v ON_ERROR_STOP=1 \
    -c "UPDATE runrelay.settings SET allow_clock_override = true"

cd clients/typescript
RUNRELAY_TS_TEMPLATE=$template RUNRELAY_TS_SERVER=$DATABASE_URL npm test
