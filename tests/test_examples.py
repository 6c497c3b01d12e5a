"""The example files the README uses: each one validates, and they fit together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl import check, load_document
from awl.documents.patterns import matches_any
from gateway import UpstreamPool, load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _load(name: str) -> Any:
    return load_document(EXAMPLES / name)


def test_every_example_document_validates() -> None:
    """Every examples/*.json is a valid AWL document (a report against the order) or config."""
    order = _load("order.json")
    files = sorted(EXAMPLES.glob("*.json"))
    assert {p.name for p in files} >= {"order.json", "report.json", "upstream.json"}
    for path in files:
        doc = load_document(path)
        if "mcpServers" in doc:
            load_config(path)  # raises ConfigError naming the problem
            continue
        assert isinstance(doc.get("spec"), str), f"{path.name}: neither AWL nor mcpServers"
        context = {"order": order} if doc["spec"].startswith("awl/work-report@") else {}
        findings = check(doc, **context)
        assert [(f.rule, f.path) for f in findings] == [], path.name


@pytest.mark.slow
def test_the_validate_commands_pass() -> None:
    """`awl validate` accepts the example order, and the example report against it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for args in (["examples/order.json"],
                 ["examples/report.json", "--order", "examples/order.json"]):
        done = subprocess.run([sys.executable, "-m", "awl", "validate", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip().endswith(": valid")


def test_the_report_uses_only_what_the_order_allows_and_stages() -> None:
    """The example report's tools are allowed by the order and its effects are staged."""
    order, report = _load("order.json"), _load("report.json")
    assert report["order_id"] == order["id"]
    assert all(matches_any(order["tools"], tool) for tool in report["tools_used"])
    assert all(matches_any(order["staged"], e["tool"]) for e in report["effects"])


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_example_upstream_offers_every_tool_the_order_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/upstream.json starts the outbox server, which has every tool of the order."""
    # The config says "python": the venv's, as in an activated shell.
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))
    config = load_config(EXAMPLES / "upstream.json")
    order = _load("order.json")
    with open(os.devnull, "w") as quiet, anyio.fail_after(60):
        async with UpstreamPool(config, errlog=quiet, require_all=True) as pool:
            tools = await pool.tools()
    for pattern in [*order["tools"], *order["staged"]]:
        assert pattern in tools, pattern
    assert json.loads((EXAMPLES / "upstream.json").read_text())["mcpServers"]["mail"]["cwd"] == "."
