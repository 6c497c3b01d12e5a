"""What passes through the gateway besides tool calls and answers (GW-13..GW-16).

``awl gateway`` runs as a stdio subprocess in front of the chatty test server, itself a real
subprocess speaking either protocol era; the worker is the SDK client in either era. What
reached the upstream is read from the upstream's own log (``CHATTY_LOG``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, stdio_client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from tests.gateway.gateway_support import Env, gateway_params, make_env, server_entry, text
from tests.servers.receiver import read_log

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ERAS = ("legacy", "2026-07-28")
"""The worker's side: the handshake era, and the 2026-07-28 (stateless) era."""


def chatty_env(tmp: Path, *, upstream: str = "modern", tools: list[str] | None = None) -> Env:
    era = {"CHATTY_ERA": "legacy"} if upstream == "legacy" else {}
    log = tmp / "chatty.jsonl"
    return make_env(tmp, servers={"chatty": server_entry(
        "chatty", env={"CHATTY_LOG": str(log), **era})},
        tools=tools or ["chatty/*"], staged=[])


def upstream_log(env: Env) -> list[dict[str, Any]]:
    return read_log(str(env.outbox.parent / "chatty.jsonl"))


async def sampling(context: ClientRequestContext,
                   params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="4"), model="m")


async def elicitation(context: ClientRequestContext,
                      params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ana"})


async def list_roots(context: ClientRequestContext) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///work/repo")])


@asynccontextmanager
async def worker(env: Env, mode: str, logs: list[Any] | None = None) -> AsyncIterator[Client]:
    """A worker in ``mode`` connected to ``awl gateway`` (stdio) for the env's order."""

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        if logs is not None:
            logs.append((params.level, params.data))

    with open(env.home / "gateway.err", "a") as errlog:
        async with Client(stdio_client(gateway_params(env), errlog=errlog), mode=mode,
                          sampling_callback=sampling, elicitation_callback=elicitation,
                          list_roots_callback=list_roots, logging_callback=on_log,
                          log_level="info") as client:
            yield client


@pytest.mark.spec("GW-13", "GW-14")
@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("upstream", ["modern", "legacy"])
async def test_progress_and_log_messages_reach_the_worker(tmp_path: Path, mode: str,
                                                          upstream: str) -> None:
    """An upstream's progress and log messages during a call reach the worker's request."""
    env = chatty_env(tmp_path, upstream=upstream)
    steps: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, total, message))

    with anyio.fail_after(60):
        async with worker(env, mode, logs) as client:
            stepped = await client.call_tool("chatty__steps", {"n": 3},
                                             progress_callback=on_progress)
            said = await client.call_tool("chatty__say", {"text": "half way there"})
    assert text(stepped) == "done 3"
    assert steps == [(1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3")]
    assert text(said) == "said"
    assert logs == [("info", "half way there")]
    assert [c.outcome for c in env.calls()] == ["ok", "ok"]


@pytest.mark.spec("GW-15")
@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("upstream", ["modern", "legacy"])
async def test_upstream_questions_reach_the_worker(tmp_path: Path, mode: str,
                                                   upstream: str) -> None:
    """Sampling, elicitation and roots asked by an upstream reach the worker and come back.

    A handshake-era upstream asks with requests of its own; a 2026-07-28 upstream answers
    ``input_required``. A 2026-07-28 worker cannot take requests, so a handshake-era
    upstream's questions are refused with a reason the upstream passes on."""
    env = chatty_env(tmp_path, upstream=upstream)
    answers: dict[str, types.CallToolResult] = {}
    with anyio.fail_after(60):
        async with worker(env, mode) as client:
            for kind in ("sampling", "elicitation", "roots"):
                answers[kind] = await client.call_tool("chatty__ask", {"kind": kind})
    if upstream == "legacy" and mode != "legacy":
        for kind, answer in answers.items():
            assert answer.is_error, kind
            assert "cannot carry requests to the worker" in text(answer)
        return
    assert {k: text(a) for k, a in answers.items()} == {
        "sampling": "sampled: 4",
        "elicitation": 'elicited: accept {"name": "Ana"}',
        "roots": "roots: file:///work/repo"}
    records = env.calls()
    assert all(r.outcome == "ok" for r in records)
    if upstream == "modern" and mode != "legacy":
        # The worker answered each round by calling again: two recorded calls per question.
        assert len(records) == 6
        assert records[0].result is not None
        assert records[0].result["resultType"] == "input_required"
    else:
        assert len(records) == 3


@pytest.mark.spec("GW-13")
@pytest.mark.parametrize("upstream", ["modern", "legacy"])
async def test_a_cancelled_call_is_cancelled_upstream(tmp_path: Path, upstream: str) -> None:
    """A worker's cancellation reaches the upstream, and the call is recorded cancelled."""
    env = chatty_env(tmp_path, upstream=upstream)
    with anyio.fail_after(60):
        async with worker(env, "legacy") as client:
            async with anyio.create_task_group() as tg:
                async def sleep() -> None:
                    await client.call_tool("chatty__sleep", {"seconds": 30})

                tg.start_soon(sleep)
                while not any(e.get("name") == "sleep" for e in upstream_log(env)):
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            # The gateway still serves after the cancellation.
            after = await client.call_tool("chatty__steps", {"n": 1})
            while not any("cancelled" in e for e in upstream_log(env)):
                await anyio.sleep(0.05)
    assert text(after) == "done 1"
    assert {"cancelled": "chatty/sleep#1"} in upstream_log(env)
    first = env.calls()[0]
    assert first.ref == "chatty/sleep#1" and first.outcome == "error"
    assert first.error is not None and first.error.startswith("AWL_CANCELLED: ")
    assert "may have run" in first.error


@pytest.mark.spec("GW-16")
@pytest.mark.parametrize("mode", ERAS)
async def test_resources_and_prompts_pass_for_a_server_the_order_covers(
        tmp_path: Path, mode: str) -> None:
    """An order that covers chatty/* reads its resources and prompts through the gateway."""
    env = chatty_env(tmp_path)
    with anyio.fail_after(60):
        async with worker(env, mode) as client:
            listed = await client.list_resources()
            templates = await client.list_resource_templates()
            note = await client.read_resource("chatty://note")
            named = await client.read_resource("chatty://notes/ana")
            prompts = await client.list_prompts()
            prompt = await client.get_prompt("greet", {"name": "Bo"})
    assert [str(r.uri) for r in listed.resources] == ["chatty://note"]
    assert [t.uri_template for t in templates.resource_templates] == ["chatty://notes/{name}"]
    assert [c.text for c in note.contents if isinstance(c, types.TextResourceContents)] == [
        "a note"]
    assert [c.text for c in named.contents if isinstance(c, types.TextResourceContents)] == [
        "the note called ana"]
    assert [p.name for p in prompts.prompts] == ["greet"]
    content = prompt.messages[0].content
    assert isinstance(content, types.TextContent) and content.text == "Say hello to Bo."
    assert env.calls() == []  # reads, not calls: not recorded, not counted


@pytest.mark.spec("GW-16")
async def test_resources_of_a_server_the_order_covers_only_in_part_stay_closed(
        tmp_path: Path) -> None:
    """With only chatty/steps allowed, nothing of chatty's resources or prompts passes."""
    env = chatty_env(tmp_path, tools=["chatty/steps"])
    with anyio.fail_after(60):
        async with worker(env, "legacy") as client:
            listed = await client.list_resources()
            prompts = await client.list_prompts()
            with pytest.raises(MCPError) as read:
                await client.read_resource("chatty://note")
            with pytest.raises(MCPError) as got:
                await client.get_prompt("greet", {"name": "Bo"})
    assert listed.resources == [] and prompts.prompts == []
    assert "chatty/*" in read.value.error.message or "covers whole" in read.value.error.message
    assert "covers whole" in got.value.error.message
    assert [e for e in upstream_log(env) if e.get("method") != "tools/call"] == []


@pytest.mark.spec("GW-14", "GW-15")
@pytest.mark.parametrize("upstream", ["modern", "legacy"])
async def test_the_worker_s_level_and_capabilities_are_kept(tmp_path: Path,
                                                           upstream: str) -> None:
    """Below the level a handshake-era worker set, no log message reaches it; a question it
    declared no capability for is refused with that reason, and the gateway keeps serving."""
    env = chatty_env(tmp_path, upstream=upstream)
    logs: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append((params.level, params.data))

    with anyio.fail_after(60), open(env.home / "gateway.err", "a") as errlog:
        async with Client(stdio_client(gateway_params(env), errlog=errlog), mode="legacy",
                          logging_callback=on_log) as client:
            with pytest.warns(MCPDeprecationWarning):
                await client.set_logging_level("warning")
            said = await client.call_tool("chatty__say", {"text": "only info"})
            asked = await client.call_tool("chatty__ask", {"kind": "sampling"})
            after = await client.call_tool("chatty__steps", {"n": 1})
    assert text(said) == "said" and logs == []
    assert asked.is_error
    assert "did not declare" in text(asked)
    assert text(after) == "done 1"
