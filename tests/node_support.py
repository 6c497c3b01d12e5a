"""The pinned Node tools of ``node/`` (installed by ``scripts/node-tools.sh``), for tests.

:func:`node_tool` finds one; when it is missing the test is skipped on a developer's
machine and fails under ``CI=true``, where ``.ci/run`` has installed them: a missing tool
never hides a test in CI.

- :func:`inspector` runs the MCP Inspector CLI (the TypeScript SDK as a client) for one
  method against a stdio command or an HTTP URL, and returns what it printed, parsed.
- :func:`ts_calls` runs ``node/calls.mjs``: many tool calls through the TypeScript SDK's
  client in one process, each answered as ``{"result": ...}`` or ``{"error": message}``.
- :func:`conformance` gives the command that runs the official MCP conformance suite on
  Node 22 (the ``node`` package's binary: the suite needs Node 22).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.service_support import unavailable

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "node"
BIN = NODE_DIR / "node_modules" / ".bin"
INSPECTOR_CLI = NODE_DIR / "node_modules/@modelcontextprotocol/inspector/cli/build/index.js"
NODE22 = NODE_DIR / "node_modules/node/bin/node"
CONFORMANCE = NODE_DIR / "node_modules/@modelcontextprotocol/conformance/dist/index.js"
TIMEOUT = 120.0
"""Seconds one Node run may take before the test fails (an Inspector run takes about 2)."""


def missing(what: str) -> NoReturn:
    """Skip the test, or fail it under CI, because ``what`` is not installed."""
    unavailable(f"{what} is not installed: run `bash scripts/node-tools.sh`")


def node() -> str:
    """The ``node`` executable."""
    found = shutil.which("node")
    if found is None:
        missing("Node.js")
    assert found is not None
    return found


def _installed(path: Path) -> Path:
    if not path.exists():
        missing(f"{path.relative_to(NODE_DIR)}")
    return path


def conformance() -> list[str]:
    """The command that runs the conformance suite's command line, on Node 22."""
    return [str(_installed(NODE22)), str(_installed(CONFORMANCE))]


def node_tool(name: str) -> Path:
    """The installed command ``name`` of ``node/node_modules/.bin``."""
    return _installed(BIN / name)


def _run(args: Sequence[str], *, env: Mapping[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, cwd=cwd,
                          env={**os.environ, **(env or {})})


def inspector(target: Sequence[str], method: str, *options: str,
              env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Any:
    """What the Inspector CLI printed for ``method`` on ``target`` (a command or a URL).

    ``options`` are Inspector options such as ``--tool-name``, ``--tool-arg k=v`` or
    ``--header "Authorization: Bearer ..."``. A run that printed no JSON fails the test with
    what the Inspector said.
    """
    # The Inspector's CLI itself, which `mcp-inspector --cli` starts after reordering its
    # arguments: the command (or URL), its own options, then the command's arguments after
    # `--`, where a variadic option such as --tool-arg ends.
    done = _run([node(), str(_installed(INSPECTOR_CLI)), target[0], "--method", method,
                 *options, "--", *target[1:]], env=env, cwd=cwd)
    try:
        return json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"the Inspector printed no JSON (exit {done.returncode}):\n"
                    f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def ts_calls(calls: Sequence[Mapping[str, Any]], *, stdio: Mapping[str, Any] | None = None,
             url: str | None = None,
             headers: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each call's answer through the TypeScript SDK's client (see ``node/calls.mjs``)."""
    _installed(NODE_DIR / "node_modules/@modelcontextprotocol/sdk/package.json")
    plan: dict[str, Any] = {"calls": list(calls)}
    if stdio is not None:
        plan["stdio"] = dict(stdio)
    else:
        plan.update(url=url, headers=dict(headers or {}))
    done = _run([node(), str(NODE_DIR / "calls.mjs"), json.dumps(plan)])
    if done.returncode != 0:
        pytest.fail(f"node calls.mjs failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


def first_text(answer: Mapping[str, Any]) -> str:
    """The first text block of an answered call; fails the test when the SDK threw."""
    assert "result" in answer, f"the TypeScript SDK refused the answer: {answer.get('error')}"
    block = answer["result"]["content"][0]
    assert block["type"] == "text"
    text: str = block["text"]
    return text
