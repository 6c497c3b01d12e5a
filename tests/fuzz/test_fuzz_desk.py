"""Fuzz: every desk MCP tool with hostile arguments, valid work between, and a second
process writing the same SQLite desk (SEC-4, BIND-2, BIND-4, LC-1).

Every call answers with a tool result: a success that fits the tool's output schema, or a
refusal with one of the documented codes (never ``INTERNAL``). Afterwards every order's log
folds to its stored state, every order a create answered for exists, and the second
process's orders all exist with the states it drove them to.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from awl.documents.lifecycle import fold
from awl.passes import KeyStore
from awl.server import TOOL_NAMES, DeskServer
from awl.server._tools import TOOLS, argument_schema
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import report_fields
from tests.awl.server_support import MANAGER, WORKER, order_fields
from tests.fuzz.generators import mutate, rng, scale, sharp, value

ROOT = Path(__file__).resolve().parents[2]
CODES = {"NOT_FOUND", "FORBIDDEN", "INVALID_TRANSITION", "VALIDATION_FAILED", "CONFLICT",
         "BAD_REQUEST"}
OUTPUTS = {t.name: Draft202012Validator(t.output_schema) for t in TOOLS}

pytestmark = pytest.mark.slow

# The second writer: its own process, the library desk on the same file, orders taken from
# offer to approval; it prints each order's id and final state.
SECOND_WRITER = """
import json, sys
from awl.desk import Desk
from awl.store.sqlite import SQLiteStore
from awl.documents.errors import Conflict
sys.path.insert(0, sys.argv[3])
from tests.awl.server_support import order_fields
from tests.awl.desk_support import report_fields
store = SQLiteStore(sys.argv[1])
desk = Desk(store, conflict_retries=20)
done = {}
for i in range(int(sys.argv[2])):
    view = desk.create(order_fields(tools=["filings/*", "mail/*"], goal=f"second {i}"),
                       "human:other")
    desk.accept(view.id, "agent:writer")
    desk.start(view.id, "agent:writer")
    desk.report(view.id, "agent:writer", report_fields())
    done[view.id] = desk.review(view.id, "human:other", "approve").state
store.close()
print(json.dumps(done))
"""


def _order(r: Any) -> dict[str, Any]:
    fields = order_fields(tools=["filings/*", "mail/*"])
    if r.random() < 0.3:
        fields["output_schema"] = {"type": "object", "properties": {
            "s": {"type": "string", "pattern": "^(a+)+$"}}}
    return mutate(fields, r) if r.random() < 0.4 else fields


def _fit(key: str, schema: Any, r: Any, ids: list[str]) -> Any:
    """A value that fits the argument's schema (most of the time)."""
    if key == "order_id":
        return r.choice([*ids[-5:], "wo_nope"]) if ids else "wo_nope"
    if key == "order":
        return _order(r)
    if key == "report":
        return mutate(report_fields(), r) if r.random() < 0.3 else report_fields()
    if not isinstance(schema, dict):
        return value(r)
    if "enum" in schema:
        return r.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return r.randint(schema.get("minimum", 0), min(schema.get("maximum", 10), 10))
    if kind == "number":
        return r.choice([0, 0.01, 1.5])
    if kind == "boolean":
        return r.random() < 0.5
    if kind == "array":
        return [r.choice(["mail/send#1", "filings/*", "c1"])]
    if kind == "object":
        return {"usd": 1}
    return r.choice(["because", "agent:writer", "happened", "mail/send#1", "it is done"])


def _arguments(name: str, r: Any, ids: list[str]) -> dict[str, Any]:
    """Arguments for ``name``: every member fitting, one hostile, or all at random."""
    properties = argument_schema(name).get("properties", {})
    style = r.random()
    out: dict[str, Any] = {}
    for key, schema in properties.items():
        if style < 0.3 or r.random() < 0.5:  # hostile throughout, or fitting
            out[key] = sharp(r) if style < 0.3 and r.random() < 0.5 else _fit(key, schema, r, ids)
    if 0.3 <= style < 0.7 and properties:
        out[r.choice(sorted(properties))] = sharp(r)  # one hostile member
    if name == "wait_for_update" and not isinstance(out.get("timeout_seconds"), str):
        out["timeout_seconds"] = r.choice([0, 0.01])
    if r.random() < 0.05:
        out[r.choice(["actor", "extra", "\ud800"])] = value(r)
    return out


def _judge(name: str, arguments: dict[str, Any], result: types.CallToolResult) -> Any:
    if result.is_error:  # BIND-8: the code is in _meta, the text starts with it
        error = (result.meta or {}).get("awl/error", {})
        assert error.get("code") in CODES, (name, arguments, result)
        text = result.content[0]
        assert isinstance(text, types.TextContent) and "Traceback" not in text.text
        assert text.text.startswith(f"{error['code']}: ")
        return None
    data = result.structured_content
    assert isinstance(data, dict), (name, arguments)
    OUTPUTS[name].validate(data)
    return data


async def _valid_step(server: DeskServer, store: SQLiteStore, r: Any, ids: list[str]) -> None:
    """The next honest step of a recent order, so hostile calls meet every state."""
    order_id = r.choice(ids[-6:]) if ids else None
    state = store.load(order_id).state if order_id else "approved"
    step: dict[str, tuple[str, str, dict[str, Any]]] = {
        "offered": ("accept_work_order", WORKER, {}),
        "accepted": ("start_work_order", WORKER, {}),
        "working": r.choice([("post_progress", WORKER, {"note": "half way", "percent": 50}),
                             ("issue_delegation_pass", WORKER, {}),
                             ("submit_work_report", WORKER, {"report": report_fields()}),
                             ("submit_work_report", WORKER,
                              {"report": report_fields("blocked")})]),
        "blocked": ("answer_question", MANAGER, {"answer": "Q3"}),
        "submitted": r.choice([("review_work_report", MANAGER, {"decision": "approve"}),
                               ("review_work_report", MANAGER,
                                {"decision": "rework", "reason": "more"})]),
    }
    if state not in step or r.random() < 0.1:
        result = await server.call("create_work_order",
                                   {"order": order_fields(tools=["filings/*", "mail/*"])},
                                   actor=MANAGER)
        data = _judge("create_work_order", {}, result)
        assert data is not None, result
        ids.append(data["order"]["id"])
        return
    name, actor, arguments = step[state]
    arguments = {"order_id": order_id, **arguments}
    _judge(name, arguments, await server.call(name, arguments, actor=actor))


@pytest.mark.anyio
@pytest.mark.spec("SEC-4", "BIND-2", "BIND-4", "DOC-11", "DOC-12", "DOC-13", "DOC-14",
                  "DOC-16")
async def test_every_desk_tool_survives_hostile_arguments_beside_a_second_writer(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = home / "desk.sqlite3"
    store = SQLiteStore(path)
    r = rng("desk")
    ids: list[str] = []
    second_count = scale(30)
    second = subprocess.Popen([sys.executable, "-c", SECOND_WRITER, str(path),
                               str(second_count), str(ROOT)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        server = DeskServer(store, keys=KeyStore(home))
        with anyio.fail_after(300):
            for _ in range(scale(900)):
                if r.random() < 0.35:
                    await _valid_step(server, store, r, ids)
                    continue
                name = r.choice(TOOL_NAMES)
                arguments = _arguments(name, r, ids)
                actor = r.choice([MANAGER, WORKER, "agent:nosy"])
                _judge(name, arguments, await server.call(name, arguments, actor=actor))
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err.decode()[-3000:]
        theirs: dict[str, str] = json.loads(out)
        assert len(theirs) == second_count and set(theirs.values()) == {"approved"}
        every = {o.order.id: o for o in store.list_orders(limit=None)}
        for order_id, record in every.items():
            assert fold(store.events(order_id)) == record.state, order_id
        assert set(ids) <= set(every), "an order a create answered for is missing"
        for order_id, state in theirs.items():
            assert every[order_id].state == state
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
        store.close()
