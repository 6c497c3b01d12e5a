"""The stdio transport to an upstream server: its process, its pipes, and a prompt stop (GW-19).

The MCP SDK's own stdio client gives a server 2 s to exit after its stdin closes and 2 s more
after SIGTERM. A gateway in front of servers that linger on exit would then outlive its
worker's client by that much, and a client such as the SDK's own sends the gateway SIGTERM
2 s after closing its stdin, so the gateway's own exit handlers would not run. Here the
sequence the MCP specification asks for runs with shorter waits: close the server's stdin,
wait up to :data:`EXIT_GRACE` for it to exit, then signal its whole process group (SIGTERM,
and SIGKILL :data:`TERM_GRACE` later). Each upstream's connection stops in its own task, so
the pool stops every server at once.

The server runs in a session of its own (its pid is its process group), so nothing it
started outlives it. Every line it writes on stdout is read as one JSON-RPC message; a line
that is not one is handed on as the exception (the connection logs it in one line, SEC-4).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import TextIO

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from gateway._config import StdioTransport

__all__ = ["EXIT_GRACE", "TERM_GRACE", "stdio_transport"]

EXIT_GRACE = 0.5
"""Seconds a server has to exit by itself once its stdin is closed."""
TERM_GRACE = 0.5
"""Seconds between SIGTERM to the server's process group and SIGKILL."""
_REAP_SECONDS = 1.0
"""Seconds to wait for a killed server to be seen dead."""
_POLL = 0.01

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception],
                MemoryObjectSendStream[SessionMessage]]


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _exited(process: anyio.abc.Process, seconds: float) -> bool:
    """Whether ``process`` is seen dead within ``seconds`` (by its return code, not by
    waiting for its pipes, which a child it left behind may hold open)."""
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(_POLL)
    return process.returncode is not None


async def stop_process(process: anyio.abc.Process) -> None:
    """Close the server's stdin, give it :data:`EXIT_GRACE` to exit, then end its process
    group: SIGTERM, and SIGKILL after :data:`TERM_GRACE`."""
    assert process.stdin is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, EXIT_GRACE):
        await terminate_posix_process_tree(process, TERM_GRACE)
        await _exited(process, _REAP_SECONDS)


class StderrTail:
    """The end of what a server wrote on its stderr (passed on to the gateway's errlog as it
    comes): why a server that never finished starting stopped is usually its last line."""

    def __init__(self, keep: int = 4096) -> None:
        self._keep = keep
        self._data = b""

    def add(self, chunk: bytes) -> None:
        self._data = (self._data + chunk)[-self._keep:]

    def last_line(self, limit: int = 300) -> str | None:
        """Its last non-empty line, one line of at most ``limit`` characters, or None."""
        lines = [line.strip() for line in self._data.decode("utf-8", "replace").splitlines()]
        said = next((line for line in reversed(lines) if line), None)
        if said is None:
            return None
        said = " ".join(said.split())
        return said if len(said) <= limit else said[:limit - 1] + "\u2026"


@asynccontextmanager
async def stdio_transport(transport: StdioTransport, errlog: TextIO,
                          said: StderrTail | None = None) -> AsyncIterator[Streams]:
    """Start the server ``transport`` names and yield the streams an MCP client speaks over;
    on exit, stop it as the module says (on Windows, the MCP SDK's own client). What the
    server writes on its stderr goes to ``errlog``, its end kept in ``said`` too."""
    if sys.platform == "win32":  # pragma: no cover - the SDK kills a Windows job at once
        params = StdioServerParameters(command=transport.command, args=list(transport.args),
                                       env=dict(transport.env), cwd=transport.cwd)
        async with stdio_client(params, errlog=errlog) as streams:
            yield streams
        return
    process = await anyio.open_process(
        [transport.command, *transport.args], env=get_default_environment() | dict(transport.env),
        cwd=transport.cwd, stderr=subprocess.PIPE if said is not None else errlog,
        start_new_session=True)
    to_client, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_client = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        assert process.stdout is not None
        delivering = True
        pending: list[bytes] = []  # the start of a line still being read, joined once whole
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with to_client:
                async for chunk in process.stdout:
                    if b"\n" not in chunk:
                        pending.append(chunk)
                        continue
                    lines = chunk.split(b"\n")
                    lines[0] = b"".join([*pending, lines[0]])
                    pending = [lines.pop()]
                    for line in lines:
                        if delivering:
                            try:
                                await to_client.send(_parse(line))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                # No one listens any more: keep reading (and dropping), so a
                                # server blocked on a full stdout can still see its stdin end.
                                delivering = False

    async def write() -> None:
        assert process.stdin is not None
        try:
            async with from_client:
                async for message in from_client:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_client.aclose()  # the server cannot be written to: end the connection

    async def relay_stderr() -> None:
        assert process.stderr is not None and said is not None
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError,
                      ValueError):
            async for chunk in process.stderr:
                said.add(chunk)
                errlog.write(chunk.decode("utf-8", "replace"))
                errlog.flush()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        if said is not None:
            tg.start_soon(relay_stderr)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                to_server.close()
                from_server.close()
                await stop_process(process)
                with anyio.move_on_after(_REAP_SECONDS), suppress(OSError):
                    await process.aclose()
            tg.cancel_scope.cancel()
