"""Fuzz: every gateway worker tool and forwarded call with hostile arguments, in front of an
upstream whose answers are themselves malformed (SEC-4, GW-7, GW-8, GW-9, DOC-15, DOC-16).

The upstream is ``tests/servers/hostile.py``, a real subprocess speaking JSON-RPC by hand.
Each call gets a tool result that the SDK client accepts (its structured content fits the
advertised output schema) or a JSON-RPC error; the gateway keeps serving; afterwards every
call the gateway named by ref is recorded, a plain call still works, and the order's log
folds to its stored state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from awl.documents.lifecycle import fold
from tests.fuzz.generators import mutate, rng, scale, sharp, value
from tests.gateway.gateway_support import connect, make_env, server_entry

pytestmark = pytest.mark.slow

EVIL = "a" * 40 + "!"


def _arguments(schema: dict[str, Any], r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hostile = r.random() < 0.5
    for key, spec in (schema.get("properties") or {}).items():
        if r.random() < 0.3:
            continue
        if hostile and r.random() < 0.5:
            out[key] = sharp(r)
        elif isinstance(spec, dict) and spec.get("type") == "integer":
            out[key] = r.randint(0, 5)
        elif isinstance(spec, dict) and "enum" in spec:
            out[key] = r.choice(spec["enum"])
        elif key == "report":
            out[key] = mutate({"status": "done", "result": {"summary": "done"},
                               "evidence": [{"criterion": "c1", "type": "note", "note": "ok"}],
                               "cost": {"tool_calls": 1, "usd": 0}, "tools_used": []}, r)
        else:
            out[key] = value(r)
    return out


def _sendable(name: str, arguments: dict[str, Any]) -> bool:
    """Whether the SDK client can encode this request at all (it refuses lone surrogates
    and nesting past pydantic's depth before anything is sent)."""
    try:
        types.CallToolRequestParams(name=name, arguments=arguments).model_dump(mode="json")
    except (ValueError, UnicodeError):
        return False
    return True


@pytest.mark.anyio
@pytest.mark.spec("SEC-4", "GW-7", "GW-8", "GW-9", "DOC-11", "DOC-15", "DOC-16")
async def test_the_gateway_survives_hostile_calls_and_hostile_upstream_answers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = make_env(tmp_path, servers={
        "hostile": server_entry("hostile", env={"HOSTILE_LOG": str(tmp_path / "h.jsonl")},
                                timeout=1),
        "notes": server_entry("notes", env={"OUTBOX_PATH": str(tmp_path / "outbox.jsonl")}),
    }, tools=["hostile/*", "notes/*"], staged=["hostile/send", "notes/send_email"],
        budget={"tool_calls": 1_000_000, "usd": 1_000_000})
    r = rng("gateway")
    refs: set[str] = set()
    slowest = 0.0
    try:
        with anyio.fail_after(240):
            async with connect(env) as (_, client):
                tools = {t.name: t for t in (await client.list_tools()).tools}
                answer = next(n for n in tools if n.endswith("answer"))
                send = next(n for n in tools if n.endswith("send") and "hostile" in n)
                names = sorted(tools)
                for i in range(scale(300)):
                    roll = r.random()
                    if roll < 0.3:
                        name, arguments = answer, {"seed": r.randrange(10**6)}
                    elif roll < 0.45:
                        name, arguments = send, {"to": r.choice([EVIL, "aaa", sharp(r)]),
                                                 "body": value(r)}
                    elif roll < 0.95:
                        name = r.choice(names)
                        arguments = _arguments(tools[name].input_schema, r)
                    else:
                        name, arguments = r.choice(["nope", "", "awl_x", "x" * 300]), {}
                    if not _sendable(name, arguments):
                        continue  # the SDK client itself cannot encode it (a lone surrogate)
                    started = time.monotonic()
                    try:
                        result = await client.call_tool(name, arguments)
                    except MCPError:
                        continue  # a protocol error (SEC-9): an answer, not a crash
                    finally:
                        slowest = max(slowest, time.monotonic() - started)
                    assert isinstance(result, types.CallToolResult), (i, name, arguments)
                    ref = (result.meta or {}).get("awl/ref")
                    if isinstance(ref, str):
                        refs.add(ref)
                # The gateway still serves a plain call after all of that.
                plain = await client.call_tool(next(n for n in tools if n.endswith("_ok")), {})
                assert not plain.is_error
        recorded = {c.ref for c in env.calls()}
        assert refs <= recorded, f"named but not recorded: {sorted(refs - recorded)[:5]}"
        assert fold(env.store.events(env.order_id)) == env.view().state
        assert slowest < 30, f"one call took {slowest:.1f} s"
        # No call fell through to the gateway's last-resort handler ("failed unexpectedly").
        surprises = [rec.getMessage() for rec in caplog.records
                     if rec.name.startswith(("gateway", "awl")) and rec.levelname == "ERROR"]
        assert not surprises, surprises[:3]
    finally:
        env.store.close()
