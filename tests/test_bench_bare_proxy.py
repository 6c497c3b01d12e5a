"""The floors of the benchmarks: :mod:`bench.bare_proxy` (the MCP SDK alone) and
:mod:`bench.memory_gateway` (the gateway on the in-memory store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters, stdio_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "tests" / "servers" / "notes.py"


def test_the_floor_imports_nothing_of_awl_or_the_gateway() -> None:
    """Importing it loads the MCP SDK and no module of ``awl`` or ``gateway``."""
    code = ("import sys, bench.bare_proxy; print(' '.join(m for m in sys.modules "
            "if m.split('.')[0] in ('awl', 'gateway')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                          timeout=60)
    assert done.stdout.strip() == ""


async def test_the_floor_lists_and_forwards_every_tool(tmp_path: Path) -> None:
    """Over stdio it lists the upstream's tools as the gateway names them and forwards calls."""
    outbox = tmp_path / "outbox.jsonl"
    config = tmp_path / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable, "args": [str(NOTES)], "env": {"OUTBOX_PATH": str(outbox)}}}}))
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "bench.bare_proxy", "--config", str(config)],
                                   env={"PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    with anyio.fail_after(60), open(tmp_path / "proxy.err", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            sent = await client.call_tool("notes__send_email",
                                          {"to": "a@example.test", "subject": "s", "body": "b"})
    assert names == {"notes__search_notes", "notes__get_note", "notes__send_email",
                     "notes__create_issue"}
    assert not sent.is_error
    assert len(outbox.read_text().splitlines()) == 1


async def test_the_memory_store_gateway_checks_and_records_each_call(tmp_path: Path) -> None:
    """:mod:`bench.memory_gateway` is the whole gateway: it hands out refs, and refuses what
    its order does not allow without forwarding it."""
    outbox = tmp_path / "outbox.jsonl"
    config = tmp_path / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable, "args": [str(NOTES)], "env": {"OUTBOX_PATH": str(outbox)}}}}))
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "bench.memory_gateway", "--config", str(config),
                                         "--calls", "1"],
                                   env={"PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    with anyio.fail_after(60), open(tmp_path / "gateway.err", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            first = await client.call_tool("notes__get_note", {"id": "n1"})
            second = await client.call_tool("notes__send_email",
                                            {"to": "a@example.test", "subject": "s", "body": "b"})
    assert not first.is_error
    assert (first.meta or {}).get("awl/ref") == "notes/get_note#1"
    assert second.is_error
    assert second.content[0].text.startswith("AWL_BUDGET_EXHAUSTED:")  # type: ignore[union-attr]
    assert not outbox.exists() or outbox.read_text() == ""
