#!/usr/bin/env bash
# The main job, end to end: makes sure the project is installed in .venv (with
# scripts/dev-install.sh), then runs examples/demo.py with any arguments given (e.g.
# --home DIR). The demo itself needs no network and no API keys; it leaves its desk in
# ./demo-desk/ under the folder you run this from.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
STAMP="$ROOT/.venv/.awl-installed"  # left by scripts/dev-install.sh
# Install on the first run, and again whenever pyproject.toml changed since (the install is
# editable, so code changes need none), and when .venv's awl is not this checkout's (a .venv
# shared with another clone). AWL_DEMO_INSTALL=1 forces it.
HERE=$(cd / && "$ROOT/.venv/bin/python" -c 'import os, awl, gateway, mcp
print(os.path.dirname(os.path.dirname(os.path.realpath(awl.__file__))))' 2>/dev/null || true)
if [ "${AWL_DEMO_INSTALL:-}" = 1 ] || [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ] \
    || [ "$HERE" != "$(cd "$ROOT" && pwd -P)" ]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "demo: needs Python 3.11 or newer; $PY is not (set PYTHON=/path/to/python3.11)" >&2
    exit 1
  fi
  echo "demo: installing the project into .venv (the first time takes a minute) ..." >&2
  PYTHON="$PY" bash "$ROOT/scripts/dev-install.sh"
fi
exec "$ROOT/.venv/bin/python" "$ROOT/examples/demo.py" "$@"
