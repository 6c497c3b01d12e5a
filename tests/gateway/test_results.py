"""Results the gateway passes on: bounded in linear time, and agreeing with the advertised
output schema, so the Python SDK client (which checks it) reads every one of them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from awl.documents.limits import MAX_CONTENT_BLOCKS
from awl.mcp.errors import ERROR_META
from gateway._results import (
    AWL_UPSTREAM_BAD_RESULT,
    TRUNCATED_META_KEY,
    bound_result,
    result_size,
)
from tests.gateway.gateway_support import connect, make_env, server_entry, text

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _shapes(tmp: Path, **extra: Any) -> Any:
    return make_env(tmp, servers={"shapes": server_entry("shapes", **extra)},
                    tools=["shapes/*"], staged=[])


def _last_text(result: types.CallToolResult) -> str:
    block = result.content[-1]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.spec("GW-8", "GW-12", "DOC-15")
def test_bounding_many_blocks_is_linear() -> None:
    """100,000 small blocks are bounded in well under a second per 100,000 (the old cut took
    minutes at 20,000), to at most MAX_CONTENT_BLOCKS blocks, saying how many were left out."""
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text=f"block {i}") for i in range(100_000)])
    started = time.perf_counter()
    bounded = bound_result(result, 1024 * 1024, label="s/t")
    took = time.perf_counter() - started
    assert took < 10, took
    assert result_size(bounded) <= 1024 * 1024
    assert len(bounded.content) == MAX_CONTENT_BLOCKS + 1
    assert isinstance(bounded.content[0], types.TextContent)
    assert bounded.content[0].text == "block 0"
    assert f"the last {100_000 - MAX_CONTENT_BLOCKS} content block(s) left out" in (
        _last_text(bounded))


@pytest.mark.spec("GW-8")
def test_a_cut_keeps_every_block_and_shortens_only_the_longest() -> None:
    """Short blocks stay whole; only the long ones are cut, and the note says by how much."""
    content = [types.TextContent(type="text", text="short"),
               types.TextContent(type="text", text="é" * 5000),
               types.TextContent(type="text", text="z" * 5000)]
    bounded = bound_result(types.CallToolResult(content=content), 4096, label="s/t")
    assert result_size(bounded) <= 4096
    texts = [b.text for b in bounded.content if isinstance(b, types.TextContent)]
    assert texts[0] == "short"
    assert texts[1].startswith("é") and texts[2].startswith("z")
    assert 1000 < len(texts[2]) < 5000
    assert "2 text block(s) shortened" in texts[-1]


@pytest.mark.spec("GW-8", "GW-12", "DOC-15", "BIND-8")
async def test_a_huge_answer_is_answered_within_seconds(tmp_path: Path) -> None:
    """An upstream answer of 100,000 blocks reaches the worker, bounded, within seconds."""
    env = _shapes(tmp_path)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            with anyio.fail_after(30):
                result = await client.call_tool("shapes__blocks", {"count": 100_000, "size": 8})
    assert not result.is_error
    assert len(result.content) == MAX_CONTENT_BLOCKS + 1
    assert result.meta is not None and TRUNCATED_META_KEY in result.meta
    assert "content block(s) left out" in _last_text(result)
    [record] = env.calls()
    assert record.outcome == "ok"


@pytest.mark.spec("GW-8", "GW-12")
async def test_a_large_file_is_cut_and_still_fits_its_output_schema(tmp_path: Path) -> None:
    """A 1 MB read (text and structured content, as a file server answers it) is cut to
    max_result_bytes with its structured content shortened, not dropped: the SDK client,
    which checks the output schema, accepts it, and the worker is told what was cut."""
    env = _shapes(tmp_path, max_result_bytes=100_000)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert listed["shapes__file"].output_schema is not None
            result = await client.call_tool("shapes__file", {"n": 1_000_000})
    assert not result.is_error
    structured = result.structured_content
    assert structured is not None and structured["content"].startswith("xxx")
    assert 30_000 < len(structured["content"]) < 100_000
    note = _last_text(result)
    assert "1000" in note and "100000 bytes" in note and "structured content shortened" in note
    assert result_size(result) <= 100_000 + 200  # the gateway's own awl/ref comes on top


@pytest.mark.spec("GW-12", "BIND-8")
async def test_results_that_break_the_advertised_schema_are_readable(tmp_path: Path) -> None:
    """A success whose structured content breaks the tool's schema, or is missing, becomes
    a readable tool error (the call is still recorded as the upstream answered); an error's
    mismatching structured content is left out; a schema that is not JSON Schema is not
    advertised."""
    env = _shapes(tmp_path)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            listed = {t.name: t for t in (await client.list_tools()).tools}
            off = await client.call_tool("shapes__off_schema", {})
            bare = await client.call_tool("shapes__bare", {})
            failed = await client.call_tool("shapes__off_schema_error", {})
            odd = await client.call_tool("shapes__bad_schema", {})
            bad_limit = await client.call_tool("awl_list_calls", {"limit": 0})
    assert off.is_error and off.structured_content is None
    assert text(off).startswith(f"{AWL_UPSTREAM_BAD_RESULT}: shapes/off_schema answered")
    assert "number" in text(off) and "the call did run" in text(off)
    assert bare.is_error and "has no structured content" in text(bare)
    assert failed.is_error and failed.structured_content is None and text(failed) == "boom"
    assert listed["shapes__bad_schema"].output_schema is None
    assert not odd.is_error and odd.structured_content == {"x": 1}
    # The gateway's own tools: an error carries its details in _meta, not structured.
    assert listed["awl_list_calls"].output_schema is not None
    assert bad_limit.is_error and bad_limit.structured_content is None
    assert text(bad_limit).startswith("BAD_REQUEST: ")
    assert (bad_limit.meta or {})[ERROR_META]["code"] == "BAD_REQUEST"
    outcomes = {c.tool: c.outcome for c in env.calls()}
    assert outcomes["shapes/off_schema"] == "ok"
    assert outcomes["shapes/off_schema_error"] == "error"
