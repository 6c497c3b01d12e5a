import sys
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client

from gateway._bare_proxy import build_bare_proxy
from gateway._config import load_config
from gateway._upstream import UpstreamPool

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

NOTES = Path(__file__).resolve().parents[1] / "servers" / "notes.py"


async def test_bare_proxy_lists_and_forwards_every_tool(tmp_path: Path) -> None:
    """The baseline proxy shows every upstream tool by exposed name and forwards calls as is."""
    outbox = tmp_path / "outbox.jsonl"
    config = load_config({"mcpServers": {"notes": {
        "command": sys.executable, "args": [str(NOTES)], "env": {"OUTBOX_PATH": str(outbox)}}}})
    with anyio.fail_after(30):
        async with UpstreamPool(config) as pool, Client(await build_bare_proxy(pool)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"notes__search_notes", "notes__get_note", "notes__send_email",
                             "notes__create_issue"}
            sent = await client.call_tool("notes__send_email",
                                          {"to": "a@example.test", "subject": "s", "body": "b"})
            assert not sent.is_error
            unknown = await client.call_tool("notes/send_email", {})
            assert unknown.is_error
            assert isinstance(unknown.content[0], types.TextContent)
            assert unknown.content[0].text.startswith("NOT_FOUND")
    assert len(outbox.read_text().splitlines()) == 1
