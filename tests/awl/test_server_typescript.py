"""The desk driven by the TypeScript SDK (the MCP Inspector CLI, and the SDK's client in one
process), over stdio and HTTP: every refusal reaches the client readable, code first.

The TypeScript client checks a result's structured content against the tool's output
schema even on errors; a refusal that carried ``{code, message}`` as structured content
came out as ``-32602 Structured content does not match...`` and the code was lost (BIND-8).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from awl.desk import Desk
from awl.server import DeskServer, issue_token, serve_desk_http
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import MANAGER, OUTSIDER, ROOT, WORKER, order_fields
from tests.node_support import first_text, inspector, ts_calls

pytestmark = pytest.mark.slow

_SERVE = [sys.executable, "-m", "awl", "serve"]
_ENV = {"PYTHONPATH": str(ROOT)}


def _desk(home: Path) -> tuple[SQLiteStore, str, str]:
    """A desk with one offered order and one working order; returns their ids."""
    home.mkdir(exist_ok=True)
    store = SQLiteStore(home / "desk.sqlite3")
    desk = Desk(store)
    offered = desk.create(order_fields(), MANAGER).id
    working = desk.create(order_fields(), MANAGER).id
    desk.accept(working, WORKER)
    desk.start(working, WORKER)
    return store, offered, working


@pytest.mark.spec("BIND-4", "BIND-8")
def test_every_refusal_code_is_readable_in_the_typescript_sdk(tmp_path: Path) -> None:
    """NOT_FOUND, FORBIDDEN, BAD_REQUEST, INVALID_TRANSITION, VALIDATION_FAILED and CONFLICT
    each reach the TypeScript client as a tool error starting with its code; a success is
    accepted by the SDK's output schema check."""
    home = tmp_path / "home"
    _store, offered, working = _desk(home)
    calls = [
        ("NOT_FOUND", "get_work_order", {"order_id": "wo_nope"}),
        ("FORBIDDEN", "accept_work_order", {"order_id": offered}),
        ("BAD_REQUEST", "list_work_orders", {"limit": 0}),
        ("INVALID_TRANSITION", "review_work_report",
         {"order_id": working, "decision": "approve"}),
        ("VALIDATION_FAILED", "create_work_order", {"order": order_fields(criteria=[])}),
        ("CONFLICT", "create_work_order", {"order": order_fields(id=offered)}),
        (None, "get_work_order", {"order_id": working}),
    ]
    answers = ts_calls([{"name": n, "arguments": a} for _, n, a in calls], stdio={
        "command": sys.executable, "args": [*_SERVE[1:], "--home", str(home), "--as", MANAGER],
        "env": _ENV, "cwd": str(home)})
    for (code, name, _), answer in zip(calls, answers, strict=True):
        text = first_text(answer)
        if code is None:
            assert not answer["result"].get("isError"), text
            assert answer["result"]["structuredContent"]["state"] == "working"
        else:
            assert answer["result"]["isError"] is True
            assert text.startswith(f"{code}: "), (name, text)
            assert answer["result"]["_meta"]["awl/error"]["code"] == code


@pytest.mark.spec("BIND-8")
def test_the_inspector_cli_reads_a_refusal_over_stdio(tmp_path: Path) -> None:
    """The report's own case: `awl serve --as agent:w`, get_work_order with an unknown id."""
    home = tmp_path / "home"
    _desk(home)
    result = inspector([*_SERVE, "--home", str(home), "--as", "agent:w"], "tools/call",
                       "--tool-name", "get_work_order", "--tool-arg", "order_id=wo_unknown",
                       env=_ENV, cwd=home)
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("NOT_FOUND: ")


@pytest.mark.anyio
@pytest.mark.spec("BIND-3", "BIND-8")
async def test_the_inspector_cli_reads_a_refusal_over_http(tmp_path: Path) -> None:
    """Over streamable HTTP with a desk token in --header: an outsider's read is FORBIDDEN,
    readable; the worker's own read is accepted."""
    store, offered, _working = _desk(tmp_path / "home")
    outsider = issue_token(store, OUTSIDER)
    async with anyio.create_task_group() as tg:
        url = await tg.start(partial(serve_desk_http, DeskServer(store), "127.0.0.1", 0))
        refused = await anyio.to_thread.run_sync(partial(
            inspector, [url], "tools/call", "--transport", "http", "--tool-name",
            "get_work_order", "--tool-arg", f"order_id={offered}",
            "--header", f"Authorization: Bearer {outsider}"))
        tg.cancel_scope.cancel()
    assert refused["isError"] is True
    assert refused["content"][0]["text"].startswith("FORBIDDEN: ")
