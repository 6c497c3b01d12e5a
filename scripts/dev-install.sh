#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with its test tools and the agent
# frameworks the integration tests drive (PydanticAI, the OpenAI Agents SDK), and the
# OpenTelemetry extra the tracing tests use, and the PostgreSQL store's driver (psycopg 3
# and its pool). Idempotent. It leaves .venv/.awl-installed behind, so scripts/demo.sh
# (which needs only the base package, and installs only that) installs nothing more until
# pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
ROOT=$PWD
. scripts/_old-name.sh
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,pydantic-ai,openai-agents,otel,postgres]"
touch .venv/.awl-installed
