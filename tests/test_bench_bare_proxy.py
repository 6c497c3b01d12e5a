"""The floors of the benchmarks: :mod:`bench.bare_proxy` (the MCP SDK alone),
:mod:`bench.memory_gateway` (the gateway on the in-memory store) and
:mod:`bench.journal_gateway` (the gateway with a journal for its call records)."""

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


async def test_the_journal_gateway_writes_each_call_before_answering(tmp_path: Path) -> None:
    """:mod:`bench.journal_gateway` is the whole gateway with a journal for its call records:
    a reservation line before forwarding and the outcome line before answering, the order's
    budget counted exactly (a call past it is refused and never forwarded), and nothing of
    the calls written to the desk."""
    from contextlib import closing

    from awl.store.sqlite import SQLiteStore
    from bench.gateway import new_working_order

    outbox = tmp_path / "outbox.jsonl"
    config = tmp_path / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable, "args": [str(NOTES)], "env": {"OUTBOX_PATH": str(outbox)}}}}))
    home = tmp_path / "home"
    home.mkdir()
    with closing(SQLiteStore(home / "desk.sqlite3")) as store:
        order_id = new_working_order(store, 2)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "bench.journal_gateway", "--home", str(home), "--order", order_id,
              "--config", str(config)],
        env={"PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    with anyio.fail_after(60), open(tmp_path / "gateway.err", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            answers = [await client.call_tool(
                "notes__send_email", {"to": to, "subject": "s", "body": "b"})
                for to in ("a@example.test", "b@example.test", "c@example.test")]
    assert [(a.meta or {}).get("awl/ref") for a in answers[:2]] == [
        "notes/send_email#1", "notes/send_email#2"]
    assert answers[2].is_error
    assert answers[2].content[0].text.startswith("AWL_BUDGET_EXHAUSTED:")  # type: ignore[union-attr]
    lines = [json.loads(line) for line in (home / "calls.journal").read_text().splitlines()]
    assert [(kind, r["ref"], r["outcome"]) for line in lines for kind, r in line.items()] == [
        ("reserved", "notes/send_email#1", "pending"), ("ended", "notes/send_email#1", "ok"),
        ("reserved", "notes/send_email#2", "pending"), ("ended", "notes/send_email#2", "ok")]
    assert lines[0]["reserved"]["arguments"] == {"to": "a@example.test", "subject": "s",
                                                 "body": "b"}
    assert [json.loads(m)["to"] for m in outbox.read_text().splitlines()] == [
        "a@example.test", "b@example.test"]  # the refused call never reached the upstream
