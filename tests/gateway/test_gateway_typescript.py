"""The gateway driven by the TypeScript SDK (its client in one process, and the MCP Inspector
CLI) over stdio and HTTP, in front of the published filesystem server: refusals, held calls,
the gateway's own tools and a 1 MB file read all reach the client readable (BIND-8, GW-12).
The Python SDK client, which checks output schemas too, reads the same file."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import pytest

from awl.passes import KeyStore, issue_recorded_pass
from gateway._serve import open_gateway, serve_http
from tests.gateway.gateway_support import (
    ROOT,
    WORKER,
    Env,
    connect,
    final,
    gateway_client,
    make_env,
    server_entry,
)
from tests.gateway.gateway_support import (
    text as first_block,
)
from tests.node_support import first_text, inspector, node, node_tool, ts_calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

_MB = 1_000_000


def _env(tmp: Path) -> tuple[Env, Path]:
    """An order allowing the filesystem server's reads and the shapes server, staging the
    receiver's create_issue; a 1 MB text file in the served folder."""
    served = tmp / "served"
    served.mkdir()
    big = served / "big.txt"
    big.write_text(("0123456789abcdef" * 64 + "\n") * (_MB // 1025 + 1), encoding="utf-8")
    servers = {
        "fs": {"command": node(), "args": [str(node_tool("mcp-server-filesystem")), str(served)]},
        "shapes": server_entry("shapes"),
        "receiver": server_entry("receiver", env={"RECEIVER_LOG": str(tmp / "receiver.jsonl")}),
    }
    env = make_env(tmp, servers=servers, tools=["fs/read_text_file", "shapes/*", "receiver/*"],
                   staged=["receiver/create_issue"])
    return env, big


def _check_big_read(result: dict[str, Any], size: int) -> None:
    """A read of the 1 MB file as a client got it: cut, valid, and saying so."""
    assert not result.get("isError"), result["content"][0]["text"][:300]
    content = result["structuredContent"]["content"]
    assert content.startswith("0123456789abcdef") and len(content) < size
    note = result["content"][-1]["text"]
    assert note.startswith("[AWL: the fs/read_text_file result was ") and "cut" in note


@pytest.mark.spec("BIND-8", "GW-6", "GW-9", "GW-12")
async def test_every_gateway_answer_is_readable_in_the_typescript_sdk(tmp_path: Path) -> None:
    """Over stdio (`awl gateway`), the TypeScript SDK reads: an AWL_FORBIDDEN refusal, an
    AWL_INVALID_ARGUMENTS held call (with its awl/ref), the gateway's own BAD_REQUEST and
    VALIDATION_FAILED, an upstream result that breaks its schema, a held call, a success
    checked against its schema, and a 1 MB file read through the filesystem server."""
    env, big = _env(tmp_path)
    calls = [
        ("AWL_FORBIDDEN", "fs__write_file", {"path": str(big), "content": "x"}),
        ("AWL_INVALID_ARGUMENTS", "receiver__create_issue", {"title": 5}),
        ("BAD_REQUEST", "awl_list_calls", {"limit": 0}),
        ("VALIDATION_FAILED", "awl_submit_report", {"report": {"status": "done"}}),
        ("AWL_UPSTREAM_BAD_RESULT", "shapes__off_schema", {}),
        ("pending:", "receiver__create_issue", {"title": "t"}),
        ("", "awl_list_calls", {}),
        ("", "fs__read_text_file", {"path": str(big)}),
    ]
    stdio: dict[str, Any] = {"command": sys.executable,
             "args": ["-m", "awl", "gateway", "--order", env.order_id, "--config",
                      str(env.config), "--home", str(env.home)],
             "env": {"PYTHONPATH": str(ROOT)}, "cwd": str(env.home)}
    with anyio.fail_after(120):
        answers = await anyio.to_thread.run_sync(partial(
            ts_calls, [{"name": n, "arguments": a} for _, n, a in calls], stdio=stdio))
    texts = [first_text(a) for a in answers]
    for (code, name, _), answer, text in zip(calls, answers, texts, strict=True):
        assert text.startswith(code), (name, text)
        assert bool(answer["result"].get("isError")) == (code not in ("", "pending:")), name
        if code not in ("", "pending:"):  # every refusal's code is readable in _meta
            error = answer["result"]["_meta"]["awl/error"]
            assert error["code"] == code, name
            assert text.startswith(f"{code}: {error['message']}"), name
            assert "structuredContent" not in answer["result"], name
    assert answers[1]["result"]["_meta"]["awl/ref"] == "receiver/create_issue#2"
    assert answers[6]["result"]["structuredContent"]["calls"][0]["outcome"] == "refused"
    _check_big_read(answers[7]["result"], big.stat().st_size)
    # The Inspector CLI itself, over stdio, as a user runs it: `... -- awl gateway ...`.
    with anyio.fail_after(120):
        refused = await anyio.to_thread.run_sync(partial(
            inspector, [stdio["command"], *stdio["args"]], "tools/call",
            "--tool-name", "awl_list_calls", "--tool-arg", "limit=0",
            env=stdio["env"], cwd=env.home))
    assert refused["isError"] is True
    assert refused["content"][0]["text"].startswith("BAD_REQUEST: ")
    # A gateway refusal as the Inspector prints it: its code is in _meta too (BIND-8).
    with anyio.fail_after(120):
        forbidden = await anyio.to_thread.run_sync(partial(
            inspector, [stdio["command"], *stdio["args"]], "tools/call",
            "--tool-name", "fs__write_file", "--tool-arg", f"path={big}", "content=x",
            env=stdio["env"], cwd=env.home))
    assert forbidden["isError"] is True and "structuredContent" not in forbidden
    assert forbidden["_meta"]["awl/error"]["code"] == "AWL_FORBIDDEN"
    assert forbidden["content"][0]["text"] == (
        f"AWL_FORBIDDEN: {forbidden['_meta']['awl/error']['message']}")


@pytest.mark.spec("BIND-6", "GW-12")
async def test_the_inspector_cli_reads_a_large_file_over_http(tmp_path: Path) -> None:
    """The Inspector CLI, with the worker's pass in --header, reads the 1 MB file through
    the gateway served over streamable HTTP."""
    env, big = _env(tmp_path)
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home), subject=WORKER)
    with anyio.fail_after(120):
        async with (open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                                 load_keys=True) as gw,
                    anyio.create_task_group() as tg):
            url = await tg.start(serve_http, gw)
            result = await anyio.to_thread.run_sync(partial(
                inspector, [url], "tools/call", "--transport", "http",
                "--header", f"Authorization: Bearer {token}",
                "--tool-name", "fs__read_text_file", "--tool-arg", f"path={big}"))
            tg.cancel_scope.cancel()
    _check_big_read(result, big.stat().st_size)


@pytest.mark.spec("GW-12")
async def test_the_python_sdk_reads_a_large_file(tmp_path: Path) -> None:
    """The Python SDK client (it checks the output schema of a success) reads the same file."""
    env, big = _env(tmp_path)
    with anyio.fail_after(60):
        async with connect(env) as (_gw, client):
            result = await client.call_tool("fs__read_text_file", {"path": str(big)})
    _check_big_read(result.model_dump(by_alias=True, mode="json", exclude_none=True),
                    big.stat().st_size)
    assert isinstance(result.content[0], types.TextContent)


@pytest.mark.spec("BIND-8")
async def test_gateway_refusals_carry_their_code_in_meta_for_the_python_sdk(
        tmp_path: Path) -> None:
    """Over stdio (`awl gateway` as a subprocess), the Python SDK reads each kind of gateway
    refusal with its code and message in ``_meta["awl/error"]`` and no structured content:
    a tool the order does not allow, held-call arguments that do not fit, an upstream result
    off its schema, and a spent budget; a held call's refusal keeps its awl/ref."""
    servers = {"shapes": server_entry("shapes"),
               "receiver": server_entry("receiver",
                                        env={"RECEIVER_LOG": str(tmp_path / "r.jsonl")})}
    env = make_env(tmp_path, servers=servers, tools=["shapes/*", "receiver/*"],
                   staged=["receiver/create_issue"], budget={"tool_calls": 2, "usd": 1})
    calls: list[tuple[str, str, dict[str, Any]]] = [
             ("AWL_FORBIDDEN", "notes__send_email", {"to": "x"}),
             ("AWL_INVALID_ARGUMENTS", "receiver__create_issue", {"title": 5}),
             ("AWL_UPSTREAM_BAD_RESULT", "shapes__off_schema", {}),
             ("AWL_BUDGET_EXHAUSTED", "shapes__off_schema", {})]
    with anyio.fail_after(120):
        async with gateway_client(env) as client:
            results = [final(await client.call_tool(name, arguments))
                       for _, name, arguments in calls]
    for (code, name, _), result in zip(calls, results, strict=True):
        assert result.is_error and result.structured_content is None, name
        error = (result.meta or {})["awl/error"]
        assert error["code"] == code, (name, error)
        assert first_block(result).startswith(f"{code}: {error['message']}"), name
    assert (results[1].meta or {})["awl/ref"] == "receiver/create_issue#2"
