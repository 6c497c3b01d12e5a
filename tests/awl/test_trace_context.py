"""A client's W3C trace context, bounded where frames enter a server (SPEC OBS-2)."""

from __future__ import annotations

import json

import mcp_types as types
import pytest

from awl.mcp.frames import check_frame
from awl.mcp.trace_context import MAX_MEMBERS, MAX_TRACESTATE, bound_meta

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.spec("OBS-2")
def test_tracestate_keeps_at_most_32_wellformed_members_and_512_characters() -> None:
    many = ",".join(f"k{i}=v{i}" for i in range(300))
    assert bound_meta({"traceparent": PARENT, "tracestate": many})["tracestate"] == ",".join(
        f"k{i}=v{i}" for i in range(MAX_MEMBERS))
    # Members over 128 characters go first (from the end), then members from the end.
    state = ",".join(["a=1", "big=" + "x" * 200, "b=2", "long=" + "y" * 200, "c=3",
                      *(f"m{i}=" + "z" * 60 for i in range(10))])
    kept = bound_meta({"traceparent": PARENT, "tracestate": state})["tracestate"]
    assert len(kept) <= MAX_TRACESTATE and kept.startswith("a=1,b=2,c=3,m0=")
    assert "big=" not in kept and "long=" not in kept
    # Malformed members, repeated keys and empty ones are dropped; white space trimmed.
    odd = " ok=1 ,,Upper=2,ok=again,sp ace=1,t@sys=v,=x,novalue=,e=a=b"
    assert bound_meta({"traceparent": PARENT, "tracestate": odd})["tracestate"] == (
        "ok=1,t@sys=v")


@pytest.mark.spec("OBS-2")
@pytest.mark.parametrize("parent", [
    "00-nothex", PARENT.upper(), PARENT + "-extra", "ff" + PARENT[2:],
    "00-" + "0" * 32 + PARENT[35:], PARENT[:36] + "0" * 16 + "-01", 12345, None])
def test_a_malformed_traceparent_is_dropped_with_its_tracestate(parent: object) -> None:
    meta = {"traceparent": parent, "tracestate": "a=1", "other": ["kept"]}
    assert bound_meta(meta) == {"other": ["kept"]}
    assert bound_meta({"tracestate": "a=1"}) == {}  # a list without its parent


def test_a_later_version_keeps_the_fields_this_one_knows() -> None:
    later = "cc" + PARENT[2:] + "-what-comes-next"
    assert bound_meta({"traceparent": later})["traceparent"] == "cc" + PARENT[2:]


@pytest.mark.spec("OBS-2")
def test_frames_carry_the_trace_context_bounded() -> None:
    """Every request read off the wire has its trace context bounded before the MCP SDK
    (which opens the request's span from it) or a handler sees it."""
    huge = ",".join(f"vendor{i}=" + "v" * 190 for i in range(300))
    raw = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "x", "arguments": {}, "_meta": {
            "traceparent": PARENT, "tracestate": huge, "progressToken": 3}}}).encode()
    message = check_frame(raw)
    assert isinstance(message, types.JSONRPCRequest) and message.params is not None
    meta = message.params["_meta"]
    assert meta["traceparent"] == PARENT and meta["progressToken"] == 3
    assert len(meta["tracestate"]) <= MAX_TRACESTATE and huge.startswith(meta["tracestate"])
