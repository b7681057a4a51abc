#!/usr/bin/env bash
# Make sure the machine has what `make test` needs: pgTAP (with pg_prove),
# plpgsql_check, PL/Proxy and PgBouncer for the system PostgreSQL, and Debian's
# Chromium (with a font) for the dashboard's browser tests, which Playwright
# drives at /usr/bin/chromium (it never downloads a browser of its own).
# Installs the Debian packages when root; says exactly what to install
# otherwise.
set -euo pipefail

sharedir=$(pg_config --sharedir 2>/dev/null || true)
pkglibdir=$(pg_config --pkglibdir 2>/dev/null || true)
major=$(pg_config --version 2>/dev/null | sed -E 's/^PostgreSQL ([0-9]+).*/\1/' || true)
if [ -z "$sharedir" ] || [ -z "$major" ]; then
    echo "ensure_prereqs: pg_config not found; install postgresql-15 (Debian) first" >&2
    exit 1
fi

# Node.js 20+ with npm for the TypeScript client's suite (its npm packages
# come from its lock file; nothing is installed globally). Debian 12's own
# nodejs is 18, too old (AbortSignal.any), so it is not installed from there.
node_major=$(node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/' || true)
if [ -z "$node_major" ] || [ "$node_major" -lt 20 ] || ! command -v npm >/dev/null 2>&1; then
    echo "ensure_prereqs: Node.js 20 or newer with npm is needed (found: ${node_major:-none})" >&2
    echo "  install it from https://nodejs.org or your distribution's Node 20+ packages" >&2
    exit 1
fi

missing=()
[ -f "$sharedir/extension/pgtap.control" ] || missing+=("postgresql-$major-pgtap")
[ -f "$pkglibdir/plpgsql_check.so" ] || missing+=("postgresql-$major-plpgsql-check")
# PL/Proxy, for the sharded install's proxy (tests/python/test_sharded*.py).
[ -f "$sharedir/extension/plproxy.control" ] || missing+=("postgresql-$major-plproxy")
command -v pg_prove >/dev/null 2>&1 || missing+=("libtap-parser-sourcehandler-pgtap-perl")
command -v pgbouncer >/dev/null 2>&1 || missing+=("pgbouncer")
[ -x /usr/bin/chromium ] || missing+=("chromium")
# Chromium only recommends a font; without any, pages render as boxes.
[ -d /usr/share/fonts/truetype/liberation ] || missing+=("fonts-liberation")

# A non-C collation (glibc's en_US.UTF-8) for the lane-order test, which
# needs a database whose default collation sorts run_ids unlike "C" (the
# embedded PostgreSQL 18 has no ICU).
need_locale=0
locale -a 2>/dev/null | grep -i '^en_US\.utf-\?8$' >/dev/null || need_locale=1
command -v locale-gen >/dev/null 2>&1 || { [ "$need_locale" -eq 0 ] || missing+=("locales"); }

if [ ${#missing[@]} -eq 0 ] && [ "$need_locale" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    if [ ${#missing[@]} -gt 0 ]; then
        echo "ensure_prereqs: missing Debian packages: ${missing[*]}" >&2
        echo "  install them with: sudo apt-get install -y ${missing[*]}" >&2
    fi
    if [ "$need_locale" -eq 1 ]; then
        echo "ensure_prereqs: missing the en_US.UTF-8 locale" >&2
        echo "  generate it with: sudo locale-gen en_US.UTF-8" >&2
    fi
    exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "ensure_prereqs: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$need_locale" -eq 1 ]; then
    echo "ensure_prereqs: generating the en_US.UTF-8 locale" >&2
    sed -i -E 's/^# *(en_US\.UTF-8 UTF-8)/\1/' /etc/locale.gen
    grep -q '^en_US.UTF-8 UTF-8' /etc/locale.gen || echo 'en_US.UTF-8 UTF-8' >> /etc/locale.gen
    locale-gen >/dev/null
fi
