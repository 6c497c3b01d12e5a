"""Where JSON-RPC frames enter a desk or gateway server: each one checked before the SDK reads it.

The MCP SDK's transports drop a frame they cannot read (invalid JSON, a batch, an id of the
wrong type) without an answer, and pass on values the rest of the server cannot hold
(``NaN``, ``1e400``, a lone surrogate, deep nesting), which then fail deep inside a handler.
SPEC SEC-9 (with the limits of DOC-1 and DOC-11) says what is refused and how it is answered;
both serving paths run every incoming frame through :func:`check_frame` first:

- over stdio, :func:`stdio_frames` replaces the SDK's ``stdio_server``: it reads the lines
  itself, answers a refused frame on the same stdout, and hands the server only messages
  that passed;
- over streamable HTTP (both protocol eras), :class:`FrameGuard` wraps the SDK's ASGI app:
  a refused POST body is answered ``400`` with the JSON-RPC error, any other is passed on
  unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, BinaryIO

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from awl.documents.errors import DocumentError
from awl.documents.limits import MAX_DOCUMENT_BYTES, MAX_INT_DIGITS, check_json_value
from awl.mcp.inflight import InFlightGate
from awl.mcp.trace_context import bound_meta, needs_bounding

__all__ = ["BODY_SECONDS", "MAX_FRAME_BYTES", "FrameGuard", "Refused", "check_frame",
           "stdio_frames"]

log = logging.getLogger("awl.server.frames")

MAX_FRAME_BYTES = MAX_DOCUMENT_BYTES
"""The largest frame read, in bytes: the size limit of DOC-1 and DOC-11."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A frame that was not passed on: the error to answer (None for a notification)."""

    answer: types.JSONRPCError | None
    reason: str
    """One line saying what was wrong, for the log."""


def _refuse(request_id: types.RequestId | None, code: int, message: str) -> Refused:
    error = types.JSONRPCError(jsonrpc="2.0", id=request_id,
                               error=types.ErrorData(code=code, message=message))
    return Refused(error, message)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=repr)
    return text if len(text) <= 40 else text[:40] + "…"


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _too_large() -> Refused:
    return _refuse(None, types.INVALID_REQUEST,
                   f"Invalid Request: the message is larger than {MAX_FRAME_BYTES} bytes")


def check_frame(raw: bytes) -> types.JSONRPCMessage | Refused:
    """The message one incoming frame carries, or why it is refused (see the module table)."""
    if len(raw) > MAX_FRAME_BYTES:
        return _too_large()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _refuse(None, types.PARSE_ERROR,
                       f"Parse error: the message is not UTF-8 (bad byte at offset {exc.start})")
    top: list[list[tuple[str, Any]]] = [[]]
    repeated: list[str] = []  # the first member name found twice in an inner object

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        top[0] = items  # the outermost object is read last
        held = dict(items)
        if len(held) != len(items) and not repeated:
            repeated.append(_twice([name for name, _ in items]))
        return held

    problem = None
    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        return _refuse(None, types.PARSE_ERROR, f"Parse error: not valid JSON: {exc.msg} "
                                                f"(column {exc.colno})")
    except RecursionError:
        return _refuse(None, types.PARSE_ERROR, "Parse error: the message nests too deeply")
    except ValueError:  # an integer literal too long for Python to read (over 4,300 digits)
        # Read again with such integers held as markers, so the answer goes to the request
        # and says what a shorter one beyond the limit is told (DOC-11, -32602).
        repeated.clear()
        longs: list[_LongInt] = []
        try:
            data = json.loads(text, object_pairs_hook=pairs,
                              parse_int=lambda literal: _LongInt.of(literal, longs))
        except (ValueError, RecursionError):
            return _refuse(None, types.PARSE_ERROR,
                           "Parse error: a number has too many digits")
        problem = (f"{longs[0]!r} is longer than the {MAX_INT_DIGITS} digits held"
                   if longs else None)
    if isinstance(data, list):
        return _refuse(None, types.INVALID_REQUEST, "Invalid Request: batches (arrays of "
                       "messages) are not supported; send each message on its own")
    if not isinstance(data, dict):
        return _refuse(None, types.INVALID_REQUEST, "Invalid Request: a JSON-RPC message is "
                       f"a JSON object, not {_show(data)}")
    names = [name for name, _ in top[0]]
    if len(names) != len(set(names)):
        return _refuse(None, types.INVALID_REQUEST,
                       f"Invalid Request: member {_show(_twice(names))} appears more than once")
    if repeated:  # DOC-1: a value with a repeated member is refused, never read last-wins
        problem = f"member {_show(repeated[0])} appears more than once in one object"
    return _check_message(data, problem)


def _twice(names: list[str]) -> str:
    return next(n for n in names if names.count(n) > 1)


class _LongInt:
    """An integer literal with more digits than are held (DOC-12), kept as a marker."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"

    @classmethod
    def of(cls, text: str, found: list[_LongInt]) -> int | _LongInt:
        digits = len(text.lstrip("-"))
        if digits <= MAX_INT_DIGITS:
            return int(text)
        found.append(cls(digits))
        return found[-1]


def _check_message(data: dict[str, Any],
                   problem: str | None = None) -> types.JSONRPCMessage | Refused:
    """Check a message's envelope, then its values: ``problem`` is one found while reading
    it (answered as a value outside the limits once the envelope is sound)."""
    has_id = "id" in data
    request_id = data.get("id")
    answer_id = request_id if has_id and _is_id(request_id) else None
    if data.get("jsonrpc") != "2.0":
        return _refuse(answer_id, types.INVALID_REQUEST,
                       'Invalid Request: "jsonrpc" must be "2.0"')
    if "method" in data:
        kind = "request" if has_id else "notification"
        if not isinstance(data["method"], str):
            return _refuse(answer_id, types.INVALID_REQUEST,
                           'Invalid Request: "method" must be a string')
        if "result" in data or "error" in data:
            return _refuse(answer_id, types.INVALID_REQUEST, "Invalid Request: a request or "
                           'notification has no "result" or "error" member')
        if has_id and not _is_id(request_id):
            return _refuse(None, types.INVALID_REQUEST, 'Invalid Request: "id" must be a '
                           f"string or an integer, not {_show(request_id)}")
        if "params" in data and not isinstance(data["params"], dict):
            return _refuse(answer_id, types.INVALID_PARAMS,
                           'Invalid params: "params" must be an object')
    elif "result" in data or "error" in data:
        kind = "response"
        answer_id = None  # a response is not answered; its id is not ours to reuse
        if ("result" in data) == ("error" in data):
            return _refuse(None, types.INVALID_REQUEST, 'Invalid Request: a response has '
                           'exactly one of "result" and "error"')
        if not (_is_id(request_id) or ("error" in data and has_id and request_id is None)):
            return _refuse(None, types.INVALID_REQUEST, 'Invalid Request: a response needs '
                           f'the "id" of its request, a string or an integer, not '
                           f"{_show(request_id)}")
    else:
        return _refuse(answer_id, types.INVALID_REQUEST, 'Invalid Request: a message needs a '
                       '"method" (a request or notification) or a "result" or "error" '
                       "(a response)")
    if problem is not None:
        return _beyond_limits(data, kind, answer_id, problem)
    try:
        check_json_value(data, where="the message", max_bytes=MAX_FRAME_BYTES)
    except DocumentError as exc:
        return _beyond_limits(data, kind, answer_id, exc.message)
    params = data.get("params")
    if kind != "response" and isinstance(params, dict) and needs_bounding(params.get("_meta")):
        # The client's trace context, bounded before any span or upstream sees it (OBS-2).
        data = {**data, "params": {**params, "_meta": bound_meta(params["_meta"])}}
    try:
        return types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"]) if exc.errors() else "message"
        return _refuse(answer_id, types.INVALID_REQUEST,
                       f"Invalid Request: not a JSON-RPC 2.0 {kind} MCP can read ({where})")


def _beyond_limits(data: dict[str, Any], kind: str, answer_id: types.RequestId | None,
                   problem: str) -> Refused:
    """A sound envelope carrying a value outside the input limits."""
    in_params = False
    if kind != "response" and "params" in data:
        with suppress(DocumentError):
            check_json_value({k: v for k, v in data.items() if k != "params"})
            in_params = True
    if in_params:
        message = f"Invalid params: {problem}"
        if kind == "notification":
            return Refused(None, f"a {data['method']!r} notification was dropped: {message}")
        return _refuse(answer_id, types.INVALID_PARAMS, message)
    return _refuse(answer_id, types.INVALID_REQUEST, f"Invalid Request: {problem}")


def _error_body(refused: Refused) -> bytes:
    answer = refused.answer or types.JSONRPCError(
        jsonrpc="2.0", id=None,
        error=types.ErrorData(code=types.INVALID_PARAMS, message=refused.reason))
    body = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["id"] = answer.id  # JSON-RPC writes "id": null when the id could not be read
    return json.dumps(body, ensure_ascii=False).encode()


# ---------------------------------------------------------------------------- stdio

_Read = MemoryObjectReceiveStream[SessionMessage | Exception]
_Write = MemoryObjectSendStream[SessionMessage]


@asynccontextmanager
async def stdio_frames() -> AsyncIterator[tuple[_Read, _Write]]:
    """Serve MCP over this process's stdin and stdout, every incoming line checked.

    Yields ``(read, write)`` for ``Server.run``. While it runs, file descriptor 0 reads the
    null device and 1 writes to stderr (the wire keeps private duplicates), so a stray
    ``print`` or a child process cannot corrupt the protocol stream; both are put back on
    exit.
    """
    wire_in, wire_out, restore = _claim_std_streams()
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    answers = write_send.clone()  # the reader's own way out, for refusals
    written = anyio.Event()
    gate = InFlightGate()  # a client that never reads its answers is not read from (GW-21)

    async def readline(limit: int) -> bytes:
        # Abandoned on cancel: a thread blocked on a quiet stdin must not hold up the exit.
        line: bytes = await anyio.to_thread.run_sync(wire_in.readline, limit,
                                                     abandon_on_cancel=True)
        return line

    async def read_lines() -> None:
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            async with read_send, answers:
                while line := await readline(MAX_FRAME_BYTES + 2):
                    frame = line.rstrip(b"\r\n")
                    if len(frame) > MAX_FRAME_BYTES:
                        while line and not line.endswith(b"\n"):  # skip the rest of it
                            line = await readline(MAX_FRAME_BYTES)
                    elif not frame.strip():
                        continue
                    checked = check_frame(frame)
                    if not isinstance(checked, Refused):
                        if isinstance(checked, types.JSONRPCRequest):
                            await gate.admit(checked.id)
                        elif (isinstance(checked, types.JSONRPCNotification)
                              and checked.method == "notifications/cancelled"
                              and isinstance(checked.params, dict)):
                            gate.release(checked.params.get("requestId"))
                        await read_send.send(SessionMessage(checked))
                        continue
                    log.warning("refused a message on stdin: %s", checked.reason)
                    if checked.answer is not None:
                        await answers.send(SessionMessage(checked.answer))

    async def write_lines() -> None:
        try:
            async with write_recv:
                async for item in write_recv:
                    data = _encode(item.message)
                    await anyio.to_thread.run_sync(_write, wire_out, data)
                    if isinstance(item.message, types.JSONRPCResponse | types.JSONRPCError):
                        gate.release(item.message.id)
        finally:
            written.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_lines)
            tg.start_soon(write_lines)
            try:
                yield read_recv, write_send
            finally:
                # The server has closed its side; let answers already on their way out go.
                write_send.close()
                with anyio.move_on_after(_FLUSH_SECONDS, shield=True):
                    await written.wait()
                tg.cancel_scope.cancel()
    finally:
        restore()


_FLUSH_SECONDS = 2.0


def _write(wire: BinaryIO, data: bytes) -> None:
    wire.write(data)
    wire.flush()


def _encode(message: types.JSONRPCMessage) -> bytes:
    """One line of wire JSON; an answer that cannot be encoded becomes an error for its id."""
    try:
        return (message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
    except (ValueError, UnicodeError) as exc:
        log.warning("an outgoing message could not be encoded as UTF-8 JSON: %s",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        request_id = getattr(message, "id", None)
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return b""
        error = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(
            code=types.INTERNAL_ERROR, message="the answer could not be encoded as JSON"))
        return (error.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()


def _claim_std_streams() -> tuple[BinaryIO, BinaryIO, Any]:
    """Private duplicates of stdin and stdout for the wire, and a function putting them back.

    When the standard streams are not real file descriptors (an embedding host), their
    buffers are used as they are.
    """
    try:
        fds = (sys.stdin.fileno(), sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return sys.stdin.buffer, sys.stdout.buffer, lambda: None
    sys.stdout.flush()
    wire = (os.dup(fds[0]), os.dup(fds[1]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, fds[0])
    os.close(devnull)
    os.dup2(2, fds[1])

    def restore() -> None:
        with suppress(OSError):
            os.dup2(wire[0], fds[0])
            os.dup2(wire[1], fds[1])
        # The duplicates stay open: a worker thread may still be blocked reading one.

    # closefd=False for the same reason.
    return (os.fdopen(wire[0], "rb", closefd=False),
            os.fdopen(wire[1], "wb", closefd=False), restore)


# ---------------------------------------------------------------------------- HTTP


class FrameGuard:
    """ASGI middleware: a POSTed JSON-RPC body is checked before the MCP app reads it.

    A refused body is answered ``400`` with its JSON-RPC error; any other request reaches
    the app with its body unchanged. Bodies that do not say they are JSON are left to the
    app (it answers ``415``). A request whose ``Content-Length`` declares more than
    :data:`MAX_FRAME_BYTES`, whatever its type, is answered ``413``
    at once, before a byte of its body is read, and its connection closed: waiting for a
    body that is refused anyway held the request for :data:`BODY_SECONDS` (SEC-9).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _declared_length(scope) > MAX_FRAME_BYTES:
            log.info("refused an HTTP message: its Content-Length is over %d bytes",
                     MAX_FRAME_BYTES)
            await _answer(send, 413, _error_body(_too_large()), close=True)
            return
        if scope["type"] != "http" or scope.get("method") != "POST" or not _says_json(scope):
            await self.app(scope, receive, send)
            return
        body = None
        with anyio.move_on_after(BODY_SECONDS):
            body = await _read_body(receive)
            if body is None:  # the client left before sending it all
                return
        if body is None:
            # A client that stops halfway through its body (crashed, or its network gone)
            # would otherwise hold this request, its socket and what it sent, forever.
            log.info("refused an HTTP message: its body did not arrive within %g seconds",
                     BODY_SECONDS)
            await _answer(send, 408, _error_body(_refuse(
                None, types.INVALID_REQUEST, "Invalid Request: the message's body did not "
                f"arrive within {BODY_SECONDS:g} seconds")), close=True)
            return
        checked = check_frame(body) if body is not _TOO_LARGE else _too_large()
        if isinstance(checked, Refused):
            log.info("refused an HTTP message: %s", checked.reason)
            await _answer(send, 413 if body is _TOO_LARGE else 400, _error_body(checked))
            return
        if b'"tracestate"' in body or b'"traceparent"' in body:
            # The message as checked, its trace context bounded (check_frame).
            body = checked.model_dump_json(by_alias=True, exclude_unset=True).encode()
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _declared_length(scope: Scope) -> int:
    """The body length the request's ``Content-Length`` declares (0 without one; the HTTP
    server refuses a malformed one before the app is called)."""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else 0
    return 0


def _says_json(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-type":
            return b"json" in value.lower()
    return False


_TOO_LARGE = b"(too large)"

BODY_SECONDS = 30.0
"""How long a POSTed message's body may take to arrive, in seconds, before it is refused
(``408``) and its connection closed."""


async def _read_body(receive: Receive) -> bytes | None:
    """The request body; None when the client left; :data:`_TOO_LARGE` past the limit."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_FRAME_BYTES:
            return _TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes, *, close: bool = False) -> None:
    """Answer ``body``; ``close``: and end the connection (the rest of the request body
    may still come, and would be read as the next request)."""
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
