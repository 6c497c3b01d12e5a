"""The worker's side of the desk, offered by the gateway next to the upstream tools.

So the worker needs one MCP connection only: it reads its order, posts progress, lists
the order's calls (their refs are its evidence) and the calls the gateway held for it, and
submits its report through the gateway, acting as the order's worker (or as the pass holder
when it runs under a Delegation Pass; the desk decides what that principal may do). These
calls are neither recorded as tool calls nor counted against the budget. Their names have no
``__``, which every exposed upstream name has (:mod:`gateway._names`), so they can never
collide with an upstream tool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, get_args

import anyio.to_thread
import mcp_types as types

from awl.desk import Desk
from awl.documents import (
    INT64_MAX,
    AWLError,
    BadRequest,
    CallOutcome,
    CallRecord,
    WorkOrder,
    check_integer,
    matches_any,
)
from awl.mcp import text_result, tool_error
from awl.store import Store
from gateway._authority import Authority

GET_ORDER = "awl_get_order"
POST_PROGRESS = "awl_post_progress"
LIST_CALLS = "awl_list_calls"
LIST_HELD_CALLS = "awl_list_held_calls"
SUBMIT_REPORT = "awl_submit_report"

WORKER_TOOL_NAMES = frozenset({GET_ORDER, LIST_CALLS, LIST_HELD_CALLS, POST_PROGRESS,
                               SUBMIT_REPORT})
"""The gateway's own tool names; the name table refuses an upstream tool taking one."""

_READ = types.ToolAnnotations(read_only_hint=True, destructive_hint=False,
                              idempotent_hint=True, open_world_hint=False)
_WRITE = types.ToolAnnotations(read_only_hint=False, destructive_hint=False,
                               idempotent_hint=False, open_world_hint=False)
_NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}

_OUTCOMES: tuple[str, ...] = get_args(CallOutcome)
DEFAULT_CALL_LIMIT = 100
"""How many calls awl_list_calls returns when the worker names no limit (the latest ones)."""
MAX_CALL_LIMIT = 500
"""The most awl_list_calls returns at once: refused calls are free, so a log can grow long."""
_TEXT_ARGUMENTS = 200
"""Characters of a call's arguments shown in the text answer (the structured one has all)."""

_LIST_CALLS_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "attempt": {"type": "integer", "minimum": 1,
                    "description": "Only calls of this report attempt."},
        "tool": {"type": "string",
                 "description": "Only calls of this canonical server/tool name."},
        "outcome": {"enum": list(_OUTCOMES), "description": "Only calls with this outcome."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_CALL_LIMIT,
                  "description": f"At most this many, the latest (default {DEFAULT_CALL_LIMIT})."},
    },
    "additionalProperties": False,
}
_LIST_CALLS_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "attempt": {"type": "integer", "minimum": 1,
                    "description": "The report attempt in progress."},
        "calls": {
            "type": "array",
            "description": "Matching call records, oldest first.",
            "items": {
                "type": "object",
                "properties": {
                    "ref": {"type": "string", "description": "server/tool#N: cite it as evidence."},
                    "tool": {"type": "string", "description": "Canonical server/tool name."},
                    "outcome": {"enum": list(_OUTCOMES)},
                    "attempt": {"type": "integer", "minimum": 1},
                    "started_at": {"type": "string"},
                    "arguments": {"type": "object"},
                },
                "required": ["ref", "tool", "outcome", "attempt", "started_at", "arguments"],
                "additionalProperties": False,
            },
        },
        "omitted": {"type": "integer", "minimum": 0,
                    "description": "Earlier matching calls left out by the limit."},
    },
    "required": ["attempt", "calls", "omitted"],
    "additionalProperties": False,
}

TOOLS = (
    types.Tool(
        name=GET_ORDER,
        description="[awl desk] Read your work order: goal, criteria, budget, deadline, allowed "
                    "and staged tools, its state, the report attempt in progress, the last "
                    "review, and what the gateway has counted so far. Free.",
        input_schema=_NO_ARGS,
        annotations=_READ,
    ),
    types.Tool(
        name=POST_PROGRESS,
        description="[awl desk] Tell the manager how the work is going (a short note and an "
                    "optional percentage). Free.",
        input_schema={
            "type": "object",
            "properties": {
                "note": {"type": "string", "minLength": 1, "description": "What happened."},
                "percent": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["note"],
            "additionalProperties": False,
        },
        annotations=_WRITE,
    ),
    types.Tool(
        name=LIST_CALLS,
        description="[awl desk] The calls recorded for this order, oldest first, each with its "
                    "ref server/tool#N (cite it as tool_call evidence), tool, outcome (ok, "
                    "error, refused, held, pending), attempt, start time and arguments. "
                    "Optionally only one attempt, tool or outcome; the latest "
                    f"{DEFAULT_CALL_LIMIT} unless limit says otherwise. Free.",
        input_schema=_LIST_CALLS_INPUT,
        output_schema=_LIST_CALLS_OUTPUT,
        annotations=_READ,
    ),
    types.Tool(
        name=LIST_HELD_CALLS,
        description="[awl desk] The calls held for approval in this attempt, each as "
                    "{ref, tool, arguments}: copy them into your report's effects. Calls "
                    "of tools the order does not stage never run and are left out. Free.",
        input_schema=_NO_ARGS,
        annotations=_READ,
    ),
    types.Tool(
        name=SUBMIT_REPORT,
        description="[awl desk] Submit your work report (status done, blocked or failed; "
                    "result; evidence citing call refs server/tool#N; cost; tools_used as "
                    "canonical server/tool names; effects for held calls). spec, order_id, "
                    "from, attempt and finished_at are filled in when left out. Free.",
        input_schema={
            "type": "object",
            "properties": {"report": {"type": "object", "description": "The Work Report."}},
            "required": ["report"],
            "additionalProperties": False,
        },
        annotations=_WRITE,
    ),
)


_USED = frozenset({"ok", "error", "held"})


def tools_used(calls: Iterable[CallRecord]) -> list[str]:
    """What a report's ``tools_used`` must equal (rule RX4), given one attempt's calls:
    every tool called that ran, failed or was held, sorted."""
    return sorted({c.tool for c in calls if c.outcome in _USED})


def listable_effects(order: WorkOrder, calls: Iterable[CallRecord]) -> list[dict[str, Any]]:
    """One attempt's held calls a report may list as effects, in order, as ``{ref, tool,
    arguments}``: only calls of tools the order stages (R14); the others (held by safe mode
    or the operator's hold list) never run."""
    return [{"ref": c.ref, "tool": c.tool, "arguments": c.arguments}
            for c in calls if c.outcome == "held" and matches_any(order.staged, c.tool)]


def _whole_number(value: Any, name: str, low: int, high: int | None) -> int | None:
    """An optional integer argument in ``[low, high]`` (DOC-12); BadRequest otherwise."""
    if value is None:
        return None
    return check_integer(value, name=name, minimum=low,
                         maximum=INT64_MAX if high is None else high)


def _cut(text: str) -> str:
    return text if len(text) <= _TEXT_ARGUMENTS else text[: _TEXT_ARGUMENTS - 1] + "…"


def _ok(data: Any, text: str) -> types.CallToolResult:
    return text_result(text, structured=data)


class DeskSide(Protocol):
    """What the desk tools need of their gateway (a :class:`~gateway.Gateway` is one)."""

    order_id: str
    desk: Desk
    store: Store

    def actor(self, authority: Authority) -> str:
        """Who the desk tools act as for ``authority``."""
        ...


class WorkerTools:
    """The desk tools of one gateway."""

    def __init__(self, gateway: DeskSide) -> None:
        self.gateway = gateway
        self._handlers: Mapping[str, Callable[[dict[str, Any], str], types.CallToolResult]] = {
            GET_ORDER: self._get_order,
            POST_PROGRESS: self._post_progress,
            LIST_CALLS: self._list_calls,
            LIST_HELD_CALLS: self._list_held,
            SUBMIT_REPORT: self._submit,
        }

    def tools(self) -> list[types.Tool]:
        """The tool definitions, for ``tools/list``."""
        return list(TOOLS)

    async def call(self, name: str, arguments: dict[str, Any],
                   authority: Authority) -> types.CallToolResult:
        """Run one desk tool as the caller; errors come back as tool errors with their code."""
        if authority.error is not None:
            return tool_error(authority.error)
        actor = self.gateway.actor(authority)
        handler = self._handlers[name]
        try:
            return await anyio.to_thread.run_sync(handler, arguments, actor)
        except AWLError as exc:
            return tool_error(exc)

    # Handlers run in a worker thread: the desk and the store are synchronous.

    def _get_order(self, arguments: dict[str, Any], actor: str) -> types.CallToolResult:
        gw = self.gateway
        view = gw.desk.get(gw.order_id)
        usage = gw.store.usage(gw.order_id)
        review = view.latest_review
        calls = gw.desk.calls(gw.order_id, attempt=view.attempt)
        data = {
            "order": view.order.to_json(),
            "state": view.state,
            "attempt": view.attempt,
            "acting_as": actor,
            "spent": {"tool_calls": usage.tool_calls, "usd": usage.usd,
                      "first_call_at": usage.first_call_at},
            "tools_used": tools_used(calls),
            "latest_review": review.to_json() if review is not None else None,
        }
        return _ok(data, f"order {view.id} is {view.state} (attempt {view.attempt}); "
                         f"{usage.tool_calls} tool calls counted so far")

    def _post_progress(self, arguments: dict[str, Any], actor: str) -> types.CallToolResult:
        gw = self.gateway
        note = arguments.get("note")
        percent = arguments.get("percent")
        if not isinstance(note, str):
            raise BadRequest("note must be a string saying what happened")
        # The desk refuses a percent that is not a whole number from 0 to 100 (LC-11).
        view = gw.desk.progress(gw.order_id, actor, note, percent)
        return _ok({"state": view.state, "seq": view.seq}, f"progress posted (event {view.seq})")

    def _list_calls(self, arguments: dict[str, Any], actor: str) -> types.CallToolResult:
        # Every call of the order, whoever made it (the worker or a pass holder under it):
        # the report answers for all of them (rule RX4), so the worker must see all of them.
        gw = self.gateway
        attempt = _whole_number(arguments.get("attempt"), "attempt", 1, None)
        limit = _whole_number(arguments.get("limit"), "limit", 1, MAX_CALL_LIMIT)
        tool = arguments.get("tool")
        outcome = arguments.get("outcome")
        if tool is not None and not isinstance(tool, str):
            raise BadRequest("tool must be a canonical server/tool name")
        if outcome is not None and outcome not in _OUTCOMES:
            raise BadRequest(f"outcome must be one of {', '.join(_OUTCOMES)}")
        current = gw.desk.get(gw.order_id).attempt
        # Calls a gateway left pending (it died) are read as may-have-run (GW-7).
        recorded = gw.desk.calls(gw.order_id, attempt=attempt)
        found = [c for c in recorded
                 if (tool is None or c.tool == tool)
                 and (outcome is None or c.outcome == outcome)]
        keep = found[-(limit or DEFAULT_CALL_LIMIT):]
        calls = [{"ref": c.ref, "tool": c.tool, "outcome": c.outcome, "attempt": c.attempt,
                  "started_at": c.started_at, "arguments": c.arguments} for c in keep]
        lines = [f"{c['ref']} {c['outcome']} (attempt {c['attempt']}) "
                 f"{_cut(json.dumps(c['arguments'], ensure_ascii=False))}" for c in calls]
        omitted = len(found) - len(keep)
        if omitted:
            plural = "s" if omitted != 1 else ""
            lines.insert(0, f"{omitted} earlier matching call{plural} left out "
                            "(raise limit or filter by attempt to see them)")
        if not found:
            lines = ["no matching calls recorded for this order"]
        return _ok({"attempt": current, "calls": calls, "omitted": omitted}, "\n".join(lines))

    def _list_held(self, arguments: dict[str, Any], actor: str) -> types.CallToolResult:
        gw = self.gateway
        view = gw.desk.get(gw.order_id)
        calls = [c for c in gw.desk.calls(gw.order_id, attempt=view.attempt)
                 if c.outcome == "held"]
        held = listable_effects(view.order, calls)
        lines = [f"{h['ref']}" for h in held] or ["no held calls to list in this attempt"]
        never = len(calls) - len(held)
        if never:
            lines.append(f"{never} more held call(s) of tools the order does not stage are "
                         "left out: they never run and a report may not list them (R14)")
        return _ok({"attempt": view.attempt, "effects": held}, "\n".join(lines))

    def _submit(self, arguments: dict[str, Any], actor: str) -> types.CallToolResult:
        gw = self.gateway
        report = arguments.get("report")
        if not isinstance(report, dict):
            raise BadRequest("report must be a JSON object: the Work Report")
        view = gw.desk.report(gw.order_id, actor, report)
        return _ok({"state": view.state, "attempt": view.attempt, "seq": view.seq},
                   f"report accepted; order {view.id} is now {view.state}")
