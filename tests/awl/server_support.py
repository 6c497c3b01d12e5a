"""Shared helpers for the desk server tests: `awl serve` subprocesses, schema-checked calls,
and held calls written into the store the way the gateway writes them."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp import Client, StdioServerParameters, stdio_client

from awl.documents.models import CallRecord, format_time
from awl.mcp.errors import ERROR_META
from awl.store.protocol import Store
from tests.awl.desk_support import reserved

ROOT = Path(__file__).resolve().parents[2]
MANAGER = "human:ana"
WORKER = "agent:writer"
OUTSIDER = "agent:nosy"
MODES = ("legacy", "2026-07-28")
"""Both protocol eras: the initialize handshake, and the stateless 2026-07-28 one."""

MANAGER_TOOLS = ("review_work_report", "answer_question", "cancel_work_order", "settle_effect")
WORKER_TOOLS = ("accept_work_order", "decline_work_order", "start_work_order",
                "post_progress", "submit_work_report")


def deadline(hours: float = 24) -> str:
    """A deadline ``hours`` from now."""
    return format_time(datetime.now(UTC) + timedelta(hours=hours))


def order_fields(**over: Any) -> dict[str, Any]:
    """A small valid order for WORKER; the desk fills spec, id, created_at and from."""
    fields: dict[str, Any] = {
        "to": WORKER,
        "goal": "Send the quarterly summary to the board",
        "criteria": [{"id": "c1", "text": "the summary is written"},
                     {"id": "c2", "text": "the board has it"}],
        "budget": {"usd": 5, "tool_calls": 20},
        "deadline": deadline(),
        "tools": ["files/read", "mail/*"],
        "staged": ["mail/send"],
    }
    fields.update(over)
    return fields


def serve_params(home: Path, *args: str) -> StdioServerParameters:
    """``awl serve`` on ``home`` with ``args``, as a stdio server command."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "awl", "serve", "--home", str(home), *args],
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}, cwd=str(home))


@asynccontextmanager
async def serve_as(home: Path, principal: str, mode: str) -> AsyncIterator[Desk]:
    """A client of an ``awl serve --as principal`` subprocess, in protocol era ``mode``."""
    with open(home / f"serve-{principal.replace(':', '-')}.err", "a") as errlog:
        transport = stdio_client(serve_params(home, "--as", principal), errlog=errlog)
        async with Client(transport, mode=mode) as client:
            yield Desk(client)


class Refused(AssertionError):
    """A call the test expected to succeed came back as a tool error."""


class Desk:
    """An MCP client of the desk whose every result is checked against its tool's schema.

    ``used`` collects the tools that answered successfully, so a test can show it covered
    every tool.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.used: set[str] = set()
        self._tools: dict[str, types.Tool] | None = None

    async def tools(self) -> dict[str, types.Tool]:
        """The listed tools by name (listed once)."""
        if self._tools is None:
            listed = await self.client.list_tools()
            self._tools = {t.name: t for t in listed.tools}
        return self._tools

    async def raw(self, name: str, **arguments: Any) -> types.CallToolResult:
        """Call a tool and return its result as it came."""
        return await self.client.call_tool(name, arguments)

    async def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        """Call a tool that must succeed; its structured content must fit its output schema."""
        result = await self.raw(name, **arguments)
        if result.is_error:
            raise Refused(f"{name} refused: {text_of(result)}")
        tool = (await self.tools())[name]
        assert tool.output_schema is not None
        Draft202012Validator(tool.output_schema).validate(result.structured_content)
        assert isinstance(result.structured_content, dict)
        self.used.add(name)
        return result.structured_content

    async def refused(self, name: str, **arguments: Any) -> dict[str, Any]:
        """Call a tool that must be refused; returns the error's details (BIND-8)."""
        result = await self.raw(name, **arguments)
        assert result.is_error, f"{name} was not refused: {text_of(result)}"
        # No structured content: a TypeScript client would check it against the tool's
        # output schema, which describes the tool's success.
        assert result.structured_content is None
        data = (result.meta or {}).get(ERROR_META)
        assert isinstance(data, dict)
        assert text_of(result).startswith(f"{data['code']}: ")
        return data


def text_of(result: types.CallToolResult) -> str:
    """The first text block of a result."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def hold_call(store: Store, order_id: str, attempt: int, tool: str,
              arguments: dict[str, Any]) -> CallRecord:
    """Record a held call as the gateway does: reserve, then hold (outcome and effect)."""
    at = format_time(datetime.now(UTC))
    record = reserved(store.reserve_call(order_id, attempt=attempt, tool=tool, arguments=arguments,
                                pass_jti=None, usd=0.0, started_at=at, scopes=()))
    store.hold_call(order_id, record.ref, result=None, ended_at=at)
    return record.model_copy(update={"outcome": "held"})


def forward_call(store: Store, order_id: str, attempt: int, tool: str,
                 arguments: dict[str, Any]) -> CallRecord:
    """Record a forwarded call that was answered, as the gateway does."""
    at = format_time(datetime.now(UTC))
    record = reserved(store.reserve_call(order_id, attempt=attempt, tool=tool, arguments=arguments,
                                pass_jti=None, usd=0.0, started_at=at, scopes=()))
    result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    store.finish_call(order_id, record.ref, outcome="ok", result=result, error=None,
                      ended_at=at)
    return record.model_copy(update={"outcome": "ok", "result": result})
