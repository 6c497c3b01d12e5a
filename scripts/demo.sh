#!/usr/bin/env bash
# The main job, end to end: makes sure the project is installed in .venv, then runs
# examples/demo.py with any arguments given (e.g. --home DIR). The demo needs the base
# package only (no extras, no test tools), so that is all this installs; `bash .ci/run` (the
# tests) installs the rest into the same .venv. The demo itself needs no network and no API
# keys; it leaves its desk in ./demo-desk/ under the folder you run this from.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
BASE="$ROOT/.venv/.awl-base-installed"  # left here after the base install
FULL="$ROOT/.venv/.awl-installed"       # left by scripts/dev-install.sh (the base and more)
fresh() { [ -f "$1" ] && ! [ "$ROOT/pyproject.toml" -nt "$1" ]; }
# Install on the first run, and again whenever pyproject.toml changed since (the install is
# editable, so code changes need none), and when .venv's awl is not this checkout's (a .venv
# shared with another clone). AWL_DEMO_INSTALL=1 forces it.
HERE=$(cd / && "$ROOT/.venv/bin/python" -c 'import os, awl, gateway, mcp
print(os.path.dirname(os.path.dirname(os.path.realpath(awl.__file__))))' 2>/dev/null || true)
if [ "${AWL_DEMO_INSTALL:-}" = 1 ] || ! { fresh "$BASE" || fresh "$FULL"; } \
    || [ "$HERE" != "$(cd "$ROOT" && pwd -P)" ]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "demo: needs Python 3.11 or newer; $PY is not (set PYTHON=/path/to/python3.11)" >&2
    exit 1
  fi
  echo "demo: installing the project (the base package only) into .venv ..." >&2
  [ -x "$ROOT/.venv/bin/python" ] || "$PY" -m venv "$ROOT/.venv"
  . "$ROOT/scripts/_old-name.sh"
  "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT"
  touch "$BASE"
fi
exec "$ROOT/.venv/bin/python" "$ROOT/examples/demo.py" "$@"
