#!/usr/bin/env bash
# Install the TypeScript client's npm packages from its lock file into
# clients/typescript/node_modules, only when the lock file changed since the
# last install, then build it (dist/ for users, build/ with the tests).
set -euo pipefail
cd "$(dirname "$0")/../clients/typescript"
stamp=node_modules/.runrelay-lock
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json "$stamp"
fi
npx tsc -p tsconfig.build.json
npx tsc -p tsconfig.json
