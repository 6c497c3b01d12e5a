#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with its test tools and the agent
# frameworks the integration tests drive (PydanticAI, the OpenAI Agents SDK), and the
# OpenTelemetry extra the tracing tests use, and the PostgreSQL store's driver (psycopg 3
# and its pool). Idempotent. It leaves .venv/.awl-installed behind, so scripts/demo.sh
# installs nothing more until pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The distribution was called agent-work-layer until it took a name of its own (that name on
# PyPI is the published AWL package): an editable install of this checkout under the old
# name goes first, so one distribution owns the awl command.
if .venv/bin/python -m pip show agent-work-layer 2>/dev/null | grep -qx "Editable project location: $PWD"; then
  .venv/bin/python -m pip uninstall -q -y --disable-pip-version-check agent-work-layer
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,pydantic-ai,openai-agents,otel,postgres]"
touch .venv/.awl-installed
