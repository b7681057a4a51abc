#!/usr/bin/env bash
# `make test`: the PostgreSQL 15 leg (everything) and the PostgreSQL 18 leg
# (pytest on the embedded server) side by side, each on its own throwaway
# server. About half of a leg's time is spent waiting (for locks it set up,
# for leases to expire, for subprocesses to start), so on two cores the pair
# takes little longer than the longer leg alone. The 15 leg streams; the 18
# leg's output is shown whole when both are done. Either failing fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Its own process group, so that an interrupted run stops the whole leg (a
# background job of a script ignores the terminal's SIGINT).
setsid -w make --no-print-directory test-pg18 >"$log" 2>&1 &
pg18=$!
trap 'kill -TERM -- "-$pg18" 2>/dev/null; wait "$pg18"; exit 130' INT TERM
make --no-print-directory test-pg15
pg15_status=$?
wait "$pg18"
pg18_status=$?

printf '\n==> PostgreSQL 18 leg (ran beside the PostgreSQL 15 leg)\n'
cat "$log"
printf '\nPostgreSQL 15 leg: exit %s; PostgreSQL 18 leg: exit %s\n' "$pg15_status" "$pg18_status"
[ "$pg15_status" -eq 0 ] && [ "$pg18_status" -eq 0 ]
