"""Malformed JSON-RPC frames, and the answers SEC-9 owes them, for every door that takes frames:
the desk and the gateway, over stdio and over streamable HTTP in both protocol eras.

Each door's test sends these as raw bytes to a real ``awl serve`` / ``awl gateway``
subprocess, checks each answer's code and id, checks that a valid call still works after,
and that nothing on stderr is a traceback.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {}}
"""The per-request ``_meta`` a 2026-07-28 request carries."""


@dataclass(frozen=True)
class Frame:
    """One malformed frame and the error it must get: its code, and the id it is answered
    with (None: ``"id": null``, the id could not be read)."""

    label: str
    raw: bytes
    code: int
    id: int | None


def _call(request_id: int, tool: str, arguments: str, *, modern: bool) -> bytes:
    meta = f', "_meta": {json.dumps(ENVELOPE)}' if modern else ""
    return (f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call", "params": '
            f'{{"name": "{tool}", "arguments": {arguments}{meta}}}}}').encode()


def malformed(tool: str, *, modern: bool = False) -> list[Frame]:
    """The malformed frames, with ``tool`` as the name in the ``tools/call`` ones."""
    ping = '{"jsonrpc": "2.0", "id": 70, "method": "ping"}'
    deep = "[" * 200 + "]" * 200
    return [
        Frame("not JSON", b"this is not json", PARSE_ERROR, None),
        Frame("cut short", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', PARSE_ERROR, None),
        Frame("not UTF-8", b'{"jsonrpc": "2.0", "id": 2, "method": "ping", "x": "\xff"}',
              PARSE_ERROR, None),
        Frame("a 5,000-digit number", b'{"jsonrpc": "2.0", "id": 3, "x": ' + b"7" * 5000 + b"}",
              INVALID_REQUEST, 3),
        Frame("a 5,000-digit argument", _call(18, tool, '{"x": ' + "7" * 5000 + "}",
                                              modern=modern), INVALID_PARAMS, 18),
        Frame("a 5,000-digit id", b'{"jsonrpc": "2.0", "id": ' + b"7" * 5000 + b', "method": '
              b'"ping"}', INVALID_REQUEST, None),
        Frame("an argument twice", _call(19, tool, '{"to": "a", "to": "b"}', modern=modern),
              INVALID_PARAMS, 19),
        Frame("a tool name twice", b'{"jsonrpc": "2.0", "id": 20, "method": "tools/call", '
              b'"params": {"name": "' + tool.encode() + b'", "name": "x", "arguments": {}}}',
              INVALID_PARAMS, 20),
        Frame("a batch", f"[{ping}]".encode(), INVALID_REQUEST, None),
        Frame("an empty batch", b"[]", INVALID_REQUEST, None),
        Frame("an array", b"[1, 2]", INVALID_REQUEST, None),
        Frame("a string", b'"ping"', INVALID_REQUEST, None),
        Frame("a number", b"42", INVALID_REQUEST, None),
        Frame("id 1.5", b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', INVALID_REQUEST, None),
        Frame("id true", b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', INVALID_REQUEST,
              None),
        Frame("id null", b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', INVALID_REQUEST,
              None),
        Frame("id object", b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}',
              INVALID_REQUEST, None),
        Frame("an id twice", b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "id": 5}',
              INVALID_REQUEST, None),
        Frame("jsonrpc 1.0", b'{"jsonrpc": "1.0", "id": 6, "method": "ping"}', INVALID_REQUEST, 6),
        Frame("no jsonrpc", b'{"id": 7, "method": "ping"}', INVALID_REQUEST, 7),
        Frame("an error member", b'{"jsonrpc": "2.0", "id": 8, "method": "ping", '
              b'"error": {"code": 1, "message": "x"}}', INVALID_REQUEST, 8),
        Frame("no method", b'{"jsonrpc": "2.0", "id": 9}', INVALID_REQUEST, 9),
        Frame("method 5", b'{"jsonrpc": "2.0", "id": 10, "method": 5}', INVALID_REQUEST, 10),
        Frame("a response with both", b'{"jsonrpc": "2.0", "id": 11, "result": {}, '
              b'"error": {"code": 1, "message": "x"}}', INVALID_REQUEST, None),
        Frame("params an array", b'{"jsonrpc": "2.0", "id": 12, "method": "tools/list", '
              b'"params": [1]}', INVALID_PARAMS, 12),
        Frame("1e400", _call(13, tool, '{"x": 1e400}', modern=modern), INVALID_PARAMS, 13),
        Frame("NaN", _call(14, tool, '{"x": NaN}', modern=modern), INVALID_PARAMS, 14),
        Frame("-Infinity", _call(15, tool, '{"x": -Infinity}', modern=modern), INVALID_PARAMS, 15),
        Frame("a lone surrogate", _call(16, tool, '{"x": "\\ud800"}', modern=modern),
              INVALID_PARAMS, 16),
        Frame("200 levels", _call(17, tool, f'{{"x": {deep}}}', modern=modern), INVALID_PARAMS, 17),
    ]


def check_answer(frame: Frame, answer: Any) -> None:
    """``answer`` is the JSON-RPC error ``frame`` is owed."""
    assert isinstance(answer, dict), (frame.label, answer)
    assert answer.get("jsonrpc") == "2.0" and "id" in answer, (frame.label, answer)
    assert answer["id"] == frame.id, (frame.label, answer)
    error = answer.get("error")
    assert isinstance(error, dict), (frame.label, answer)
    assert error["code"] == frame.code, (frame.label, answer)
    assert isinstance(error["message"], str) and error["message"], (frame.label, answer)


def initialize(request_id: int = 0) -> bytes:
    """A handshake-era ``initialize`` request."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}).encode()


INITIALIZED = b'{"jsonrpc": "2.0", "method": "notifications/initialized"}'


class StdioPeer:
    """Raw JSON-RPC lines to and from a subprocess's stdin and stdout."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._out = BufferedByteReceiveStream(process.stdout)

    async def send(self, frame: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(frame + b"\n")

    async def receive(self, seconds: float = 20) -> Any:
        with anyio.fail_after(seconds):
            line = await self._out.receive_until(b"\n", 10 * 1024 * 1024)
        return json.loads(line)

    async def exchange(self, frame: bytes) -> Any:
        await self.send(frame)
        return await self.receive()


HTTP_HEADERS = {"Accept": "application/json, text/event-stream",
                "Content-Type": "application/json"}


async def post_http(http: httpx2.AsyncClient, url: str, frame: bytes, *,
                    era: str, session: str | None = None) -> httpx2.Response:
    """POST one raw frame in protocol era ``era`` (a handshake session, or 2026-07-28)."""
    headers = {**HTTP_HEADERS, "MCP-Protocol-Version": era}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return await http.post(url, content=frame, headers=headers)


async def legacy_session(http: httpx2.AsyncClient, url: str) -> str:
    """Open a handshake-era session over HTTP; its ``Mcp-Session-Id``."""
    opened = await http.post(url, content=initialize(), headers=HTTP_HEADERS)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    done = await post_http(http, url, INITIALIZED, era=LEGACY, session=session)
    assert done.status_code == 202, done.text
    return str(session)


def no_traceback(stderr: str) -> None:
    """Nothing on stderr is a traceback, and every line of it is one line of its own."""
    assert "Traceback" not in stderr, stderr[-3000:]


async def refuse_all_over_http(url: str, token: str, tool: str) -> None:
    """POST every malformed frame with ``token``, in a handshake session and in the
    2026-07-28 era; each must get ``400`` and its error."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=30) as http:
        session = await legacy_session(http, url)
        for era, frames, sid in ((LEGACY, malformed(tool), session),
                                 (MODERN, malformed(tool, modern=True), None)):
            for frame in frames:
                answer = await post_http(http, url, frame.raw, era=era, session=sid)
                assert answer.status_code == 400, (era, frame.label, answer.text)
                check_answer(frame, answer.json())


async def refuse_all_over_stdio(peer: StdioPeer, tool: str) -> None:
    """Open a handshake session on ``peer`` and send it every malformed frame; each must
    get its error."""
    assert "result" in await peer.exchange(initialize())
    await peer.send(INITIALIZED)
    for frame in malformed(tool):
        check_answer(frame, await peer.exchange(frame.raw))


@asynccontextmanager
async def announced_server(command: list[str],
                           **options: Any) -> AsyncIterator[tuple[str, list[str]]]:
    """Run an HTTP-serving ``awl`` command; yields the URL it announces on stderr and a list
    that holds all of its stderr once the block has ended (the process terminated)."""
    stderr_text: list[str] = []
    async with await anyio.open_process(command, stderr=subprocess.PIPE, **options) as process:
        assert process.stderr is not None
        stderr = BufferedByteReceiveStream(process.stderr)
        announced = (await stderr.receive_until(b"\n", 4096)).decode()
        url = announced.split(" on ", 1)[1].split(";", 1)[0].strip()
        try:
            yield url, stderr_text
        finally:
            process.terminate()
            await process.wait()
            rest = bytearray(stderr.buffer)
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    rest += await stderr.receive()
            stderr_text.append(rest.decode(errors="replace"))
