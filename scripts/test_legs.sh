#!/usr/bin/env bash
# `make test`: three legs side by side, each part of scripts/test_suite.sh in
# exactly one of them:
#   PostgreSQL 15 (system server): migrations, plpgsql_check, pgTAP, pytest
#     (the sharded suites only here: they need the system server's PL/Proxy);
#   PostgreSQL 18 (embedded wheel): migrations, pytest (the package suites,
#     marked `package`, only here: the server under them is incidental),
#     then the TypeScript suite;
#   no server of the legs': ruff, mypy, sqlfluff, the frozen code, and the
#     bench smoke test (it starts a cluster of its own).
# About half of a pytest leg's time is spent waiting (for locks it set up,
# for leases to expire, for subprocesses to start), so on two cores the
# three take little longer than the longest alone; what runs where is
# chosen so that the two PostgreSQL legs end together. The 15 leg streams;
# the others' output is shown whole when all are done. Any leg failing fails
# the run.
set -uo pipefail
cd "$(dirname "$0")/.."

pg18_log=$(mktemp)
static_log=$(mktemp)
trap 'rm -f "$pg18_log" "$static_log"' EXIT
# Each its own process group, so that an interrupted run stops the whole leg
# (a background job of a script ignores the terminal's SIGINT).
setsid -w make --no-print-directory test-pg18 PG18_PARTS=migrations,pytest,ts \
    >"$pg18_log" 2>&1 &
pg18=$!
setsid -w bash scripts/test_suite.sh static,bench >"$static_log" 2>&1 &
static=$!
trap 'kill -TERM -- "-$pg18" "-$static" 2>/dev/null; wait; exit 130' INT TERM
make --no-print-directory test-pg15 PG15_PARTS=migrations,sql,pytest PG15_MARKS="-m 'not package'"
pg15_status=$?
wait "$pg18"
pg18_status=$?
wait "$static"
static_status=$?

printf '\n==> Static checks and the bench smoke test (ran beside the PostgreSQL legs)\n'
cat "$static_log"
printf '\n==> PostgreSQL 18 leg (ran beside the PostgreSQL 15 leg)\n'
cat "$pg18_log"
printf '\nPostgreSQL 15 leg: exit %s; PostgreSQL 18 leg: exit %s; static checks and bench smoke: exit %s\n' \
    "$pg15_status" "$pg18_status" "$static_status"
[ "$pg15_status" -eq 0 ] && [ "$pg18_status" -eq 0 ] && [ "$static_status" -eq 0 ]
