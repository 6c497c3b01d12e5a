"""Finding the pinned Node tools (node/package.json, installed by scripts/node-tools.sh).

A test that needs one calls :func:`need`: it gets the path, or the test is skipped with a
line saying how to install the tools, except under CI (``CI=true``), where a missing tool
fails the test: CI installs them, so a missing one there is a broken install, not a reason
to skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODE_MODULES = ROOT / "node" / "node_modules"

NODE22 = NODE_MODULES / "node" / "bin" / "node"
"""Node 22 from the npm registry's ``node`` package (the conformance suite needs it)."""

CONFORMANCE = NODE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
"""The official MCP conformance suite's command line."""


def in_ci() -> bool:
    """Whether the tests run under CI (``CI=true``)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(path: Path) -> Path:
    """``path`` if the Node tools are installed; else skip the test (fail it under CI)."""
    if path.exists():
        return path
    message = (f"{path.relative_to(ROOT)} is missing: run scripts/node-tools.sh "
               "(needs npm) to install the pinned Node tools")
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)
