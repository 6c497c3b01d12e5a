import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awl import NotFound
from gateway._config import GatewayConfig, load_config
from gateway._results import TRUNCATED_META_KEY, bound_result, result_size
from gateway._upstream import (
    RETRY_FIRST,
    UpstreamPool,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
    clean_meta,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SERVERS = Path(__file__).resolve().parents[1] / "servers"


def notes_entry(outbox: Path) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVERS / "notes.py")],
            "env": {"OUTBOX_PATH": str(outbox)}, "timeout": 10}


def flaky_entry(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVERS / "flaky.py")], "timeout": 10, **extra}


TIME_ENTRY = {"command": sys.executable,
              "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def config(**servers: dict[str, Any]) -> GatewayConfig:
    return load_config({"mcpServers": servers})


async def pid_of(pool: UpstreamPool, server: str = "flaky") -> int:
    result = await pool.call(server, "pid")
    assert result.structured_content is not None
    pid = result.structured_content["pid"]
    assert isinstance(pid, int)
    return pid


async def kill_flaky(pool: UpstreamPool) -> int:
    """SIGKILL the flaky server and wait until the pool has noticed; return its old pid."""
    pid = await pid_of(pool)
    os.kill(pid, signal.SIGKILL)
    while pool.status()["flaky"].state == "connected":
        await anyio.sleep(0.01)
    return pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@asynccontextmanager
async def notes_over_http(outbox: Path) -> AsyncIterator[str]:
    """Start the notes server on a free loopback port; yield its URL."""
    env = {**os.environ, "OUTBOX_PATH": str(outbox)}
    process = await anyio.open_process(
        [sys.executable, str(SERVERS / "notes.py"), "--http", "0"], stderr=subprocess.PIPE, env=env
    )
    try:
        assert process.stderr is not None
        seen = b""
        with anyio.fail_after(30):
            while (found := re.search(rb"listening on (http://\S+)", seen)) is None:
                seen += await process.stderr.receive()
        yield found.group(1).decode()
    finally:
        process.kill()
        with anyio.fail_after(10):
            await process.wait()
        await process.aclose()


async def test_pool_lists_tools_of_real_stdio_servers(tmp_path: Path) -> None:
    """Tools of a project server and the published time server appear under server/tool."""
    with anyio.fail_after(60):
        async with UpstreamPool(config(notes=notes_entry(tmp_path / "o"), time=TIME_ENTRY)) as pool:
            tools = await pool.tools()
            assert {"notes/search_notes", "notes/get_note", "notes/send_email",
                    "notes/create_issue", "time/get_current_time"} <= set(tools)
            search = tools["notes/search_notes"]
            assert search.annotations is not None and search.annotations.read_only_hint
            assert "query" in search.input_schema["properties"]
            result = await pool.call("time", "get_current_time", {"timezone": "UTC"})
            assert not result.is_error
            assert isinstance(result.content[0], types.TextContent)
            assert '"timezone": "UTC"' in result.content[0].text
            assert all(s.state == "connected" and s.starts == 1 for s in pool.status().values())


async def test_call_runs_the_tool_and_forwards_awl_meta(tmp_path: Path) -> None:
    """A write reaches the server once, with the awl/ref it was given; results come back."""
    outbox = tmp_path / "outbox.jsonl"
    with anyio.fail_after(30):
        async with UpstreamPool(config(notes=notes_entry(outbox))) as pool:
            result = await pool.call(
                "notes", "send_email", {"to": "a@example.test", "subject": "hi", "body": "b"},
                meta={"awl/ref": "notes/send_email#3", "awl/order": "wo-1"},
            )
            assert not result.is_error
            issue = await pool.call("notes", "create_issue", {"title": "t"})
            assert issue.structured_content == {"number": 1}
            assert issue.meta is None  # the upstream's protocol stamps are not passed on
    lines = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert [(m["to"], m["awl_ref"]) for m in lines] == [("a@example.test", "notes/send_email#3")]


async def test_reserved_meta_and_progress_tokens_are_not_forwarded() -> None:
    """Protocol-reserved _meta keys and progress tokens are dropped; other keys pass."""
    meta = {"awl/ref": "flaky/echo#1", "io.modelcontextprotocol/clientInfo": {"name": "worker"},
            "io.modelcontextprotocol/awl-test": 1, "progressToken": 7}
    assert clean_meta(meta) == {"awl/ref": "flaky/echo#1"}
    assert clean_meta({"progressToken": 1}) is None
    with anyio.fail_after(30):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:
            result = await pool.call("flaky", "echo", {"x": [1, 2]}, meta=meta)
    assert result.structured_content is not None
    received = result.structured_content["meta"]
    assert received["awl/ref"] == "flaky/echo#1"
    assert "io.modelcontextprotocol/awl-test" not in received
    assert "progressToken" not in received
    # Our own connection's stamp, not the worker's.
    assert received.get("io.modelcontextprotocol/clientInfo", {}).get("name") != "worker"
    assert result.structured_content["arguments"] == {"x": [1, 2]}


@pytest.mark.spec("GW-8")
async def test_crashed_upstream_is_restarted_by_the_next_call() -> None:
    """A call that crashes its server fails as possibly sent; the next call gets a new process."""
    with anyio.fail_after(60):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:
            first = await pid_of(pool)
            with pytest.raises(UpstreamUnavailable) as info:
                await pool.call("flaky", "crash")
            assert info.value.sent is True
            second = await pid_of(pool)
            assert second != first
            assert pool.status()["flaky"].starts == 2


@pytest.mark.spec("GW-8")
async def test_server_killed_between_calls_is_restarted_without_failing_a_call() -> None:
    """A server killed with SIGKILL while idle is noticed; the next call runs on a new one."""
    with anyio.fail_after(60):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:
            first = await kill_flaky(pool)
            assert await pid_of(pool) != first
            assert not alive(first)


@pytest.mark.spec("GW-8")
async def test_slow_call_times_out_and_the_connection_keeps_serving() -> None:
    """No answer in time is a timeout (sent, outcome unknown); the same server keeps serving."""
    with anyio.fail_after(30):
        async with UpstreamPool(config(flaky=flaky_entry(timeout=0.5))) as pool:
            with pytest.raises(UpstreamTimeout) as info:
                await pool.call("flaky", "slow", {"seconds": 30})
            assert info.value.sent is True and info.value.timeout == 0.5
            assert (await pool.call("flaky", "slow", {"seconds": 0})).is_error is False
            assert (await pool.call("flaky", "pid", timeout=5)).structured_content is not None
            assert pool.status()["flaky"].starts == 1


@pytest.mark.spec("GW-8")
async def test_big_result_is_truncated_to_the_limit() -> None:
    """A result over max_result_bytes is cut to fit, keeping its error flag and saying so."""
    with anyio.fail_after(30):
        async with UpstreamPool(config(flaky=flaky_entry(max_result_bytes=4096))) as pool:
            small = await pool.call("flaky", "big", {"n": 100})
            big = await pool.call("flaky", "big", {"n": 200_000})
    assert small.meta is None
    assert result_size(big) <= 4096
    assert big.is_error is False
    assert big.meta is not None and big.meta[TRUNCATED_META_KEY]["limit"] == 4096
    assert isinstance(big.content[0], types.TextContent) and big.content[0].text.startswith("xxx")
    assert isinstance(big.content[-1], types.TextContent) and "4096" in big.content[-1].text


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=3000)


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, min_size=1, max_size=5),
       st.none() | st.dictionaries(st.text(max_size=5), texts, max_size=3),
       st.booleans(), st.integers(min_value=1024, max_value=6000))
@pytest.mark.spec("GW-8")
def test_bound_result_always_fits(parts: list[str], structured: dict[str, Any] | None,
                                  is_error: bool, limit: int) -> None:
    """Whatever the content, a bounded result fits the limit and keeps is_error."""
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=t) for t in parts]
    content.append(types.ImageContent(type="image", data="QUJD" * 300, mime_type="image/png"))
    result = types.CallToolResult(content=content, structured_content=structured, is_error=is_error)
    bounded = bound_result(result, limit)
    assert result_size(bounded) <= limit
    assert bounded.is_error == is_error
    if result_size(result) <= limit:
        assert bounded is result


async def test_protocol_error_is_an_answered_rejection() -> None:
    """An upstream's JSON-RPC error is reported with its code, as an answer."""
    with anyio.fail_after(30):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:
            with pytest.raises(UpstreamRejected) as info:
                await pool.call("flaky", "slow", {"seconds": "not a number"})
            assert info.value.rpc_code is not None and info.value.sent is True
            assert (await pool.call("flaky", "pid")).is_error is False


async def test_before_send_runs_before_the_request_and_can_stop_it(tmp_path: Path) -> None:
    """before_send runs before the request leaves; if it raises, nothing is sent."""
    outbox = tmp_path / "outbox.jsonl"
    args = {"to": "a@example.test", "subject": "s", "body": "b"}
    seen: list[bool] = []

    async def mark() -> None:
        seen.append(outbox.exists())

    async def refuse() -> None:
        raise RuntimeError("disk full")

    with anyio.fail_after(30):
        async with UpstreamPool(config(notes=notes_entry(outbox))) as pool:
            with pytest.raises(RuntimeError, match="disk full"):
                await pool.call("notes", "send_email", args, before_send=refuse)
            assert not outbox.exists()
            await pool.call("notes", "send_email", args, before_send=mark)
    assert seen == [False]
    assert len(outbox.read_text().splitlines()) == 1


@pytest.mark.spec("GW-8")
async def test_one_dead_upstream_leaves_the_others_serving(tmp_path: Path) -> None:
    """A server that cannot start fails its own calls as never sent; the others keep serving."""
    hook_calls: list[str] = []

    async def hook() -> None:
        hook_calls.append("called")

    missing = {"command": str(tmp_path / "no-such-server"), "connect_timeout": 10}
    with anyio.fail_after(60):
        async with UpstreamPool(config(broken=missing, flaky=flaky_entry(),
                                       notes=notes_entry(tmp_path / "o"))) as pool:
            status = pool.status()
            assert status["broken"].state == "down" and status["broken"].error
            with pytest.raises(UpstreamUnavailable) as info:
                await pool.call("broken", "anything", {}, before_send=hook)
            assert info.value.sent is False and hook_calls == []
            with pytest.raises(UpstreamUnavailable):
                await pool.call("flaky", "crash")
            found = await pool.call("notes", "search_notes", {"query": "invoice"})
            assert found.structured_content is not None
            assert [n["id"] for n in found.structured_content["notes"]] == ["n1"]
            with pytest.raises(NotFound):
                await pool.call("nobody", "x")


async def test_require_all_refuses_to_start_without_every_server(tmp_path: Path) -> None:
    """With require_all, a server that cannot start fails the pool's start."""
    missing = {"command": str(tmp_path / "no-such-server")}
    with anyio.fail_after(30), pytest.raises(UpstreamUnavailable) as info:
        async with UpstreamPool(config(broken=missing, flaky=flaky_entry()), require_all=True):
            pass
    assert info.value.server == "broken" and info.value.sent is False


@pytest.mark.spec("GW-8")
async def test_a_server_that_failed_to_start_is_tried_again_only_after_its_backoff() -> None:
    """A start that times out fails at once every call made within the backoff, with its
    reason and never sent; the first call after the backoff starts the server again."""
    # Reads its stdin and never answers; leaves as soon as the stdin closes.
    silent = {"command": "sh", "args": ["-c", "cat > /dev/null"], "connect_timeout": 0.5}
    failures: list[UpstreamUnavailable] = []

    async def one() -> None:
        try:
            await pool.call("silent", "anything")
        except UpstreamUnavailable as exc:
            failures.append(exc)

    with anyio.fail_after(30):
        async with UpstreamPool(config(silent=silent)) as pool:
            assert pool.status()["silent"].attempts == 1
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
            within = pool.status()["silent"]
            await anyio.sleep(RETRY_FIRST + 0.2)
            await one()
            after = pool.status()["silent"]
    assert len(failures) == 9 and not any(f.sent for f in failures)
    assert within.attempts == 1 and within.starts == 0
    assert all("0.5 s" in f.message and "again" in f.message for f in failures[:8])
    assert after.attempts == 2 and after.starts == 0
    assert after.error is not None and "connect_timeout" in after.error


async def test_exit_stops_stdio_servers() -> None:
    """Leaving the pool ends every server process it started."""
    with anyio.fail_after(30):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:
            pid = await pid_of(pool)
            assert alive(pid)
        assert not alive(pid)


async def test_concurrent_calls_share_one_connection() -> None:
    """Many calls at once from many tasks all get their own answers over one connection."""
    answers: dict[int, Any] = {}
    with anyio.fail_after(30):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:

            async def one(i: int) -> None:
                answers[i] = (await pool.call("flaky", "echo", {"i": i})).structured_content

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(one, i)
            assert pool.status()["flaky"].starts == 1
    assert all(answers[i]["arguments"] == {"i": i} for i in range(50))


async def test_http_upstream_serves_and_reports_its_death(tmp_path: Path) -> None:
    """A streamable HTTP server on loopback serves calls; once it is gone, its calls fail."""
    outbox = tmp_path / "outbox.jsonl"
    with anyio.fail_after(60):
        async with notes_over_http(outbox) as url:
            cfg = config(notes={"url": url, "timeout": 10, "connect_timeout": 10},
                         flaky=flaky_entry())
            async with UpstreamPool(cfg) as pool:
                assert "notes/send_email" in await pool.tools()
                await pool.call("notes", "send_email", {"to": "h@example.test", "subject": "s",
                                                        "body": "b"}, meta={"awl/ref": "r#1"})
                assert json.loads(outbox.read_text())["awl_ref"] == "r#1"
                assert url.startswith("http://127.0.0.1:")
        with pytest.raises(UpstreamUnavailable):
            async with UpstreamPool(cfg) as pool:
                assert pool.status()["notes"].state == "down"
                assert (await pool.call("flaky", "pid")).is_error is False
                await pool.call("notes", "get_note", {"id": "n1"})


async def test_refresh_lists_tools_again_and_starts_servers_that_were_down() -> None:
    """tools(refresh=True) lists every server again, starting any that are down."""
    with anyio.fail_after(60):
        async with UpstreamPool(config(flaky=flaky_entry())) as pool:
            await kill_flaky(pool)
            tools = await pool.tools(refresh=True)
            assert "flaky/echo" in tools
            assert pool.status()["flaky"].state == "connected"
            assert pool.skipped() == {}


@pytest.mark.spec("GW-8", "SEC-4")
async def test_a_server_that_dies_starting_names_its_last_words(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A stdio server that exits before its handshake (a missing module, a bad flag) was
    refused as "Connection closed", its reason only on the gateway's stderr; the refusal
    now carries the last line it wrote there, which still reaches the gateway's stderr."""
    dying = {"command": sys.executable, "args": ["-c", (
        "import sys; sys.stderr.write('Traceback (most recent call last):\\n  ...\\n"
        "ModuleNotFoundError: No module named \\'anyio\\'\\n\\n'); sys.exit(1)")],
        "connect_timeout": 10}
    with anyio.fail_after(30):
        async with UpstreamPool(config(dying=dying)) as pool:
            with pytest.raises(UpstreamUnavailable) as info:
                await pool.call("dying", "anything", {})
    assert info.value.sent is False
    assert info.value.message.startswith(
        "cannot connect to upstream 'dying': Connection closed (its last words on stderr: "
        "ModuleNotFoundError: No module named 'anyio') "), info.value.message
    assert "No module named 'anyio'" in capfd.readouterr().err
