#!/usr/bin/env bash
# Installs the pinned Node tools the tests drive (node/package.json, node/package-lock.json)
# into node/node_modules. Idempotent: it does nothing when the installed tree already
# matches the lock file. Add a tool by adding it to node/package.json (exact version) and
# running `npm install --prefix node`, then commit both files.
set -euo pipefail
cd "$(dirname "$0")/../node"
if ! command -v npm >/dev/null 2>&1; then
  echo "node-tools: npm is not installed; install Node.js 20 or newer with npm" >&2
  exit 1
fi
stamp=node_modules/.awl-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
